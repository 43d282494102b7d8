// #/images: the images sandboxes are created from (GET /v1/images, each
// name's newest build), building one from an OCI image in a registry
// (POST /v1/images) and deleting one (two clicks), both the operator's.
// Each image's golden snapshots (by size and state) and idle warm-pool
// sandboxes are in its list entry, for the server that answered; the
// server's metrics (GET /metrics, Prometheus text) add how creates were
// served.

import { call, clearError, clearFieldErrors, currentSession, fieldError, getText, refusal, reportError } from "../api";
import { append, emptyRow, field, h, listen, replace, tableWrap, thead, time } from "../dom";
import type { Image } from "../types";
import { confirmButtons, focusAction } from "./confirm";

const COLS = 9;
const BUILT_IN = new Set(["minimal", "default"]);

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

// parseMetrics reads the Prometheus text format's samples (what the
// pool section needs: names, labels, values).
export function parseMetrics(text: string): Sample[] {
  const out: Sample[] = [];
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line.startsWith("#")) continue;
    const m = /^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    const re = /([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
    let l: RegExpExecArray | null;
    while ((l = re.exec(m[2] ?? "")) !== null) labels[l[1]] = l[2].replace(/\\(.)/g, (_, c: string) => (c === "n" ? "\n" : c));
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

export function imagesPage(root: HTMLElement): () => void {
  document.title = "Images · HareBox console";
  let stopped = false;
  const operator = currentSession()?.principal.operator === true;
  let confirming = "";
  let busy = "";
  let last: Image[] = [];

  // ---- The table ----
  const tbody = h("tbody", null, emptyRow(COLS, "Loading…"));
  const table = h(
    "table",
    { "data-testid": "images", class: "list" },
    thead("Name", "Source", "Digest", "Kernel", "Built", "Root disk", "Golden snapshots", "Idle in the pool", "Actions"),
    tbody,
  );
  const note = h("p", { class: "part-note", "data-testid": "images-note", role: "status" });

  function row(i: Image): HTMLTableRowElement {
    const builtIn = BUILT_IN.has(i.name);
    const buttons =
      operator && !builtIn
        ? h(
            "div",
            { class: "actions" },
            confirmButtons({
              action: "delete",
              label: "Delete",
              confirmLabel: "Confirm delete",
              confirming: confirming === i.name,
              busy: busy === i.name,
              onAsk: () => {
                confirming = i.name;
                render();
                focusAction(tbody, i.name, "confirm-delete");
              },
              onCancel: () => {
                confirming = "";
                render();
                focusAction(tbody, i.name, "delete");
              },
              onConfirm: () => void remove(i.name),
            }),
          )
        : h("span", { class: "muted" }, builtIn ? "built in" : "");
    return h(
      "tr",
      { "data-id": i.name },
      h("td", { class: "name" }, i.name),
      h("td", { class: "source" }, i.from ? i.from : h("span", { class: "muted" }, builtIn ? "built in" : "not from an OCI image")),
      h("td", { class: "digest" }, i.digest ? h("code", null, i.digest) : ""),
      h("td", { class: "kernel" }, i.kernel_version ?? ""),
      h("td", { class: "created" }, time(i.built_at)),
      h("td", null, i.root_disk ? "yes" : "no (boots from its initrd)"),
      h(
        "td",
        { class: "golden" },
        i.golden?.length
          ? h(
              "ul",
              { class: "plain" },
              i.golden.map((g) =>
                h("li", { "data-state": g.state }, `${g.vcpus} vCPU, ${g.memory_mb} MiB, ${g.disk_gb} GB: `, h("strong", null, g.state)),
              ),
            )
          : h("span", { class: "muted" }, "none yet"),
      ),
      h("td", { class: "pool-idle num" }, String(i.pool_idle ?? 0)),
      h("td", { class: "buttons" }, buttons),
    );
  }

  function render(): void {
    replace(tbody, last.length ? last.map(row) : emptyRow(COLS, "No images."));
  }

  async function load(): Promise<void> {
    try {
      const res = await call<{ images: Image[] }>("GET", "/v1/images");
      if (stopped) return;
      last = res.images ?? [];
      note.textContent = "";
      render();
    } catch (err) {
      if (stopped) return;
      last = [];
      const denied = refusal(err);
      replace(tbody, emptyRow(COLS, denied ? "The images are not shown." : "The images could not be listed."));
      if (denied) note.textContent = denied;
      else reportError(err);
    }
  }

  async function remove(name: string): Promise<void> {
    clearError();
    busy = name;
    render();
    try {
      await call<void>("DELETE", "/v1/images/" + encodeURIComponent(name));
    } catch (err) {
      reportError(err);
    } finally {
      busy = "";
      confirming = "";
    }
    if (!stopped) await load();
  }

  // ---- Building (the operator) ----
  const nameIn = h("input", { id: "image-name", name: "name", type: "text", autocomplete: "off", maxlength: 63 });
  const fromIn = h("input", { id: "image-from", name: "from", type: "text", autocomplete: "off", maxlength: 1024, placeholder: "ghcr.io/org/app:1", spellcheck: "false" });
  const buildBtn = h("button", { type: "submit", class: "primary" }, "Build image");
  const buildStatus = h("div", { class: "status", role: "status", "data-testid": "build-status" });
  const buildForm = h(
    "form",
    { "data-testid": "build-image", class: "grid-form", "aria-labelledby": "build-title" },
    field("Name", nameIn, "Lower-case letters, digits and dashes; not minimal or default. Building a name again replaces what new sandboxes get."),
    field("OCI image", fromIn, "A registry reference (registry: is added if missing), e.g. ghcr.io/org/app:1; the server pulls it with its own credentials."),
    h("div", { class: "form-actions" }, buildBtn, buildStatus),
  );
  listen(buildForm, "submit", async (e) => {
    e.preventDefault();
    clearError();
    clearFieldErrors(buildForm);
    const name = nameIn.value.trim();
    let from = fromIn.value.trim();
    if (!name) return fieldError(nameIn, "name", "Give the image a name.");
    if (!from) return fieldError(fromIn, "from", "Give the OCI image's reference.");
    if (!from.startsWith("registry:")) from = "registry:" + from;
    buildBtn.disabled = true;
    buildForm.setAttribute("aria-busy", "true");
    replace(buildStatus, h("progress", { "aria-label": "Building the image" }), " Building… a large image takes minutes.");
    try {
      const img = await call<Image>("POST", "/v1/images", { name, from });
      if (stopped) return;
      buildForm.reset();
      replace(buildStatus, `Built ${img.name}.`);
      await load();
    } catch (err) {
      buildStatus.replaceChildren();
      reportError(err, buildForm);
    } finally {
      buildBtn.disabled = false;
      buildForm.removeAttribute("aria-busy");
    }
  });

  // ---- The warm pool (the server's metrics) ----
  const poolBox = h("div", { "data-testid": "pool" }, h("p", { class: "muted" }, "Loading…"));
  async function loadPool(): Promise<void> {
    let samples: Sample[];
    try {
      samples = parseMetrics(await getText("/metrics"));
    } catch (err) {
      if (stopped) return;
      const denied = refusal(err);
      replace(poolBox, h("p", { class: "part-note", "data-testid": "pool-note" }, denied ?? "The server's metrics could not be read."));
      if (!denied) reportError(err);
      return;
    }
    if (stopped) return;
    const idle = samples.find((s) => s.name === "harebox_pool_idle");
    const served = new Map<string, { count: number; sum: number }>();
    for (const s of samples) {
      if (s.name !== "harebox_create_seconds_count" && s.name !== "harebox_create_seconds_sum") continue;
      const k = s.labels.served ?? "";
      const e = served.get(k) ?? { count: 0, sum: 0 };
      if (s.name.endsWith("_count")) e.count = s.value;
      else e.sum = s.value;
      served.set(k, e);
    }
    const kinds = ["boot", "snapshot", "pool", ...Array.from(served.keys()).filter((k) => !["boot", "snapshot", "pool"].includes(k)).sort()];
    replace(
      poolBox,
      h(
        "p",
        { "data-testid": "pool-idle" },
        "Idle warm-pool sandboxes ready to be claimed: ",
        h("strong", null, idle && isFinite(idle.value) ? String(idle.value) : "not reported"),
        ".",
      ),
      tableWrap(
        "Creates by how they were served",
        h(
          "table",
          { "data-testid": "creates-served" },
          thead("Served", "Creates", "Average seconds"),
          h(
            "tbody",
            null,
            kinds.map((k) => {
              const e = served.get(k) ?? { count: 0, sum: 0 };
              return h(
                "tr",
                { "data-served": k },
                h("th", { scope: "row" }, k === "boot" ? "boot (the image booted)" : k === "snapshot" ? "snapshot (golden, fork or named)" : k === "pool" ? "pool (claimed warm)" : k),
                h("td", { class: "num" }, String(e.count)),
                h("td", { class: "num" }, e.count > 0 ? (e.sum / e.count).toFixed(2) : "—"),
              );
            }),
          ),
        ),
      ),
    );
  }

  append(root, [
    h("h1", { tabindex: -1 }, "Images"),
    h("section", { "aria-labelledby": "images-title" }, h("h2", { id: "images-title" }, "Images"), note, tableWrap("Images", table)),
    h(
      "section",
      { "aria-labelledby": "build-title" },
      h("h2", { id: "build-title" }, "Build an image"),
      operator ? buildForm : h("p", { class: "muted", "data-testid": "build-note" }, "Only the operator builds and deletes images."),
    ),
    h(
      "section",
      { "aria-labelledby": "pool-title" },
      h("h2", { id: "pool-title" }, "How creates were served"),
      h(
        "p",
        { class: "hint" },
        "Each image's golden snapshots and idle warm-pool sandboxes are in its row above; this server's metrics give the pool's total and how creates were served since it started.",
      ),
      poolBox,
    ),
  ]);
  void load();
  void loadPool();
  return () => {
    stopped = true;
  };
}
