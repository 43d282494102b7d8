// The published URLs of #/sandboxes/ID: GET/POST .../urls, rotate and
// delete. A URL is the sandbox's own content, which is hostile: it is
// shown as text with a copy button, never as a link. A token comes only
// in the create and rotate answers, and is shown once. The server's
// errors about this part (no ingress, no right to it) show in it.

import { call, clearError, clearFieldErrors, fieldError, messageOf, refusal, reportError, ApiError } from "../api";
import { KeyedRows, emptyRow, field, h, list, listen, replace, tableWrap, thead, time } from "../dom";
import { URL_AUTHS, type PublishedURL, type Sandbox } from "../types";
import { confirmButtons, focusAction } from "./confirm";

const COLS = 6;

function copyButton(text: string, what: string, action: string): HTMLButtonElement {
  const b = h("button", { type: "button", "data-action": action, "aria-label": "Copy " + what }, "Copy");
  listen(b, "click", async () => {
    try {
      await navigator.clipboard.writeText(text);
      b.textContent = "Copied";
    } catch {
      b.textContent = "Copy failed: select the text";
    }
  });
  return b;
}

export interface URLsSection {
  el: HTMLElement;
  update(s: Sandbox): void;
  stop(): void;
}

export function urlsSection(base: string): URLsSection {
  let stopped = false;
  let loaded = false;
  let last: PublishedURL[] = [];
  const confirming = new Set<string>();
  const busy = new Set<string>();

  const note = h("p", { class: "part-note", "data-testid": "urls-note", role: "status" });
  const tokenBox = h("div", { class: "token-slot" });

  // ---- The table ----
  const tbody = h("tbody", null, emptyRow(COLS, "Loading…"));
  const table = h("table", { "data-testid": "urls", class: "list" }, thead("Port", "URL", "Access", "Created", "Token rotated", "Actions"), tbody);
  const rows = new KeyedRows<PublishedURL>(
    tbody,
    (u) => u.id,
    (u) => JSON.stringify([u.port, u.url, u.path_url, u.auth, u.oidc, u.created_at, u.rotated_at, confirming.has(u.id), busy.has(u.id)]),
    (u) => row(u),
    () => emptyRow(COLS, "No published URLs."),
  );

  function row(u: PublishedURL): HTMLTableRowElement {
    const auth = u.auth || "token";
    const rotate =
      auth === "token"
        ? listen(h("button", { type: "button", "data-action": "rotate", disabled: busy.has(u.id) }, "Rotate token"), "click", () => void rotateURL(u))
        : null;
    const del = confirmButtons({
      action: "delete",
      label: "Delete",
      confirmLabel: "Confirm delete",
      confirming: confirming.has(u.id),
      busy: busy.has(u.id),
      onAsk: () => {
        confirming.add(u.id);
        rows.update(last);
        focusAction(tbody, u.id, "confirm-delete");
      },
      onCancel: () => {
        confirming.delete(u.id);
        rows.update(last);
        focusAction(tbody, u.id, "delete");
      },
      onConfirm: () => void deleteURL(u),
    });
    const shown = u.url || u.path_url || "";
    return h(
      "tr",
      { "data-id": u.id, "data-port": u.port },
      h("td", { class: "num port" }, String(u.port)),
      h(
        "td",
        { class: "url" },
        shown ? h("div", { class: "url-line" }, h("code", { "data-testid": "url" }, shown), " ", copyButton(shown, "the URL for port " + u.port, "copy-url")) : "—",
        u.path_url && u.path_url !== shown
          ? h("div", { class: "url-line" }, h("span", { class: "muted" }, "Path form: "), h("code", null, u.path_url), " ", copyButton(u.path_url, "the path-form URL for port " + u.port, "copy-path-url"))
          : null,
      ),
      h("td", { class: "auth" }, auth, u.oidc ? h("div", { class: "muted" }, u.oidc.issuer, " (", u.oidc.audience, ")") : null),
      h("td", { class: "created" }, time(u.created_at)),
      h("td", { class: "created" }, u.rotated_at ? time(u.rotated_at) : "never"),
      h("td", { class: "buttons" }, h("div", { class: "actions" }, rotate, del)),
    );
  }

  // problem shows err in this part: a refusal, no ingress, anything but a
  // field's mistake (at its field) or the end of the session.
  function problem(err: unknown, form?: HTMLFormElement): void {
    if (err instanceof ApiError && err.sessionEnded) return;
    if (form && err instanceof ApiError && err.field) return reportError(err, form);
    note.textContent = refusal(err) ?? messageOf(err);
  }

  async function load(): Promise<void> {
    try {
      const res = await call<{ urls?: PublishedURL[] }>("GET", base + "/urls");
      if (stopped) return;
      last = res?.urls ?? [];
      rows.update(last);
    } catch (err) {
      if (stopped) return;
      last = [];
      replace(tbody, emptyRow(COLS, "The URLs could not be listed."));
      problem(err);
    }
  }

  function showToken(u: PublishedURL, what: string): void {
    if (!u.token) return replace(tokenBox);
    replace(
      tokenBox,
      h(
        "div",
        { class: "notice", "data-testid": "url-token-box", role: "group", "aria-labelledby": "url-token-title" },
        h("h3", { id: "url-token-title", tabindex: -1 }, what + " for port " + u.port),
        h("p", { class: "secret-line" }, h("code", { "data-testid": "url-token", class: "secret" }, u.token), " ", copyButton(u.token, "the token", "copy-token")),
        u.link
          ? h("p", { class: "secret-line" }, "A link that carries it: ", h("code", { "data-testid": "url-link", class: "secret" }, u.link), " ", copyButton(u.link, "the link", "copy-link"))
          : null,
        h(
          "p",
          { class: "note" },
          "This token is shown only once: copy it now. Send it as the X-HareBox-Token header (or Authorization: Bearer); the link swaps it for a cookie on the first visit.",
        ),
      ),
    );
    tokenBox.querySelector<HTMLElement>("h3")?.focus();
  }

  async function rotateURL(u: PublishedURL): Promise<void> {
    clearError();
    note.textContent = "";
    busy.add(u.id);
    rows.update(last);
    try {
      const r = await call<PublishedURL>("POST", base + "/urls/" + encodeURIComponent(u.id) + "/rotate");
      if (stopped) return;
      showToken(r, "New token");
    } catch (err) {
      problem(err);
    } finally {
      busy.delete(u.id);
    }
    await load();
  }

  async function deleteURL(u: PublishedURL): Promise<void> {
    clearError();
    note.textContent = "";
    busy.add(u.id);
    rows.update(last);
    try {
      await call<void>("DELETE", base + "/urls/" + encodeURIComponent(u.id));
      if (!stopped) replace(tokenBox);
    } catch (err) {
      problem(err);
    } finally {
      busy.delete(u.id);
      confirming.delete(u.id);
    }
    await load();
  }

  // ---- Publish one ----
  const portIn = h("input", { id: "url-port", name: "port", type: "number", min: 1, max: 65535, step: 1, inputmode: "numeric", required: true });
  const authSel = h(
    "select",
    { id: "url-auth", name: "auth" },
    URL_AUTHS.map((a) => h("option", { value: a }, a === "token" ? "token (a bearer token)" : a === "oidc" ? "oidc (OpenID Connect)" : "mtls (client certificate)")),
  );
  const issuerIn = h("input", { id: "url-oidc-issuer", name: "oidc.issuer", type: "text", autocomplete: "off", spellcheck: "false", placeholder: "https://" });
  const audienceIn = h("input", { id: "url-oidc-audience", name: "oidc.audience", type: "text", autocomplete: "off", spellcheck: "false" });
  const subjectsIn = h("input", { id: "url-oidc-subjects", name: "oidc.subjects", type: "text", autocomplete: "off", spellcheck: "false" });
  const emailsIn = h("input", { id: "url-oidc-emails", name: "oidc.emails", type: "text", autocomplete: "off", spellcheck: "false" });
  const groupsIn = h("input", { id: "url-oidc-groups", name: "oidc.groups", type: "text", autocomplete: "off", spellcheck: "false" });
  const oidcBox = h(
    "fieldset",
    { class: "grid-form oidc", hidden: true },
    h("legend", null, "OpenID Connect"),
    field("Issuer", issuerIn, "An https URL."),
    field("Audience", audienceIn, "The client ID the tokens are for."),
    field("Subjects", subjectsIn, "Comma-separated; optional."),
    field("Emails", emailsIn, "Comma-separated; optional."),
    field("Groups", groupsIn, "Comma-separated; optional."),
  );
  const publishBtn = h("button", { type: "submit", class: "primary" }, "Publish");
  const form = h(
    "form",
    { "data-testid": "create-url", class: "grid-form", "aria-label": "Publish a port" },
    field("Port", portIn, "A TCP port the sandbox serves plain HTTP on."),
    field("Access", authSel, "mtls: a client certificate from the project's URL CA."),
    oidcBox,
    h("div", { class: "form-actions" }, publishBtn),
  );
  listen(authSel, "change", () => (oidcBox.hidden = authSel.value !== "oidc"));
  listen(form, "submit", async (e) => {
    e.preventDefault();
    clearError();
    clearFieldErrors(form);
    note.textContent = "";
    const port = Number(portIn.value);
    if (portIn.value.trim() === "" || !Number.isInteger(port) || port < 1 || port > 65535) return fieldError(portIn, "port", "A port from 1 to 65535.");
    const body: Record<string, unknown> = { port, auth: authSel.value };
    if (authSel.value === "oidc") {
      if (!issuerIn.value.trim()) return fieldError(issuerIn, "oidc.issuer", "Give the issuer's https URL.");
      if (!audienceIn.value.trim()) return fieldError(audienceIn, "oidc.audience", "Give the audience (the client ID).");
      const oidc: Record<string, unknown> = { issuer: issuerIn.value.trim(), audience: audienceIn.value.trim() };
      for (const [k, el] of [
        ["subjects", subjectsIn],
        ["emails", emailsIn],
        ["groups", groupsIn],
      ] as [string, HTMLInputElement][]) {
        const items = list(el.value);
        if (items.length) oidc[k] = items;
      }
      body.oidc = oidc;
    }
    publishBtn.disabled = true;
    form.setAttribute("aria-busy", "true");
    try {
      const u = await call<PublishedURL>("POST", base + "/urls", body);
      if (stopped) return;
      portIn.value = "";
      showToken(u, "Token");
    } catch (err) {
      problem(err, form);
    } finally {
      publishBtn.disabled = false;
      form.removeAttribute("aria-busy");
    }
    await load();
  });

  const el = h(
    "section",
    { "aria-labelledby": "urls-title", "data-testid": "urls-section" },
    h("h2", { id: "urls-title" }, "Published URLs"),
    h("p", { class: "hint" }, "A port of the sandbox on the server's ingress, behind a token, OpenID Connect or a client certificate. What it serves is the sandbox's: open it with care."),
    note,
    tokenBox,
    tableWrap("Published URLs", table),
    h("h3", null, "Publish a port"),
    form,
  );

  return {
    el,
    update(_s: Sandbox) {
      if (loaded) return;
      loaded = true;
      void load();
    },
    stop() {
      stopped = true;
    },
  };
}
