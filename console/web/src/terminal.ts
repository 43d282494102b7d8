// A sandbox's interactive terminal: xterm.js on the API's WebSocket
// GET /v1/sandboxes/{id}/pty (same origin: the browser sends the console's
// session cookie itself, the URL the session's token). The protocol (api/pty.go):
//   - to the server: binary messages are what is typed; text messages are
//     JSON controls: {"type":"resize","rows":R,"cols":C} (the only one sent
//     here: ^D is a key like any other in a terminal);
//   - from the server: binary messages are what the terminal shows; the
//     last text message is {"type":"exit","result":ExecResult} or
//     {"type":"error","error":{code,message}}, then a normal close.
// The terminal's box carries its size as data-rows and data-cols.

import { FitAddon } from "@xterm/addon-fit";
import { Terminal } from "@xterm/xterm";
import { socketToken } from "./api";
import { h, listen } from "./dom";

export interface TerminalSection {
  el: HTMLElement;
  // running enables the open button (a terminal needs a running sandbox).
  running(yes: boolean): void;
  // stop closes the socket and disposes the terminal (the page's cleanup).
  stop(): void;
}

const THEME = {
  background: "#111827",
  foreground: "#f3f4f6",
  cursor: "#f3f4f6",
  cursorAccent: "#111827",
  selectionBackground: "#4b5563",
};

// Escape then Tab (within this many ms) moves the focus out of the
// terminal, which takes Tab for the shell otherwise.
const ESCAPE_TAB_MS = 2000;

interface Session {
  // ended: the server said how it ended (exit or error), or we closed it.
  ended: boolean;
  dispose(): void;
}

export function terminalSection(base: string): TerminalSection {
  const openBtn = h("button", { type: "button", class: "primary", "data-testid": "terminal-open", disabled: true }, "Open terminal");
  const closeBtn = h("button", { type: "button", "data-testid": "terminal-close", hidden: true }, "Close terminal");
  const status = h("span", { class: "status", role: "status", "data-testid": "terminal-status" });
  const hint = h(
    "p",
    { class: "hint", id: "terminal-hint", hidden: true },
    "Keys go to the sandbox's shell. To move the focus out of the terminal, press Esc then Tab.",
  );
  const box = h("div", { class: "terminal-box", "data-testid": "terminal", hidden: true });
  const el = h(
    "section",
    { "aria-labelledby": "terminal-title" },
    h("h2", { id: "terminal-title" }, "Terminal"),
    h("div", { class: "form-actions" }, openBtn, closeBtn, status),
    hint,
    box,
  );

  let isRunning = false;
  let current: Session | null = null;

  function setStatus(text: string): void {
    status.textContent = text;
  }

  function sync(): void {
    openBtn.disabled = !isRunning || (current !== null && !current.ended);
    closeBtn.hidden = current === null;
    box.hidden = current === null;
    hint.hidden = current === null;
  }

  function open(): void {
    close(false);
    box.hidden = false;
    const term = new Terminal({
      fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace',
      fontSize: 14,
      scrollback: 5000,
      screenReaderMode: true,
      theme: THEME,
    });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(box);
    term.textarea?.setAttribute("aria-label", "Terminal input");
    term.textarea?.setAttribute("aria-describedby", hint.id);
    fit.fit();

    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const asked = { rows: term.rows, cols: term.cols };
    const ws = new WebSocket(`${proto}//${location.host}${base}/pty?rows=${asked.rows}&cols=${asked.cols}&${socketToken()}`);
    ws.binaryType = "arraybuffer";
    const enc = new TextEncoder();
    const send = (data: string | BufferSource) => {
      if (ws.readyState === WebSocket.OPEN) ws.send(data);
    };
    const sendResize = () => send(JSON.stringify({ type: "resize", rows: term.rows, cols: term.cols }));

    // The box's size follows the window's: fit the terminal to it (the
    // resize goes to the server from onResize).
    let frame = 0;
    const observer = new ResizeObserver(() => {
      window.cancelAnimationFrame(frame);
      frame = window.requestAnimationFrame(() => {
        if (current === s && !box.hidden) fit.fit();
      });
    });
    observer.observe(box);

    const s: Session = {
      ended: false,
      dispose: () => {
        observer.disconnect();
        window.cancelAnimationFrame(frame);
        ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
        // (Closed while connecting, the browser logs an error: once open.)
        if (ws.readyState === WebSocket.CONNECTING) ws.onopen = () => ws.close(1000);
        else if (ws.readyState === WebSocket.OPEN) ws.close(1000);
        term.dispose();
        box.replaceChildren();
        delete box.dataset.rows;
        delete box.dataset.cols;
      },
    };
    current = s;

    const showSize = () => {
      box.dataset.rows = String(term.rows);
      box.dataset.cols = String(term.cols);
    };
    showSize();
    term.onResize(() => {
      showSize();
      sendResize();
    });
    term.onData((d) => send(enc.encode(d)));
    // (Mouse reports in the X10 encoding: one byte a character.)
    term.onBinary((d) => send(Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff)));

    let escAt = -Infinity;
    term.attachCustomKeyEventHandler((e) => {
      if (e.type !== "keydown") return true;
      if (e.key === "Escape") {
        escAt = e.timeStamp;
      } else if (e.key === "Tab" && !e.ctrlKey && !e.altKey && !e.metaKey && e.timeStamp - escAt < ESCAPE_TAB_MS) {
        escAt = -Infinity;
        return false; // the browser moves the focus
      } else if (e.key !== "Shift") {
        escAt = -Infinity;
      }
      return true;
    });

    let opened = false;
    setStatus("connecting…");
    ws.onopen = () => {
      opened = true;
      setStatus("connected");
      // The size may have changed while connecting.
      if (term.rows !== asked.rows || term.cols !== asked.cols) sendResize();
    };
    ws.onmessage = (ev: MessageEvent) => {
      if (ev.data instanceof ArrayBuffer) {
        term.write(new Uint8Array(ev.data));
        return;
      }
      let msg: { type?: string; result?: { exit_code?: number; signal?: number }; error?: { message?: string } };
      try {
        msg = JSON.parse(String(ev.data));
      } catch {
        return;
      }
      if (msg.type === "exit") {
        const r = msg.result ?? {};
        setStatus("exited with code " + (r.exit_code ?? "?") + (r.signal ? " (signal " + r.signal + ")" : ""));
        end();
      } else if (msg.type === "error") {
        setStatus("error: " + (msg.error?.message || "the terminal failed"));
        end();
      }
    };
    ws.onclose = (ev: CloseEvent) => {
      if (s.ended) return;
      // A refused upgrade (no such sandbox, not running, no right to it)
      // closes before it opens; the browser tells no more.
      setStatus(ev.code === 1006 && !opened ? "error: the terminal could not be opened" : "closed");
      end();
    };

    function end(): void {
      if (s.ended) return;
      s.ended = true;
      term.options.disableStdin = true;
      if (current === s) sync();
    }

    sync();
    term.focus();
  }

  // close ends the terminal; by the user's button, the focus goes back to
  // the open button.
  function close(byUser: boolean): void {
    const s = current;
    if (!s) return;
    current = null;
    s.ended = true;
    s.dispose();
    sync();
    if (byUser) {
      setStatus("closed");
      openBtn.focus();
    }
  }

  listen(openBtn, "click", () => open());
  listen(closeBtn, "click", () => close(true));

  return {
    el,
    running(yes: boolean) {
      if (yes === isRunning) return;
      isRunning = yes;
      sync();
    },
    stop() {
      close(false);
    },
  };
}
