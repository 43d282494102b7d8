/**
 * The error every HareBox call throws: an error the server returned
 * (status is its HTTP status, code its error code), or one the client met
 * before or instead of a response (status 0; code "invalid" for a bad
 * argument, "timeout" when the request's time ran out, "network" when the
 * server could not be reached or the response was malformed).
 *
 * A request the caller aborted through its own signal rejects with the
 * signal's reason (an AbortError), not with a HareBoxError.
 */
export class HareBoxError extends Error {
  /** The HTTP status, or 0 for an error met in the client. */
  readonly status: number;
  /** The server's error code ("invalid", "not_found", ...) or the client's. */
  readonly code: string;
  /** The request field at fault, as a JSON path, when there is one. */
  readonly field: string | undefined;

  constructor(status: number, code: string, message: string, field?: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "HareBoxError";
    this.status = status;
    this.code = code;
    this.field = field || undefined;
  }

  override toString(): string {
    let s = `${this.name}: ${this.message} (${this.code}`;
    if (this.status) s += `, HTTP ${this.status}`;
    if (this.field) s += `, field ${this.field}`;
    return s + ")";
  }
}

/**
 * The error a request past its API key's rate throws (HTTP 429, code
 * "rate_limited"): retryAfter is the server's Retry-After, in seconds
 * (undefined if it sent none).
 */
export class RateLimitedError extends HareBoxError {
  /** Seconds to wait before the key's next request succeeds. */
  readonly retryAfter: number | undefined;

  constructor(status: number, code: string, message: string, field?: string, retryAfter?: number) {
    super(status, code, message, field);
    this.name = "RateLimitedError";
    this.retryAfter = retryAfter;
  }

  override toString(): string {
    const s = super.toString();
    return this.retryAfter === undefined ? s : `${s.slice(0, -1)}, retry after ${this.retryAfter} s)`;
  }
}

const statusOfCode: Record<string, number> = {
  invalid: 400,
  unauthorized: 401,
  forbidden: 403,
  not_found: 404,
  conflict: 409,
  too_large: 413,
  rate_limited: 429,
  budget_exceeded: 402,
  internal: 500,
  over_capacity: 503,
  unavailable: 503,
  timeout: 504,
};

const codeOfStatus: Record<number, string> = {
  400: "invalid",
  401: "unauthorized",
  402: "budget_exceeded",
  403: "forbidden",
  404: "not_found",
  405: "not_found",
  409: "conflict",
  413: "too_large",
  429: "rate_limited",
  503: "unavailable",
  504: "timeout",
};

/** The HTTP status an error code stands for (an error event in a stream). */
export function statusForCode(code: string): number {
  return statusOfCode[code] ?? 500;
}

/**
 * A Retry-After header in seconds: delay-seconds, or an HTTP date (seconds
 * from now, at least 0); undefined when absent or malformed.
 */
export function parseRetryAfter(value: string | null | undefined): number | undefined {
  const v = value?.trim();
  if (!v) return undefined;
  if (/^[+-]?[\d.]+$/.test(v)) {
    const n = Number(v);
    return Number.isFinite(n) && n >= 0 ? n : undefined;
  }
  const when = Date.parse(v);
  return Number.isNaN(when) ? undefined : Math.max(0, (when - Date.now()) / 1000);
}

/**
 * Builds a HareBoxError from a non-2xx response's body text (and its
 * Retry-After header, for a RateLimitedError).
 */
export function errorFromBody(status: number, statusText: string, text: string, retryAfter?: string | null): HareBoxError {
  const make = (code: string, message: string, field?: string): HareBoxError =>
    code === "rate_limited"
      ? new RateLimitedError(status, code, message, field, parseRetryAfter(retryAfter))
      : new HareBoxError(status, code, message, field);
  try {
    const v: unknown = JSON.parse(text);
    const e = (v as { error?: unknown } | null)?.error as { code?: unknown; message?: unknown; field?: unknown } | undefined;
    if (e && typeof e === "object" && typeof e.code === "string") {
      return make(
        e.code,
        typeof e.message === "string" ? e.message : e.code,
        typeof e.field === "string" ? e.field : undefined,
      );
    }
  } catch {
    // Not JSON: a proxy's page, say. Fall through.
  }
  const snippet = text.replace(/\s+/g, " ").trim().slice(0, 200);
  const code = codeOfStatus[status] ?? (status >= 500 ? "internal" : "invalid");
  return make(code, `HTTP ${status} ${statusText}${snippet ? `: ${snippet}` : ""}`);
}
