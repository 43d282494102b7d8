// The usage part of #/budgets: GET /v1/usage (metered usage and its cost
// for a time range, one row per group) as a table, and over time as a
// stacked bar chart with a table of the same numbers beside it. The API
// answers one total per group for a range, so the time series is made of
// one request per bucket (a metering interval, 5 s by default, that
// straddles a bucket's edge counts in both).

import { call, clearFieldErrors, fieldError, refusal, reportError } from "../api";
import { bytes, emptyRow, field, h, listen, replace, tableWrap, thead } from "../dom";
import { svg } from "../svg";
import type { UsageGroup } from "../types";

const HOUR = 3600_000;
const DAY = 24 * HOUR;
const MAX_BUCKETS = 31;
const PARALLEL = 4; // bucket requests at once
const SERIES = 6; // the top groups drawn on their own; the rest are "other"

type Metric = "cost_usd" | "vcpu_seconds" | "memory_gib_seconds" | "egress_bytes";
const METRICS: { id: Metric; label: string }[] = [
  { id: "cost_usd", label: "Cost (USD)" },
  { id: "vcpu_seconds", label: "vCPU-seconds" },
  { id: "memory_gib_seconds", label: "Memory GiB-seconds" },
  { id: "egress_bytes", label: "Egress" },
];

function metricOf(g: UsageGroup, m: Metric): number {
  const v = m === "cost_usd" ? Number(g.cost_usd) : g[m];
  return typeof v === "number" && isFinite(v) ? v : 0;
}

function fmt(v: number, m: Metric): string {
  if (m === "egress_bytes") return bytes(v);
  if (m === "cost_usd") {
    if (v === 0) return "0.00";
    return v >= 0.01 ? v.toFixed(2) : v.toFixed(6).replace(/0+$/, "");
  }
  return Math.round(v).toLocaleString("en-US");
}

interface Bucket {
  from: Date;
  to: Date;
  label: string;
  groups: UsageGroup[] | null;
}

interface Plan {
  from: Date;
  to: Date;
  step: number;
}

function ceilTo(t: number, step: number): number {
  return Math.ceil(t / step) * step;
}

function pad(n: number): string {
  return n < 10 ? "0" + n : String(n);
}

function bucketLabel(d: Date, step: number): string {
  const day = `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())}`;
  return step < DAY ? `${day} ${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}` : day;
}

function buckets(p: Plan): Bucket[] {
  const out: Bucket[] = [];
  for (let t = p.from.getTime(); t < p.to.getTime() && out.length < MAX_BUCKETS; t += p.step) {
    const from = new Date(t);
    out.push({ from, to: new Date(Math.min(t + p.step, p.to.getTime())), label: bucketLabel(from, p.step), groups: null });
  }
  return out;
}

// A custom range's step: the shortest of these that makes at most
// MAX_BUCKETS buckets.
const STEPS = [HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 7 * DAY, 30 * DAY];

export function usageSection(account: () => string): { el: HTMLElement; load(): void; stop(): void } {
  let stopped = false;
  let generation = 0;

  // ---- The form ----
  const groupSel = h(
    "select",
    { id: "usage-group", name: "group_by", "data-testid": "usage-group" },
    h("option", { value: "project" }, "project"),
    h("option", { value: "fleet" }, "fleet"),
    h("option", { value: "label" }, "label (give its key)"),
    h("option", { value: "key" }, "API key"),
    h("option", { value: "sandbox" }, "sandbox"),
    h("option", { value: "account" }, "account"),
  );
  const labelIn = h("input", { id: "usage-label", name: "label", type: "text", autocomplete: "off", placeholder: "team" });
  const rangeSel = h(
    "select",
    { id: "usage-range", name: "range", "data-testid": "usage-range" },
    h("option", { value: "24h" }, "Last 24 hours (by hour)"),
    h("option", { value: "7d" }, "Last 7 days (by day)"),
    h("option", { value: "30d" }, "Last 30 days (by day)"),
    h("option", { value: "custom" }, "From … to …"),
  );
  rangeSel.value = "30d";
  const fromIn = h("input", { id: "usage-from", name: "from", type: "datetime-local" });
  const toIn = h("input", { id: "usage-to", name: "to", type: "datetime-local" });
  const metricSel = h("select", { id: "usage-metric", name: "metric", "data-testid": "usage-metric" }, METRICS.map((m) => h("option", { value: m.id }, m.label)));
  const labelField = field("Label key", labelIn, "Group by this label's value.");
  const fromField = field("From", fromIn, "Your local time.");
  const toField = field("To", toIn, "Your local time; empty for now.");
  const showBtn = h("button", { type: "submit" }, "Show usage");
  const form = h(
    "form",
    { class: "filters", "data-testid": "usage-form", "aria-label": "Usage to show" },
    field("Group by", groupSel),
    labelField,
    field("Range", rangeSel),
    fromField,
    toField,
    field("Chart", metricSel, "What the chart and its table show."),
    h("div", { class: "form-actions" }, showBtn),
  );
  function showFields(): void {
    labelField.hidden = groupSel.value !== "label";
    fromField.hidden = toField.hidden = rangeSel.value !== "custom";
  }
  showFields();
  listen(groupSel, "change", showFields);
  listen(rangeSel, "change", showFields);
  listen(form, "submit", (e) => {
    e.preventDefault();
    load();
  });
  listen(metricSel, "change", () => drawSeries());

  // ---- The outputs ----
  const note = h("p", { class: "part-note", "data-testid": "usage-note", role: "status" });
  const summaryBody = h("tbody", null, emptyRow(7, "Loading…"));
  const summary = h(
    "table",
    { "data-testid": "usage", class: "list" },
    thead("Group", "Cost (USD)", "vCPU-seconds", "Memory GiB-seconds", "Snapshot GB-seconds", "Paused seconds", "Egress"),
    summaryBody,
  );
  const chartBox = h("figure", { class: "chart", "data-testid": "usage-figure" });
  const seriesBox = h("div", { class: "chart-table" });
  const pair = h("div", { class: "chart-pair" }, chartBox, seriesBox);

  let shown: { plan: Plan; groupBy: string; buckets: Bucket[] } | null = null;

  function plan(): Plan | string {
    const now = Date.now();
    switch (rangeSel.value) {
      case "24h": {
        const to = ceilTo(now, HOUR);
        return { from: new Date(to - 24 * HOUR), to: new Date(to), step: HOUR };
      }
      case "7d": {
        const to = ceilTo(now, DAY);
        return { from: new Date(to - 7 * DAY), to: new Date(to), step: DAY };
      }
      case "custom": {
        if (!fromIn.value) return "from:Give the start of the range.";
        const from = new Date(fromIn.value);
        const to = toIn.value ? new Date(toIn.value) : new Date(now);
        if (isNaN(from.getTime())) return "from:Not a date and time.";
        if (isNaN(to.getTime())) return "to:Not a date and time.";
        if (to.getTime() <= from.getTime()) return "to:Must be after the start.";
        const span = to.getTime() - from.getTime();
        const step = STEPS.find((s) => span / s <= MAX_BUCKETS) ?? ceilTo(span / MAX_BUCKETS, DAY);
        return { from, to, step };
      }
      default: {
        const to = ceilTo(now, DAY);
        return { from: new Date(to - 30 * DAY), to: new Date(to), step: DAY };
      }
    }
  }

  function query(from: Date, to: Date, groupBy: string): string {
    const q = new URLSearchParams();
    const a = account();
    if (a) q.set("account", a);
    q.set("from", from.toISOString());
    q.set("to", to.toISOString());
    q.set("group_by", groupBy);
    return "/v1/usage?" + q.toString();
  }

  function load(): void {
    clearFieldErrors(form);
    let groupBy = groupSel.value;
    if (groupBy === "label") {
      const k = labelIn.value.trim();
      if (!k) return fieldError(labelIn, "group_by", "Name the label to group by.");
      groupBy = "label:" + k;
    }
    const p = plan();
    if (typeof p === "string") {
      const [which, msg] = [p.slice(0, p.indexOf(":")), p.slice(p.indexOf(":") + 1)];
      return fieldError(which === "from" ? fromIn : toIn, which, msg);
    }
    void fetchAll(p, groupBy);
  }

  async function fetchAll(p: Plan, groupBy: string): Promise<void> {
    const gen = ++generation;
    note.textContent = "";
    showBtn.disabled = true;
    form.setAttribute("aria-busy", "true");
    summaryBody.replaceChildren(emptyRow(7, "Loading…"));
    chartBox.replaceChildren(h("p", { class: "muted" }, "Loading…"));
    seriesBox.replaceChildren();
    try {
      let total: UsageGroup[];
      try {
        const res = await call<{ usage: UsageGroup[] }>("GET", query(p.from, p.to, groupBy));
        total = res.usage ?? [];
      } catch (err) {
        if (stopped || gen !== generation) return;
        const denied = refusal(err);
        summaryBody.replaceChildren(emptyRow(7, denied ? "The usage is not shown." : "The usage could not be read."));
        chartBox.replaceChildren();
        if (denied) note.textContent = denied;
        else reportError(err, form);
        return;
      }
      if (stopped || gen !== generation) return;
      renderSummary(total);

      const bs = buckets(p);
      let next = 0;
      let failed: unknown = null;
      const worker = async (): Promise<void> => {
        while (next < bs.length && failed === null && !stopped && gen === generation) {
          const b = bs[next++];
          try {
            const res = await call<{ usage: UsageGroup[] }>("GET", query(b.from, b.to, groupBy));
            b.groups = res.usage ?? [];
          } catch (err) {
            failed = err;
          }
        }
      };
      await Promise.all(Array.from({ length: Math.min(PARALLEL, bs.length) }, worker));
      if (stopped || gen !== generation) return;
      if (failed !== null) {
        chartBox.replaceChildren(h("p", { class: "muted" }, "The usage over time could not be read."));
        const denied = refusal(failed);
        if (denied) note.textContent = denied;
        else reportError(failed);
        return;
      }
      shown = { plan: p, groupBy, buckets: bs };
      drawSeries();
    } finally {
      if (gen === generation) {
        showBtn.disabled = false;
        form.removeAttribute("aria-busy");
      }
    }
  }

  function renderSummary(groups: UsageGroup[]): void {
    if (!groups.length) return replace(summaryBody, emptyRow(7, "No usage in this range."));
    replace(
      summaryBody,
      groups.map((g) =>
        h(
          "tr",
          { "data-group": g.group },
          h("th", { scope: "row", class: "name" }, groupText(g.group, g.name)),
          h("td", { class: "num cost" }, g.cost_usd),
          h("td", { class: "num" }, fmt(g.vcpu_seconds, "vcpu_seconds")),
          h("td", { class: "num" }, fmt(g.memory_gib_seconds, "memory_gib_seconds")),
          h("td", { class: "num" }, fmt(g.snapshot_gb_seconds ?? 0, "vcpu_seconds")),
          h("td", { class: "num" }, fmt(g.paused_seconds, "vcpu_seconds")),
          h("td", { class: "num" }, bytes(g.egress_bytes)),
        ),
      ),
    );
  }

  // drawSeries draws the shown buckets for the chosen metric: the chart,
  // its legend, and the same numbers as a table.
  function drawSeries(): void {
    if (!shown) return;
    const m = metricSel.value as Metric;
    const metricLabel = METRICS.find((x) => x.id === m)?.label ?? m;
    const bs = shown.buckets;
    const groupWord = shown.groupBy.startsWith("label:") ? "label " + shown.groupBy.slice(6) : shown.groupBy;

    // The series: the groups with the most, then "other". (By ID; shown
    // by name where the server gave one.)
    const given = new Map<string, string>();
    for (const b of bs) for (const g of b.groups ?? []) if (g.name) given.set(g.group, g.name);
    const shownName = (id: string): string => groupText(id, given.get(id));
    const totals = new Map<string, number>();
    for (const b of bs) for (const g of b.groups ?? []) totals.set(g.group, (totals.get(g.group) ?? 0) + metricOf(g, m));
    const ranked = Array.from(totals.entries())
      .filter(([, v]) => v > 0)
      .sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))
      .map(([k]) => k);
    const named = ranked.length > SERIES ? ranked.slice(0, SERIES - 1) : ranked;
    const hasOther = ranked.length > named.length;
    const names = hasOther ? [...named, "other"] : named;
    const values: number[][] = bs.map((b) => {
      const row = names.map(() => 0);
      for (const g of b.groups ?? []) {
        const i = named.indexOf(g.group);
        if (i >= 0) row[i] += metricOf(g, m);
        else if (hasOther) row[names.length - 1] += metricOf(g, m);
      }
      return row;
    });
    const sums = values.map((r) => r.reduce((a, b) => a + b, 0));
    const max = Math.max(0, ...sums);

    const first = bs[0]?.label ?? "";
    const lastLabel = bs[bs.length - 1]?.label ?? "";
    const step = shown.plan.step;
    const hourly = step < DAY;
    const unit = step === HOUR ? "hour" : step === DAY ? "day" : hourly ? `${Math.round(step / HOUR)} hours` : `${Math.round(step / DAY)} days`;
    const axisName = step === HOUR ? "Hour (UTC)" : step === DAY ? "Day (UTC)" : "Period from (UTC)";
    const title = `${metricLabel} per ${unit} by ${groupWord}, ${first} to ${lastLabel} (UTC)`;

    // ---- The chart ----
    const W = 640;
    const H = 260;
    const left = 84; // (room for a tick such as 0.000785)
    const right = 8;
    const top = 12;
    const bottom = 44;
    const pw = W - left - right;
    const ph = H - top - bottom;
    const slot = bs.length ? pw / bs.length : pw;
    const bw = Math.max(1, slot * 0.72);
    const y = (v: number) => top + ph - (max > 0 ? (v / max) * ph : 0);
    const r2 = (n: number) => Math.round(n * 100) / 100;

    const parts: SVGElement[] = [svg("title", null, title)];
    // Gridlines and the y axis's labels: 0, half, most.
    for (const v of max > 0 ? [0, max / 2, max] : [0]) {
      parts.push(svg("line", { x1: left, x2: W - right, y1: r2(y(v)), y2: r2(y(v)), class: "grid" }));
      parts.push(svg("text", { x: left - 6, y: r2(y(v) + 4), "text-anchor": "end", class: "tick" }, fmt(v, m)));
    }
    const labelEvery = Math.max(1, Math.ceil(bs.length / 6));
    bs.forEach((b, i) => {
      let acc = 0;
      const x = left + i * slot + (slot - bw) / 2;
      values[i].forEach((v, si) => {
        if (v <= 0) return;
        const y0 = y(acc);
        acc += v;
        const y1 = y(acc);
        parts.push(
          svg(
            "rect",
            { x: r2(x), y: r2(y1), width: r2(bw), height: r2(Math.max(0.5, y0 - y1)), class: "bar series-" + si, "data-bucket": b.from.toISOString(), "data-series": names[si] },
            svg("title", null, `${shownName(names[si])}, ${b.label}: ${fmt(v, m)}`),
          ),
        );
      });
      if (i % labelEvery === 0) {
        const short = hourly ? b.label.slice(11) : b.label.slice(5);
        parts.push(svg("text", { x: r2(left + i * slot + slot / 2), y: H - bottom + 16, "text-anchor": "middle", class: "tick" }, short));
      }
    });
    parts.push(svg("line", { x1: left, x2: W - right, y1: top + ph, y2: top + ph, class: "axis" }));
    if (max === 0) {
      parts.push(svg("text", { x: left + pw / 2, y: top + ph / 2, "text-anchor": "middle", class: "empty-note" }, "No usage in this range."));
    }
    parts.push(svg("text", { x: left + pw / 2, y: H - 6, "text-anchor": "middle", class: "tick" }, axisName));
    const chart = svg(
      "svg",
      { "data-testid": "usage-chart", class: "usage-chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title, preserveAspectRatio: "xMidYMid meet" },
      parts,
    );
    const legend = names.length
      ? h(
          "ul",
          { class: "legend", "data-testid": "usage-legend", "aria-label": "Legend" },
          names.map((n, i) => h("li", null, h("span", { class: "swatch series-" + i, "aria-hidden": "true" }), shownName(n))),
        )
      : null;
    replace(chartBox, chart, legend, h("figcaption", { class: "hint" }, title + ". The table beside it has the same numbers."));

    // ---- The same numbers as a table ----
    const table = h(
      "table",
      { "data-testid": "usage-series" },
      thead(axisName, ...names.map(shownName), "Total"),
      h(
        "tbody",
        null,
        bs.map((b, i) =>
          h(
            "tr",
            { "data-bucket": b.from.toISOString() },
            h("th", { scope: "row", class: "time" }, b.label),
            values[i].map((v) => h("td", { class: "num" }, fmt(v, m))),
            h("td", { class: "num total" }, fmt(sums[i], m)),
          ),
        ),
      ),
    );
    replace(seriesBox, tableWrap(metricLabel + " over time", table));
  }

  const el = h(
    "section",
    { "aria-labelledby": "usage-title", "data-testid": "usage-section" },
    h("h2", { id: "usage-title" }, "Usage"),
    form,
    note,
    tableWrap("Usage by group", summary),
    h("h3", null, "Over time"),
    pair,
  );
  return {
    el,
    load,
    stop: () => {
      stopped = true;
    },
  };
}

// groupText is how a usage group is shown: its name and its ID, or the
// ID (or label value) alone; "(none)" for usage outside any group.
function groupText(id: string, name?: string): string {
  if (!id) return "(none)";
  return name ? `${name} (${id})` : id;
}
