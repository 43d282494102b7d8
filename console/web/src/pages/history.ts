// The command history of #/sandboxes/ID: GET .../commands, newest first,
// refreshed every 10 s and after a command the page ran. The endpoint
// has no pages: its limit keeps the newest N entries (oldest first), so
// "Show older" asks again for PAGE more.

import { ApiError, call, messageOf, refusal } from "../api";
import { KeyedRows, emptyRow, h, listen, tableWrap, thead, time } from "../dom";
import { Poller } from "../poll";
import type { Command, Sandbox } from "../types";
import { commandLine, exitText } from "./processes";

const PAGE = 25;
const MAX = 10000; // the endpoint's largest limit
const COLS = 6;

export function duration(ms: number): string {
  if (!isFinite(ms) || ms < 0) return "—";
  if (ms < 1000) return Math.round(ms) + " ms";
  const s = ms / 1000;
  if (s < 60) return (Math.round(s * 10) / 10).toString() + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s - m * 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

function durationOf(c: Command): string {
  if (c.result && typeof c.result.duration_ms === "number") return duration(c.result.duration_ms);
  return duration(new Date(c.ended_at).getTime() - new Date(c.started_at).getTime());
}

export interface HistorySection {
  el: HTMLElement;
  update(s: Sandbox): void;
  // refresh reads the history again now (after a command ran).
  refresh(): void;
  stop(): void;
}

export function historySection(base: string): HistorySection {
  let stopped = false;
  let monitoring: boolean | null = null;
  let limit = PAGE;
  let more = false;
  let last: Command[] = [];

  const note = h("p", { class: "part-note", "data-testid": "history-note", role: "status" });
  const tbody = h("tbody", null, emptyRow(COLS, "Loading…"));
  const table = h("table", { "data-testid": "history", class: "list" }, thead("Command", "Kind", "User", "Exit code", "Started", "Duration"), tbody);
  const rows = new KeyedRows<Command>(
    tbody,
    (c) => c.id,
    (c) => JSON.stringify([commandLine(c.cmd, c.argv), c.kind, c.user, exitText(c.result), c.started_at, durationOf(c)]),
    (c) =>
      h(
        "tr",
        { "data-id": c.id, "data-kind": c.kind },
        h("td", { class: "cmd" }, h("code", null, commandLine(c.cmd, c.argv))),
        h("td", { class: "kind" }, c.kind),
        h("td", { class: "user" }, c.user || "user"),
        h("td", { class: "num exit" }, exitText(c.result)),
        h("td", { class: "created" }, time(c.started_at)),
        h("td", { class: "num duration" }, durationOf(c)),
      ),
    () => emptyRow(COLS, monitoring === false ? "No history: this sandbox was created with monitoring off." : "No commands yet."),
  );
  const olderBtn = h("button", { type: "button", "data-action": "older", hidden: true }, "Show older commands");
  const count = h("span", { class: "status", "data-testid": "history-count" });
  listen(olderBtn, "click", () => {
    limit = Math.min(MAX, limit + PAGE);
    void poller.now();
  });

  async function refresh(): Promise<void> {
    if (monitoring === false) {
      last = [];
      rows.update(last);
      note.textContent = "Command history is off for this sandbox (created with monitoring off).";
      return;
    }
    try {
      const res = await call<{ commands: Command[] }>("GET", base + "/commands?limit=" + limit);
      if (stopped) return;
      const got = res.commands ?? [];
      more = got.length >= limit && limit < MAX;
      last = got.slice().reverse();
      rows.update(last);
      note.textContent = "";
    } catch (err) {
      if (stopped) return;
      note.textContent = refusal(err) ?? "The history could not be read: " + messageOf(err);
      if (err instanceof ApiError && err.status === 404) poller.stop();
    }
    olderBtn.hidden = !more;
    count.textContent = last.length ? `The newest ${last.length} command${last.length === 1 ? "" : "s"}${more ? "" : " (all of them)"}.` : "";
  }
  const poller = new Poller(refresh, 10_000);

  const el = h(
    "section",
    { "aria-labelledby": "history-title", "data-testid": "history-section" },
    h("h2", { id: "history-title" }, "Command history"),
    note,
    tableWrap("Command history", table),
    h("div", { class: "form-actions table-after" }, olderBtn, count),
  );

  return {
    el,
    update(s: Sandbox) {
      const m = s.monitoring !== false;
      if (monitoring === m) return;
      monitoring = m;
      void poller.now();
    },
    refresh() {
      void poller.now();
    },
    stop() {
      stopped = true;
      poller.stop();
    },
  };
}
