// The sign-in form, shown while there is no session. The key goes to
// POST /console/session once; the input is emptied right after, and the
// key is kept nowhere (the session is an HttpOnly cookie).

import { clearError, clearFieldErrors, fieldError, reportError, signIn } from "../api";
import { h, listen } from "../dom";
import type { Session } from "../types";

export function signinPage(root: HTMLElement, signedIn: (s: Session) => void): () => void {
  document.title = "Sign in · HareBox console";
  let stopped = false;
  const keyIn = h("input", { id: "key", name: "key", type: "password", autocomplete: "off", spellcheck: "false", autocapitalize: "off" });
  const btn = h("button", { type: "submit", class: "primary" }, "Sign in");
  const form = h(
    "form",
    { "data-testid": "signin", class: "signin" },
    h("div", { class: "field" }, h("label", { for: "key" }, "API key"), keyIn),
    h("div", { class: "form-actions" }, btn),
  );
  listen(form, "submit", async (e) => {
    e.preventDefault();
    clearError();
    clearFieldErrors(form);
    const key = keyIn.value.trim();
    if (!key) return fieldError(keyIn, "key", "Paste an API key (hbk_…).");
    btn.disabled = true;
    try {
      const s = await signIn(key);
      keyIn.value = "";
      if (!stopped) signedIn(s);
    } catch (err) {
      keyIn.value = "";
      reportError(err, form);
      keyIn.focus();
    } finally {
      btn.disabled = false;
    }
  });
  root.append(
    h("h1", null, "Sign in"),
    h("p", null, "Sign in with a HareBox API key. It is sent once to open a session and is not stored in the browser."),
    form,
  );
  keyIn.focus();
  return () => {
    stopped = true;
  };
}
