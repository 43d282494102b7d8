// #/environments/ID: an environment's latest version (its variables,
// files and credential rules), its versions, a diff between two of them,
// a form for a new version (EnvironmentUpdate: set, unset, third-party
// safe) and delete (two clicks). A secret variable shows "secret
// (hidden)", never a value, even if an answer carried one.

import { call, clearError, clearFieldErrors, fieldError, refusal, reportError } from "../api";
import { emptyRow, field, h, listen, list, replace, tableWrap, thead, time, type Child } from "../dom";
import type { EnvVar, Environment, EnvironmentVersion } from "../types";
import { confirmButtons } from "./confirm";
import { counts, parseVariables } from "./environments";

const VAR_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;
const HIDDEN = "secret (hidden)";

function sortedNames(vars?: Record<string, EnvVar> | null): string[] {
  return Object.keys(vars ?? {}).sort();
}

function valueCell(v: EnvVar | undefined): Child {
  if (!v) return "";
  if (v.secret) return h("span", { class: "secret-hidden" }, HIDDEN);
  if (!v.value) return h("span", { class: "muted" }, "(empty)");
  return h("code", { class: "value" }, v.value);
}

// The difference between two versions' variables, by name. A secret's
// value is never in an answer, so between two versions where a variable
// is secret in both, whether its value changed cannot be told.
export interface VarChange {
  name: string;
  change: "added" | "removed" | "changed" | "secret-unknown";
  detail: Child;
}

export function diffVariables(a: Record<string, EnvVar>, b: Record<string, EnvVar>): VarChange[] {
  const out: VarChange[] = [];
  const names = Array.from(new Set([...Object.keys(a), ...Object.keys(b)])).sort();
  for (const name of names) {
    const had = Object.prototype.hasOwnProperty.call(a, name) ? a[name] : undefined;
    const has = Object.prototype.hasOwnProperty.call(b, name) ? b[name] : undefined;
    if (!had && has) {
      out.push({ name, change: "added", detail: has.secret ? " (a secret)" : [" = ", valueCell(has)] });
    } else if (had && !has) {
      out.push({ name, change: "removed", detail: had.secret ? " (was a secret)" : [" (was ", valueCell(had), ")"] });
    } else if (had && has) {
      if (had.secret && has.secret) {
        out.push({ name, change: "secret-unknown", detail: "" });
      } else if (had.secret !== has.secret) {
        out.push({ name, change: "changed", detail: has.secret ? " (now a secret)" : " (no longer a secret)" });
      } else if ((had.value ?? "") !== (has.value ?? "")) {
        out.push({ name, change: "changed", detail: [": ", valueCell(had), " → ", valueCell(has)] });
      }
    }
  }
  return out;
}

export function environmentPage(root: HTMLElement, ref: string): () => void {
  document.title = ref + " · Environments · HareBox console";
  let stopped = false;
  let env: Environment | null = null;
  let versions: EnvironmentVersion[] = [];
  let confirming = false;
  let busy = false;
  const path = () => "/v1/environments/" + encodeURIComponent(env?.id ?? ref);

  const title = h("h1", { tabindex: -1, "data-testid": "env-title" }, ref);
  const note = h("p", { class: "part-note", "data-testid": "env-note", role: "status" });
  const record = h("dl", { "data-testid": "env-record", class: "record" });

  // ---- The latest version ----
  const varsBody = h("tbody", null, emptyRow(2, "Loading…"));
  const varsTable = h("table", { "data-testid": "env-variables" }, thead("Name", "Value"), varsBody);
  const filesBox = h("div", { "data-testid": "env-files-box" });
  const credsBox = h("div", { "data-testid": "env-credentials-box" });

  function renderLatest(e: Environment): void {
    title.textContent = e.name;
    document.title = e.name + " · Environments · HareBox console";
    const v = e.version;
    const c = counts(v?.variables);
    const items: [string, string, Child][] = [
      ["id", "ID", e.id],
      ["project", "Project", e.project],
      ["version", "Latest version", String(e.latest)],
      ["variables", "Variables", `${c.all} (${c.secret} secret)`],
      ["third_party_safe", "Third-party safe", v ? (v.third_party_safe ? "yes" : "no") : ""],
      ["created", "Created", time(e.created_at)],
      ["updated", "Updated", time(e.updated_at)],
    ];
    replace(
      record,
      items.filter(([, , x]) => x !== "").map(([key, label, x]) => h("div", { class: "row" }, h("dt", null, label), h("dd", { "data-key": key }, x))),
    );
    const names = sortedNames(v?.variables);
    replace(
      varsBody,
      names.length
        ? names.map((n) => {
            const x = v!.variables[n];
            return h("tr", { "data-name": n, "data-secret": x.secret ? "true" : "false" }, h("th", { scope: "row", class: "name" }, n), h("td", { class: "value" }, valueCell(x)));
          })
        : emptyRow(2, "No variables."),
    );
    const files = v?.files ?? [];
    replace(
      filesBox,
      files.length
        ? tableWrap(
            "Files",
            h(
              "table",
              { "data-testid": "env-files" },
              thead("Path", "Mode", "Owner", "Template", "Size"),
              h(
                "tbody",
                null,
                files.map((f) =>
                  h(
                    "tr",
                    { "data-path": f.path },
                    h("th", { scope: "row", class: "name" }, f.path),
                    h("td", null, f.mode !== undefined ? "0" + f.mode.toString(8) : "0644"),
                    h("td", null, f.owner ?? ""),
                    h("td", null, f.template ? "yes" : "no"),
                    h("td", { class: "num" }, String((f.content ?? "").length) + " characters"),
                  ),
                ),
              ),
            ),
          )
        : h("p", { class: "muted" }, "No files."),
    );
    const creds = v?.credentials ?? [];
    replace(
      credsBox,
      creds.length
        ? tableWrap(
            "Credential rules",
            h(
              "table",
              { "data-testid": "env-credentials" },
              thead("Secret", "Hosts", "Ports", "Header"),
              h(
                "tbody",
                null,
                creds.map((r) =>
                  h(
                    "tr",
                    null,
                    h("th", { scope: "row", class: "name" }, r.secret),
                    h("td", { class: "labels" }, (r.hosts ?? []).join(", ")),
                    h("td", null, r.ports ?? ""),
                    h("td", null, r.header ?? "", r.allow_http ? " (plain HTTP allowed)" : ""),
                  ),
                ),
              ),
            ),
          )
        : h("p", { class: "muted" }, "No credential rules."),
    );
  }

  // ---- Versions and the diff ----
  const versBody = h("tbody", null, emptyRow(5, "Loading…"));
  const versTable = h("table", { "data-testid": "env-versions" }, thead("Version", "Created", "Variables", "Secrets", "Third-party safe"), versBody);
  const versNote = h("p", { class: "part-note", "data-testid": "env-versions-note", role: "status" });
  const fromSel = h("select", { id: "diff-from", name: "from" });
  const toSel = h("select", { id: "diff-to", name: "to" });
  const diffOut = h("div", { "data-testid": "env-diff", class: "diff", "aria-live": "polite" });
  const diffForm = h(
    "form",
    { class: "filters", "data-testid": "env-diff-form", "aria-label": "Versions to compare" },
    field("From version", fromSel),
    field("To version", toSel),
  );
  listen(diffForm, "submit", (e) => {
    e.preventDefault();
    renderDiff();
  });
  listen(fromSel, "change", renderDiff);
  listen(toSel, "change", renderDiff);

  function renderVersions(pick?: { from: number; to: number }): void {
    replace(
      versBody,
      versions.length
        ? versions
            .slice()
            .reverse()
            .map((v) => {
              const c = counts(v.variables);
              return h(
                "tr",
                { "data-version": v.version },
                h("th", { scope: "row", class: "num" }, String(v.version)),
                h("td", { class: "time" }, time(v.created_at)),
                h("td", { class: "num" }, String(c.all)),
                h("td", { class: "num" }, String(c.secret)),
                h("td", null, v.third_party_safe ? "yes" : "no"),
              );
            })
        : emptyRow(5, "No versions."),
    );
    const opts = () => versions.map((v) => h("option", { value: v.version }, "Version " + v.version));
    const n = versions.length;
    const from = pick?.from ?? (n >= 2 ? versions[n - 2].version : versions[0]?.version);
    const to = pick?.to ?? versions[n - 1]?.version;
    fromSel.replaceChildren(...opts());
    toSel.replaceChildren(...opts());
    if (from !== undefined) fromSel.value = String(from);
    if (to !== undefined) toSel.value = String(to);
    renderDiff();
  }

  function renderDiff(): void {
    const a = versions.find((v) => String(v.version) === fromSel.value);
    const b = versions.find((v) => String(v.version) === toSel.value);
    if (!a || !b) return replace(diffOut, h("p", { class: "muted" }, "No versions to compare."));
    const changes = diffVariables(a.variables ?? {}, b.variables ?? {});
    const known = changes.filter((c) => c.change !== "secret-unknown");
    const unknown = changes.filter((c) => c.change === "secret-unknown");
    const n = (k: VarChange["change"]) => changes.filter((c) => c.change === k).length;
    const others: string[] = [];
    if (a.third_party_safe !== b.third_party_safe) others.push(`Third-party safe: ${a.third_party_safe ? "yes" : "no"} → ${b.third_party_safe ? "yes" : "no"}.`);
    if (JSON.stringify(a.files ?? []) !== JSON.stringify(b.files ?? [])) others.push("The files differ.");
    if (JSON.stringify(a.credentials ?? []) !== JSON.stringify(b.credentials ?? [])) others.push("The credential rules differ.");
    replace(
      diffOut,
      h(
        "p",
        { class: "diff-summary", "data-testid": "env-diff-summary" },
        `Version ${a.version} → version ${b.version}: ${n("added")} added, ${n("removed")} removed, ${n("changed")} changed.`,
      ),
      known.length
        ? h(
            "ul",
            { class: "diff-list" },
            known.map((c) => h("li", { "data-change": c.change, "data-name": c.name }, h("span", { class: "badge diff-" + c.change }, c.change), " ", h("code", null, c.name), c.detail)),
          )
        : h("p", { class: "muted" }, a.version === b.version ? "The same version." : "No variable added, removed or changed."),
      unknown.length
        ? h(
            "p",
            { class: "diff-secrets", "data-testid": "env-diff-secrets" },
            "Secret in both versions (values hidden; the API does not say whether they changed): ",
            unknown.map((c, i) => [i ? ", " : "", h("code", { "data-change": c.change, "data-name": c.name }, c.name)]),
            ".",
          )
        : null,
      others.map((t) => h("p", { class: "diff-other" }, t)),
    );
  }

  // ---- Loading ----
  async function loadEnv(): Promise<void> {
    try {
      const e = await call<Environment>("GET", path());
      if (stopped) return;
      env = e;
      note.textContent = "";
      renderLatest(e);
    } catch (err) {
      if (stopped) return;
      const denied = refusal(err);
      replace(varsBody, emptyRow(2, "The environment is not shown."));
      if (denied) note.textContent = denied;
      else reportError(err);
    }
  }

  async function loadVersions(pick?: { from: number; to: number }): Promise<void> {
    try {
      const res = await call<{ versions: EnvironmentVersion[] }>("GET", path() + "/versions");
      if (stopped) return;
      versions = (res.versions ?? []).slice().sort((x, y) => x.version - y.version);
      versNote.textContent = "";
      renderVersions(pick);
    } catch (err) {
      if (stopped) return;
      versions = [];
      const denied = refusal(err);
      replace(versBody, emptyRow(5, "The versions are not shown."));
      replace(diffOut, h("p", { class: "muted" }, "No versions to compare."));
      if (denied) versNote.textContent = denied;
      else reportError(err);
    }
  }

  // ---- A new version ----
  const setIn = h("textarea", { id: "env-set", name: "set", rows: 4, class: "code", autocomplete: "off", spellcheck: "false" });
  const unsetIn = h("input", { id: "env-unset", name: "unset", type: "text", autocomplete: "off" });
  const tpsSel = h(
    "select",
    { id: "env-update-third-party", name: "third_party_safe" },
    h("option", { value: "" }, "Unchanged"),
    h("option", { value: "true" }, "Yes"),
    h("option", { value: "false" }, "No"),
  );
  const saveBtn = h("button", { type: "submit", class: "primary" }, "Save as a new version");
  const update = h(
    "form",
    { "data-testid": "update-environment", class: "grid-form", "aria-labelledby": "update-env-title" },
    h(
      "div",
      { class: "field wide" },
      h("label", { for: "env-set" }, "Set variables"),
      setIn,
      h("small", { class: "hint", id: "env-set-hint" }, "One NAME=value per line: added, or replacing the variable of that name. Start a line with secret: for a secret (secret:API_TOKEN=…)."),
    ),
    field("Remove variables", unsetIn, "Comma-separated names."),
    field("Third-party safe", tpsSel),
    h("div", { class: "form-actions" }, saveBtn),
  );
  setIn.setAttribute("aria-describedby", "env-set-hint");

  listen(update, "submit", async (e) => {
    e.preventDefault();
    clearError();
    clearFieldErrors(update);
    const set = parseVariables(setIn.value);
    if (typeof set === "string") return fieldError(setIn, "set", set);
    const unset = list(unsetIn.value);
    const bad = unset.find((n) => !VAR_NAME.test(n));
    if (bad !== undefined) return fieldError(unsetIn, "unset", "Not a variable name: " + bad.slice(0, 64));
    const body: Record<string, unknown> = {};
    if (Object.keys(set).length) body.set = set;
    if (unset.length) body.unset = unset;
    if (tpsSel.value) body.third_party_safe = tpsSel.value === "true";
    if (!Object.keys(body).length) return fieldError(setIn, "set", "Nothing to change: set or remove a variable, or change third-party safe.");
    const before = env?.latest;
    saveBtn.disabled = true;
    try {
      const e2 = await call<Environment>("PATCH", path(), body);
      update.reset(); // the secret values go with it
      if (stopped) return;
      env = e2;
      renderLatest(e2);
      await loadVersions(before !== undefined ? { from: before, to: e2.latest } : undefined);
    } catch (err) {
      reportError(err, update);
    } finally {
      saveBtn.disabled = false;
    }
  });

  // ---- Delete ----
  const delBox = h("div", { class: "actions", "data-testid": "delete-environment" });
  function renderDelete(): void {
    replace(
      delBox,
      confirmButtons({
        action: "delete",
        label: "Delete environment",
        confirmLabel: "Confirm delete",
        confirming,
        busy,
        onAsk: () => {
          confirming = true;
          renderDelete();
          delBox.querySelector<HTMLElement>('[data-action="confirm-delete"]')?.focus();
        },
        onCancel: () => {
          confirming = false;
          renderDelete();
          delBox.querySelector<HTMLElement>('[data-action="delete"]')?.focus();
        },
        onConfirm: () => void remove(),
      }),
    );
  }
  async function remove(): Promise<void> {
    clearError();
    busy = true;
    renderDelete();
    try {
      await call<void>("DELETE", path());
      if (!stopped) location.hash = "#/environments";
      return;
    } catch (err) {
      reportError(err);
    }
    busy = false;
    confirming = false;
    if (!stopped) renderDelete();
  }
  renderDelete();

  root.append(
    h("p", { class: "crumbs" }, h("a", { href: "#/environments" }, "All environments")),
    title,
    note,
    record,
    h("section", { "aria-labelledby": "env-vars-title" }, h("h2", { id: "env-vars-title" }, "Variables (latest version)"), tableWrap("Variables", varsTable)),
    h("section", { "aria-labelledby": "env-files-title" }, h("h2", { id: "env-files-title" }, "Files and credential rules"), h("h3", null, "Files"), filesBox, h("h3", null, "Credential rules"), credsBox),
    h("section", { "aria-labelledby": "env-versions-title" }, h("h2", { id: "env-versions-title" }, "Versions"), versNote, tableWrap("Versions", versTable)),
    h("section", { "aria-labelledby": "env-diff-title" }, h("h2", { id: "env-diff-title" }, "Compare versions"), diffForm, diffOut),
    h("section", { "aria-labelledby": "update-env-title" }, h("h2", { id: "update-env-title" }, "New version"), update),
    h("section", { "aria-labelledby": "delete-env-title" }, h("h2", { id: "delete-env-title" }, "Delete"), h("p", null, "Refused while a live sandbox uses the environment."), delBox),
  );
  void loadEnv();
  void loadVersions();
  return () => {
    stopped = true;
    setIn.value = "";
  };
}
