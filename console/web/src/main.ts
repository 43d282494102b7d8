// The HareBox console: the layout, the session's start and end, and hash
// routing (#/sandboxes, #/sandboxes/ID, #/keys, #/environments,
// #/environments/ID, #/budgets, #/audit, #/hosts, #/images).

import { SESSION_ENDED, alertBox, clearError, currentSession, loadSession, onSessionEnded, reportError, setSession, showError, signOut } from "./api";
import { h, listen } from "./dom";
import { auditPage } from "./pages/audit";
import { budgetsPage } from "./pages/budgets";
import { environmentPage } from "./pages/environment";
import { environmentsPage } from "./pages/environments";
import { hostsPage } from "./pages/hosts";
import { imagesPage } from "./pages/images";
import { keysPage } from "./pages/keys";
import { sandboxPage } from "./pages/sandbox";
import { sandboxesPage } from "./pages/sandboxes";
import { signinPage } from "./pages/signin";
import type { Session } from "./types";

type Cleanup = () => void;

let cleanup: Cleanup | null = null;
let page: HTMLElement | null = null; // where the current page renders
let navLinks: HTMLAnchorElement[] = [];

function stopPage(): void {
  if (cleanup) cleanup();
  cleanup = null;
}

// layout renders the header and main (with the alert area) and returns
// the element the page goes in.
function layout(s: Session | null): HTMLElement {
  stopPage();
  const brand = h("span", { class: "brand" }, "HareBox console");
  let header: HTMLElement;
  if (s) {
    navLinks = [
      h("a", { href: "#/sandboxes" }, "Sandboxes"),
      h("a", { href: "#/keys" }, "Keys"),
      h("a", { href: "#/environments" }, "Environments"),
      h("a", { href: "#/budgets" }, "Budgets"),
      h("a", { href: "#/audit" }, "Audit"),
      h("a", { href: "#/hosts" }, "Hosts"),
      h("a", { href: "#/images" }, "Images"),
    ];
    const who = s.principal.operator ? "operator" : s.principal.key_id || "a key";
    const signout = h("button", { type: "button", "data-testid": "signout" }, "Sign out");
    listen(signout, "click", () => void doSignOut(signout));
    header = h(
      "header",
      { class: "top" },
      brand,
      h("nav", { "aria-label": "Main" }, h("ul", null, navLinks.map((a) => h("li", null, a)))),
      h(
        "div",
        { class: "who" },
        h("span", null, "Signed in as ", h("strong", { "data-testid": "whoami" }, who)),
        s.principal.account_id ? h("span", { class: "account" }, " (", s.principal.account_id, ")") : null,
        " ",
        signout,
      ),
    );
  } else {
    navLinks = [];
    header = h("header", { class: "top" }, brand);
  }
  page = h("div", { class: "page" });
  document.body.replaceChildren(header, h("main", { id: "main" }, alertBox(), page));
  return page;
}

function showSignIn(message?: string): void {
  setSession(null);
  const root = layout(null);
  cleanup = signinPage(root, (s) => {
    setSession(s);
    showApp();
  });
  if (message) showError(message);
}

function showApp(): void {
  layout(currentSession());
  route(false);
}

function route(moveFocus: boolean): void {
  if (!currentSession() || !page) return;
  const hash = location.hash || "#/sandboxes";
  const parts = hash.replace(/^#\/?/, "").split("/");
  stopPage();
  clearError();
  page.replaceChildren();
  const root = page;
  let section = parts[0];
  const whole = parts.length === 1 || (parts.length === 2 && parts[1] === "");
  if (parts[0] === "sandboxes" && parts.length === 2 && parts[1] !== "") {
    let id = parts[1];
    try {
      id = decodeURIComponent(id);
    } catch {
      // Left as it came.
    }
    cleanup = sandboxPage(root, id);
  } else if (parts[0] === "environments" && parts.length === 2 && parts[1] !== "") {
    let id = parts[1];
    try {
      id = decodeURIComponent(id);
    } catch {
      // Left as it came.
    }
    cleanup = environmentPage(root, id);
  } else if (parts[0] === "environments" && whole) {
    cleanup = environmentsPage(root);
  } else if (parts[0] === "budgets" && whole) {
    cleanup = budgetsPage(root);
  } else if (parts[0] === "hosts" && whole) {
    cleanup = hostsPage(root);
  } else if (parts[0] === "images" && whole) {
    cleanup = imagesPage(root);
  } else if (parts[0] === "sandboxes" && (parts.length === 1 || parts[1] === "")) {
    cleanup = sandboxesPage(root);
  } else if (parts[0] === "keys" && parts.length === 1) {
    cleanup = keysPage(root);
  } else if (parts[0] === "audit" && parts.length === 1) {
    cleanup = auditPage(root);
  } else {
    // Unknown: the default page, without a history entry of its own.
    history.replaceState(null, "", "#/sandboxes");
    section = "sandboxes";
    cleanup = sandboxesPage(root);
  }
  for (const a of navLinks) {
    if (a.getAttribute("href") === "#/" + section) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (moveFocus) root.querySelector<HTMLElement>("h1")?.focus();
}

async function doSignOut(btn: HTMLButtonElement): Promise<void> {
  clearError();
  btn.disabled = true;
  try {
    await signOut();
  } catch (err) {
    // A session already gone is signed out all the same.
    if (!(err && (err as { status?: number }).status === 401)) {
      btn.disabled = false;
      return reportError(err);
    }
  }
  showSignIn();
}

onSessionEnded(() => showSignIn(SESSION_ENDED));
window.addEventListener("hashchange", () => route(true));

async function boot(): Promise<void> {
  try {
    const s = await loadSession();
    setSession(s);
    showApp();
  } catch (err) {
    showSignIn();
    if (!(err && (err as { status?: number }).status === 401)) reportError(err);
  }
}

void boot();
