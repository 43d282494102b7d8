// #/audit: the audit log, newest first, live: the newest entries that
// match the filters (GET /v1/audit?newest=true), then a followed stream
// of each one appended after them (GET /v1/audit?follow=true&after=the
// newest shown), put on top as they come. Filters are the endpoint's own
// (action, target, principal, outcome); "Verify chain" checks the hash
// chain (the operator only).

import { ApiError, call, clearError, clearErrorIf, clearFieldErrors, follow, messageOf, reportError } from "../api";
import { emptyRow, field, h, listen, tableWrap, thead, time } from "../dom";
import { debounce } from "../poll";
import type { AuditEntry, AuditReport } from "../types";

const MAX_ROWS = 1000; // kept on the page
const FIRST = 200; // the newest entries shown at first

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

  function query(): URLSearchParams {
    const q = new URLSearchParams();
    if (actionIn.value.trim()) q.set("action", actionIn.value.trim());
    if (targetIn.value.trim()) q.set("target", targetIn.value.trim());
    if (principalIn.value.trim()) q.set("principal", principalIn.value.trim());
    if (outcomeSel.value) q.set("outcome", outcomeSel.value);
    return q;
  }

  // The newest entries first, then the stream from the newest shown. A
  // stream that breaks is opened again from there, later each time (one
  // the server ended after its few minutes, at once); a change of
  // filters starts over.
  let streamError = "";
  let ctrl: AbortController | null = null;
  function ok(): void {
    clearFieldErrors(filters);
    if (streamError) clearErrorIf(streamError);
    streamError = "";
  }
  function failed(err: unknown): void {
    clearFieldErrors(filters);
    reportError(err, filters);
    streamError = messageOf(err);
  }
  // Entries that came over the stream are shown together, a moment after
  // the first of them.
  let pending: AuditEntry[] = [];
  let flushTimer: number | undefined;
  function queue(e: AuditEntry): void {
    if (e.seq <= cursor) return;
    cursor = e.seq;
    pending.push(e);
    flushTimer ??= window.setTimeout(() => {
      flushTimer = undefined;
      const batch = pending;
      pending = [];
      show(batch, true);
    }, 50);
  }
  async function tail(c: AbortController): Promise<void> {
    try {
      const q = query();
      q.set("newest", "true");
      q.set("limit", String(FIRST));
      const page = await call<{ entries: AuditEntry[] }>("GET", "/v1/audit?" + q.toString());
      if (c.signal.aborted) return;
      const entries = page.entries ?? [];
      cursor = entries.length ? entries[entries.length - 1].seq : 0;
      show(entries, true);
      ok();
    } catch (err) {
      if (c.signal.aborted || (err instanceof ApiError && err.sessionEnded)) return;
      show([], false);
      failed(err);
      return; // (a refused filter waits for the next change of filters)
    }
    await follow(
      () => {
        const q = query();
        q.set("follow", "true");
        q.set("after", String(cursor));
        return "/v1/audit?" + q.toString();
      },
      (e) => {
        if (e.event !== "entry") return;
        queue(JSON.parse(e.data) as AuditEntry);
        if (streamError) ok();
      },
      c.signal,
      failed,
    );
  }

  // show puts entries (oldest first) on top of the table, newest first.
  function show(entries: AuditEntry[], answered: boolean): void {
    if (stopped) return;
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

  function refilter(): void {
    ctrl?.abort();
    window.clearTimeout(flushTimer);
    flushTimer = undefined;
    pending = [];
    cursor = 0;
    tbody.replaceChildren(emptyRow(8, "Loading…"));
    ctrl = new AbortController();
    void tail(ctrl);
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

  refilter();
  return () => {
    stopped = true;
    ctrl?.abort();
    window.clearTimeout(flushTimer);
    refilterSoon.cancel();
  };
}
