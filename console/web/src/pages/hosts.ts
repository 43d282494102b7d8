// #/hosts: the deployment's hosts (GET /v1/hosts, the operator only),
// refreshed every 5 s: each one's state and lease, what its sandboxes
// reserve against its admission limits, its site and its mesh endpoint.
// A host that is down can be removed (two clicks), and a host's mesh key
// rotated.

import { call, clearError, clearErrorIf, messageOf, refusal, reportError } from "../api";
import { KeyedRows, emptyRow, h, listen, replace, tableWrap, thead, time } from "../dom";
import { Poller } from "../poll";
import type { Host } from "../types";
import { confirmButtons, focusAction } from "./confirm";

const COLS = 7;

function leaseLapsed(x: Host): boolean {
  const t = new Date(x.lease_until).getTime();
  return isFinite(t) && t < Date.now();
}

function used(host: string, what: string, key: string, n: number, most: number, unit: string): HTMLElement {
  const meter =
    most > 0
      ? h("meter", {
          min: 0,
          max: most,
          low: most * 0.75,
          high: most * 0.9,
          optimum: 0,
          value: Math.min(Math.max(n, 0), most),
          "aria-label": `${what} reserved on ${host}: ${n} of ${most}${unit ? " " + unit : ""}`,
        })
      : null;
  const pct = most > 0 ? ` (${Math.round((n / most) * 100)}%)` : " (no limit)";
  return h(
    "div",
    { class: "cap", "data-resource": key },
    h("span", { class: "cap-name" }, what),
    " ",
    h("span", { class: "amount" }, `${n} / ${most}${unit ? " " + unit : ""}`),
    h("span", { class: "muted" }, pct),
    meter,
  );
}

function tunnels(n: number): string {
  return n === 1 ? "1 tunnel" : `${n} tunnels`;
}

export function hostsPage(root: HTMLElement): () => void {
  document.title = "Hosts · HareBox console";
  let stopped = false;
  const confirming = new Set<string>();
  const busy = new Set<string>();
  let last: Host[] = [];

  const tbody = h("tbody", null, emptyRow(COLS, "Loading…"));
  const table = h(
    "table",
    { "data-testid": "hosts", class: "list" },
    thead("Name", "State", "Lease", "Reserved / limit", "Site", "Mesh endpoint", "Actions"),
    tbody,
  );
  const note = h("p", { class: "part-note", "data-testid": "hosts-note", role: "status" });
  const status = h("p", { class: "status-line", "data-testid": "hosts-status", role: "status" });

  const rows = new KeyedRows<Host>(
    tbody,
    (x) => x.name,
    (x) => JSON.stringify([x, leaseLapsed(x), confirming.has(x.name), busy.has(x.name)]),
    (x) => row(x),
    () => emptyRow(COLS, "No hosts."),
  );

  function stateBadge(x: Host): HTMLElement {
    if (!x.up) return h("span", { class: "badge state-lost" }, "down");
    if (leaseLapsed(x)) return h("span", { class: "badge state-paused" }, "lease lapsed");
    return h("span", { class: "badge state-running" }, "up");
  }

  function row(x: Host): HTMLTableRowElement {
    const mesh = x.mesh
      ? h(
          "td",
          { class: "mesh" },
          h("code", null, x.mesh.endpoint),
          h("div", { class: "muted" }, tunnels(x.mesh.tunnels?.length ?? 0)),
        )
      : h("td", { class: "mesh muted" }, "none");
    const buttons = h(
      "div",
      { class: "actions" },
      x.mesh
        ? listen(h("button", { type: "button", "data-action": "rotate-mesh-key", disabled: busy.has(x.name) }, "Rotate mesh key"), "click", () => void rotate(x.name))
        : null,
      confirmButtons({
        action: "remove",
        label: "Remove",
        confirmLabel: "Confirm remove (its sandboxes are deleted)",
        confirming: confirming.has(x.name),
        busy: busy.has(x.name),
        onAsk: () => {
          confirming.add(x.name);
          rows.update(last);
          focusAction(tbody, x.name, "confirm-remove");
        },
        onCancel: () => {
          confirming.delete(x.name);
          rows.update(last);
          focusAction(tbody, x.name, "remove");
        },
        onConfirm: () => void removeHost(x.name),
      }),
    );
    return h(
      "tr",
      { "data-id": x.name, "data-up": x.up ? "true" : "false" },
      h("td", { class: "name" }, x.name, x.address ? h("div", { class: "muted" }, x.address) : null, h("div", { class: "muted" }, "started ", time(x.started_at))),
      h("td", { class: "state" }, stateBadge(x)),
      h("td", { class: "lease" }, h("div", null, "until ", time(x.lease_until)), h("div", { class: "muted" }, "renewed ", time(x.renewed_at))),
      h(
        "td",
        { class: "capacity" },
        used(x.name, "vCPUs", "vcpus", x.used?.vcpus ?? 0, x.capacity?.vcpus ?? 0, ""),
        used(x.name, "Memory", "memory_mb", x.used?.memory_mb ?? 0, x.capacity?.memory_mb ?? 0, "MB"),
        used(x.name, "Disk", "disk_gb", x.used?.disk_gb ?? 0, x.capacity?.disk_gb ?? 0, "GB"),
      ),
      h("td", { class: "site" }, x.site, x.country ? ` (${x.country})` : ""),
      mesh,
      h("td", { class: "buttons" }, buttons),
    );
  }

  let pollError = "";
  async function refresh(): Promise<void> {
    try {
      const res = await call<{ hosts: Host[] }>("GET", "/v1/hosts");
      if (stopped) return;
      last = res.hosts ?? [];
      rows.update(last);
      note.textContent = "";
      if (pollError) clearErrorIf(pollError);
      pollError = "";
    } catch (err) {
      if (stopped) return;
      last = [];
      const denied = refusal(err);
      if (denied) {
        replace(tbody, emptyRow(COLS, "The hosts are not shown."));
        note.textContent = denied + " (Only the operator sees the hosts.)";
        return;
      }
      replace(tbody, emptyRow(COLS, "The hosts could not be listed."));
      reportError(err);
      pollError = messageOf(err);
    }
  }
  const poller = new Poller(refresh, 5000);

  async function removeHost(name: string): Promise<void> {
    clearError();
    status.textContent = "";
    busy.add(name);
    rows.update(last);
    try {
      const res = await call<{ host: string; deleted_sandboxes: string[] }>("DELETE", "/v1/hosts/" + encodeURIComponent(name));
      const n = res?.deleted_sandboxes?.length ?? 0;
      if (!stopped) status.textContent = `Host ${res?.host ?? name} removed; ${n} sandbox${n === 1 ? "" : "es"} deleted with it.`;
    } catch (err) {
      reportError(err);
    } finally {
      busy.delete(name);
      confirming.delete(name);
    }
    await poller.now();
  }

  async function rotate(name: string): Promise<void> {
    clearError();
    status.textContent = "";
    busy.add(name);
    rows.update(last);
    try {
      await call<{ host: string }>("POST", "/v1/hosts/" + encodeURIComponent(name) + "/mesh-key");
      if (!stopped) status.textContent = `Host ${name} was asked to make a new mesh key; its tunnels stall for a few seconds.`;
    } catch (err) {
      reportError(err);
    } finally {
      busy.delete(name);
    }
    await poller.now();
    if (!stopped) focusAction(tbody, name, "rotate-mesh-key");
  }

  root.append(
    h("h1", { tabindex: -1 }, "Hosts"),
    h(
      "section",
      { "aria-labelledby": "hosts-title" },
      h("h2", { id: "hosts-title" }, "The deployment's hosts"),
      h("p", { class: "hint" }, "Capacity is what the host's sandboxes reserve against its admission limits, as of its last write. Only a host that is down (its lease lapsed) can be removed."),
      note,
      status,
      tableWrap("Hosts", table),
    ),
  );
  void poller.now();
  return () => {
    stopped = true;
    poller.stop();
  };
}
