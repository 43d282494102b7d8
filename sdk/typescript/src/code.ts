// Execution and Result: a code interpreter's finished cell and its rich
// results, as Sandbox.runCode returns them: the API's CodeExecution and
// CodeResult, with the images decoded to bytes.

import { fromBase64, toBase64 } from "./client.js";
import type { Chart, CodeError, CodeExecution, CodeResult } from "./types.js";

/** The formats a Result may have, in the order {@link Result.formats} lists them. */
export const RESULT_FORMATS = ["text", "html", "markdown", "svg", "png", "jpeg", "latex", "json", "chart"] as const;

/** One of {@link RESULT_FORMATS}. */
export type ResultFormat = (typeof RESULT_FORMATS)[number];

/**
 * One rich result of a cell (a CodeResult): the value of its last
 * expression (`is_main_result`) or something it displayed (a chart, for
 * one), in each format the kernel gave that the host keeps; the others are
 * undefined. `png` and `jpeg` are the image's bytes (the API's base64,
 * decoded), `width` and `height` the PNG's (else the JPEG's) in pixels;
 * `json` is the application/json value; `chart` what a Matplotlib figure
 * draws, as data ({@link Chart}). HTML, SVG, Markdown and LaTeX are
 * the sandbox's own text: never render them trusted. JSON.stringify gives
 * the CodeResult (images as base64).
 */
export class Result {
  readonly is_main_result: boolean;
  // (Declared, not defined: a format it lacks is not a property at all.)
  declare readonly text?: string;
  declare readonly html?: string;
  declare readonly markdown?: string;
  declare readonly svg?: string;
  declare readonly png?: Uint8Array;
  declare readonly jpeg?: Uint8Array;
  declare readonly latex?: string;
  declare readonly json?: unknown;
  declare readonly chart?: Chart;
  declare readonly width?: number;
  declare readonly height?: number;
  readonly #data: CodeResult;

  constructor(data: CodeResult) {
    if (!data || typeof data !== "object") throw new TypeError("the server's answer is not a code result");
    this.#data = data;
    this.is_main_result = data.is_main_result === true;
    if (typeof data.text === "string") this.text = data.text;
    if (typeof data.html === "string") this.html = data.html;
    if (typeof data.markdown === "string") this.markdown = data.markdown;
    if (typeof data.svg === "string") this.svg = data.svg;
    if (typeof data.latex === "string") this.latex = data.latex;
    if (typeof data.png === "string") this.png = fromBase64(data.png);
    if (typeof data.jpeg === "string") this.jpeg = fromBase64(data.jpeg);
    if ("json" in data) this.json = data.json;
    if (data.chart && typeof data.chart === "object") this.chart = data.chart;
    if (typeof data.width === "number") this.width = data.width;
    if (typeof data.height === "number") this.height = data.height;
  }

  /** The formats it has, of RESULT_FORMATS, in that order (a json value may be null). */
  formats(): ResultFormat[] {
    return RESULT_FORMATS.filter((f) => f in this.#data && this.#data[f] !== undefined);
  }

  /** The CodeResult it was made from. */
  toJSON(): CodeResult {
    const out: CodeResult = { is_main_result: this.is_main_result };
    for (const f of this.formats()) {
      const v = this[f];
      (out as unknown as Record<string, unknown>)[f] = v instanceof Uint8Array ? toBase64(v) : v;
    }
    if (this.width !== undefined) out.width = this.width;
    if (this.height !== undefined) out.height = this.height;
    return out;
  }
}

/**
 * A finished cell (a CodeExecution), as Sandbox.runCode returns it:
 * `status` is "ok", "error" (the cell raised: see `error`), "timeout" (it
 * was interrupted; the context stays usable) or "died" (the kernel died:
 * the context answers so until it is restarted). `stdout` and `stderr` are
 * what it printed (`stdout_truncated` and `stderr_truncated` say the server
 * kept only the first part), `results` its rich results (`results_dropped`
 * counts those the server did not keep), `text` the main result's text.
 * JSON.stringify gives the CodeExecution (images as base64).
 */
export class Execution {
  readonly context_id: string;
  readonly execution_count: number;
  readonly status: CodeExecution["status"];
  readonly stdout: string;
  readonly stderr: string;
  readonly results: Result[];
  /** The exception the cell raised, as data (runCode does not throw it). */
  declare readonly error?: CodeError;
  readonly duration_ms: number;
  readonly stdout_truncated: boolean;
  readonly stderr_truncated: boolean;
  readonly results_dropped: number;

  /** `results`, when given, replace the CodeExecution's own (a streamed cell's end has none). */
  constructor(data: CodeExecution, results?: Result[]) {
    if (!data || typeof data !== "object") throw new TypeError("the server's answer is not a finished cell");
    this.context_id = data.context_id;
    this.execution_count = data.execution_count;
    this.status = data.status;
    this.stdout = data.stdout ?? "";
    this.stderr = data.stderr ?? "";
    this.results = results ?? (data.results ?? []).map((r) => new Result(r));
    if (data.error) this.error = data.error;
    this.duration_ms = data.duration_ms ?? 0;
    this.stdout_truncated = data.stdout_truncated === true;
    this.stderr_truncated = data.stderr_truncated === true;
    this.results_dropped = data.results_dropped ?? 0;
  }

  /** The result that is the value of the cell's last expression, if any. */
  get mainResult(): Result | undefined {
    return this.results.find((r) => r.is_main_result);
  }

  /** The main result's text (its text/plain, e.g. "42"), if any. */
  get text(): string | undefined {
    return this.mainResult?.text;
  }

  /** The cell as a CodeExecution. */
  toJSON(): CodeExecution {
    const out: CodeExecution = {
      context_id: this.context_id,
      execution_count: this.execution_count,
      status: this.status,
      stdout: this.stdout,
      stderr: this.stderr,
      results: this.results.map((r) => r.toJSON()),
      duration_ms: this.duration_ms,
      stdout_truncated: this.stdout_truncated,
      stderr_truncated: this.stderr_truncated,
    };
    if (this.error) out.error = this.error;
    if (this.results_dropped) out.results_dropped = this.results_dropped;
    return out;
  }
}
