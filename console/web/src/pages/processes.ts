// The background processes of #/sandboxes/ID: the list (GET .../processes,
// refreshed every 4 s while the sandbox runs), a form to start one
// (POST .../processes), kill (POST .../processes/{pid}/kill), and the
// selected process's output, followed live from GET .../output?follow=true
// (server-sent events of base64 chunks at byte offsets; a broken stream is
// asked again from the offsets already seen). The page keeps the last
// MAX_OUTPUT bytes of it, dropping the oldest with a note.

import { ApiError, call, clearError, clearFieldErrors, events, fieldError, messageOf, refusal, reportError, type ServerEvent } from "../api";
import { KeyedRows, emptyRow, field, h, listen, tableWrap, thead, time } from "../dom";
import { Poller, sleep } from "../poll";
import type { ExecResult, Process, Sandbox } from "../types";
import { stateBadge } from "./actions";

export const MAX_OUTPUT = 1024 * 1024;
const COLS = 5;
const STREAMS: readonly string[] = ["stdout", "stderr"];
const COALESCE = 16 * 1024; // bytes a span of output grows to before the next
const RETRIES = 5; // streams in a row that bring nothing before giving up

// commandLine is how a process or command was given: its shell string, or
// its argv with the words that need it quoted.
export function commandLine(cmd?: string, argv?: string[]): string {
  if (cmd) return cmd;
  return (argv ?? []).map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : "'" + a.replace(/'/g, "'\\''") + "'")).join(" ");
}

export function exitText(r?: ExecResult): string {
  if (!r) return "—";
  const notes: string[] = [];
  if (r.signal) notes.push("signal " + r.signal);
  if (r.timed_out) notes.push("timed out");
  if (r.error) notes.push("could not start");
  return String(r.exit_code) + (notes.length ? " (" + notes.join(", ") + ")" : "");
}

function decode64(s: string): Uint8Array {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

export interface ProcessesSection {
  el: HTMLElement;
  update(s: Sandbox): void;
  stop(): void;
}

export function processesSection(base: string, onChange: () => void): ProcessesSection {
  let stopped = false;
  let running = false;
  let known = false; // running is known (the record came)
  let last: Process[] = [];
  let selected: string | null = null;
  const busy = new Set<string>();
  let view: { pid: string; stop(): void } | null = null;

  const note = h("p", { class: "part-note", "data-testid": "processes-note", role: "status" });

  // ---- The list ----
  const tbody = h("tbody", null, emptyRow(COLS, "Loading…"));
  const table = h("table", { "data-testid": "processes", class: "list" }, thead("Command", "State", "Exit code", "Started", "Actions"), tbody);
  const rows = new KeyedRows<Process>(
    tbody,
    (p) => p.id,
    (p) => JSON.stringify([commandLine(p.cmd, p.argv), p.tag, p.running, p.result?.exit_code, exitText(p.result), p.started_at, selected === p.id, busy.has(p.id)]),
    (p) => row(p),
    () => emptyRow(COLS, running ? "No background processes." : "Background processes show while the sandbox runs."),
  );

  function row(p: Process): HTMLTableRowElement {
    const line = commandLine(p.cmd, p.argv);
    const isSel = selected === p.id;
    const show = listen(
      h("button", { type: "button", "data-action": "output", "aria-pressed": isSel ? "true" : "false" }, isSel ? "Showing output" : "Show output"),
      "click",
      () => select(p),
    );
    const kill = p.running
      ? listen(h("button", { type: "button", class: "danger-outline", "data-action": "kill", disabled: busy.has(p.id) }, "Kill"), "click", () => void killIt(p.id))
      : null;
    return h(
      "tr",
      { "data-pid": p.id, "data-state": p.running ? "running" : "exited", class: isSel ? "selected" : null },
      h("td", { class: "cmd" }, h("code", null, line), p.tag ? h("span", { class: "muted" }, " (", p.tag, ")") : null),
      h("td", { class: "state" }, p.running ? stateBadge("running") : h("span", { class: p.result && p.result.exit_code === 0 ? "badge" : "badge outcome-bad" }, "exited")),
      h("td", { class: "num exit" }, p.running ? "—" : exitText(p.result)),
      h("td", { class: "created" }, time(p.started_at)),
      h("td", { class: "buttons" }, h("div", { class: "actions" }, show, kill)),
    );
  }

  function sorted(l: Process[]): Process[] {
    return l.slice().sort((a, b) => (a.started_at < b.started_at ? 1 : a.started_at > b.started_at ? -1 : 0));
  }

  async function refresh(): Promise<void> {
    if (!running) {
      last = [];
      rows.update(last);
      return;
    }
    try {
      const res = await call<{ processes: Process[] }>("GET", base + "/processes");
      if (stopped) return;
      last = sorted(res.processes ?? []);
      rows.update(last);
      note.textContent = "";
    } catch (err) {
      if (stopped) return;
      // Stopped meanwhile (409): the next record says so.
      if (err instanceof ApiError && err.status === 409) return;
      note.textContent = refusal(err) ?? "The processes could not be listed: " + messageOf(err);
    }
  }
  const poller = new Poller(refresh, 4000);

  async function killIt(pid: string): Promise<void> {
    clearError();
    busy.add(pid);
    rows.update(last);
    try {
      await call<void>("POST", base + "/processes/" + encodeURIComponent(pid) + "/kill");
    } catch (err) {
      const denied = refusal(err);
      if (denied) note.textContent = denied;
      else reportError(err);
    } finally {
      busy.delete(pid);
    }
    await poller.now();
  }

  // ---- Start one ----
  const cmdIn = h("input", { id: "process-cmd", name: "cmd", type: "text", autocomplete: "off", spellcheck: "false" });
  const rootBox = h("input", { id: "process-root", name: "user", type: "checkbox", value: "root" });
  const startBtn = h("button", { type: "submit", class: "primary", disabled: true }, "Start in background");
  const startStatus = h("span", { class: "status", role: "status" });
  const form = h(
    "form",
    { "data-testid": "start-process", class: "inline-form", "aria-label": "Start a background process" },
    field("Command to run in the background", cmdIn, "A shell command line, run with sh -c; it goes on after this page closes (default timeout 300 s)."),
    h("div", { class: "check" }, rootBox, h("label", { for: "process-root" }, "As root")),
    h("div", { class: "form-actions" }, startBtn, startStatus),
  );
  listen(form, "submit", async (e) => {
    e.preventDefault();
    clearError();
    clearFieldErrors(form);
    note.textContent = "";
    if (!cmdIn.value.trim()) return fieldError(cmdIn, "cmd", "Type a command to start.");
    const body: Record<string, unknown> = { cmd: cmdIn.value };
    if (rootBox.checked) body.user = "root";
    startBtn.disabled = true;
    form.setAttribute("aria-busy", "true");
    startStatus.textContent = "Starting…";
    try {
      const p = await call<Process>("POST", base + "/processes", body);
      if (stopped) return;
      cmdIn.value = "";
      startStatus.textContent = "Started.";
      last = sorted([p, ...last.filter((x) => x.id !== p.id)]);
      select(p);
      onChange();
    } catch (err) {
      startStatus.textContent = "";
      const denied = refusal(err);
      if (denied) note.textContent = denied;
      else reportError(err, form);
    } finally {
      startBtn.disabled = !running;
      form.removeAttribute("aria-busy");
    }
  });

  // ---- The selected process's output ----
  const outTitle = h("h3", { id: "process-output-title" }, "Output");
  const outStatus = h("p", { class: "muted", role: "status", "data-testid": "process-output-status" });
  const outNote = h("p", { class: "hint", "data-testid": "process-output-note" });
  const pre = h("pre", { class: "output", "data-testid": "process-output", tabindex: 0, "aria-labelledby": "process-output-title" });
  const outBox = h("div", { class: "process-output", hidden: true }, outTitle, outStatus, outNote, pre);

  function select(p: Process): void {
    view?.stop();
    selected = p.id;
    rows.update(last);
    view = follow(p.id, commandLine(p.cmd, p.argv));
  }

  function follow(pid: string, label: string): { pid: string; stop(): void } {
    const ctrl = new AbortController();
    const offsets = [0, 0];
    const decoders = [new TextDecoder(), new TextDecoder()];
    let spans: { el: HTMLSpanElement; text: Text; bytes: number; kind: string }[] = [];
    let total = 0;
    let dropped = false;
    let ended = false;

    outTitle.textContent = "Output of " + label;
    outNote.textContent = "";
    outStatus.textContent = "";
    pre.replaceChildren();
    outBox.hidden = false;

    function add(kind: string, text: string, n: number): void {
      const atEnd = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 8;
      const tail = spans[spans.length - 1];
      if (tail && tail.kind === kind && tail.bytes < COALESCE && kind !== "gap") {
        tail.text.appendData(text);
        tail.bytes += n;
      } else {
        const t = document.createTextNode(text);
        const el = h("span", { class: kind }, t);
        pre.append(el);
        spans.push({ el, text: t, bytes: n, kind });
      }
      total += n;
      while (total > MAX_OUTPUT && spans.length > 1) {
        const s = spans[0];
        spans = spans.slice(1);
        s.el.remove();
        total -= s.bytes;
        dropped = true;
      }
      if (total > MAX_OUTPUT && spans.length === 1) {
        // One span over the bound: keep its end (a character a byte, near enough).
        const s = spans[0];
        s.text.data = s.text.data.slice(-MAX_OUTPUT);
        s.bytes = total = Math.min(s.bytes, MAX_OUTPUT);
        dropped = true;
      }
      if (dropped) outNote.textContent = "Older output was dropped: this page keeps the last 1 MiB of it.";
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    }

    function onEvent(e: ServerEvent): void {
      let msg: { offset?: number; data?: string; error?: { message?: string } } & Partial<ExecResult>;
      try {
        msg = JSON.parse(e.data);
      } catch {
        return;
      }
      const i = e.event === "stdout" ? 0 : e.event === "stderr" ? 1 : -1;
      if (i >= 0) {
        const full = decode64(msg.data ?? "");
        let chunk = full;
        const at = typeof msg.offset === "number" ? msg.offset : offsets[i];
        if (at > offsets[i]) {
          const tailText = decoders[i].decode();
          if (tailText) add(STREAMS[i], tailText, 0);
          add("gap", `\n[${at - offsets[i]} bytes of ${STREAMS[i]} dropped by the sandbox's agent]\n`, 0);
        } else if (at < offsets[i]) {
          chunk = chunk.subarray(Math.min(chunk.length, offsets[i] - at));
        }
        offsets[i] = Math.max(offsets[i], at + full.length);
        const text = decoders[i].decode(chunk, { stream: true });
        if (text) add(STREAMS[i], text, chunk.length);
      } else if (e.event === "exit") {
        ended = true;
        for (let j = 0; j < 2; j++) {
          const rest = decoders[j].decode();
          if (rest) add(STREAMS[j], rest, 0);
        }
        outStatus.textContent = "Exited with code " + exitText(msg as ExecResult) + ".";
        void poller.now();
        onChange();
      } else if (e.event === "error") {
        ended = true;
        outStatus.textContent = "The output stream failed: " + (msg.error?.message ?? "the server gave no reason") + ".";
      }
    }

    async function run(): Promise<void> {
      let idle = 0;
      while (!ctrl.signal.aborted && !ended) {
        const seen = offsets[0] + offsets[1];
        outStatus.textContent = "Following the output…";
        const q = new URLSearchParams({ follow: "true", stdout_offset: String(offsets[0]), stderr_offset: String(offsets[1]) });
        try {
          await events(base + "/processes/" + encodeURIComponent(pid) + "/output?" + q.toString(), onEvent, ctrl.signal);
        } catch (err) {
          if (ctrl.signal.aborted || stopped) return;
          if (err instanceof ApiError && err.sessionEnded) return;
          if (err instanceof ApiError && err.status >= 400 && err.status < 500 && err.status !== 429) {
            outStatus.textContent = refusal(err) ?? "The output could not be read: " + messageOf(err);
            return;
          }
        }
        if (ended || ctrl.signal.aborted) return;
        idle = offsets[0] + offsets[1] > seen ? 0 : idle + 1;
        if (idle >= RETRIES) {
          outStatus.textContent = "The output stream keeps breaking: show the output again to retry.";
          return;
        }
        // The stream ended early (a server restart, a proxy): again from the offsets.
        outStatus.textContent = "Reconnecting…";
        await sleep(Math.min(1000 * 2 ** idle, 15_000), ctrl.signal);
      }
    }
    void run();
    return {
      pid,
      stop() {
        ctrl.abort();
      },
    };
  }

  const el = h(
    "section",
    { "aria-labelledby": "processes-title", "data-testid": "processes-section" },
    h("h2", { id: "processes-title" }, "Background processes"),
    note,
    form,
    tableWrap("Background processes", table),
    outBox,
  );

  return {
    el,
    update(s: Sandbox) {
      const r = s.state === "running";
      if (known && r === running) return;
      known = true;
      running = r;
      if (form.getAttribute("aria-busy") !== "true") startBtn.disabled = !r;
      if (r) void poller.now();
      else {
        last = [];
        rows.update(last);
      }
    },
    stop() {
      stopped = true;
      poller.stop();
      view?.stop();
    },
  };
}
