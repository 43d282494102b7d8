// The live charts of #/sandboxes/ID: CPU, memory and egress from
// GET /v1/sandboxes/{id}/metrics (MetricSample: cumulative CPU time,
// resident memory, cumulative traffic), refreshed every 15 s (the
// server's default sampling interval) while the page is open. The
// charts cover the last hour. The endpoint answers the oldest samples
// first and its limit keeps the oldest, so the page asks for the hour
// once, then only for what came after the newest sample it has.

import { ApiError, call, messageOf, refusal } from "../api";
import { bytes, h } from "../dom";
import { Poller } from "../poll";
import { svg } from "../svg";
import type { MetricSample, Sandbox } from "../types";

const WINDOW = 60 * 60_000; // what the charts show
const REFRESH = 15_000;
const PAGE = 1000; // samples a request asks for
const MAX_PAGES = 10; // requests a refresh makes at most

type Kind = "cpu" | "memory" | "egress";

interface Point {
  t: number; // ms since the epoch
  v: number;
}

interface Series {
  kind: Kind;
  label: string;
  unit: string;
  // points, with null where the line breaks (a gap, a counter reset)
  points: (Point | null)[];
  format(v: number): string;
}

function pad(n: number): string {
  return n < 10 ? "0" + n : String(n);
}

function clock(t: number): string {
  const d = new Date(t);
  return `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}`;
}

function percent(v: number): string {
  return (v >= 10 ? Math.round(v) : Math.round(v * 10) / 10) + " %";
}

function rate(v: number): string {
  return bytes(Math.round(v)) + "/s";
}

// series derives the three series from the samples (oldest first). A
// rate needs two samples; a gap longer than 2.5 typical intervals (the
// sandbox was stopped) or a counter that went back (its VMM restarted)
// breaks the lines.
function series(samples: MetricSample[], vcpus: number): Series[] {
  const ts = samples.map((s) => new Date(s.time).getTime());
  const steps: number[] = [];
  for (let i = 1; i < ts.length; i++) steps.push(ts[i] - ts[i - 1]);
  const sorted = steps.slice().sort((a, b) => a - b);
  const typical = sorted.length ? sorted[Math.floor(sorted.length / 2)] : REFRESH;
  const gap = Math.max(2.5 * typical, 1000);

  const cpu: (Point | null)[] = [];
  const mem: (Point | null)[] = [];
  const egress: (Point | null)[] = [];
  for (let i = 0; i < samples.length; i++) {
    const s = samples[i];
    if (!isFinite(ts[i])) continue;
    if (i > 0 && ts[i] - ts[i - 1] > gap) mem.push(null);
    mem.push({ t: ts[i], v: s.memory_bytes });
    if (i === 0) continue;
    const p = samples[i - 1];
    const dt = (ts[i] - ts[i - 1]) / 1000;
    if (!(dt > 0) || ts[i] - ts[i - 1] > gap) {
      cpu.push(null);
      egress.push(null);
      continue;
    }
    const dc = s.cpu_seconds - p.cpu_seconds;
    const dn = s.net_sent_bytes - p.net_sent_bytes;
    cpu.push(dc >= 0 ? { t: ts[i], v: (dc / dt / vcpus) * 100 } : null);
    egress.push(dn >= 0 ? { t: ts[i], v: dn / dt } : null);
  }
  const of = vcpus === 1 ? "of its vCPU" : `of its ${vcpus} vCPUs`;
  return [
    { kind: "cpu", label: "CPU", unit: `% ${of}`, points: cpu, format: percent },
    { kind: "memory", label: "Memory", unit: "resident", points: mem, format: bytes },
    { kind: "egress", label: "Egress", unit: "bytes sent per second", points: egress, format: rate },
  ];
}

function latest(s: Series): Point | null {
  for (let i = s.points.length - 1; i >= 0; i--) {
    const p = s.points[i];
    if (p) return p;
  }
  return null;
}

// chart draws one series as a line over the window ending at now.
function chart(s: Series, now: number, note: string): SVGSVGElement {
  const W = 400;
  const H = 180;
  const left = 72;
  const right = 10;
  const top = 12;
  const bottom = 30;
  const pw = W - left - right;
  const ph = H - top - bottom;
  // The window: the last hour, or less for a younger sandbox (at least
  // five minutes), so a new sandbox's samples are not a sliver at the end.
  const pts = s.points.filter((p): p is Point => p !== null && p.t >= now - WINDOW);
  const span = Math.min(WINDOW, Math.max(5 * 60_000, now - Math.min(now, ...pts.map((p) => p.t))));
  const from = now - span;
  const over = span === WINDOW ? "the last hour" : `the last ${Math.round(span / 60_000)} minutes`;
  let max = Math.max(0, ...pts.map((p) => p.v));
  if (s.kind === "cpu") max = Math.max(max, 100);
  if (max === 0) max = 1;
  const r2 = (n: number) => Math.round(n * 100) / 100;
  const x = (t: number) => r2(left + ((Math.min(Math.max(t, from), now) - from) / span) * pw);
  const y = (v: number) => r2(top + ph - (v / max) * ph);

  const last = latest(s);
  const title = pts.length
    ? `${s.label} (${s.unit}) over ${over}: from ${s.format(Math.min(...pts.map((p) => p.v)))} to ${s.format(Math.max(...pts.map((p) => p.v)))}, latest ${last ? s.format(last.v) : "none"}`
    : `${s.label} (${s.unit}) over ${over}: ${note}`;

  const parts: SVGElement[] = [svg("title", null, title)];
  for (const v of [0, max / 2, max]) {
    parts.push(svg("line", { x1: left, x2: W - right, y1: y(v), y2: y(v), class: "grid" }));
    parts.push(svg("text", { x: left - 6, y: r2(y(v) + 4), "text-anchor": "end", class: "tick" }, s.format(v)));
  }
  parts.push(svg("line", { x1: left, x2: W - right, y1: top + ph, y2: top + ph, class: "axis" }));
  for (const [t, anchor] of [
    [from, "start"],
    [from + span / 2, "middle"],
    [now, "end"],
  ] as [number, string][]) {
    parts.push(svg("text", { x: x(t), y: H - 8, "text-anchor": anchor, class: "tick" }, clock(t) + (t === now ? " UTC" : "")));
  }

  // The line: M at the start of each run, L along it; a lone point is a dot.
  let d = "";
  let run: Point[] = [];
  const flush = () => {
    if (run.length === 1) parts.push(svg("circle", { cx: x(run[0].t), cy: y(run[0].v), r: 2.5, class: "dot" }));
    else if (run.length > 1) d += run.map((p, i) => (i === 0 ? "M" : "L") + x(p.t) + " " + y(p.v)).join(" ") + " ";
    run = [];
  };
  for (const p of s.points) {
    if (p === null) flush();
    else if (p.t >= from) run.push(p);
  }
  flush();
  if (d) parts.push(svg("path", { d: d.trim(), class: "line" }));
  if (!pts.length) parts.push(svg("text", { x: left + pw / 2, y: top + ph / 2, "text-anchor": "middle", class: "empty-note" }, note));

  return svg(
    "svg",
    {
      "data-testid": "chart-" + s.kind,
      class: "metric-chart",
      viewBox: `0 0 ${W} ${H}`,
      role: "img",
      "aria-label": title,
      preserveAspectRatio: "xMidYMid meet",
    },
    parts,
  );
}

export interface MetricsSection {
  el: HTMLElement;
  // update takes the sandbox's record (its monitoring and size).
  update(s: Sandbox): void;
  stop(): void;
}

export function metricsSection(base: string): MetricsSection {
  let stopped = false;
  let monitoring: boolean | null = null; // unknown until the record comes
  let vcpus = 1;
  let samples: MetricSample[] = [];
  let loaded = false;

  const note = h("p", { class: "part-note", "data-testid": "metrics-note", role: "status" });
  const figures = new Map<Kind, { fig: HTMLElement; value: HTMLElement; box: HTMLElement }>();
  const grid = h("div", { class: "metric-charts" });
  for (const [kind, label] of [
    ["cpu", "CPU"],
    ["memory", "Memory"],
    ["egress", "Egress"],
  ] as [Kind, string][]) {
    const value = h("span", { class: "metric-latest", "data-testid": "latest-" + kind }, "no samples yet");
    const box = h("div", { class: "metric-box" });
    const fig = h("figure", { class: "metric", "data-metric": kind }, h("figcaption", null, h("span", { class: "metric-name" }, label), " ", value), box);
    figures.set(kind, { fig, value, box });
    grid.append(fig);
  }
  const el = h(
    "section",
    { "aria-labelledby": "metrics-title", "data-testid": "metrics" },
    h("h2", { id: "metrics-title" }, "Live charts"),
    h("p", { class: "hint" }, "Measured on the host every 15 s while the sandbox runs; the last hour, refreshed every 15 s."),
    note,
    grid,
  );

  function draw(): void {
    const now = Date.now();
    if (monitoring === false) {
      grid.hidden = true;
      note.textContent = "Monitoring is off for this sandbox (created with monitoring off): it has no samples to chart.";
      return;
    }
    grid.hidden = false;
    const all = series(samples, vcpus);
    for (const s of all) {
      const f = figures.get(s.kind);
      if (!f) continue;
      const last = latest(s);
      const empty = !loaded ? "Loading…" : samples.length === 0 ? "No samples yet" : "Needs a second sample";
      f.value.textContent = last ? s.format(last.v) + (s.kind === "cpu" ? " of " + (vcpus === 1 ? "its vCPU" : vcpus + " vCPUs") : "") : empty.toLowerCase();
      f.box.replaceChildren(chart(s, now, empty));
    }
  }

  async function refresh(): Promise<void> {
    if (monitoring === false) return draw();
    const cutoff = Date.now() - WINDOW;
    try {
      for (let page = 0; page < MAX_PAGES; page++) {
        const newest = samples.length ? samples[samples.length - 1].time : new Date(cutoff).toISOString();
        const q = new URLSearchParams({ from: newest, limit: String(PAGE) });
        const res = await call<{ samples: MetricSample[] }>("GET", base + "/metrics?" + q.toString());
        if (stopped) return;
        const have = new Set(samples.map((s) => s.time));
        const fresh = (res.samples ?? []).filter((s) => !have.has(s.time));
        samples = samples.concat(fresh);
        if ((res.samples ?? []).length < PAGE || fresh.length === 0) break;
      }
      samples = samples.filter((s) => new Date(s.time).getTime() >= Date.now() - WINDOW);
      loaded = true;
      note.textContent = "";
    } catch (err) {
      if (stopped) return;
      note.textContent = refusal(err) ?? "The samples could not be read: " + messageOf(err);
      // No such sandbox (or none this key sees): nothing to refresh.
      if (err instanceof ApiError && err.status === 404) poller.stop();
    }
    draw();
  }
  const poller = new Poller(refresh, REFRESH);
  draw();

  return {
    el,
    update(s: Sandbox) {
      const v = s.size?.vcpus && s.size.vcpus > 0 ? s.size.vcpus : 1;
      const m = s.monitoring !== false;
      const first = monitoring === null;
      const changed = v !== vcpus || (monitoring !== null && m !== monitoring);
      vcpus = v;
      monitoring = m;
      if (first) void poller.now();
      else if (changed) draw();
    },
    stop() {
      stopped = true;
      poller.stop();
    },
  };
}
