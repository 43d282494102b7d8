// #/keys: the keys the caller sees, revoke and rotate, and a form for a
// new key (the KeyRequest schema). A secret is shown once, when a key is
// created or rotated, and is never kept anywhere else.

import { call, clearError, clearFieldErrors, currentSession, fieldError, reportError } from "../api";
import { emptyRow, field, h, list, listen, parsePairs, replace, tableWrap, thead, time } from "../dom";
import type { Key, KeyWithSecret, Scope } from "../types";

const GROUPS =
  "*, info, sandboxes:read, sandboxes:write, exec, files:read, files:write, firewall:read, firewall:write, accounts:read, projects:read, projects:write, keys:read, keys:write";

export function keysPage(root: HTMLElement): () => void {
  document.title = "Keys · HareBox console";
  let stopped = false;
  const operator = currentSession()?.principal.operator === true;

  // ---- The secret, once ----
  const secretBox = h("div", { class: "secret-slot" });
  function showSecret(k: KeyWithSecret, what: string): void {
    const code = h("code", { "data-testid": "secret", class: "secret" }, k.secret);
    const copy = listen(h("button", { type: "button", "data-action": "copy-secret" }, "Copy"), "click", async () => {
      try {
        await navigator.clipboard.writeText(k.secret);
        copy.textContent = "Copied";
      } catch {
        copy.textContent = "Copy failed: select the text";
      }
    });
    replace(
      secretBox,
      h(
        "section",
        { class: "notice", "data-testid": "secret-box", "aria-labelledby": "secret-title" },
        h("h2", { id: "secret-title" }, what),
        h("p", null, "Key ", h("code", null, k.id), ":"),
        h("p", { class: "secret-line" }, code, " ", copy),
        h("p", { class: "note", "data-testid": "secret-note" }, "This secret is shown only once: copy it now. It cannot be shown again."),
      ),
    );
    secretBox.querySelector("h2")?.setAttribute("tabindex", "-1");
    secretBox.querySelector<HTMLElement>("h2")?.focus();
  }

  // ---- The table ----
  const accountIn = h("input", { id: "keys-account", name: "account", type: "text", autocomplete: "off" });
  const accountForm = operator
    ? h(
        "form",
        { class: "filters", "data-testid": "keys-filter", role: "search", "aria-label": "Filter keys" },
        field("Account", accountIn, "ID or name; default the default account."),
        h("div", { class: "form-actions" }, h("button", { type: "submit" }, "Show")),
      )
    : null;
  if (accountForm) {
    listen(accountForm, "submit", (e) => {
      e.preventDefault();
      clearError();
      void load();
    });
  }
  const tbody = h("tbody", null, emptyRow(10, "Loading…"));
  const table = h(
    "table",
    { "data-testid": "keys", class: "list" },
    thead("Description", "ID", "Account", "Projects", "Permissions", "Created", "Expires", "Revoked", "Secret", "Actions"),
    tbody,
  );

  function scopeText(items?: string[]): string {
    return items && items.length ? items.join(", ") : "all";
  }

  function row(k: Key): HTMLTableRowElement {
    const revoked = !!k.revoked_at;
    const buttons = revoked
      ? null
      : h(
          "div",
          { class: "actions" },
          listen(h("button", { type: "button", "data-action": "rotate" }, "Rotate"), "click", () => void rotate(k.id)),
          listen(h("button", { type: "button", "data-action": "revoke", class: "danger-outline" }, "Revoke"), "click", () => void revoke(k.id)),
        );
    return h(
      "tr",
      { "data-id": k.id, "data-revoked": revoked ? "true" : "false" },
      h("td", { class: "description" }, k.description || ""),
      h("td", { class: "id" }, k.id),
      h("td", { class: "account" }, k.account_id),
      h("td", { class: "projects" }, scopeText(k.scope?.projects)),
      h("td", { class: "permissions" }, scopeText(k.scope?.actions)),
      h("td", { class: "created" }, time(k.created_at)),
      h("td", { class: "expires" }, k.expires_at ? time(k.expires_at) : "never"),
      h("td", { class: "revoked" }, revoked ? time(k.revoked_at) : "no"),
      h("td", { class: "hint" }, k.hint),
      h("td", { class: "buttons" }, buttons),
    );
  }

  async function load(): Promise<void> {
    const account = accountIn.value.trim();
    try {
      const res = await call<{ keys: Key[] }>("GET", "/v1/keys" + (account ? "?account=" + encodeURIComponent(account) : ""));
      if (stopped) return;
      const keys = res.keys ?? [];
      replace(tbody, keys.length ? keys.map(row) : emptyRow(10, "No keys."));
    } catch (err) {
      if (stopped) return;
      replace(tbody, emptyRow(10, "The keys could not be listed."));
      reportError(err, accountForm);
    }
  }

  async function revoke(id: string): Promise<void> {
    clearError();
    try {
      await call<Key>("DELETE", "/v1/keys/" + encodeURIComponent(id));
    } catch (err) {
      reportError(err);
    }
    if (!stopped) await load();
  }

  async function rotate(id: string): Promise<void> {
    clearError();
    try {
      const k = await call<KeyWithSecret>("POST", "/v1/keys/" + encodeURIComponent(id) + "/rotate");
      if (stopped) return;
      showSecret(k, "New secret for the key");
    } catch (err) {
      reportError(err);
    }
    if (!stopped) await load();
  }

  // ---- The create form (KeyRequest) ----
  const descIn = h("input", { id: "key-name", name: "description", type: "text", autocomplete: "off", maxlength: 256 });
  const projectsIn = h("input", { id: "key-projects", name: "scope.projects", type: "text", autocomplete: "off" });
  const actionsIn = h("input", { id: "key-actions", name: "scope.actions", type: "text", autocomplete: "off" });
  const sandboxesIn = h("input", { id: "key-sandboxes", name: "scope.sandboxes", type: "text", autocomplete: "off" });
  const labelsIn = h("input", { id: "key-labels", name: "scope.labels", type: "text", autocomplete: "off" });
  const cidrsIn = h("input", { id: "key-cidrs", name: "scope.cidrs", type: "text", autocomplete: "off" });
  const rateIn = h("input", { id: "key-rate", name: "scope.rate.per_second", type: "number", min: 0, step: "any", inputmode: "decimal" });
  const burstIn = h("input", { id: "key-burst", name: "scope.rate.burst", type: "number", min: 0, step: 1, inputmode: "numeric" });
  const budgetIn = h("input", { id: "key-budget", name: "scope.budget_usd", type: "text", autocomplete: "off", inputmode: "decimal" });
  const ttlIn = h("input", { id: "key-ttl", name: "ttl_seconds", type: "number", min: 0, max: 31536000, step: 1, inputmode: "numeric" });
  const formatSel = h(
    "select",
    { id: "key-format", name: "format" },
    h("option", { value: "harebox" }, "harebox (hbk_…)"),
    h("option", { value: "e2b" }, "e2b (e2b_…)"),
  );
  const acctIn = h("input", { id: "key-account", name: "account_id", type: "text", autocomplete: "off" });
  const createBtn = h("button", { type: "submit", class: "primary" }, "Create key");
  const form = h(
    "form",
    { "data-testid": "create-key", class: "grid-form", "aria-labelledby": "create-key-title" },
    field("Description", descIn, "What the key is for."),
    field("Projects", projectsIn, "Comma-separated project IDs or names; empty for all."),
    field("Permissions", actionsIn, "Comma-separated operationIds or groups: " + GROUPS + "; empty for all."),
    field("Sandboxes", sandboxesIn, "Comma-separated sandbox IDs: the only ones it sees (it cannot create)."),
    field("Labels", labelsIn, "Comma-separated key=value: it sees only sandboxes with them."),
    field("Allowed addresses", cidrsIn, "Comma-separated CIDRs the caller must be in."),
    field("Rate (requests per second)", rateIn, "With a burst."),
    field("Burst", burstIn),
    field("Budget (USD)", budgetIn, 'A dollar limit, e.g. "25.00".'),
    field("Expires after (seconds)", ttlIn, "Empty for never."),
    field("Secret format", formatSel),
    operator ? field("Account", acctIn, "ID or name; default the default account.") : null,
    h("div", { class: "form-actions" }, createBtn),
  );

  function numberOf(input: HTMLInputElement, fieldPath: string, integer: boolean): number | null | undefined {
    const v = input.value.trim();
    if (v === "") return undefined;
    const n = Number(v);
    if (!isFinite(n) || n < 0 || (integer && !Number.isInteger(n))) {
      fieldError(input, fieldPath, integer ? "A whole number, 0 or more." : "A number, 0 or more.");
      return null;
    }
    return n;
  }

  listen(form, "submit", async (e) => {
    e.preventDefault();
    clearError();
    clearFieldErrors(form);
    const body: Record<string, unknown> = {};
    const scope: Scope = {};
    if (descIn.value.trim()) body.description = descIn.value.trim();
    if (list(projectsIn.value).length) scope.projects = list(projectsIn.value);
    if (list(actionsIn.value).length) scope.actions = list(actionsIn.value);
    if (list(sandboxesIn.value).length) scope.sandboxes = list(sandboxesIn.value);
    if (labelsIn.value.trim()) {
      const labels = parsePairs(labelsIn.value, /,/);
      if (typeof labels === "string") return fieldError(labelsIn, "scope.labels", labels);
      scope.labels = labels;
    }
    if (list(cidrsIn.value).length) scope.cidrs = list(cidrsIn.value);
    const rate = numberOf(rateIn, "scope.rate.per_second", false);
    const burst = numberOf(burstIn, "scope.rate.burst", true);
    const ttl = numberOf(ttlIn, "ttl_seconds", true);
    if (rate === null || burst === null || ttl === null) return;
    if (rate !== undefined || burst !== undefined) {
      if (rate === undefined) return fieldError(rateIn, "scope.rate.per_second", "Give a rate with the burst.");
      if (burst === undefined) return fieldError(burstIn, "scope.rate.burst", "Give a burst with the rate.");
      scope.rate = { per_second: rate, burst };
    }
    if (budgetIn.value.trim()) scope.budget_usd = budgetIn.value.trim();
    if (Object.keys(scope).length) body.scope = scope;
    if (ttl !== undefined) body.ttl_seconds = ttl;
    if (formatSel.value && formatSel.value !== "harebox") body.format = formatSel.value;
    if (operator && acctIn.value.trim()) body.account_id = acctIn.value.trim();

    createBtn.disabled = true;
    try {
      const k = await call<KeyWithSecret>("POST", "/v1/keys", body);
      if (stopped) return;
      form.reset();
      showSecret(k, "New key");
      await load();
    } catch (err) {
      reportError(err, form);
    } finally {
      createBtn.disabled = false;
    }
  });

  root.append(
    h("h1", { tabindex: -1 }, "Keys"),
    secretBox,
    h("section", { "aria-labelledby": "keys-title" }, h("h2", { id: "keys-title" }, "API keys"), accountForm, tableWrap("API keys", table)),
    h("section", { "aria-labelledby": "create-key-title" }, h("h2", { id: "create-key-title" }, "New key"), form),
  );
  void load();
  return () => {
    stopped = true;
  };
}
