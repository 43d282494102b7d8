// #/budgets: an account's budgets (refreshed every 10 s) with their
// spend, a form for a new one (BudgetRequest), delete (two clicks), and
// the account's metered usage (usage.ts).

import { call, clearError, clearErrorIf, clearFieldErrors, currentSession, fieldError, messageOf, refusal, reportError } from "../api";
import { KeyedRows, append, emptyRow, field, h, list, listen, pairs, parsePairs, tableWrap, thead, time } from "../dom";
import { Poller } from "../poll";
import { BUDGET_ACTIONS, BUDGET_KINDS, BUDGET_PERIODS, type Budget, type BudgetScope } from "../types";
import { confirmButtons, focusAction } from "./confirm";
import { usageSection } from "./usage";

const ACTION_TEXT: Record<string, string> = {
  notify: "notify (an audit event only)",
  deny_new: "deny_new (refuse creates, resumes and starts)",
  pause: "pause the sandboxes",
  stop: "stop the sandboxes",
  delete: "delete the sandboxes",
};

export function scopeText(s: BudgetScope): string {
  if (s.kind === "label") return "label " + pairs(s.labels);
  return s.ref ? s.kind + " " + s.ref : s.kind;
}

const COLS = 9;

export function budgetsPage(root: HTMLElement): () => void {
  document.title = "Budgets · HareBox console";
  let stopped = false;
  const operator = currentSession()?.principal.operator === true;
  const confirming = new Set<string>();
  const busy = new Set<string>();
  let last: Budget[] = [];

  // ---- The account (the operator's choice) ----
  const accountIn = h("input", { id: "budgets-account", name: "account", type: "text", autocomplete: "off" });
  const accountForm = operator
    ? h(
        "form",
        { class: "filters", "data-testid": "budgets-filter", role: "search", "aria-label": "Choose the account" },
        field("Account", accountIn, "ID or name; default the default account."),
        h("div", { class: "form-actions" }, h("button", { type: "submit" }, "Show")),
      )
    : null;
  function accountQuery(): string {
    const a = operator ? accountIn.value.trim() : "";
    return a ? "?account=" + encodeURIComponent(a) : "";
  }

  // ---- The table ----
  const tbody = h("tbody", null, emptyRow(COLS, "Loading…"));
  const table = h(
    "table",
    { "data-testid": "budgets", class: "list" },
    thead("Name", "Scope", "Period", "Limit (USD)", "Spent (USD)", "Reserved (USD)", "Action", "Status", "Actions"),
    tbody,
  );
  const listNote = h("p", { class: "part-note", "data-testid": "budgets-note", role: "status" });

  const rows = new KeyedRows<Budget>(
    tbody,
    (b) => b.id,
    (b) => JSON.stringify([b, confirming.has(b.id), busy.has(b.id)]),
    (b) => row(b),
    () => emptyRow(COLS, "No budgets."),
  );

  function spentCell(b: Budget): HTMLElement {
    const limit = Number(b.limit_usd);
    const spent = Number(b.spent_usd);
    const meter =
      isFinite(limit) && limit > 0 && isFinite(spent)
        ? h("meter", {
            min: 0,
            max: limit,
            low: limit * 0.8,
            high: limit * 0.95,
            optimum: 0,
            value: Math.min(Math.max(spent, 0), limit),
            "aria-label": `Spent ${b.spent_usd} of ${b.limit_usd} USD`,
          })
        : null;
    return h("td", { class: "spent num" }, h("span", { class: "amount" }, b.spent_usd), meter);
  }

  function status(b: Budget): HTMLElement {
    const parts: (Node | string)[] = [];
    if (b.reached_at) parts.push(h("span", { class: "badge outcome-bad" }, "reached"), " ", time(b.reached_at));
    if (b.action_pending) parts.push(" ", h("span", { class: "badge state-paused" }, "action pending"));
    if (b.warned_percent && b.warned_percent.length) parts.push(" warned at " + b.warned_percent.map((p) => p + "%").join(", "));
    if (!parts.length) parts.push(h("span", { class: "badge outcome-ok" }, "within"));
    return h("td", { class: "status-cell" }, parts);
  }

  function row(b: Budget): HTMLTableRowElement {
    const buttons = b.from_key
      ? h("span", { class: "muted" }, "goes with its key")
      : h(
          "div",
          { class: "actions" },
          confirmButtons({
            action: "delete",
            label: "Delete",
            confirmLabel: "Confirm delete",
            confirming: confirming.has(b.id),
            busy: busy.has(b.id),
            onAsk: () => {
              confirming.add(b.id);
              rows.update(last);
              focusAction(tbody, b.id, "confirm-delete");
            },
            onCancel: () => {
              confirming.delete(b.id);
              rows.update(last);
              focusAction(tbody, b.id, "delete");
            },
            onConfirm: () => void remove(b.id),
          }),
        );
    return h(
      "tr",
      { "data-id": b.id },
      h("td", { class: "name" }, b.name || b.id),
      h("td", { class: "scope" }, scopeText(b.scope), b.from_key ? " (a key's budget_usd)" : ""),
      h("td", { class: "period" }, b.period, b.period === "monthly" ? h("span", { class: "muted" }, " since ", time(b.period_start)) : null),
      h("td", { class: "limit num" }, b.limit_usd),
      spentCell(b),
      h("td", { class: "reserved num" }, b.reserved_usd),
      h("td", { class: "action" }, b.action, b.warn_at_percent?.length ? h("span", { class: "muted" }, "; warns at " + b.warn_at_percent.map((p) => p + "%").join(", ")) : null),
      status(b),
      h("td", { class: "buttons" }, buttons),
    );
  }

  let pollError = "";
  async function refresh(): Promise<void> {
    try {
      const res = await call<{ budgets: Budget[] }>("GET", "/v1/budgets" + accountQuery());
      if (stopped) return;
      last = res.budgets ?? [];
      rows.update(last);
      listNote.textContent = "";
      if (accountForm) clearFieldErrors(accountForm);
      if (pollError) clearErrorIf(pollError);
      pollError = "";
    } catch (err) {
      if (stopped) return;
      last = [];
      const denied = refusal(err);
      if (denied) {
        tbody.replaceChildren(emptyRow(COLS, "The budgets are not shown."));
        listNote.textContent = denied;
        return;
      }
      tbody.replaceChildren(emptyRow(COLS, "The budgets could not be listed."));
      if (accountForm) clearFieldErrors(accountForm);
      reportError(err, accountForm);
      pollError = messageOf(err);
    }
  }
  const poller = new Poller(refresh, 10000);

  async function remove(id: string): Promise<void> {
    clearError();
    busy.add(id);
    rows.update(last);
    try {
      await call<void>("DELETE", "/v1/budgets/" + encodeURIComponent(id));
    } catch (err) {
      reportError(err);
    } finally {
      busy.delete(id);
      confirming.delete(id);
    }
    await poller.now();
  }

  // ---- The create form (BudgetRequest) ----
  const nameIn = h("input", { id: "budget-name", name: "name", type: "text", autocomplete: "off", maxlength: 63 });
  const kindSel = h(
    "select",
    { id: "budget-kind", name: "scope.kind" },
    BUDGET_KINDS.map((k) => h("option", { value: k }, k)),
  );
  kindSel.value = "project";
  const refIn = h("input", { id: "budget-ref", name: "scope.ref", type: "text", autocomplete: "off", maxlength: 64 });
  const labelsIn = h("input", { id: "budget-labels", name: "scope.labels", type: "text", autocomplete: "off", placeholder: "key=value, key=value" });
  const periodSel = h("select", { id: "budget-period", name: "period" }, BUDGET_PERIODS.map((p) => h("option", { value: p }, p === "monthly" ? "monthly (calendar months, UTC)" : "total (from creation on)")));
  const limitIn = h("input", { id: "budget-limit", name: "limit_usd", type: "text", autocomplete: "off", inputmode: "decimal", placeholder: "25.00" });
  const actionSel = h("select", { id: "budget-action", name: "action" }, BUDGET_ACTIONS.map((a) => h("option", { value: a }, ACTION_TEXT[a])));
  const warnIn = h("input", { id: "budget-warn", name: "warn_at_percent", type: "text", autocomplete: "off", inputmode: "numeric", placeholder: "50, 80" });
  const refField = field("Target", refIn, "A project (ID or name), a fleet (ID) or an API key (ID).");
  const labelsField = field("Label selector", labelsIn, "Comma-separated key=value; every label must match.");
  const createBtn = h("button", { type: "submit", class: "primary" }, "Create budget");
  const form = h(
    "form",
    { "data-testid": "create-budget", class: "grid-form", "aria-labelledby": "create-budget-title" },
    field("Scope", kindSel, "What the limit covers."),
    refField,
    labelsField,
    field("Period", periodSel),
    field("Limit (USD)", limitIn, "A dollar amount, at most six decimals."),
    field("When reached", actionSel),
    field("Warn at (percent)", warnIn, "Up to four comma-separated percentages, 1 to 99 (optional)."),
    field("Name", nameIn, "Lower-case letters, digits and dashes (optional)."),
    h("div", { class: "form-actions" }, createBtn),
  );
  function showScopeFields(): void {
    refField.hidden = kindSel.value === "account" || kindSel.value === "label";
    labelsField.hidden = kindSel.value !== "label";
  }
  listen(kindSel, "change", showScopeFields);
  showScopeFields();

  listen(form, "submit", async (e) => {
    e.preventDefault();
    clearError();
    clearFieldErrors(form);
    const kind = kindSel.value as BudgetScope["kind"];
    const scope: BudgetScope = { kind };
    if (kind === "label") {
      const labels = parsePairs(labelsIn.value, /,/);
      if (typeof labels === "string") return fieldError(labelsIn, "scope.labels", labels);
      if (!Object.keys(labels).length) return fieldError(labelsIn, "scope.labels", "Give at least one key=value.");
      scope.labels = labels;
    } else if (kind !== "account") {
      const ref = refIn.value.trim();
      if (!ref) return fieldError(refIn, "scope.ref", `Name the ${kind} the budget covers.`);
      scope.ref = ref;
    }
    const limit = limitIn.value.trim().replace(/^\$/, "");
    if (!/^\d+(\.\d{1,6})?$/.test(limit)) return fieldError(limitIn, "limit_usd", 'A dollar amount such as "25.00" (at most six decimals).');
    const body: Record<string, unknown> = { scope, period: periodSel.value, limit_usd: limit, action: actionSel.value };
    if (nameIn.value.trim()) body.name = nameIn.value.trim();
    const warn = list(warnIn.value);
    if (warn.length) {
      const nums = warn.map((w) => Number(w.replace(/%$/, "")));
      if (nums.some((n) => !Number.isInteger(n) || n < 1 || n > 99) || nums.length > 4) {
        return fieldError(warnIn, "warn_at_percent", "Up to four whole numbers from 1 to 99.");
      }
      body.warn_at_percent = nums;
    }
    createBtn.disabled = true;
    try {
      await call<Budget>("POST", "/v1/budgets" + accountQuery(), body);
      if (stopped) return;
      form.reset();
      kindSel.value = "project";
      showScopeFields();
      await poller.now();
    } catch (err) {
      reportError(err, form);
    } finally {
      createBtn.disabled = false;
    }
  });

  // ---- Usage ----
  const usage = usageSection(() => (operator ? accountIn.value.trim() : ""));

  if (accountForm) {
    listen(accountForm, "submit", (e) => {
      e.preventDefault();
      clearError();
      void poller.now();
      usage.load();
    });
  }

  append(root, [
    h("h1", { tabindex: -1 }, "Budgets"),
    accountForm,
    h("section", { "aria-labelledby": "budgets-title" }, h("h2", { id: "budgets-title" }, "Budgets"), listNote, tableWrap("Budgets", table)),
    h("section", { "aria-labelledby": "create-budget-title" }, h("h2", { id: "create-budget-title" }, "New budget"), form),
    usage.el,
  ]);
  void poller.now();
  usage.load();
  return () => {
    stopped = true;
    poller.stop();
    usage.stop();
  };
}
