// #/environments: a project's environments (GET /v1/environments, each
// with its latest version) and a form for a new one (EnvironmentRequest).
// A secret's value is never shown: the API leaves it out, and the console
// would not show it if it did not.

import { call, clearError, clearFieldErrors, currentSession, fieldError, refusal, reportError } from "../api";
import { append, emptyRow, field, h, listen, replace, tableWrap, thead, time } from "../dom";
import type { EnvVar, Environment } from "../types";

export function environmentHref(id: string): string {
  return "#/environments/" + encodeURIComponent(id);
}

const VAR_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;

// parseVariables reads lines NAME=value; a line that starts with
// "secret:" makes a secret (secret:TOKEN=…). The value is everything after
// the first "=", as typed. An error is a string.
export function parseVariables(text: string): Record<string, EnvVar> | string {
  const entries: [string, EnvVar][] = [];
  const seen = new Set<string>();
  for (const raw of text.split(/\r?\n/)) {
    let line = raw.trimStart();
    if (line.trim() === "") continue;
    let secret = false;
    if (line.startsWith("secret:")) {
      secret = true;
      line = line.slice("secret:".length).trimStart();
    }
    const eq = line.indexOf("=");
    const name = eq < 0 ? line.trim() : line.slice(0, eq).trim();
    if (eq <= 0) return `Write each variable as NAME=value: ${name.slice(0, 64)}`;
    if (!VAR_NAME.test(name)) return `Not a variable name (letters, digits and _, not starting with a digit): ${name.slice(0, 64)}`;
    if (seen.has(name)) return `${name} is given twice.`;
    seen.add(name);
    entries.push([name, secret ? { value: line.slice(eq + 1), secret: true } : { value: line.slice(eq + 1) }]);
  }
  // fromEntries defines own properties: a name "__proto__" stays a name.
  return Object.fromEntries(entries);
}

export function counts(vars?: Record<string, EnvVar> | null): { all: number; secret: number } {
  const names = Object.keys(vars ?? {});
  return { all: names.length, secret: names.filter((n) => vars?.[n]?.secret).length };
}

const COLS = 5;

export function environmentsPage(root: HTMLElement): () => void {
  document.title = "Environments · HareBox console";
  let stopped = false;
  const operator = currentSession()?.principal.operator === true;

  // ---- Which project ----
  const projectIn = h("input", { id: "envs-project", name: "project", type: "text", autocomplete: "off", "data-testid": "envs-project" });
  const accountIn = h("input", { id: "envs-account", name: "account", type: "text", autocomplete: "off" });
  const filters = h(
    "form",
    { class: "filters", "data-testid": "envs-filter", role: "search", "aria-label": "Choose the project" },
    field("Project", projectIn, "ID or name; default the account's default project."),
    operator ? field("Account", accountIn, "ID or name; default the default account.") : null,
    h("div", { class: "form-actions" }, h("button", { type: "submit" }, "Show")),
  );
  function query(): string {
    const q = new URLSearchParams();
    if (projectIn.value.trim()) q.set("project", projectIn.value.trim());
    if (operator && accountIn.value.trim()) q.set("account", accountIn.value.trim());
    const s = q.toString();
    return s ? "?" + s : "";
  }

  // ---- The table ----
  const tbody = h("tbody", null, emptyRow(COLS, "Loading…"));
  const table = h("table", { "data-testid": "environments", class: "list" }, thead("Name", "Project", "Version", "Variables", "Updated"), tbody);
  const note = h("p", { class: "part-note", "data-testid": "environments-note", role: "status" });

  function row(e: Environment): HTMLTableRowElement {
    const c = counts(e.version?.variables);
    return h(
      "tr",
      { "data-id": e.id },
      h("td", { class: "name" }, h("a", { href: environmentHref(e.id) }, e.name)),
      h("td", { class: "project" }, e.project),
      h("td", { class: "version num" }, String(e.latest)),
      h("td", { class: "variables num" }, String(c.all), c.secret ? h("span", { class: "muted" }, ` (${c.secret} secret)`) : null),
      h("td", { class: "time" }, time(e.updated_at)),
    );
  }

  async function load(): Promise<void> {
    note.textContent = "";
    try {
      const res = await call<{ environments: Environment[] }>("GET", "/v1/environments" + query());
      if (stopped) return;
      const envs = res.environments ?? [];
      clearFieldErrors(filters);
      replace(tbody, envs.length ? envs.map(row) : emptyRow(COLS, "No environments in this project."));
    } catch (err) {
      if (stopped) return;
      const denied = refusal(err);
      replace(tbody, emptyRow(COLS, denied ? "The environments are not shown." : "The environments could not be listed."));
      if (denied) note.textContent = denied;
      else reportError(err, filters);
    }
  }
  listen(filters, "submit", (e) => {
    e.preventDefault();
    clearError();
    clearFieldErrors(filters);
    void load();
  });

  // ---- The create form ----
  const nameIn = h("input", { id: "env-name", name: "name", type: "text", autocomplete: "off", maxlength: 63 });
  const projIn = h("input", { id: "env-create-project", name: "project", type: "text", autocomplete: "off" });
  const varsIn = h("textarea", { id: "env-vars", name: "variables", rows: 5, class: "code", autocomplete: "off", spellcheck: "false" });
  const tpsBox = h("input", { id: "env-third-party", name: "third_party_safe", type: "checkbox" });
  const acctIn = h("input", { id: "env-create-account", name: "account", type: "text", autocomplete: "off" });
  const createBtn = h("button", { type: "submit", class: "primary" }, "Create environment");
  const form = h(
    "form",
    { "data-testid": "create-environment", class: "grid-form", "aria-labelledby": "create-env-title" },
    field("Name", nameIn, "Lower-case letters, digits and dashes."),
    field("Project", projIn, "ID or name; default the account's default project."),
    operator ? field("Account", acctIn, "ID or name; default the default account.") : null,
    h("div", { class: "field wide" }, h("label", { for: "env-vars" }, "Variables"), varsIn, h("small", { class: "hint", id: "env-vars-hint" }, "One NAME=value per line. Start a line with secret: for a secret (secret:API_TOKEN=…): it is sealed on the host and never shown again.")),
    h("div", { class: "check" }, tpsBox, h("label", { for: "env-third-party" }, "Third-party safe (third-party sandboxes may use it)")),
    h("div", { class: "form-actions" }, createBtn),
  );
  varsIn.setAttribute("aria-describedby", "env-vars-hint");

  listen(form, "submit", async (e) => {
    e.preventDefault();
    clearError();
    clearFieldErrors(form);
    const name = nameIn.value.trim();
    if (!name) return fieldError(nameIn, "name", "Give the environment a name.");
    const vars = parseVariables(varsIn.value);
    if (typeof vars === "string") return fieldError(varsIn, "variables", vars);
    const body: Record<string, unknown> = { name };
    if (projIn.value.trim()) body.project = projIn.value.trim();
    if (Object.keys(vars).length) body.variables = vars;
    if (tpsBox.checked) body.third_party_safe = true;
    const acct = operator ? acctIn.value.trim() : "";
    createBtn.disabled = true;
    try {
      const env = await call<Environment>("POST", "/v1/environments" + (acct ? "?account=" + encodeURIComponent(acct) : ""), body);
      form.reset(); // the secret values go with it
      if (!stopped) location.hash = environmentHref(env.id);
    } catch (err) {
      reportError(err, form);
    } finally {
      createBtn.disabled = false;
    }
  });

  append(root, [
    h("h1", { tabindex: -1 }, "Environments"),
    h("section", { "aria-labelledby": "envs-title" }, h("h2", { id: "envs-title" }, "A project's environments"), filters, note, tableWrap("Environments", table)),
    h("section", { "aria-labelledby": "create-env-title" }, h("h2", { id: "create-env-title" }, "New environment"), form),
  ]);
  void load();
  return () => {
    stopped = true;
    varsIn.value = "";
  };
}
