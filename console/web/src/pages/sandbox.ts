// #/sandboxes/ID: a sandbox's record (refreshed every 2 s), its create
// phases, its lifecycle buttons, live charts, a command runner,
// background processes, the command history, a terminal, a file browser,
// its firewall policy and its published URLs (the newer parts in
// metrics.ts, processes.ts, history.ts and urls.ts).

import {
  download as download_,
  call,
  clearError,
  clearErrorIf,
  clearFieldErrors,
  fieldError,
  follow,
  messageOf,
  reportError,
  upload,
} from "../api";
import { bytes, emptyRow, field, h, listen, pairs, replace, tableWrap, thead, time, type Child } from "../dom";
import { terminalSection } from "../terminal";
import type { ExecResult, FileInfo, Sandbox } from "../types";
import { actionButtons, perform, stateBadge, type Action } from "./actions";
import { historySection } from "./history";
import { metricsSection } from "./metrics";
import { processesSection } from "./processes";
import { urlsSection } from "./urls";

const PHASES = ["admit", "prepare", "launch", "restore", "claim", "agent", "identity", "provision", "total"];

function joinPath(dir: string, name: string): string {
  return (dir.endsWith("/") ? dir : dir + "/") + name;
}

function parentOf(dir: string): string {
  const trimmed = dir.replace(/\/+$/, "");
  const i = trimmed.lastIndexOf("/");
  return i <= 0 ? "/" : trimmed.slice(0, i);
}

export function sandboxPage(root: HTMLElement, id: string): () => void {
  document.title = id + " · HareBox console";
  let stopped = false;
  const base = "/v1/sandboxes/" + encodeURIComponent(id);
  let sb: Sandbox | null = null;
  let confirming = false;
  let busy = false;

  // ---- The record ----
  const title = h("h1", { tabindex: -1 }, id);
  const record = h("dl", { "data-testid": "record", class: "record" });
  const phases = h("div", { class: "phases" });
  const actions = h("div", { class: "sandbox-actions", "data-testid": "actions" });
  let recordSig = "";
  let actionsSig = "";

  function renderRecord(s: Sandbox): void {
    sb = s;
    const name = s.name || s.id;
    if (title.textContent !== name) {
      title.textContent = name;
      document.title = name + " · HareBox console";
    }
    const sig = JSON.stringify(s);
    if (sig !== recordSig) {
      recordSig = sig;
      const size = s.size ? `${s.size.vcpus} vCPU, ${s.size.memory_mb} MiB memory, ${s.size.disk_gb} GB disk` : "";
      const mesh = [s.mesh_name, s.mesh_address].filter(Boolean).join(" at ");
      const volumes = (s.volumes ?? []).map((v) => `${v.name} at ${v.path}${v.read_only ? " (read-only)" : ""}`).join(", ");
      const yesNo = (b?: boolean, yes = "yes", no = "no") => (b === undefined ? "" : b ? yes : no);
      const items: [string, string, Child][] = [
        ["id", "ID", s.id],
        ["name", "Name", s.name],
        ["state", "State", stateBadge(s.state)],
        ["error", "Error", s.error],
        ["image", "Image", s.image],
        ["size", "Size", size],
        ["project", "Project", s.project],
        ["fleet", "Fleet", s.fleet],
        ["account", "Account", s.account_id],
        ["labels", "Labels", pairs(s.labels)],
        ["environment", "Environment", s.environment || (s.no_env ? "none" : "")],
        ["site", "Site", s.site ? `${s.site.name} (${s.site.country})` : ""],
        ["host", "Host", s.host],
        ["served", "Served", s.served],
        ["agent", "Agent", s.agent],
        ["mesh", "Mesh", mesh],
        ["volumes", "Volumes", volumes],
        ["monitoring", "Command history", yesNo(s.monitoring, "kept", "off")],
        ["snapshots", "Snapshots", yesNo(s.snapshots, "allowed", "refused")],
        ["third_party", "Third party", yesNo(s.third_party)],
        ["created", "Created", time(s.created_at)],
        ["expires", "Expires", s.expires_at ? time(s.expires_at) : "never"],
      ];
      replace(
        record,
        items
          .filter(([, , v]) => v !== undefined && v !== "")
          .map(([key, label, v]) => h("div", { class: "row" }, h("dt", null, label), h("dd", { "data-key": key }, v))),
      );
      renderPhases(s.create_phases_ms);
    }
    renderActions();
    charts.update(s);
    processes.update(s);
    commandHistory.update(s);
    urls.update(s);
    terminal.running(s.state === "running");
    if (s.state === "running" && !filesLoaded) void loadFiles();
  }

  function renderPhases(ms?: Record<string, number>): void {
    if (!ms || Object.keys(ms).length === 0) return phases.replaceChildren();
    const names = Object.keys(ms).sort((a, b) => {
      const ia = PHASES.indexOf(a);
      const ib = PHASES.indexOf(b);
      return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib) || (a < b ? -1 : a > b ? 1 : 0);
    });
    const table = h(
      "table",
      { "data-testid": "phases" },
      thead("Phase", "Milliseconds"),
      h(
        "tbody",
        null,
        names.map((n) => h("tr", { "data-phase": n }, h("th", { scope: "row" }, n), h("td", { class: "num" }, String(Math.round(ms[n] * 10) / 10)))),
      ),
    );
    replace(phases, h("h2", { id: "phases-title" }, "Create phases"), tableWrap("Create phases", table));
  }

  function renderActions(): void {
    if (!sb) return;
    const sig = JSON.stringify([sb.state, confirming, busy]);
    if (sig === actionsSig) return;
    actionsSig = sig;
    const s = sb;
    const had = document.activeElement instanceof HTMLElement && actions.contains(document.activeElement) ? document.activeElement.getAttribute("data-action") : null;
    replace(
      actions,
      actionButtons(s, { confirming, busy }, {
        run: (a) => void act(a),
        askDelete: () => {
          confirming = true;
          renderActions();
          actions.querySelector<HTMLElement>('[data-action="confirm-delete"]')?.focus();
        },
        cancelDelete: () => {
          confirming = false;
          renderActions();
          actions.querySelector<HTMLElement>('[data-action="delete"]')?.focus();
        },
      }),
    );
    if (had) (actions.querySelector<HTMLElement>(`[data-action="${CSS.escape(had)}"]`) ?? actions.querySelector<HTMLElement>("button"))?.focus();
  }

  async function act(a: Action): Promise<void> {
    clearError();
    busy = true;
    renderActions();
    try {
      const s = await perform(id, a);
      if (!stopped && s && s.id) renderRecord(s);
    } catch (err) {
      reportError(err);
    } finally {
      busy = false;
      confirming = false;
      renderActions();
    }
  }

  // The record comes over one stream (GET ...?follow=true), at once and
  // again whenever it changes; one that breaks is opened again (follow).
  let streamError = "";
  const ctrl = new AbortController();
  function failed(err: unknown): void {
    if (stopped) return;
    reportError(err);
    streamError = messageOf(err);
  }
  function followRecord(): void {
    void follow(
      () => base + "?follow=true",
      (e) => {
        if (e.event !== "sandbox" || stopped) return;
        renderRecord(JSON.parse(e.data) as Sandbox);
        if (streamError) clearErrorIf(streamError);
        streamError = "";
      },
      ctrl.signal,
      failed,
    );
  }

  // ---- Run a command ----
  const cmdIn = h("input", { id: "exec-cmd", name: "cmd", "data-testid": "cmd", type: "text", autocomplete: "off", spellcheck: "false" });
  const rootBox = h("input", { id: "exec-root", name: "user", type: "checkbox", value: "root" });
  const runBtn = h("button", { type: "submit", class: "primary" }, "Run");
  const output = h("pre", { "data-testid": "output", class: "output", tabindex: 0, hidden: true });
  const execStatus = h("span", { class: "status", role: "status" });
  const execForm = h(
    "form",
    { "data-testid": "exec", class: "inline-form", "aria-labelledby": "exec-title" },
    field("Command", cmdIn, "A shell command line, run with sh -c."),
    h("div", { class: "check" }, rootBox, h("label", { for: "exec-root" }, "As root")),
    h("div", { class: "form-actions" }, runBtn, execStatus),
  );
  listen(execForm, "submit", async (e) => {
    e.preventDefault();
    clearError();
    clearFieldErrors(execForm);
    if (!cmdIn.value.trim()) return fieldError(cmdIn, "cmd", "Type a command to run.");
    const body: Record<string, unknown> = { cmd: cmdIn.value };
    if (rootBox.checked) body.user = "root";
    runBtn.disabled = true;
    execForm.setAttribute("aria-busy", "true");
    execStatus.textContent = "Running…";
    try {
      const r = await call<ExecResult>("POST", base + "/exec", body);
      if (!stopped) showResult(r);
      commandHistory.refresh();
    } catch (err) {
      reportError(err, execForm);
    } finally {
      runBtn.disabled = false;
      execForm.removeAttribute("aria-busy");
      execStatus.textContent = "";
    }
  });

  function showResult(r: ExecResult): void {
    const parts: Child[] = [];
    const nl = (s: string) => (s && !s.endsWith("\n") ? "\n" : "");
    if (r.error) parts.push(h("span", { class: "stderr" }, "could not start: " + r.error + "\n"));
    parts.push(h("span", { class: "stdout", "data-testid": "stdout" }, r.stdout ?? ""), nl(r.stdout ?? ""));
    parts.push(h("span", { class: "stderr", "data-testid": "stderr" }, r.stderr ?? ""), nl(r.stderr ?? ""));
    const notes: string[] = [];
    if (r.signal) notes.push("signal " + r.signal);
    if (r.timed_out) notes.push("timed out");
    if (r.stdout_truncated || r.stderr_truncated) notes.push("output truncated");
    if (typeof r.duration_ms === "number") notes.push(r.duration_ms + " ms");
    parts.push(h("span", { class: "exit", "data-testid": "exit-code" }, "exit code: " + r.exit_code + (notes.length ? " (" + notes.join(", ") + ")" : "")));
    replace(output, parts);
    output.hidden = false;
  }

  // ---- Terminal; charts, processes, history and URLs ----
  const terminal = terminalSection(base);
  const charts = metricsSection(base);
  const commandHistory = historySection(base);
  const processes = processesSection(base, () => commandHistory.refresh());
  const urls = urlsSection(base);

  // ---- Files ----
  let dir = "/tmp";
  let filesLoaded = false;
  const pathIn = h("input", { id: "files-path", name: "path", "data-testid": "path", type: "text", autocomplete: "off", spellcheck: "false", value: dir });
  const upBtn = h("button", { type: "button", "data-action": "up" }, "Up");
  const nav = h(
    "form",
    { "data-testid": "files-nav", class: "inline-form", "aria-label": "Folder" },
    field("Folder", pathIn),
    h("div", { class: "form-actions" }, h("button", { type: "submit" }, "Open"), upBtn),
  );
  const filesBody = h("tbody", null, emptyRow(4, "Files show while the sandbox runs."));
  const filesTable = h("table", { "data-testid": "files", class: "list" }, thead("Name", "Size", "Type", "Actions"), filesBody);
  const uploadIn = h("input", { type: "file", id: "upload", "data-testid": "upload", name: "upload" });
  const uploadStatus = h("div", { class: "status", "aria-live": "polite" });
  const mkdirIn = h("input", { id: "mkdir-name", name: "path", type: "text", autocomplete: "off", spellcheck: "false" });
  const mkdirForm = h(
    "form",
    { "data-testid": "mkdir", class: "inline-form", "aria-label": "New folder" },
    field("Folder name", mkdirIn),
    h("div", { class: "form-actions" }, h("button", { type: "submit" }, "New folder")),
  );

  // syncDir takes the folder typed in the path box (opened or not) as the
  // one an upload or a new folder goes in.
  function syncDir(): void {
    const typed = pathIn.value.trim();
    if (typed) dir = typed;
  }

  function open(path: string): void {
    dir = path || "/";
    pathIn.value = dir;
    void loadFiles();
  }

  listen(nav, "submit", (e) => {
    e.preventDefault();
    clearError();
    open(pathIn.value.trim() || "/");
  });
  listen(upBtn, "click", () => {
    clearError();
    open(parentOf(dir));
  });

  async function loadFiles(): Promise<void> {
    filesLoaded = true;
    const want = dir;
    clearFieldErrors(nav);
    try {
      const res = await call<{ entries: FileInfo[]; truncated: boolean }>("GET", base + "/files/list?path=" + encodeURIComponent(want));
      if (stopped || want !== dir) return;
      const entries = (res.entries ?? []).slice().sort((a, b) => {
        const da = a.type === "dir" ? 0 : 1;
        const db = b.type === "dir" ? 0 : 1;
        return da - db || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
      });
      replace(filesBody, entries.length ? entries.map(fileRow) : emptyRow(4, "This folder is empty."));
      if (res.truncated) filesBody.append(emptyRow(4, "More entries were left out."));
    } catch (err) {
      if (stopped) return;
      replace(filesBody, emptyRow(4, "This folder could not be listed."));
      reportError(err, nav);
    }
  }

  function fileRow(f: FileInfo): HTMLTableRowElement {
    const path = f.path || joinPath(dir, f.name);
    const isDir = f.type === "dir";
    const nameCell = isDir
      ? listen(h("button", { type: "button", class: "link", "data-action": "open" }, f.name), "click", () => {
          clearError();
          open(path);
        })
      : f.name;
    const download =
      f.type === "file" || f.type === "symlink"
        ? listen(h("button", { type: "button", class: "link", "data-action": "download" }, "Download"), "click", async () => {
            clearError();
            try {
              await download_(base + "/files?path=" + encodeURIComponent(path), f.name);
            } catch (err) {
              reportError(err);
            }
          })
        : null;
    const remove = listen(h("button", { type: "button", "data-action": "remove", class: "danger-outline" }, "Remove"), "click", async () => {
      clearError();
      remove.disabled = true;
      try {
        await call<void>("DELETE", base + "/files?path=" + encodeURIComponent(path) + (isDir ? "&recursive=true" : ""));
      } catch (err) {
        reportError(err);
      }
      await loadFiles();
    });
    return h(
      "tr",
      { "data-name": f.name, "data-type": f.type },
      h("td", { class: "name" }, nameCell),
      h("td", { class: "size num" }, isDir ? "" : bytes(f.size)),
      h("td", { class: "type" }, f.type),
      h("td", { class: "buttons" }, h("div", { class: "actions" }, download, remove)),
    );
  }

  listen(uploadIn, "change", async () => {
    const files = Array.from(uploadIn.files ?? []);
    if (!files.length) return;
    clearError();
    syncDir();
    uploadIn.disabled = true;
    try {
      for (const file of files) {
        const progress = h("progress", { "data-testid": "upload-progress", max: file.size || 1, value: 0, "aria-label": "Uploading " + file.name });
        uploadStatus.replaceChildren(progress, " Uploading " + file.name + "…");
        await upload(base + "/files?path=" + encodeURIComponent(joinPath(dir, file.name)), file, (loaded, total) => {
          progress.max = total || 1;
          progress.value = loaded;
        });
      }
      uploadStatus.replaceChildren("Uploaded.");
    } catch (err) {
      uploadStatus.replaceChildren();
      reportError(err);
    } finally {
      uploadIn.disabled = false;
      uploadIn.value = "";
    }
    await loadFiles();
  });

  listen(mkdirForm, "submit", async (e) => {
    e.preventDefault();
    clearError();
    clearFieldErrors(mkdirForm);
    const name = mkdirIn.value.trim();
    if (!name) return fieldError(mkdirIn, "path", "Name the new folder.");
    syncDir();
    const path = name.startsWith("/") ? name : joinPath(dir, name);
    try {
      await call("POST", base + "/files/mkdir?path=" + encodeURIComponent(path));
      mkdirIn.value = "";
    } catch (err) {
      return reportError(err, mkdirForm);
    }
    await loadFiles();
  });

  // ---- Firewall ----
  const fwIn = h("textarea", { id: "firewall", name: "firewall", "data-testid": "firewall", rows: 12, spellcheck: "false", class: "code" });
  const fwBtn = h("button", { type: "submit", class: "primary" }, "Save firewall");
  const fwStatus = h("span", { class: "status", role: "status", "data-testid": "firewall-status" });
  const fwForm = h(
    "form",
    { "data-testid": "firewall-form", "aria-labelledby": "firewall-title" },
    field("Firewall policy (JSON)", fwIn, "Outbound rules in order; the first that matches decides."),
    h("div", { class: "form-actions" }, fwBtn, fwStatus),
  );
  listen(fwIn, "input", () => (fwStatus.textContent = ""));

  async function loadFirewall(): Promise<void> {
    try {
      const p = await call<unknown>("GET", base + "/firewall");
      if (!stopped) fwIn.value = JSON.stringify(p, null, 2);
    } catch (err) {
      if (!stopped) reportError(err);
    }
  }

  listen(fwForm, "submit", async (e) => {
    e.preventDefault();
    clearError();
    clearFieldErrors(fwForm);
    fwStatus.textContent = "";
    let policy: unknown;
    try {
      policy = JSON.parse(fwIn.value);
    } catch (err) {
      return fieldError(fwIn, "firewall", "Not valid JSON: " + messageOf(err));
    }
    fwBtn.disabled = true;
    try {
      const p = await call<unknown>("PUT", base + "/firewall", policy);
      if (stopped) return;
      fwIn.value = JSON.stringify(p, null, 2);
      fwStatus.textContent = "Saved";
    } catch (err) {
      // Every field of the body is the textarea's.
      reportError(err, null, fwIn);
    } finally {
      fwBtn.disabled = false;
    }
  });

  root.append(
    h("p", { class: "crumbs" }, h("a", { href: "#/sandboxes" }, "All sandboxes")),
    title,
    actions,
    h("section", { "aria-labelledby": "record-title" }, h("h2", { id: "record-title" }, "Record"), record),
    phases,
    charts.el,
    h("section", { "aria-labelledby": "exec-title" }, h("h2", { id: "exec-title" }, "Run a command"), execForm, output),
    processes.el,
    commandHistory.el,
    terminal.el,
    h(
      "section",
      { "aria-labelledby": "files-title" },
      h("h2", { id: "files-title" }, "Files"),
      nav,
      tableWrap("Files", filesTable),
      h("div", { class: "file-tools" }, h("div", { class: "field" }, h("label", { for: "upload" }, "Upload a file"), uploadIn, uploadStatus), mkdirForm),
    ),
    h("section", { "aria-labelledby": "firewall-title" }, h("h2", { id: "firewall-title" }, "Firewall"), fwForm),
    urls.el,
  );

  followRecord();
  void loadFirewall();
  return () => {
    stopped = true;
    ctrl.abort();
    terminal.stop();
    charts.stop();
    processes.stop();
    commandHistory.stop();
    urls.stop();
  };
}
