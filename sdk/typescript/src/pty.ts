// An interactive terminal in a sandbox (openPty): a WebSocket session
// opened with undici's WebSocket, which sends the Authorization header and
// takes a dispatcher, so that a client's TLS trust (its `ca` Agent) applies
// to wss:// as it does to the client's requests.
//
// The protocol (GET /v1/sandboxes/{id}/pty): the client's binary messages
// are typed into the terminal, its text messages are JSON controls
// (resize, signal, eof); the server's binary messages are what the
// terminal shows, and its last text message is {"type": "exit", "result"}
// or {"type": "error", "error"}, then a normal close.

import type * as Undici from "undici";

import { HareBoxError, errorFromBody, statusForCode } from "./errors.js";
import type { ExecResult } from "./types.js";

/** The largest binary message write() sends (the server refuses one over 64 KiB). */
const MAX_MESSAGE = 32 << 10;
/** The bounds of a terminal's rows and columns. */
const MAX_DIM = 1000;
/** The most of a refused upgrade's answer kept for its error. */
const MAX_REFUSAL = 64 << 10;
const EMPTY = new Uint8Array(0);

/** How openPty connects; the client fills it in. */
export interface PtyDial {
  /** The session's http(s) URL, query included. */
  url: string;
  headers: Record<string, string>;
  /** The client's own Agent (a client with `ca`); undefined: undici's global dispatcher. */
  dispatcher: Undici.Dispatcher | undefined;
  /** The caller's signal: it aborts the opening, then closes the session. */
  signal: AbortSignal | undefined;
  /** How long the opening may take, in milliseconds (0: no bound). */
  timeoutMs: number;
  /** Turns an error met while connecting (refused, untrusted certificate) into the one to throw. */
  networkError: (err: unknown) => HareBoxError;
}

/** What the connection's dispatch saw: a refused upgrade's answer, or the error it met. */
interface Seen {
  refusal?: { status: number; statusText: string; retryAfter: string | null; body: string };
  error?: unknown;
}

/**
 * Opens the session: resolves once the server accepted the upgrade, with
 * the {@link Pty}. An error answer instead of the upgrade (the server's
 * JSON errors: 400, 403, 404, 426, ...) rejects with the HareBoxError it
 * carries, a 2xx answer with code "network"; an error met while
 * connecting, as `dial.networkError` makes it; the caller's signal with
 * its reason; the time running out with code "timeout".
 */
export async function dialPty(dial: PtyDial): Promise<Pty> {
  const undici = await import("undici");
  dial.signal?.throwIfAborted();
  const seen: Seen = {};
  const base = dial.dispatcher ?? undici.getGlobalDispatcher();
  const wsUrl = dial.url.replace(/^http(s?):/, "ws$1:");
  const ws = new undici.WebSocket(wsUrl, { dispatcher: watching(base, seen), headers: dial.headers });
  ws.binaryType = "arraybuffer";
  return new Promise<Pty>((resolve, reject) => {
    const timer = dial.timeoutMs > 0 ? setTimeout(() => stop(new HareBoxError(0, "timeout", `openPty: no answer from ${origin(dial.url)} within ${dial.timeoutMs / 1000} s`)), dial.timeoutMs) : undefined;
    const onAbort = (): void => stop(dial.signal?.reason);
    const done = (): void => {
      clearTimeout(timer);
      dial.signal?.removeEventListener("abort", onAbort);
      ws.removeEventListener("open", onOpen);
      ws.removeEventListener("error", onFail);
      ws.removeEventListener("close", onFail);
    };
    const stop = (err: unknown): void => {
      done();
      ws.close();
      reject(err);
    };
    const onOpen = (): void => {
      done();
      // Here, in the open event: no message can have come before the Pty listens.
      resolve(new Pty(ws, dial.signal));
    };
    const onFail = (ev: Event): void => {
      done();
      reject(refused(dial, seen, ev));
    };
    ws.addEventListener("open", onOpen);
    ws.addEventListener("error", onFail);
    ws.addEventListener("close", onFail);
    dial.signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** The error an opening that failed stands for. */
function refused(dial: PtyDial, seen: Seen, ev: Event): HareBoxError {
  const r = seen.refusal;
  if (r && r.status < 300) {
    return new HareBoxError(0, "network", `openPty: the server answered HTTP ${r.status} instead of switching to a WebSocket (${origin(dial.url)})`);
  }
  if (r) return errorFromBody(r.status, r.statusText, r.body, r.retryAfter);
  if (seen.error !== undefined) return dial.networkError(seen.error);
  const why = (ev as { message?: unknown }).message;
  const code = (ev as { code?: unknown }).code;
  const detail = typeof why === "string" && why ? why : typeof code === "number" ? `closed with status ${code}` : "it failed";
  return new HareBoxError(0, "network", `openPty: the WebSocket upgrade failed: ${detail} (${origin(dial.url)})`);
}

function origin(url: string): string {
  try {
    return new URL(url).origin;
  } catch {
    return url;
  }
}

/**
 * A dispatcher that sends through `base` and notes, in `seen`, an upgrade
 * the server refused (its status, Retry-After and up to 64 KiB of its body)
 * or the error the request met. undici's WebSocket gives neither: it fails
 * with one message for every non-101 answer. A refused answer is handed on
 * whole, once its body has been read, so that it is noted before the
 * WebSocket learns of it.
 */
function watching(base: Undici.Dispatcher, seen: Seen): Undici.Dispatcher {
  const d = {
    dispatch: (opts: Undici.Dispatcher.DispatchOptions, handler: Undici.Dispatcher.DispatchHandlers): boolean =>
      base.dispatch(opts, new Watch(handler, seen) as unknown as Handler),
    get webSocketOptions(): unknown {
      return (base as { webSocketOptions?: unknown }).webSocketOptions;
    },
  };
  // undici's WebSocket calls only dispatch (and reads webSocketOptions).
  return d as unknown as Undici.Dispatcher;
}

type Handler = Undici.Dispatcher.DispatchHandlers;
type Forward = Record<string, ((...args: unknown[]) => unknown) | undefined>;

/** A dispatch handler that hands everything on to the WebSocket's, but holds a refused answer until its end. */
class Watch {
  readonly #h: Handler;
  readonly #seen: Seen;
  #held: { statusCode: number; rawHeaders: Buffer[]; resume: () => void; statusText: string } | undefined;
  #body: Buffer[] = [];
  #size = 0;

  constructor(handler: Handler, seen: Seen) {
    this.#h = handler;
    this.#seen = seen;
  }

  /** Calls the WebSocket's handler's method, as a method of it, if it has one. */
  #forward(name: string, ...args: unknown[]): unknown {
    return (this.#h as unknown as Forward)[name]?.call(this.#h, ...args);
  }

  onConnect(...args: unknown[]): unknown {
    return this.#forward("onConnect", ...args);
  }

  onUpgrade(...args: unknown[]): unknown {
    return this.#forward("onUpgrade", ...args);
  }

  onResponseStarted(...args: unknown[]): unknown {
    return this.#forward("onResponseStarted", ...args);
  }

  onBodySent(...args: unknown[]): unknown {
    return this.#forward("onBodySent", ...args);
  }

  onRequestSent(...args: unknown[]): unknown {
    return this.#forward("onRequestSent", ...args);
  }

  onError(err: Error): unknown {
    this.#seen.error ??= err;
    if (this.#held) this.#note();
    return this.#forward("onError", err);
  }

  onHeaders(statusCode: number, rawHeaders: Buffer[], resume: () => void, statusText: string): boolean {
    if (statusCode < 200) return (this.#forward("onHeaders", statusCode, rawHeaders, resume, statusText) ?? true) as boolean;
    this.#held = { statusCode, rawHeaders, resume, statusText };
    return true;
  }

  onData(chunk: Buffer): boolean {
    if (!this.#held) return (this.#forward("onData", chunk) ?? true) as boolean;
    if (this.#size < MAX_REFUSAL) {
      const keep = Buffer.from(chunk.subarray(0, MAX_REFUSAL - this.#size)); // (a copy)
      this.#body.push(keep);
      this.#size += keep.length;
    }
    return true;
  }

  onComplete(trailers: string[] | null): void {
    const held = this.#held;
    if (held) {
      this.#note();
      this.#forward("onHeaders", held.statusCode, held.rawHeaders, held.resume, held.statusText);
      for (const chunk of this.#body) this.#forward("onData", chunk);
    }
    this.#forward("onComplete", trailers);
  }

  #note(): void {
    const held = this.#held;
    if (!held || this.#seen.refusal) return;
    let retryAfter: string | null = null;
    for (let i = 0; i + 1 < held.rawHeaders.length; i += 2) {
      if (String(held.rawHeaders[i]).toLowerCase() === "retry-after") retryAfter = String(held.rawHeaders[i + 1]);
    }
    this.#seen.refusal = { status: held.statusCode, statusText: held.statusText ?? "", retryAfter, body: Buffer.concat(this.#body).toString("utf8") };
  }
}

/**
 * An interactive terminal session in a sandbox, open: what
 * {@link HareBox.openPty} (or Sandbox.pty) returns.
 *
 * - Iterating it (`for await (const chunk of pty)`) yields what the
 *   terminal shows, as bytes (Uint8Array), in order. Output is received as
 *   it comes and held in memory until it is read. Leaving a loop does not
 *   end the session: a later loop goes on with the next chunk. Once the
 *   session is over and its output read, a loop ends; if the session
 *   failed (an error message, a close before the exit), it throws the
 *   error `result` rejects with instead. After close() or the caller's
 *   signal, a loop ends at once.
 * - `write`, `resize`, `signal` and `eof` send input and controls;
 *   `close` ends the session.
 * - `result` settles once: with the command's result when the server
 *   sends its exit, or with the error that ended the session.
 */
export class Pty implements AsyncIterable<Uint8Array> {
  /**
   * The command's ExecResult (its exit_code, or the signal that killed it)
   * once it exits. Rejects with a HareBoxError when the server reports an
   * error (its code and message; status as that code has in an answer),
   * or with code "network" when the connection closes before the exit
   * (the close's status is in the message, e.g. 1008 when the server
   * ends the session for a message against the protocol, 1009 for one
   * over 64 KiB); with an AbortError after close(), or with the signal's
   * reason when the caller's signal aborts. The rejection is handled here
   * too, so leaving it unread does not crash the process.
   */
  readonly result: Promise<ExecResult>;
  readonly #ws: Undici.WebSocket;
  readonly #signal: AbortSignal | undefined;
  readonly #onAbort: () => void;
  #resolve!: (r: ExecResult) => void;
  #reject!: (err: unknown) => void;
  /** Output not yet yielded: #chunks from #head on. */
  #chunks: Uint8Array[] = [];
  #head = 0;
  #waiting: (() => void)[] = [];
  /** No more output will be yielded. */
  #ended = false;
  #settled = false;
  /** What a loop throws once the output is read. */
  #failure: unknown = undefined;

  /** Made by {@link HareBox.openPty}, from an open undici WebSocket. */
  constructor(ws: Undici.WebSocket, signal?: AbortSignal) {
    this.#ws = ws;
    this.result = new Promise<ExecResult>((resolve, reject) => {
      this.#resolve = resolve;
      this.#reject = reject;
    });
    this.result.catch(() => {});
    ws.binaryType = "arraybuffer";
    ws.addEventListener("message", (ev) => this.#message(ev.data));
    ws.addEventListener("close", (ev) => this.#closed(ev.code, ev.reason));
    this.#signal = signal;
    this.#onAbort = () => this.#stop(signal?.reason);
    if (signal?.aborted) this.#stop(signal.reason);
    else signal?.addEventListener("abort", this.#onAbort, { once: true });
  }

  /** Whether the session still takes input: open, and the command's end not yet reported. */
  get open(): boolean {
    return !this.#ended && !this.#settled && this.#ws.readyState === this.#ws.OPEN;
  }

  /**
   * Types bytes into the terminal (a string is sent as UTF-8), as binary
   * messages of at most 32 KiB each. Returns false, sending nothing, once
   * the session no longer takes input (see `open`).
   */
  write(data: Uint8Array | string): boolean {
    let bytes: Uint8Array;
    if (typeof data === "string") bytes = new TextEncoder().encode(data);
    else if (data instanceof Uint8Array) bytes = data;
    else throw new HareBoxError(0, "invalid", "Pty.write: data must be a Uint8Array or a string", "data");
    if (!this.open) return false;
    for (let i = 0; i < bytes.length; i += MAX_MESSAGE) this.#ws.send(bytes.subarray(i, i + MAX_MESSAGE));
    return true;
  }

  /**
   * Sets the terminal's size (each 1 to 1000; anything else throws code
   * "invalid"). Returns false, sending nothing, once the session no longer
   * takes input.
   */
  resize(rows: number, cols: number): boolean {
    for (const [name, v] of [["rows", rows], ["cols", cols]] as const) {
      if (!Number.isInteger(v) || v < 1 || v > MAX_DIM) {
        throw new HareBoxError(0, "invalid", `Pty.resize: ${name} must be a whole number from 1 to ${MAX_DIM}`, name);
      }
    }
    return this.#control({ type: "resize", rows, cols });
  }

  /**
   * Sends a signal (1 to 64; e.g. 2 for SIGINT) to the session's process
   * group. Returns false, sending nothing, once the session no longer
   * takes input.
   */
  signal(signal: number): boolean {
    if (!Number.isInteger(signal) || signal < 1 || signal > 64) {
      throw new HareBoxError(0, "invalid", "Pty.signal: the signal must be a whole number from 1 to 64", "signal");
    }
    return this.#control({ type: "signal", signal });
  }

  /**
   * Sends the eof control: the end of the terminal's input (^D). Returns
   * false, sending nothing, once the session no longer takes input.
   */
  eof(): boolean {
    return this.#control({ type: "eof" });
  }

  /**
   * Closes the connection (WebSocket status 1000), which ends the command
   * if it still runs. Output not yet read is dropped and a loop ends; if
   * the command had not exited, `result` rejects with an AbortError.
   */
  close(): void {
    this.#stop(new DOMException("openPty: the session was closed before its command exited", "AbortError"));
  }

  /** The terminal's output, chunk by chunk (see the class). */
  [Symbol.asyncIterator](): AsyncIterableIterator<Uint8Array> {
    const it: AsyncIterableIterator<Uint8Array> = {
      next: () => this.#next(),
      // Leaving a loop leaves the session as it is.
      return: async () => ({ done: true, value: undefined }),
      [Symbol.asyncIterator]: () => it,
    };
    return it;
  }

  async #next(): Promise<IteratorResult<Uint8Array, undefined>> {
    for (;;) {
      if (this.#head < this.#chunks.length) {
        const chunk = this.#chunks[this.#head] as Uint8Array;
        this.#chunks[this.#head++] = EMPTY; // (not kept once yielded)
        if (this.#head === this.#chunks.length || this.#head >= 1024) {
          this.#chunks.splice(0, this.#head);
          this.#head = 0;
        }
        return { done: false, value: chunk };
      }
      if (this.#ended) {
        if (this.#failure !== undefined) throw this.#failure;
        return { done: true, value: undefined };
      }
      await new Promise<void>((resolve) => this.#waiting.push(resolve));
    }
  }

  #control(c: Record<string, unknown>): boolean {
    if (!this.open) return false;
    this.#ws.send(JSON.stringify(c));
    return true;
  }

  #message(data: unknown): void {
    if (this.#ended) return;
    if (data instanceof ArrayBuffer) {
      this.#chunks.push(new Uint8Array(data));
      this.#wake();
      return;
    }
    if (typeof data !== "string") return;
    let v: { type?: unknown; result?: unknown; error?: unknown } | null;
    try {
      v = JSON.parse(data);
    } catch {
      v = null;
    }
    if (!v || typeof v !== "object") {
      this.#fail(new HareBoxError(0, "network", "openPty: a text message from the server is not JSON"));
      this.#ws.close();
      return;
    }
    if (v.type === "exit") {
      const r = v.result as ExecResult | null;
      if (!r || typeof r !== "object" || typeof r.exit_code !== "number") {
        this.#fail(new HareBoxError(0, "network", "openPty: malformed exit message"));
        this.#ws.close();
        return;
      }
      this.#settle();
      this.#resolve(r);
    } else if (v.type === "error") {
      const e = v.error as { code?: unknown; message?: unknown; field?: unknown } | null;
      const code = typeof e?.code === "string" ? e.code : "internal";
      this.#fail(new HareBoxError(statusForCode(code), code, typeof e?.message === "string" ? e.message : "the session failed", typeof e?.field === "string" ? e.field : undefined));
    }
    // Another type: one this client does not know; skip it.
  }

  #closed(code: number, reason: string): void {
    if (!this.#settled) {
      this.#fail(new HareBoxError(0, "network", `openPty: the session ended before the command's exit: ${closeStatus(code, reason)}`));
    }
    this.#end();
  }

  /** Closes the connection, settling `result` with err if it is not yet settled; a loop ends quietly. */
  #stop(err: unknown): void {
    if (!this.#settled) {
      this.#settle();
      this.#reject(err);
    }
    this.#chunks = [];
    this.#head = 0;
    this.#failure = undefined;
    this.#end();
    this.#ws.close(1000);
  }

  /** The session failed: result rejects with err, and a loop throws it once the output is read. */
  #fail(err: unknown): void {
    if (this.#settled) return;
    this.#settle();
    this.#failure = err;
    this.#reject(err);
  }

  #settle(): void {
    this.#settled = true;
    this.#end();
  }

  #end(): void {
    this.#ended = true;
    this.#signal?.removeEventListener("abort", this.#onAbort);
    this.#wake();
  }

  #wake(): void {
    const waiting = this.#waiting;
    this.#waiting = [];
    for (const w of waiting) w();
  }
}

const CLOSE_NAMES: Record<number, string> = {
  1000: "normal closure",
  1001: "going away",
  1005: "no status",
  1006: "the connection was lost",
  1008: "policy violation",
  1009: "message too big",
  1011: "server error",
};

function closeStatus(code: number, reason: string): string {
  const name = CLOSE_NAMES[code];
  return `WebSocket status ${code}${name ? ` (${name})` : ""}${reason ? `: ${reason}` : ""}`;
}
