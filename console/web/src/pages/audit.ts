// #/audit: the audit log, newest first, live: every 2 s it asks for the
// entries after the newest it has (the after cursor) and puts them on
// top. Filters are the endpoint's own (action, target, principal,
// outcome); "Verify chain" checks the hash chain (the operator only).

import { call, clearError, clearErrorIf, clearFieldErrors, messageOf, reportError } from "../api";
import { emptyRow, field, h, listen, tableWrap, thead, time } from "../dom";
import { Poller, debounce } from "../poll";
import type { AuditEntry, AuditReport } from "../types";

const MAX_ROWS = 1000; // kept on the page
const PAGE = 1000; // the endpoint's largest limit
const PAGES_PER_POLL = 10;

export function auditPage(root: HTMLElement): () => void {
  document.title = "Audit · HareBox console";
  let stopped = false;

  // ---- Filters ----
  const actionIn = h("input", { id: "audit-action", name: "action", type: "text", autocomplete: "off", "data-testid": "audit-action" });
  const targetIn = h("input", { id: "audit-target", name: "target", type: "text", autocomplete: "off", "data-testid": "audit-target" });
  const principalIn = h("input", { id: "audit-principal", name: "principal", type: "text", autocomplete: "off", "data-testid": "audit-principal" });
  const outcomeSel = h(
    "select",
    { id: "audit-outcome", name: "outcome", "data-testid": "audit-outcome" },
    h("option", { value: "" }, "Any"),
    h("option", { value: "ok" }, "ok"),
    h("option", { value: "denied" }, "denied"),
    h("option", { value: "error" }, "error"),
  );
  const filters = h(
    "form",
    { class: "filters", "data-testid": "audit-filters", role: "search", "aria-label": "Filter the audit log" },
    field("Action", actionIn, "An operationId, e.g. createSandbox."),
    field("Sandbox or target", targetIn, "e.g. a sandbox ID."),
    field("Principal", principalIn, 'A key ID, or "operator".'),
    field("Outcome", outcomeSel),
  );

  // ---- The table ----
  const tbody = h("tbody", null, emptyRow(8, "Loading…"));
  const table = h("table", { "data-testid": "audit", class: "list" }, thead("Seq", "Time", "Principal", "Action", "Target", "Outcome", "Source", "Request ID"), tbody);
  let cursor = 0; // the newest seq shown
  let generation = 0; // bumped when the filters change

  function row(e: AuditEntry): HTMLTableRowElement {
    return h(
      "tr",
      { "data-seq": e.seq, "data-outcome": e.outcome },
      h("td", { class: "seq num" }, String(e.seq)),
      h("td", { class: "time" }, time(e.time)),
      h("td", { class: "principal" }, e.principal),
      h("td", { class: "action" }, e.action),
      h("td", { class: "target" }, e.target ?? ""),
      h("td", { class: "outcome" }, h("span", { class: "badge outcome-" + (e.outcome === "ok" ? "ok" : "bad") }, e.outcome), e.error ? " " + e.error : ""),
      h("td", { class: "source" }, e.source ?? ""),
      h("td", { class: "request-id" }, e.request_id ?? ""),
    );
  }

  function query(after: number): string {
    const q = new URLSearchParams();
    if (actionIn.value.trim()) q.set("action", actionIn.value.trim());
    if (targetIn.value.trim()) q.set("target", targetIn.value.trim());
    if (principalIn.value.trim()) q.set("principal", principalIn.value.trim());
    if (outcomeSel.value) q.set("outcome", outcomeSel.value);
    q.set("after", String(after));
    q.set("limit", String(PAGE));
    return q.toString();
  }

  let pollError = "";
  async function poll(): Promise<void> {
    const gen = generation;
    const fresh: AuditEntry[] = [];
    let answered = true;
    try {
      for (let i = 0; i < PAGES_PER_POLL; i++) {
        const page = await call<{ entries: AuditEntry[]; next?: string }>("GET", "/v1/audit?" + query(cursor));
        if (stopped || gen !== generation) return;
        const entries = page.entries ?? [];
        for (const e of entries) {
          if (e.seq > cursor) {
            fresh.push(e);
            cursor = e.seq;
          }
        }
        if (!page.next || entries.length === 0) break;
      }
      clearFieldErrors(filters);
      if (pollError) clearErrorIf(pollError);
      pollError = "";
    } catch (err) {
      if (stopped || gen !== generation) return;
      clearFieldErrors(filters);
      reportError(err, filters);
      pollError = messageOf(err);
      answered = false;
    } finally {
      if (!stopped && gen === generation) show(fresh, answered);
    }
  }

  // show puts entries (oldest first) on top of the table, newest first.
  function show(entries: AuditEntry[], answered: boolean): void {
    const placeholder = tbody.querySelector("tr.empty");
    if (entries.length === 0) {
      if (placeholder) placeholder.replaceWith(emptyRow(8, answered ? "No entries." : "The audit log could not be read."));
      return;
    }
    placeholder?.remove();
    const rows = entries.slice(-MAX_ROWS).reverse().map(row);
    tbody.prepend(...rows);
    while (tbody.rows.length > MAX_ROWS) tbody.rows[tbody.rows.length - 1].remove();
  }

  const poller = new Poller(poll, 2000);
  function refilter(): void {
    generation++;
    cursor = 0;
    tbody.replaceChildren(emptyRow(8, "Loading…"));
    void poller.now();
  }
  const refilterSoon = debounce(refilter, 300);
  listen(filters, "submit", (e) => {
    e.preventDefault();
    refilter();
  });
  for (const input of [actionIn, targetIn, principalIn]) listen(input, "input", refilterSoon);
  listen(outcomeSel, "change", refilter);

  // ---- Verify ----
  const verifyBtn = h("button", { type: "button", "data-testid": "verify", "data-action": "verify" }, "Verify chain");
  const verifyResult = h("p", { "data-testid": "verify-result", role: "status", class: "verify-result" });
  listen(verifyBtn, "click", async () => {
    clearError();
    verifyBtn.disabled = true;
    verifyResult.textContent = "Verifying…";
    verifyResult.removeAttribute("data-ok");
    try {
      const r = await call<AuditReport>("GET", "/v1/audit/verify");
      if (stopped) return;
      verifyResult.setAttribute("data-ok", r.ok ? "true" : "false");
      verifyResult.textContent = r.ok
        ? `Chain intact: ${r.entries} entries, ${r.checkpoints} checkpoints; ` +
          (r.anchor && r.anchor !== "none" ? `the anchor (${r.anchor}) holds entries through ${r.anchored}, ${r.unanchored} after it not yet signed.` : "no anchor outside the database.")
        : `Chain broken${r.first_bad ? " at entry " + r.first_bad : ""}: ${r.reason || "no reason given"}.`;
    } catch (err) {
      verifyResult.textContent = "";
      reportError(err);
    } finally {
      verifyBtn.disabled = false;
    }
  });

  root.append(
    h("h1", { tabindex: -1 }, "Audit"),
    h("section", { "aria-labelledby": "verify-title" }, h("h2", { id: "verify-title" }, "Integrity"), h("div", { class: "form-actions" }, verifyBtn), verifyResult),
    h("section", { "aria-labelledby": "audit-title" }, h("h2", { id: "audit-title" }, "Entries, newest first"), filters, tableWrap("Audit entries", table)),
  );

  void poller.now();
  return () => {
    stopped = true;
    poller.stop();
    refilterSoon.cancel();
  };
}
