import type { HareBox, RequestOptions } from "./client.js";
import { Execution, Result } from "./code.js";
import { HareBoxError } from "./errors.js";
import type { Pty } from "./pty.js";
import type {
  CodeContext,
  CodeContextRequest,
  CodeError,
  CodeLanguage,
  CodeRequest,
  ExecEvent,
  ExecRequest,
  ExecResult,
  FileData,
  FileInfo,
  FileList,
  FirewallPolicy,
  ForkRequest,
  MetricSampleList,
  MetricsQuery,
  Process,
  ProcessOutputEvent,
  ProcessOutputQuery,
  PtyQuery,
  Resources,
  Sandbox as SandboxData,
  SandboxURL,
  Site,
  Snapshot,
  SnapshotRequest,
  State,
  URLList,
  URLRequest,
} from "./types.js";

/** Options of {@link Sandbox.run}: an ExecRequest without the command. */
export type RunOptions = Omit<ExecRequest, "cmd" | "argv"> & RequestOptions;

/** Options of {@link Sandbox.writeFile}. */
export interface WriteOptions extends RequestOptions {
  /** Octal permission bits, e.g. "0644" (the default). */
  mode?: string;
  owner?: string;
  make_parents?: boolean;
}

/** Options of {@link Sandbox.pty}: openPty's query, and the call's options. */
export type PtyOptions = PtyQuery & RequestOptions;

/** Options of {@link Sandbox.runCode}. */
export interface RunCodeOptions {
  /** The context it runs in: its ID, or the CodeContext createCodeContext returned. Default: the default context of `language`. */
  context?: string | CodeContext;
  /** "python" (the default), "javascript", "typescript" or "bash". */
  language?: CodeLanguage;
  /** Variables for this cell, over the sandbox's own. */
  env?: Record<string, string>;
  /**
   * The cell's timeout, in milliseconds (sent as `timeout_seconds`; default
   * the server's 300 s, at most 3600 s): it interrupts the cell, and the
   * context stays usable. The request waits for it, plus the server's
   * grace and a margin.
   */
  timeoutMs?: number;
  /** Aborts the request; it then rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Text the cell writes to stdout, as it comes. Any callback makes the cell stream. */
  onStdout?: (text: string) => void | Promise<void>;
  /** Text the cell writes to stderr, as it comes. */
  onStderr?: (text: string) => void | Promise<void>;
  /** Each rich result, as it comes. */
  onResult?: (result: Result) => void | Promise<void>;
  /** The exception the cell raised. */
  onError?: (error: CodeError) => void | Promise<void>;
}

const FIELDS = ["id", "name", "account_id", "project_id", "project", "fleet_id", "fleet", "state", "image", "size", "labels", "no_env", "environment", "third_party", "monitoring", "snapshots", "agent", "site", "mesh_address", "mesh_name", "created_at", "expires_at", "error"] as const;

/**
 * A sandbox: the server's description of it (every field of the Sandbox
 * schema) and methods that act on it through the client that returned it.
 * JSON.stringify gives the plain description.
 */
export class Sandbox implements SandboxData {
  declare id: string;
  declare name?: string;
  declare account_id: string;
  declare project_id: string;
  declare project: string;
  declare fleet_id?: string;
  declare fleet?: string;
  declare state: State;
  declare image: string;
  declare size: Resources;
  declare labels?: Record<string, string>;
  declare no_env: boolean;
  declare environment?: string;
  declare third_party?: boolean;
  declare monitoring?: boolean;
  declare snapshots?: boolean;
  declare agent?: "ok" | "unresponsive";
  declare site: Site;
  /** Its address on its project's private mesh, if it is on it. */
  declare mesh_address?: string;
  /** Its name there, "NAME.PROJECT.internal". */
  declare mesh_name?: string;
  declare created_at: string;
  declare expires_at?: string;
  declare error?: string;
  readonly #client: HareBox;

  constructor(client: HareBox, data: SandboxData) {
    this.#client = client;
    this.#update(data);
  }

  /** The client this sandbox was returned by. */
  get client(): HareBox {
    return this.#client;
  }

  #update(data: SandboxData): this {
    if (!data || typeof data !== "object" || typeof data.id !== "string") {
      throw new TypeError("the server's answer is not a sandbox");
    }
    const self = this as unknown as Record<string, unknown>;
    const src = data as unknown as Record<string, unknown>;
    for (const f of FIELDS) {
      if (src[f] === undefined) delete self[f];
      else self[f] = src[f];
    }
    return this;
  }

  /** The plain description (what the server returned). */
  toJSON(): SandboxData {
    const out: Record<string, unknown> = {};
    const self = this as unknown as Record<string, unknown>;
    for (const f of FIELDS) if (self[f] !== undefined) out[f] = self[f];
    return out as unknown as SandboxData;
  }

  /**
   * Runs a command and waits for it: a string runs with /bin/sh -c, an
   * array runs a program directly. A non-zero exit is a result, not an
   * error.
   */
  run(cmd: string | string[], options: RunOptions = {}): Promise<ExecResult> {
    const { signal, timeoutMs, ...req } = options;
    return this.#client.exec(this.id, { body: { ...req, ...command(cmd) }, ...opt(signal, timeoutMs) });
  }

  /** Runs a command, yielding its output as it comes (see HareBox.execStream). */
  stream(cmd: string | string[], options: RunOptions = {}): AsyncGenerator<ExecEvent, void, undefined> {
    const { signal, timeoutMs, ...req } = options;
    return this.#client.execStream(this.id, { body: { ...req, ...command(cmd) }, ...opt(signal, timeoutMs) });
  }

  /** Starts a command in the background ({@link Sandbox.boot} starts a stopped sandbox). */
  start(cmd: string | string[], options: RunOptions = {}): Promise<Process> {
    const { signal, timeoutMs, ...req } = options;
    return this.#client.startProcess(this.id, { body: { ...req, ...command(cmd) }, ...opt(signal, timeoutMs) });
  }

  /**
   * A background process's output from the given offsets (default 0),
   * then, with `follow`, what comes until it ends (see
   * HareBox.getProcessOutput).
   *
   *     for await (const ev of box.processOutput(p.id, { follow: true })) { ... }
   */
  processOutput(pid: string, options: RequestOptions & ProcessOutputQuery = {}): AsyncGenerator<ProcessOutputEvent, void, undefined> {
    const { signal, timeoutMs, ...query } = options;
    return this.#client.getProcessOutput(this.id, pid, { query, ...opt(signal, timeoutMs) });
  }

  /**
   * Opens an interactive terminal in the sandbox (see HareBox.openPty):
   * the login shell, or `cmd`, on a terminal of `rows` by `cols`.
   *
   *     const pty = await box.pty({ rows: 30, cols: 90, cmd: "top" });
   */
  pty(options: PtyOptions = {}): Promise<Pty> {
    const { signal, timeoutMs, ...query } = options;
    return this.#client.openPty(this.id, { query, ...opt(signal, timeoutMs) });
  }

  /**
   * Runs a cell of code in this sandbox's code interpreter (a sandbox made
   * from the code-interpreter image; see HareBox.runCode) and resolves to
   * the finished cell, an {@link Execution}: `text` is the value of its
   * last expression as text, `results` its rich results (charts' `png` as
   * bytes), `error` the exception it raised (not thrown). Without
   * `context` it runs in the default context of `language`, whose state
   * lasts from one cell to the next.
   *
   * With any of the callbacks the cell is streamed (HareBox.runCodeStream):
   * `onStdout` and `onStderr` get the text as the cell writes it,
   * `onResult` each Result, `onError` the cell's exception, as they come
   * (a callback's promise is awaited before the next event); the Execution
   * then has what was streamed.
   *
   *     const x = await box.runCode("x = 41\nx + 1");   // x.text === "42"
   */
  async runCode(code: string, options: RunCodeOptions = {}): Promise<Execution> {
    const { context, language, env, timeoutMs, signal, onStdout, onStderr, onResult, onError } = options;
    const body: CodeRequest = { code };
    if (context !== undefined) body.context_id = typeof context === "string" ? context : context.id;
    if (language !== undefined) body.language = language;
    if (env !== undefined) body.env = env;
    if (timeoutMs !== undefined) {
      if (!(timeoutMs > 0) || !Number.isFinite(timeoutMs)) {
        throw new HareBoxError(0, "invalid", "runCode: timeoutMs must be a number of milliseconds above 0", "timeoutMs");
      }
      body.timeout_seconds = timeoutMs / 1000;
    }
    const call = signal ? { body, signal } : { body };
    if (!onStdout && !onStderr && !onResult && !onError) {
      return new Execution(await this.#client.runCode(this.id, call));
    }
    const stdout: string[] = [];
    const stderr: string[] = [];
    const results: Result[] = [];
    for await (const ev of this.#client.runCodeStream(this.id, call)) {
      switch (ev.type) {
        case "stdout":
          stdout.push(ev.text);
          await onStdout?.(ev.text);
          break;
        case "stderr":
          stderr.push(ev.text);
          await onStderr?.(ev.text);
          break;
        case "result": {
          const r = new Result(ev.result);
          results.push(r);
          await onResult?.(r);
          break;
        }
        case "exception":
          await onError?.(ev.error);
          break;
        case "end":
          return new Execution({ ...ev.execution, stdout: stdout.join(""), stderr: stderr.join("") }, results);
      }
    }
    // (runCodeStream throws first.)
    throw new HareBoxError(0, "network", "runCodeStream: the stream ended before the end event");
  }

  /** The code interpreter's contexts (see HareBox.listCodeContexts). */
  async codeContexts(options: RequestOptions = {}): Promise<CodeContext[]> {
    return (await this.#client.listCodeContexts(this.id, options)).contexts ?? [];
  }

  /**
   * Starts a code interpreter context: a kernel of its own ("python", the
   * default, "javascript", "typescript" or "bash") that shares only the filesystem with the others,
   * its code running in `cwd` (default the user's home) with `env` added
   * (see HareBox.createCodeContext). `runCode(code, { context })` runs in it.
   */
  createCodeContext(options: RequestOptions & CodeContextRequest = {}): Promise<CodeContext> {
    const { signal, timeoutMs, ...body } = options;
    return this.#client.createCodeContext(this.id, { body, ...opt(signal, timeoutMs) });
  }

  /** Gives a context a fresh kernel: its state is lost, and a kernel that died comes back. */
  restartCodeContext(context: string, options: RequestOptions = {}): Promise<CodeContext> {
    return this.#client.restartCodeContext(this.id, context, options);
  }

  /** Shuts a context's kernel down (see HareBox.deleteCodeContext). */
  deleteCodeContext(context: string, options: RequestOptions = {}): Promise<void> {
    return this.#client.deleteCodeContext(this.id, context, options);
  }

  /** Writes a file (bytes; a string is UTF-8). */
  writeFile(path: string, data: FileData, options: WriteOptions = {}): Promise<FileInfo> {
    const { signal, timeoutMs, ...q } = options;
    return this.#client.writeFile(this.id, { query: { ...q, path }, body: data, ...opt(signal, timeoutMs) });
  }

  /** Reads a file's bytes. */
  readFile(path: string, options: RequestOptions = {}): Promise<Uint8Array> {
    return this.#client.readFile(this.id, { query: { path }, ...options });
  }

  /** Reads a file as UTF-8 text. */
  async readText(path: string, options: RequestOptions = {}): Promise<string> {
    return new TextDecoder().decode(await this.readFile(path, options));
  }

  /** Describes a path. */
  stat(path: string, options: RequestOptions = {}): Promise<FileInfo> {
    return this.#client.statFile(this.id, { query: { path }, ...options });
  }

  /** Lists a directory. */
  listFiles(path: string, options: RequestOptions = {}): Promise<FileList> {
    return this.#client.listFiles(this.id, { query: { path }, ...options });
  }

  /** Creates a directory and its parents. */
  mkdir(path: string, options: RequestOptions & { mode?: string } = {}): Promise<FileInfo> {
    const { signal, timeoutMs, mode } = options;
    return this.#client.mkdir(this.id, { query: { path, mode }, ...opt(signal, timeoutMs) });
  }

  /** Removes a file or directory. */
  removeFile(path: string, options: RequestOptions & { recursive?: boolean } = {}): Promise<void> {
    const { signal, timeoutMs, recursive } = options;
    return this.#client.removeFile(this.id, { query: { path, recursive }, ...opt(signal, timeoutMs) });
  }

  /** The firewall policy in force. */
  getFirewall(options: RequestOptions = {}): Promise<FirewallPolicy> {
    return this.#client.getFirewall(this.id, options);
  }

  /** Replaces the firewall policy. */
  setFirewall(policy: FirewallPolicy, options: RequestOptions = {}): Promise<FirewallPolicy> {
    return this.#client.setFirewall(this.id, { ...options, body: policy });
  }

  /**
   * Publishes this sandbox's TCP `port` (1 to 65535) as a URL on the
   * server's ingress (see HareBox.createURL). `auth` "token" (the default)
   * puts it behind a token: its `token` and `link` are shown only here and
   * by {@link Sandbox.rotateURL}. `auth` "oidc" with `oidc` (the
   * `OIDCRule`: issuer, audience, and at least one of subjects,
   * emails and groups) puts it behind OpenID Connect ID tokens, taken as
   * `Authorization: Bearer`; such a URL has no token and no link. `oidc` is
   * sent when given; the server refuses it without auth "oidc" (400).
   * `auth` "mtls" puts it behind TLS client certificates signed by the
   * project's URL CA (see HareBox.setURLCA) and not revoked.
   */
  createURL(port: number, options: RequestOptions & Omit<URLRequest, "port"> = {}): Promise<SandboxURL> {
    const { signal, timeoutMs, ...rest } = options;
    return this.#client.createURL(this.id, { body: { ...rest, port }, ...opt(signal, timeoutMs) });
  }

  /** This sandbox's URLs, oldest first, without tokens (see HareBox.listURLs). */
  listURLs(options: RequestOptions = {}): Promise<URLList> {
    return this.#client.listURLs(this.id, options);
  }

  /** One of this sandbox's URLs (url_...), without its token. */
  getURL(url: string, options: RequestOptions = {}): Promise<SandboxURL> {
    return this.#client.getURL(this.id, url, options);
  }

  /**
   * Gives a token URL a new token (see HareBox.rotateURL): when this
   * returns, the old token is refused and what it opened is cut. Returns the
   * URL with its new `token` and `link`. An oidc URL has no token: invalid
   * (400).
   */
  rotateURL(url: string, options: RequestOptions = {}): Promise<SandboxURL> {
    return this.#client.rotateURL(this.id, url, options);
  }

  /** Unpublishes the URL (see HareBox.deleteURL). */
  deleteURL(url: string, options: RequestOptions = {}): Promise<void> {
    return this.#client.deleteURL(this.id, url, options);
  }

  /** Its monitoring samples, oldest first (see HareBox.getSandboxMetrics). */
  metrics(options: RequestOptions & MetricsQuery = {}): Promise<MetricSampleList> {
    const { signal, timeoutMs, ...query } = options;
    return this.#client.getSandboxMetrics(this.id, { query, ...opt(signal, timeoutMs) });
  }

  /** Re-reads the sandbox from the server; returns this, updated. */
  async refresh(options: RequestOptions = {}): Promise<this> {
    return this.#update(await this.#client.getSandbox(this.id, options));
  }

  /** Freezes the sandbox; returns this, updated. */
  async pause(options: RequestOptions = {}): Promise<this> {
    return this.#update(await this.#client.pauseSandbox(this.id, options));
  }

  /** Continues a paused sandbox, or restores a hibernated one; returns this, updated. */
  async resume(options: RequestOptions = {}): Promise<this> {
    return this.#update(await this.#client.resumeSandbox(this.id, options));
  }

  /**
   * Shuts the sandbox down, keeping its disk (state "stopped"); returns
   * this, updated. {@link Sandbox.boot} starts it again.
   */
  async stop(options: RequestOptions = {}): Promise<this> {
    return this.#update(await this.#client.stopSandbox(this.id, options));
  }

  /**
   * Boots a stopped sandbox again on its disk (HareBox.startSandbox; named
   * boot because {@link Sandbox.start} starts a background command);
   * returns this, updated.
   */
  async boot(options: RequestOptions = {}): Promise<this> {
    return this.#update(await this.#client.startSandbox(this.id, options));
  }

  /**
   * Writes the sandbox's memory, device state and disk to encrypted files on
   * the host and stops its VMM (state "hibernated"; see
   * HareBox.hibernateSandbox); returns this, updated. {@link Sandbox.resume}
   * restores it.
   */
  async hibernate(options: RequestOptions = {}): Promise<this> {
    return this.#update(await this.#client.hibernateSandbox(this.id, options));
  }

  /** Deletes the sandbox (VM, disks, network); returns this, updated. */
  async delete(options: RequestOptions = {}): Promise<this> {
    return this.#update(await this.#client.deleteSandbox(this.id, options));
  }

  /**
   * Makes `count` new sandboxes from this running or paused one (default 1;
   * see HareBox.forkSandbox) and returns them, running: each is restored
   * from one snapshot of this sandbox, with its own ID, data key,
   * machine-id and network. `name` names them NAME-1 ... NAME-count;
   * `labels` are added to this sandbox's. Every clone is made or none is.
   */
  async fork(options: RequestOptions & ForkRequest = {}): Promise<Sandbox[]> {
    const { signal, timeoutMs, ...body } = options;
    return (await this.#client.forkSandbox(this.id, { body, ...opt(signal, timeoutMs) })).sandboxes;
  }

  /**
   * Snapshots this running or paused sandbox (memory, device state, its
   * disk's writes; see HareBox.createSnapshot); it is paused only while the
   * snapshot is written. `create({ snapshot: snap.id })` makes a sandbox
   * from it.
   */
  snapshot(options: RequestOptions & SnapshotRequest = {}): Promise<Snapshot> {
    const { signal, timeoutMs, ...body } = options;
    return this.#client.createSnapshot(this.id, { body, ...opt(signal, timeoutMs) });
  }
}

function command(cmd: string | string[]): { cmd: string } | { argv: string[] } {
  return Array.isArray(cmd) ? { argv: cmd } : { cmd };
}

function opt(signal: AbortSignal | undefined, timeoutMs: number | undefined): RequestOptions {
  const o: RequestOptions = {};
  if (signal) o.signal = signal;
  if (timeoutMs !== undefined) o.timeoutMs = timeoutMs;
  return o;
}
