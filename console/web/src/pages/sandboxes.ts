// #/sandboxes: the list (followed over one stream, GET
// /v1/sandboxes?follow=true, filtered by the list endpoint's state,
// project and label parameters) and the create form.

import { call, clearError, clearErrorIf, clearFieldErrors, fieldError, follow, messageOf, reportError } from "../api";
import { KeyedRows, emptyRow, field, h, listen, pairs, parsePairs, tableWrap, thead, time } from "../dom";
import { debounce } from "../poll";
import { SIZE_PRESETS, STATES, type Image, type Sandbox } from "../types";
import { actionButtons, perform, sandboxHref, stateBadge, type Action } from "./actions";

export function sandboxesPage(root: HTMLElement): () => void {
  document.title = "Sandboxes · HareBox console";
  let stopped = false;
  const confirming = new Set<string>();
  const busy = new Set<string>();
  let last: Sandbox[] = [];

  // ---- Filters ----
  const stateSel = h(
    "select",
    { id: "filter-state", name: "state", "data-testid": "filter-state" },
    h("option", { value: "" }, "All states"),
    STATES.map((s) => h("option", { value: s }, s)),
  );
  const projectIn = h("input", { id: "filter-project", name: "project", "data-testid": "filter-project", type: "text", autocomplete: "off" });
  const labelIn = h("input", { id: "filter-label", name: "label", "data-testid": "filter-label", type: "text", autocomplete: "off", placeholder: "key=value" });
  const filters = h(
    "form",
    { class: "filters", "data-testid": "filters", role: "search", "aria-label": "Filter sandboxes" },
    field("State", stateSel),
    field("Project", projectIn),
    field("Label", labelIn, "key=value"),
  );
  listen(filters, "submit", (e) => {
    e.preventDefault();
    restart();
  });

  // ---- The table ----
  const tbody = h("tbody");
  const table = h("table", { "data-testid": "sandboxes", class: "list" }, thead("Name", "State", "Project", "Image", "Labels", "Created", "Actions"), tbody);

  const rows = new KeyedRows<Sandbox>(
    tbody,
    (s) => s.id,
    (s) => JSON.stringify([s.name, s.state, s.project, s.image, pairs(s.labels), s.created_at, confirming.has(s.id), busy.has(s.id)]),
    (s) => row(s),
    () => emptyRow(7, "No sandboxes."),
  );

  function row(s: Sandbox): HTMLTableRowElement {
    return h(
      "tr",
      { "data-id": s.id, "data-state": s.state },
      h("td", { class: "name" }, h("a", { href: sandboxHref(s.id) }, s.name || s.id)),
      h("td", { class: "state" }, stateBadge(s.state)),
      h("td", { class: "project" }, s.project),
      h("td", { class: "image" }, s.image),
      h("td", { class: "labels" }, pairs(s.labels)),
      h("td", { class: "created" }, time(s.created_at)),
      h(
        "td",
        { class: "buttons" },
        actionButtons(s, { confirming: confirming.has(s.id), busy: busy.has(s.id) }, {
          run: (a) => void act(s.id, a),
          askDelete: () => {
            confirming.add(s.id);
            rows.update(last);
            focusIn(s.id, "confirm-delete");
          },
          cancelDelete: () => {
            confirming.delete(s.id);
            rows.update(last);
            focusIn(s.id, "delete");
          },
        }),
      ),
    );
  }

  function focusIn(id: string, action: string): void {
    for (const tr of Array.from(tbody.querySelectorAll("tr"))) {
      if (tr.getAttribute("data-id") === id) tr.querySelector<HTMLElement>(`[data-action="${action}"]`)?.focus();
    }
  }

  async function act(id: string, action: Action): Promise<void> {
    clearError();
    busy.add(id);
    rows.update(last);
    try {
      await perform(id, action);
    } catch (err) {
      reportError(err);
    } finally {
      busy.delete(id);
      confirming.delete(id);
    }
    // (The stream brings the new state.)
    rows.update(last);
  }

  // The list comes over one stream, at once and again whenever it
  // changes (the server looks after every change it records, and every
  // 5 s). A stream that breaks is opened again, later each time; a
  // change of filters opens a new one.
  let streamError = "";
  let ctrl: AbortController | null = null;
  function apply(list: Sandbox[]): void {
    if (stopped) return;
    last = list;
    rows.update(last);
    clearFieldErrors(filters);
    if (streamError) clearErrorIf(streamError);
    streamError = "";
  }
  function failed(err: unknown): void {
    if (stopped) return;
    clearFieldErrors(filters);
    reportError(err, filters);
    streamError = messageOf(err);
  }
  function path(): string {
    const q = new URLSearchParams();
    if (stateSel.value) q.set("state", stateSel.value);
    if (projectIn.value.trim()) q.set("project", projectIn.value.trim());
    if (labelIn.value.trim()) q.append("label", labelIn.value.trim());
    q.set("follow", "true");
    return "/v1/sandboxes?" + q.toString();
  }
  function restart(): void {
    ctrl?.abort();
    ctrl = new AbortController();
    void follow(
      path,
      (e) => {
        if (e.event === "sandboxes") apply((JSON.parse(e.data) as { sandboxes?: Sandbox[] }).sandboxes ?? []);
      },
      ctrl.signal,
      failed,
    );
  }
  const refilter = debounce(restart, 300);
  listen(stateSel, "change", restart);
  listen(projectIn, "input", refilter);
  listen(labelIn, "input", refilter);

  // ---- The create form ----
  const nameIn = h("input", { id: "create-name", name: "name", type: "text", autocomplete: "off", maxlength: 63 });
  const imageSel = h("select", { id: "create-image", name: "image" }, h("option", { value: "default" }, "default"));
  const ttlIn = h("input", { id: "create-ttl", name: "ttl_seconds", type: "number", min: 0, max: 2592000, step: 1, inputmode: "numeric" });
  const projIn = h("input", { id: "create-project", name: "project", type: "text", autocomplete: "off" });
  const labelsIn = h("textarea", { id: "create-labels", name: "labels", rows: 3 });
  // The CreateRequest's size: a preset, or custom vcpus and memory_mb
  // (and disk_gb), not both.
  const sizeSel = h(
    "select",
    { id: "create-size", name: "size" },
    h("option", { value: "" }, "Default (the server's small)"),
    SIZE_PRESETS.map((p) => h("option", { value: p }, p)),
    h("option", { value: "custom" }, "Custom…"),
  );
  const vcpusIn = h("input", { id: "create-vcpus", name: "size.vcpus", type: "number", min: 1, max: 32, step: 1, inputmode: "numeric" });
  const memoryIn = h("input", { id: "create-memory", name: "size.memory_mb", type: "number", min: 128, max: 131072, step: 1, inputmode: "numeric" });
  const diskIn = h("input", { id: "create-disk", name: "size.disk_gb", type: "number", min: 1, max: 1024, step: 1, inputmode: "numeric" });
  const customFields = [field("vCPUs", vcpusIn, "1 to 32."), field("Memory (MiB)", memoryIn, "128 to 131072."), field("Disk (GB)", diskIn, "1 to 1024; optional.")];
  const envIn = h("input", { id: "create-environment", name: "environment", type: "text", autocomplete: "off", spellcheck: "false" });
  const fwIn = h("textarea", { id: "create-firewall", name: "firewall", rows: 5, spellcheck: "false", class: "code", placeholder: '{"default_outbound": "deny", "outbound": []}' });
  const volumesIn = h("textarea", { id: "create-volumes", name: "volumes", rows: 3, spellcheck: "false", class: "code", placeholder: "data:/data" });
  const meshBox = h("input", { id: "create-mesh", name: "mesh", type: "checkbox", "aria-describedby": "create-mesh-hint" });
  const wide = (el: HTMLElement) => {
    el.classList.add("wide");
    return el;
  };
  function showSize(): void {
    for (const f of customFields) f.hidden = sizeSel.value !== "custom";
  }
  showSize();
  listen(sizeSel, "change", showSize);
  const createBtn = h("button", { type: "submit", class: "primary" }, "Create");
  const status = h("div", { class: "status", "aria-live": "polite" });
  const create = h(
    "form",
    { "data-testid": "create", class: "grid-form", "aria-labelledby": "create-title" },
    field("Name", nameIn, "Lower-case letters, digits and dashes (optional)."),
    field("Image", imageSel),
    field("TTL (seconds)", ttlIn, "Deleted that long after creation; empty or 0 for none."),
    field("Project", projIn, "Optional; default the account's default project."),
    field("Labels", labelsIn, "One key=value per line."),
    field("Size", sizeSel, "A preset, or custom vCPUs and memory."),
    customFields,
    field("Environment", envIn, "An environment of the project: NAME or NAME@VERSION (optional)."),
    wide(field("Firewall policy (JSON)", fwIn, "Optional: outbound rules in order, the first that matches decides; empty for the server's default.")),
    wide(field("Volumes", volumesIn, "Optional: one volume of the project a line, as name:/path, or name:/path:ro to mount it read-only.")),
    h("div", { class: "check" }, meshBox, h("label", { for: "create-mesh" }, "On the project's private mesh"), h("span", { class: "hint", id: "create-mesh-hint" }, "(unchecked: as the project says)")),
    h("div", { class: "form-actions" }, createBtn, status),
  );

  listen(create, "submit", async (e) => {
    e.preventDefault();
    clearError();
    clearFieldErrors(create);
    const body: Record<string, unknown> = {};
    if (nameIn.value.trim()) body.name = nameIn.value.trim();
    if (imageSel.value) body.image = imageSel.value;
    if (ttlIn.value.trim() !== "") {
      const n = Number(ttlIn.value);
      if (!Number.isInteger(n) || n < 0) return fieldError(ttlIn, "ttl_seconds", "A whole number of seconds, 0 or more.");
      body.ttl_seconds = n;
    }
    if (projIn.value.trim()) body.project = projIn.value.trim();
    const labels = parsePairs(labelsIn.value);
    if (typeof labels === "string") return fieldError(labelsIn, "labels", labels);
    if (Object.keys(labels).length) body.labels = labels;
    if (sizeSel.value === "custom") {
      const size: Record<string, number> = {};
      for (const [el, key, lo, hi, need] of [
        [vcpusIn, "vcpus", 1, 32, true],
        [memoryIn, "memory_mb", 128, 131072, true],
        [diskIn, "disk_gb", 1, 1024, false],
      ] as [HTMLInputElement, string, number, number, boolean][]) {
        const raw = el.value.trim();
        if (raw === "") {
          if (need) return fieldError(el, "size." + key, "A custom size needs this.");
          continue;
        }
        const n = Number(raw);
        if (!Number.isInteger(n) || n < lo || n > hi) return fieldError(el, "size." + key, `A whole number from ${lo} to ${hi}.`);
        size[key] = n;
      }
      body.size = size;
    } else if (sizeSel.value) {
      body.size = { preset: sizeSel.value };
    }
    if (envIn.value.trim()) body.environment = envIn.value.trim();
    if (fwIn.value.trim()) {
      let policy: unknown;
      try {
        policy = JSON.parse(fwIn.value);
      } catch (err) {
        return fieldError(fwIn, "firewall", "Not valid JSON: " + messageOf(err));
      }
      if (!policy || typeof policy !== "object" || Array.isArray(policy)) return fieldError(fwIn, "firewall", "A policy is a JSON object, such as {\"default_outbound\": \"deny\"}.");
      body.firewall = policy;
    }
    const volumes = parseVolumes(volumesIn.value);
    if (typeof volumes === "string") return fieldError(volumesIn, "volumes", volumes);
    if (volumes.length) body.volumes = volumes;
    if (meshBox.checked) body.mesh = true;

    createBtn.disabled = true;
    create.setAttribute("aria-busy", "true");
    const progress = h("progress", { "data-testid": "progress", "aria-label": "Creating the sandbox" });
    status.replaceChildren(progress, " Creating…");
    try {
      const sb = await call<Sandbox>("POST", "/v1/sandboxes", body);
      if (!stopped) location.hash = sandboxHref(sb.id);
    } catch (err) {
      reportError(err, create);
    } finally {
      createBtn.disabled = false;
      create.removeAttribute("aria-busy");
      status.replaceChildren();
    }
  });

  async function loadImages(): Promise<void> {
    let names: string[] = [];
    try {
      const res = await call<{ images: Image[] }>("GET", "/v1/images");
      names = (res.images ?? []).map((i) => i.name);
    } catch {
      // A key without images:read still creates from the default image.
    }
    if (stopped || names.length === 0) return;
    const chosen = names.includes(imageSel.value) ? imageSel.value : names.includes("default") ? "default" : names[0];
    imageSel.replaceChildren(...names.map((n) => h("option", { value: n }, n)));
    imageSel.value = chosen;
  }

  root.append(
    h("h1", { tabindex: -1 }, "Sandboxes"),
    h("section", { "aria-labelledby": "list-title" }, h("h2", { id: "list-title" }, "All sandboxes"), filters, tableWrap("Sandboxes", table)),
    h("section", { "aria-labelledby": "create-title" }, h("h2", { id: "create-title" }, "New sandbox"), create),
  );

  restart();
  void loadImages();
  return () => {
    stopped = true;
    ctrl?.abort();
    refilter.cancel();
  };
}

// parseVolumes reads lines name:/path or name:/path:ro as the
// CreateRequest's volumes, or says what is wrong.
export function parseVolumes(text: string): { name: string; path: string; read_only?: boolean }[] | string {
  const out: { name: string; path: string; read_only?: boolean }[] = [];
  for (const raw of text.split(/\r?\n/)) {
    const line = raw.trim();
    if (!line) continue;
    const colon = line.indexOf(":");
    if (colon <= 0) return "Write each volume as name:/path (or name:/path:ro): " + line;
    const name = line.slice(0, colon).trim();
    let path = line.slice(colon + 1).trim();
    let readOnly = false;
    if (path.endsWith(":ro")) {
      readOnly = true;
      path = path.slice(0, -3);
    } else if (path.endsWith(":rw")) {
      path = path.slice(0, -3);
    }
    if (!path.startsWith("/")) return "The path must be absolute (start with /): " + line;
    out.push(readOnly ? { name, path, read_only: true } : { name, path });
  }
  return out;
}
