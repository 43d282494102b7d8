// Talking to the server: the console session (an HttpOnly cookie the
// page never sees, plus its CSRF token), API calls, and showing their
// errors. The API key itself is sent once, to sign in, and never kept.
//
// Every request carries the token, reads too: the server honours the
// cookie only with it. The token is kept in this origin's localStorage
// (so a reload or another tab goes on), which a page on another port or
// host cannot read or write, whereas a cookie is shared by every port of
// a host name, where a sandbox's own pages may be served.

import { h } from "./dom";
import { sleep } from "./poll";
import type { Session } from "./types";

export const SESSION_ENDED = "Your session ended or your key was refused: sign in again.";

export class ApiError extends Error {
  // sessionEnded: this 401 ended the console session (the UI shows the
  // sign-in form already; nothing more to show).
  sessionEnded = false;
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly field?: string,
  ) {
    super(message);
    this.name = "ApiError";
  }
}

let session: Session | null = null;
let onEnded: () => void = () => {};

// tokenKey names the token in localStorage.
const tokenKey = "harebox.console.csrf";

export function currentSession(): Session | null {
  return session;
}

// setSession keeps the session (its token in storage), or forgets it.
export function setSession(s: Session | null): void {
  session = s;
  try {
    if (s) localStorage.setItem(tokenKey, s.csrf_token);
    else localStorage.removeItem(tokenKey);
  } catch {
    // No storage (a private window that refuses it): this tab only.
  }
}

// token is the session's CSRF token: the session's, or the one kept from
// an earlier page of this origin.
function token(): string {
  if (session) return session.csrf_token;
  try {
    return localStorage.getItem(tokenKey) ?? "";
  } catch {
    return "";
  }
}

// authHeaders are the headers every request carries.
function authHeaders(accept: string): Record<string, string> {
  const headers: Record<string, string> = { Accept: accept };
  const t = token();
  if (t) headers["X-CSRF-Token"] = t;
  return headers;
}

// socketToken is the query parameter that carries the token on a
// WebSocket's handshake, which cannot carry a header.
export function socketToken(): string {
  return "csrf_token=" + encodeURIComponent(token());
}

// onSessionEnded sets what happens when a call is answered 401.
export function onSessionEnded(fn: () => void): void {
  onEnded = fn;
}

function errorFrom(status: number, statusText: string, body: string): ApiError {
  try {
    const parsed: unknown = JSON.parse(body);
    const e = (parsed as { error?: { code?: unknown; message?: unknown; field?: unknown } } | null)?.error;
    if (e && typeof e.message === "string") {
      const field = typeof e.field === "string" && e.field !== "" ? e.field : undefined;
      return new ApiError(status, typeof e.code === "string" ? e.code : "", e.message, field);
    }
  } catch {
    // Not JSON: described below.
  }
  return new ApiError(status, "http_" + status, ("The server answered " + status + " " + statusText).trim() + ".");
}

function failed(status: number, statusText: string, body: string, endsSession: boolean): ApiError {
  const err = errorFrom(status, statusText, body);
  if (status === 401 && endsSession) {
    err.sessionEnded = true;
    if (session) {
      session = null;
      onEnded();
    }
  }
  return err;
}

function checkPath(path: string): void {
  if (!/^\/(v1|console)\//.test(path) && path !== "/console/session") {
    throw new Error("not an API path: " + path);
  }
}

interface CallOptions {
  // endsSession false: a 401 is an answer (wrong key), not the end of the session.
  endsSession?: boolean;
}

// call makes a same-origin request and returns its JSON answer (undefined
// for an empty one).
export async function call<T>(method: string, path: string, body?: unknown, opts: CallOptions = {}): Promise<T> {
  checkPath(path);
  const headers = authHeaders("application/json");
  let payload: string | undefined;
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  let res: Response;
  try {
    res = await fetch(path, { method, headers, body: payload, credentials: "same-origin", cache: "no-store" });
  } catch {
    throw new ApiError(0, "network", "The server could not be reached.");
  }
  const text = await res.text();
  if (!res.ok) throw failed(res.status, res.statusText, text, opts.endsSession !== false);
  if (text === "") return undefined as T;
  try {
    return JSON.parse(text) as T;
  } catch {
    throw new ApiError(res.status, "invalid_answer", "The server's answer was not JSON.");
  }
}

// upload PUTs a file's bytes, reporting progress (fetch cannot).
export function upload(path: string, file: Blob, progress: (loaded: number, total: number) => void): Promise<void> {
  checkPath(path);
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("PUT", path);
    for (const [k, v] of Object.entries(authHeaders("application/json"))) xhr.setRequestHeader(k, v);
    xhr.setRequestHeader("Content-Type", "application/octet-stream");
    xhr.upload.addEventListener("progress", (e) => progress(e.loaded, e.lengthComputable ? e.total : file.size));
    xhr.addEventListener("load", () => {
      if (xhr.status >= 200 && xhr.status < 300) resolve();
      else reject(failed(xhr.status, xhr.statusText, xhr.responseText, true));
    });
    xhr.addEventListener("error", () => reject(new ApiError(0, "network", "The upload failed: the server could not be reached.")));
    xhr.addEventListener("abort", () => reject(new ApiError(0, "aborted", "The upload was cancelled.")));
    xhr.send(file);
  });
}

// download saves the answer of a GET as a file named name: fetched with
// the token (a plain link could not send it), then handed to the browser
// as a blob.
export async function download(path: string, name: string): Promise<void> {
  checkPath(path);
  let res: Response;
  try {
    res = await fetch(path, { method: "GET", headers: authHeaders("application/octet-stream"), credentials: "same-origin", cache: "no-store" });
  } catch {
    throw new ApiError(0, "network", "The server could not be reached.");
  }
  if (!res.ok) throw failed(res.status, res.statusText, await res.text(), true);
  const url = URL.createObjectURL(await res.blob());
  try {
    const a = document.createElement("a");
    a.href = url;
    a.download = name;
    a.click();
  } finally {
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  }
}

// ---- The console session ----

export function signIn(key: string): Promise<Session> {
  return call<Session>("POST", "/console/session", { key }, { endsSession: false });
}

export function loadSession(): Promise<Session> {
  return call<Session>("GET", "/console/session", undefined, { endsSession: false });
}

export function signOut(): Promise<void> {
  return call<void>("DELETE", "/console/session", undefined, { endsSession: false });
}

// ---- Showing errors ----

let alertArea: HTMLElement | null = null;

// alertBox makes the page's alert area (one per page, kept in main).
export function alertBox(): HTMLElement {
  alertArea = h("div", { role: "alert", "data-testid": "error", class: "alert", hidden: true });
  return alertArea;
}

export function showError(message: string): void {
  if (!alertArea) return;
  alertArea.textContent = message;
  alertArea.hidden = false;
}

export function clearError(): void {
  if (!alertArea) return;
  alertArea.textContent = "";
  alertArea.hidden = true;
}

// clearErrorIf clears the alert only if it still shows message (a poll
// that recovers takes back its own error, not someone else's).
export function clearErrorIf(message: string): void {
  if (alertArea && !alertArea.hidden && alertArea.textContent === message) clearError();
}

export function messageOf(err: unknown): string {
  if (err instanceof Error) return err.message;
  return String(err);
}

type Control = HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement;

// controlFor finds the form control an error's field (a JSON path such as
// "labels.team" or "outbound[0].ports") is about: the one whose name is
// the field, else the longest one whose name is a prefix of it, else the
// first one under it (field "scope.rate": the control "scope.rate.burst").
function controlFor(form: HTMLFormElement, fieldPath: string): Control | null {
  let best: Control | null = null;
  let under: Control | null = null;
  for (const el of Array.from(form.elements)) {
    if (!(el instanceof HTMLInputElement || el instanceof HTMLSelectElement || el instanceof HTMLTextAreaElement)) continue;
    const name = el.name;
    if (!name) continue;
    if (fieldPath === name || fieldPath.startsWith(name + ".") || fieldPath.startsWith(name + "[")) {
      if (!best || name.length > best.name.length) best = el;
    } else if (!under && (name.startsWith(fieldPath + ".") || name.startsWith(fieldPath + "["))) {
      under = el;
    }
  }
  return best ?? under;
}

// fieldError shows message at control, as
// <span class="field-error" data-testid="field-error" data-field=FIELD>.
export function fieldError(control: HTMLElement, fieldPath: string, message: string): void {
  const id = (control.id || "field") + "-error";
  document.getElementById(id)?.remove();
  const span = h("span", { class: "field-error", "data-testid": "field-error", "data-field": fieldPath, id }, message);
  control.after(span);
  control.setAttribute("aria-invalid", "true");
  const described = (control.getAttribute("aria-describedby") || "").split(" ").filter((s) => s && s !== id);
  described.push(id);
  control.setAttribute("aria-describedby", described.join(" "));
}

export function clearFieldErrors(form: HTMLElement): void {
  for (const span of Array.from(form.querySelectorAll(".field-error"))) {
    const control = span.previousElementSibling;
    if (control) {
      control.removeAttribute("aria-invalid");
      const rest = (control.getAttribute("aria-describedby") || "").split(" ").filter((s) => s && s !== span.id);
      if (rest.length) control.setAttribute("aria-describedby", rest.join(" "));
      else control.removeAttribute("aria-describedby");
    }
    span.remove();
  }
}

// reportError shows err: at the form's control its field names, at
// fallback (any field) if given, else in the alert area. A 401 that
// ended the session shows nothing more: the sign-in form says it.
export function reportError(err: unknown, form?: HTMLFormElement | null, fallback?: HTMLElement): void {
  if (err instanceof ApiError) {
    if (err.sessionEnded) return;
    if (err.field) {
      const control = form ? controlFor(form, err.field) : null;
      if (control) return fieldError(control, err.field, err.message);
      if (fallback) return fieldError(fallback, err.field, err.message);
    }
  }
  showError(messageOf(err));
}

// ---- Text answers ----

// The server's paths that answer text rather than JSON.
const textPaths = new Set(["/metrics"]);

// getText GETs a text answer: the server's metrics (Prometheus text
// format). Its errors are the API's, as call's.
export async function getText(path: string): Promise<string> {
  if (!textPaths.has(path)) throw new Error("not a text path: " + path);
  let res: Response;
  try {
    res = await fetch(path, { method: "GET", headers: authHeaders("text/plain"), credentials: "same-origin", cache: "no-store" });
  } catch {
    throw new ApiError(0, "network", "The server could not be reached.");
  }
  const text = await res.text();
  if (!res.ok) throw failed(res.status, res.statusText, text, true);
  return text;
}

// refusal is err's message if it is a refusal (403: the key may not do
// this), for the part of a page it concerns to show in place; else null.
export function refusal(err: unknown): string | null {
  if (err instanceof ApiError && err.status === 403) return "Not allowed for this key: " + err.message;
  return null;
}

// ---- Event streams ----

export interface ServerEvent {
  event: string;
  data: string;
}

// The API's paths that answer server-sent events the console reads: a
// background process's output, the followed list of sandboxes and a
// followed sandbox, the followed audit log.
const eventPaths = [
  /^\/v1\/sandboxes\/[^/?#]+\/processes\/[^/?#]+\/output(\?|$)/,
  /^\/v1\/sandboxes\?([^#]*&)?follow=true(&|$)/,
  /^\/v1\/sandboxes\/[^/?#]+\?([^#]*&)?follow=true(&|$)/,
  /^\/v1\/audit\?([^#]*&)?follow=true(&|$)/,
];

// events GETs a stream of server-sent events, with the session's token
// (which an EventSource could not send), and calls onEvent for each until
// the stream ends or signal aborts it (an abort rejects with the
// browser's AbortError). Errors before the first event are the API's, as
// call's.
export async function events(path: string, onEvent: (e: ServerEvent) => void, signal: AbortSignal): Promise<void> {
  if (!eventPaths.some((p) => p.test(path))) throw new Error("not an event-stream path: " + path);
  let res: Response;
  try {
    res = await fetch(path, { method: "GET", headers: authHeaders("text/event-stream"), credentials: "same-origin", cache: "no-store", signal });
  } catch (err) {
    if (signal.aborted) throw err;
    throw new ApiError(0, "network", "The server could not be reached.");
  }
  if (!res.ok) throw failed(res.status, res.statusText, await res.text(), true);
  if (!res.body) throw new ApiError(res.status, "invalid_answer", "The server's answer had no body.");
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  let name = "";
  let data: string[] = [];
  const line = (l: string): void => {
    if (l === "") {
      if (data.length) onEvent({ event: name || "message", data: data.join("\n") });
      name = "";
      data = [];
      return;
    }
    if (l.startsWith(":")) return; // a comment: a keepalive
    const colon = l.indexOf(":");
    const field = colon < 0 ? l : l.slice(0, colon);
    let value = colon < 0 ? "" : l.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") name = value;
    else if (field === "data") data.push(value);
  };
  let ended = false;
  try {
    for (;;) {
      let chunk: ReadableStreamReadResult<Uint8Array>;
      try {
        chunk = await reader.read();
      } catch (err) {
        if (signal.aborted) throw err;
        throw new ApiError(0, "network", "The stream from the server broke.");
      }
      if (chunk.done) break;
      const lines = (buf + dec.decode(chunk.value, { stream: true })).split("\n");
      buf = lines.pop() ?? "";
      for (const l of lines) line(l.endsWith("\r") ? l.slice(0, -1) : l);
    }
    ended = true;
    buf += dec.decode();
    if (buf !== "") line(buf);
    line("");
  } finally {
    // Left early (onEvent threw, or an abort): the connection goes too.
    if (!ended) reader.cancel().catch(() => {});
  }
}

// follow reads a followed stream (events at path(), asked at each
// opening) until signal aborts, and opens it again when it ends: at once
// when the server ended it in its time (after 10 s or more), else later
// each time (1 s, doubling to 15 s; an event resets it). An "error" event
// goes to failed (the stream ends there; the next opening says why in
// full, a revoked key's as the refusal that ends the session), as does a
// failed opening. A refusal (4xx but 429) stops it until the caller
// starts another (with other filters); so does the session's end.
export async function follow(path: () => string, onEvent: (e: ServerEvent) => void, signal: AbortSignal, failed: (err: unknown) => void): Promise<void> {
  for (let tries = 0; !signal.aborted; tries++) {
    const opened = Date.now();
    try {
      await events(
        path(),
        (e) => {
          if (e.event === "error") {
            const msg = (JSON.parse(e.data) as { error?: { message?: string } }).error?.message;
            failed(new ApiError(0, "stream", msg ?? "The stream from the server failed."));
            return;
          }
          tries = 0;
          onEvent(e);
        },
        signal,
      );
      if (Date.now() - opened > 10_000) {
        tries = -1;
        continue;
      }
    } catch (err) {
      if (signal.aborted) return;
      if (err instanceof ApiError && err.sessionEnded) return;
      failed(err);
      if (err instanceof ApiError && err.status >= 400 && err.status < 500 && err.status !== 429) return;
    }
    await sleep(Math.min(1000 * 2 ** tries, 15_000), signal);
  }
}
