import { Buffer } from "node:buffer";

import { HareBoxError, errorFromBody, statusForCode } from "./errors.js";
import { OPERATIONS, type OperationId } from "./operations.js";
import { Sandbox } from "./sandbox.js";
import { readSSE, type SSEMessage } from "./sse.js";
import { dialPty, type Pty } from "./pty.js";
import { PIN_MISMATCH, certificateError, describeTrust, parseTrust, trustingAgent, trustingFetch, type Trust } from "./tls.js";
import type {
  Account,
  AccountList,
  AccountQuery,
  AccountUpdate,
  AuditEntry,
  AuditKey,
  AuditList,
  AuditQuery,
  AuditReport,
  Budget,
  BudgetList,
  BudgetRequest,
  ClientCert,
  ClientCertList,
  ClientCertRequest,
  CodeContext,
  CodeContextList,
  CodeContextRequest,
  CodeEvent,
  CodeExecution,
  CodeRequest,
  CodeResult,
  CodeError,
  CommandList,
  CommandsQuery,
  CreateRequest,
  Environment,
  EnvironmentList,
  Volume,
  VolumeList,
  VolumeRequest,
  EnvironmentQuery,
  EnvironmentRequest,
  EnvironmentUpdate,
  EnvironmentVersion,
  EnvironmentVersionList,
  EventList,
  EventQuery,
  ExecEvent,
  ExecRequest,
  ExecResult,
  FileData,
  FileInfo,
  FileList,
  FirewallPolicy,
  Fleet,
  FleetList,
  ForkRequest,
  GetProcessQuery,
  Health,
  Readiness,
  Info,
  Key,
  KeyList,
  KeyRequest,
  KeyWithSecret,
  KillRequest,
  ProcessInput,
  StartProcessRequest,
  ListSandboxesQuery,
  MetricSampleList,
  MetricsQuery,
  MkdirQuery,
  MoveFileQuery,
  NameRequest,
  PathQuery,
  Process,
  ProcessList,
  ProcessOutputEvent,
  ProcessOutputQuery,
  Project,
  ProjectList,
  ProjectUpdate,
  PtyQuery,
  RemoveFileQuery,
  Sandbox as SandboxData,
  SandboxURL,
  Snapshot,
  SnapshotList,
  Image,
  ImageBuildRequest,
  ImageList,
  HostList,
  HostName,
  Pool,
  DrainReport,
  MoveResult,
  HostRemoval,
  SnapshotRequest,
  SnapshotsQuery,
  URLCA,
  URLCAQuery,
  URLCARequest,
  URLList,
  URLRequest,
  UsageList,
  UsageQuery,
  WriteFileQuery,
} from "./types.js";

/** The version of this client. */
export const VERSION = "1.0.0";

/** How a client reaches the server. */
export interface HareBoxOptions {
  /** The server's base URL, http or https. Default: $HAREBOX_URL. */
  url?: string;
  /** The API key, sent as a Bearer token. Default: $HAREBOX_API_KEY. */
  apiKey?: string;
  /**
   * The time, in milliseconds, an ordinary request may take (default
   * 60000). Long operations get more: creating a sandbox 600 s, exec its
   * own timeout plus a margin, runCode the cell's own timeout plus the
   * server's grace and a margin, file transfers 300 s.
   */
  timeoutMs?: number;
  /**
   * The fetch to use (default: the global fetch). It cannot be combined
   * with `ca`; when it is given, HAREBOX_CA is not read. openPty does not
   * use it (its WebSocket connects through undici's global dispatcher).
   */
  fetch?: typeof fetch;
  /**
   * How an https server is trusted. Default (also when empty):
   * $HAREBOX_CA; without either, the CA certificates Node trusts by
   * default, host name verified. Either:
   * - the path of a PEM file of one or more CA certificates: they are the
   *   roots trusted instead of Node's default ones, and the host name is verified;
   * - `sha256:` and the server certificate's SHA-256 fingerprint (64 hex
   *   digits, any case, `:` between bytes allowed): every connection must
   *   present exactly that certificate; the chain and the host name are
   *   then not checked.
   *
   * It is checked when the client is constructed (a missing or unreadable
   * file, no PEM certificate in it, or a malformed fingerprint throws
   * HareBoxError code "invalid", field "ca"), and ignored for an http URL.
   * The requests then go through the `undici` package's fetch, not the
   * global one, with an Agent of the client's own, which openPty's
   * WebSocket uses too.
   */
  ca?: string;
}

/** Options every call takes. */
export interface RequestOptions {
  /** Aborts the request; it then rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Overrides the request's timeout, in milliseconds; 0 means none. */
  timeoutMs?: number;
}

/** A call's options: its query parameters and body, as the API names them. */
export interface CallOptions<Q = never, B = never> extends RequestOptions {
  query?: Q;
  body?: B;
}

/** A call whose query (path) is required. */
export interface PathCallOptions<Q extends PathQuery, B = never> extends RequestOptions {
  query: Q;
  body?: B;
}

/** The body of listSandboxes, with sandbox objects. */
export interface SandboxList {
  sandboxes: Sandbox[];
}

const DEFAULT_TIMEOUT_MS = 60_000;
const CREATE_TIMEOUT_MS = 600_000;
const LIFECYCLE_TIMEOUT_MS = 180_000;
const FILE_TIMEOUT_MS = 300_000;
/** Added to a command's own timeout: the server needs a moment to report. */
const EXEC_MARGIN_MS = 30_000;
const DEFAULT_EXEC_TIMEOUT_S = 300;
/** The server's default cell timeout (CodeRequest.timeout_seconds). */
const DEFAULT_CODE_TIMEOUT_S = 300;
/** How long past a cell's timeout the server waits for the code interpreter to say it interrupted the cell. */
const CODE_GRACE_MS = 30_000;
const DEFAULT_WAIT_TIMEOUT_S = 60;
/** How long a followed event stream may say nothing (it sends a keepalive every 15 s). */
const FOLLOW_IDLE_MS = 60_000;

type Kind = "json" | "bytes" | "text" | "none";

interface Send {
  query?: unknown;
  /** A JSON value, or raw bytes for writeFile. */
  json?: unknown;
  raw?: FileData;
  /** The Accept header, when not the operation's usual one. */
  accept?: string;
  signal?: AbortSignal | undefined;
  timeoutMs: number;
  /** Statuses besides 2xx that are answers, not errors. */
  ok?: number[];
}

/**
 * A client of the HareBox REST API. Each API operation is a method named
 * by its operationId; it takes the path parameters in order, then
 * `{ query, body, signal, timeoutMs }`. Failures throw {@link HareBoxError}.
 */
export class HareBox {
  /** The server's base URL (no trailing slash). */
  readonly url: string;
  readonly timeoutMs: number;
  readonly #apiKey: string;
  readonly #fetch: typeof fetch;
  /** The Agent of a client with `ca`, which openPty's WebSocket uses too. */
  readonly #agent: (() => Promise<import("undici").Agent>) | undefined;
  /** How the server's certificate is trusted, as an error message says it. */
  readonly #trustNote: string;

  constructor(options: HareBoxOptions = {}) {
    const raw = options.url ?? process.env.HAREBOX_URL ?? "";
    if (!raw) {
      throw new HareBoxError(0, "invalid", "no server URL: pass { url } or set HAREBOX_URL", "url");
    }
    let u: URL;
    try {
      u = new URL(raw);
    } catch {
      throw new HareBoxError(0, "invalid", "the server URL is not a valid URL", "url");
    }
    if (u.protocol !== "http:" && u.protocol !== "https:") {
      throw new HareBoxError(0, "invalid", `the server URL must be http or https, not ${u.protocol.replace(/:$/, "")}`, "url");
    }
    if (u.username || u.password) {
      throw new HareBoxError(0, "invalid", "the server URL must not carry credentials; pass { apiKey } instead", "url");
    }
    if (u.search || u.hash) {
      throw new HareBoxError(0, "invalid", "the server URL must not have a query or a fragment", "url");
    }
    this.url = u.origin + u.pathname.replace(/\/+$/, "");
    const key = options.apiKey ?? process.env.HAREBOX_API_KEY ?? "";
    if (/[\s]/.test(key.trim()) || /[\r\n]/.test(key)) {
      throw new HareBoxError(0, "invalid", "the API key must not contain white space", "apiKey");
    }
    this.#apiKey = key.trim();
    const t = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    if (!(t >= 0) || !Number.isFinite(t)) {
      throw new HareBoxError(0, "invalid", "timeoutMs must be a number of milliseconds, 0 or more", "timeoutMs");
    }
    this.timeoutMs = t;
    if (options.ca !== undefined && typeof options.ca !== "string") {
      throw new HareBoxError(0, "invalid", "ca must be a string: a CA file's path or sha256:FINGERPRINT", "ca");
    }
    if (options.fetch !== undefined && options.ca) {
      throw new HareBoxError(0, "invalid", "pass either fetch or ca, not both: the ca option sets up a fetch of its own", "ca");
    }
    // The option wins over the environment; a fetch of the caller's wins over both.
    const [ca, source] = options.ca ? [options.ca, "the ca option"] : [options.fetch === undefined ? process.env.HAREBOX_CA ?? "" : "", "HAREBOX_CA"];
    const trust: Trust | undefined = ca && u.protocol === "https:" ? parseTrust(ca, source) : undefined;
    this.#trustNote = options.fetch === undefined ? ` ${describeTrust(trust)}` : "";
    this.#agent = options.fetch === undefined && trust ? trustingAgent(trust) : undefined;
    const f = options.fetch ?? (this.#agent && trust ? trustingFetch(trust, this.#agent) : globalThis.fetch);
    if (typeof f !== "function") {
      throw new HareBoxError(0, "invalid", "no fetch: HareBox needs Node 20 or later", "fetch");
    }
    this.#fetch = f;
  }

  /** Keeps the API key out of logs: this is what console.log shows. */
  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return `HareBox { url: ${JSON.stringify(this.url)} }`;
  }

  toJSON(): { url: string } {
    return { url: this.url };
  }

  // ---- Conveniences -------------------------------------------------

  /** Creates a sandbox and returns it, running, as a {@link Sandbox}. */
  create(fields: CreateRequest = {}, options: RequestOptions = {}): Promise<Sandbox> {
    return this.createSandbox({ ...options, body: fields });
  }

  // ---- Operations, in the document's order --------------------------

  /** Liveness of the server (no key needed). */
  async getHealth(options: CallOptions = {}): Promise<Health> {
    return this.#call("getHealth", [], "json", this.#plain(options));
  }

  /**
   * Whether the server can serve now (no key needed): `status` is `ready`,
   * or `not_ready` (the server answered 503, returned here rather than
   * thrown), and `checks` gives each part (`database`, `hypervisor`, and
   * `network` where the server has a sandbox network) as `ok` or
   * `unavailable`.
   */
  async getReady(options: CallOptions = {}): Promise<Readiness> {
    return this.#call("getReady", [], "json", { ...this.#plain(options), ok: [503] });
  }

  /** The server's OpenAPI document (no key needed). */
  async getOpenAPI(options: CallOptions = {}): Promise<Record<string, unknown>> {
    return this.#call("getOpenAPI", [], "json", this.#plain(options));
  }

  /** Server version, hypervisor backend and site. */
  async getInfo(options: CallOptions = {}): Promise<Info> {
    return this.#call("getInfo", [], "json", this.#plain(options));
  }

  /** Creates a sandbox; returns once its agent answers. */
  async createSandbox(options: CallOptions<never, CreateRequest> = {}): Promise<Sandbox> {
    const data = await this.#call<SandboxData>("createSandbox", [], "json", {
      json: options.body ?? {},
      signal: options.signal,
      timeoutMs: this.#timeout(options, CREATE_TIMEOUT_MS),
    });
    return new Sandbox(this, data);
  }

  /** Lists sandboxes, oldest first. */
  async listSandboxes(options: CallOptions<ListSandboxesQuery> = {}): Promise<SandboxList> {
    const q = options.query ?? {};
    let label = q.label;
    if (label && typeof label === "object" && !Array.isArray(label)) {
      label = Object.entries(label).map(([k, v]) => `${k}=${v}`);
    }
    const res = await this.#call<{ sandboxes: SandboxData[] }>("listSandboxes", [], "json", {
      query: { state: q.state, label, account: q.account, project: q.project, fleet: q.fleet },
      signal: options.signal,
      timeoutMs: this.#timeout(options, 0),
    });
    return { sandboxes: (res.sandboxes ?? []).map((d) => new Sandbox(this, d)) };
  }

  /** Gets a sandbox (deleted ones too). */
  async getSandbox(id: string, options: CallOptions = {}): Promise<Sandbox> {
    return new Sandbox(this, await this.#call<SandboxData>("getSandbox", [id], "json", this.#plain(options)));
  }

  /**
   * Deletes a sandbox: its data key first (its disk, console log, env and
   * command history are encrypted under it, unless the server runs with
   * --plaintext-disks), then its VM, files and network; returns it, deleted.
   */
  async deleteSandbox(id: string, options: CallOptions = {}): Promise<Sandbox> {
    return new Sandbox(this, await this.#call<SandboxData>("deleteSandbox", [id], "json", this.#plain(options, LIFECYCLE_TIMEOUT_MS)));
  }

  /** Freezes a running sandbox. */
  async pauseSandbox(id: string, options: CallOptions = {}): Promise<Sandbox> {
    return new Sandbox(this, await this.#call<SandboxData>("pauseSandbox", [id], "json", this.#plain(options, LIFECYCLE_TIMEOUT_MS)));
  }

  /**
   * Continues a paused sandbox, or restores a hibernated one from its files
   * (admitted again as a create is: host capacity, budgets).
   */
  async resumeSandbox(id: string, options: CallOptions = {}): Promise<Sandbox> {
    return new Sandbox(this, await this.#call<SandboxData>("resumeSandbox", [id], "json", this.#plain(options, CREATE_TIMEOUT_MS)));
  }

  /**
   * Shuts a running or paused sandbox down, keeping its disk, data key and
   * record (state "stopped"): startSandbox boots it again on that disk;
   * what ran in it (processes, memory) is gone. A stopped sandbox holds no
   * host capacity and is charged for its disk only.
   */
  async stopSandbox(id: string, options: CallOptions = {}): Promise<Sandbox> {
    return new Sandbox(this, await this.#call<SandboxData>("stopSandbox", [id], "json", this.#plain(options, LIFECYCLE_TIMEOUT_MS)));
  }

  /**
   * Boots a stopped sandbox again on its disk, admitted as a create is: a
   * full host throws over_capacity (503), a budget with no room
   * budget_exceeded (402). A sandbox that is not stopped, or that stopped
   * on its own (its VM exited), throws conflict (409).
   */
  async startSandbox(id: string, options: CallOptions = {}): Promise<Sandbox> {
    return new Sandbox(this, await this.#call<SandboxData>("startSandbox", [id], "json", this.#plain(options, CREATE_TIMEOUT_MS)));
  }

  /**
   * Writes a running or paused sandbox's memory, device state and disk to
   * encrypted files on the host's disk (under its data key), stops its VMM
   * and gives up its network (state "hibernated"): it holds no host RAM and
   * is charged for its disk only. resumeSandbox restores it, also after
   * hareboxd restarts or the host reboots. Refused for a sandbox created
   * with `snapshots: false`.
   */
  async hibernateSandbox(id: string, options: CallOptions = {}): Promise<Sandbox> {
    return new Sandbox(this, await this.#call<SandboxData>("hibernateSandbox", [id], "json", this.#plain(options, CREATE_TIMEOUT_MS)));
  }

  /**
   * The sandbox expires ttlSeconds from now (the TTL reaper deletes it
   * then), or never for 0; it replaces the TTL it had, shorter or longer.
   */
  async setSandboxTimeout(id: string, ttlSeconds: number, options: CallOptions = {}): Promise<Sandbox> {
    return new Sandbox(this, await this.#call<SandboxData>("setSandboxTimeout", [id], "json", {
      json: { ttl_seconds: ttlSeconds },
      signal: options.signal,
      timeoutMs: this.#timeout(options, LIFECYCLE_TIMEOUT_MS),
    }));
  }

  /**
   * Moves a running, paused, hibernated or stopped sandbox to host `to`
   * of the deployment, as it was (its processes run on; a stopped one's
   * disk goes), for the operator only:
   * the sandbox on its new host, the hosts, and how long it did not run
   * (`paused_ms`). Refused before anything happens when the host is down,
   * lacks the same image build or has no room, and for a sandbox with
   * volumes.
   */
  async moveSandbox(id: string, to: string, options: CallOptions = {}): Promise<{ sandbox: Sandbox; from: string; to: string; paused_ms: number }> {
    const res = await this.#call<MoveResult>("moveSandbox", [id], "json", {
      json: { to },
      signal: options.signal,
      timeoutMs: this.#timeout(options, LIFECYCLE_TIMEOUT_MS),
    });
    return { ...res, sandbox: new Sandbox(this, res.sandbox) };
  }

  // Forks and snapshots. A sandbox created with `snapshots: false` refuses both.

  /**
   * Makes `count` new sandboxes (default 1) from a running or paused
   * sandbox: it is paused only while one snapshot is written, then each
   * clone is restored from it with its own ID, data key, machine-id, fresh
   * kernel entropy, network (the source's firewall policy copied),
   * placeholders and CA. Every clone is made or none is; returns them,
   * running, as {@link Sandbox} objects. `body.name` names the clones
   * NAME-1 ... NAME-count; `body.labels` are added to the source's.
   */
  async forkSandbox(id: string, options: CallOptions<never, ForkRequest> = {}): Promise<SandboxList> {
    const res = await this.#call<{ sandboxes?: SandboxData[] }>("forkSandbox", [id], "json", {
      json: options.body,
      signal: options.signal,
      timeoutMs: this.#timeout(options, CREATE_TIMEOUT_MS),
    });
    return { sandboxes: (res.sandboxes ?? []).map((d) => new Sandbox(this, d)) };
  }

  /**
   * Snapshots a running or paused sandbox (memory, device state, its disk's
   * writes); it is paused only while the snapshot is written. The snapshot
   * is written under a random key of its own (the sandbox's key does not
   * open it) and outlives the sandbox; `create({ snapshot: id })` makes a
   * sandbox from it.
   */
  async createSnapshot(id: string, options: CallOptions<never, SnapshotRequest> = {}): Promise<Snapshot> {
    return this.#call("createSnapshot", [id], "json", {
      json: options.body,
      signal: options.signal,
      timeoutMs: this.#timeout(options, CREATE_TIMEOUT_MS),
    });
  }

  /** Lists the snapshots the caller sees, oldest first; `query.sandbox` keeps one source sandbox's. */
  async listSnapshots(options: CallOptions<SnapshotsQuery> = {}): Promise<SnapshotList> {
    return this.#call("listSnapshots", [], "json", this.#plain(options));
  }

  /** Gets a snapshot (snap_...). */
  async getSnapshot(snapshot: string, options: CallOptions = {}): Promise<Snapshot> {
    return this.#call("getSnapshot", [snapshot], "json", this.#plain(options));
  }

  /**
   * Erases a snapshot's key, then removes its files. Sandboxes made from it
   * keep running (they need nothing of it); a create from it in flight
   * makes this throw conflict (409).
   */
  async deleteSnapshot(snapshot: string, options: CallOptions = {}): Promise<void> {
    await this.#call("deleteSnapshot", [snapshot], "none", this.#plain(options));
  }

  /** Lists the hosts of the deployment (hareboxd that share a PostgreSQL store), up or down, with what they run and their leases: the operator only. */
  async listHosts(options: CallOptions = {}): Promise<HostList> {
    return this.#call("listHosts", [], "json", this.#plain(options));
  }

  /** Takes a host that is down out of the deployment for good (the operator only): its sandboxes that are not deleted become deleted (data keys erased) and snapshots of them go. Conflict while the host is up or its lease has not lapsed. */
  async deleteHost(name: string, options: CallOptions = {}): Promise<HostRemoval> {
    return this.#call("deleteHost", [name], "json", this.#plain(options));
  }

  /** Has a host make a new key for its end of the mesh's tunnels (the operator only); the other hosts take its new public key. Conflict for a host without a mesh tunnel. */
  async rotateMeshKey(name: string, options: CallOptions = {}): Promise<HostName> {
    return this.#call("rotateMeshKey", [name], "json", this.#plain(options));
  }

  /** Drains a host (the operator only): it takes no new sandbox, and its running, paused, hibernated and stopped sandboxes move one by one to the hosts placement picks. What moved where, and what stayed, with why. It stays draining until undrainHost. */
  async drainHost(name: string, options: CallOptions = {}): Promise<DrainReport> {
    return this.#call("drainHost", [name], "json", this.#plain(options, 3_600_000));
  }

  /** Lets new sandboxes go to a drained host again (the operator only). */
  async undrainHost(name: string, options: CallOptions = {}): Promise<HostName> {
    return this.#call("undrainHost", [name], "json", this.#plain(options));
  }

  /** The warm pool as the host that answers keeps it (the operator only): `pool` ("IMAGE:PRESET" to idle sandboxes kept), `source` ("deployment", or "host": its own hareboxd --pool) and `idle` (how many it holds now). */
  async getPool(options: CallOptions = {}): Promise<Pool> {
    return this.#call("getPool", [], "json", this.#plain(options));
  }

  /** Makes `pool` (for example `{ "default:small": 2 }`; `{}` keeps none) the warm pool of every host of the deployment, in place of each host's hareboxd --pool (the operator only). Invalid for an image the answering host does not have. */
  async setPool(pool: Record<string, number>, options: CallOptions = {}): Promise<Pool> {
    return this.#call("setPool", [], "json", this.#withBody({ ...options, body: { pool } }));
  }

  /** Removes the deployment's warm pool (the operator only): each host keeps its own hareboxd --pool again. */
  async resetPool(options: CallOptions = {}): Promise<Pool> {
    return this.#call("resetPool", [], "json", this.#plain(options));
  }

  /** Lists the images sandboxes can be created from (each name's newest build), by name. */
  async listImages(options: CallOptions = {}): Promise<ImageList> {
    return this.#call("listImages", [], "json", this.#plain(options));
  }

  /**
   * Builds an image from an OCI image in a registry (the operator only):
   * `body: { name: "myimg", from: "registry:REF" }`. Resolves once it is
   * built (minutes for a large image; the default timeout is 30 minutes).
   */
  async buildImage(options: CallOptions<never, ImageBuildRequest> & { body: ImageBuildRequest }): Promise<Image> {
    return this.#call("buildImage", [], "json", {
      json: options.body,
      signal: options.signal,
      timeoutMs: this.#timeout(options, 1_800_000),
    });
  }

  /**
   * Removes every build of an image (the operator only); throws conflict
   * (409) while a sandbox or snapshot uses it, and for the built-in images.
   */
  async deleteImage(name: string, options: CallOptions = {}): Promise<void> {
    await this.#call("deleteImage", [name], "none", this.#plain(options));
  }

  // Published ports: a port is published on the server's ingress behind a
  // token (hburl_...), which a client sends in the X-HareBox-Token header
  // or as `Authorization: Bearer`, or gets as a cookie by visiting the
  // URL's `link`; or behind OpenID Connect (auth "oidc"): an ID token its
  // rule allows, as `Authorization: Bearer`; or behind client certificates
  // (auth "mtls"): a TLS client certificate signed by the project's URL CA
  // and not revoked. The ingress takes a token or ID token off every
  // request before it reaches the guest. The token is only in the answers
  // of createURL and rotateURL.

  /**
   * Publishes a TCP port of the sandbox (`body.port`, 1 to 65535) as a URL
   * on the server's ingress. The guest's port is reached only through the
   * ingress. `body.auth` "token" (the default) puts it behind a token: the
   * URL is returned with its `token` and `link`, shown only here and by
   * rotateURL. `body.auth` "oidc" with `body.oidc` (an `OIDCRule`: an
   * https issuer, an audience, and at least one of subjects, emails and
   * groups) puts it behind OpenID Connect: the ingress takes an ID token as
   * `Authorization: Bearer` (an invalid one gets 401, one the rule does not
   * allow 403, and 503 when the issuer cannot be reached); the URL has no
   * token and no link. A rule without auth "oidc", or a missing or bad one
   * with it, throws invalid (400). `body.auth` "mtls" puts it behind TLS
   * client certificates: the ingress takes one signed by the project's URL
   * CA (setURLCA) and not revoked; host form only, so the ingress's host
   * must be a name. A port published already throws conflict (409); a
   * server without an ingress, unavailable (503).
   */
  async createURL(id: string, options: CallOptions<never, URLRequest>): Promise<SandboxURL> {
    return this.#call("createURL", [id], "json", this.#withBody(options));
  }

  /** Lists the sandbox's URLs, oldest first (without tokens). */
  async listURLs(id: string, options: CallOptions = {}): Promise<URLList> {
    return this.#call("listURLs", [id], "json", this.#plain(options));
  }

  /** Gets a URL (url_...) of the sandbox, without its token. */
  async getURL(id: string, url: string, options: CallOptions = {}): Promise<SandboxURL> {
    return this.#call("getURL", [id, url], "json", this.#plain(options));
  }

  /**
   * Gives a token URL a new token, atomically: when this returns, the new
   * token works, every request sent with the old one is refused, and requests,
   * event streams, WebSockets and HTTP/1.1 keep-alive connections opened with the
   * old one are cut. Returns the URL with its new `token` and `link`. An oidc
   * URL has no token: invalid (400).
   */
  async rotateURL(id: string, url: string, options: CallOptions = {}): Promise<SandboxURL> {
    return this.#call("rotateURL", [id, url], "json", this.#plain(options));
  }

  /**
   * Unpublishes a URL: its port is closed to the ingress again, and
   * requests, streams and WebSockets its token opened are cut.
   */
  async deleteURL(id: string, url: string, options: CallOptions = {}): Promise<void> {
    await this.#call("deleteURL", [id, url], "none", this.#plain(options));
  }

  // The URL certificate authority and client certificates: an mtls URL
  // takes a TLS client certificate signed by its project's URL CA and not
  // revoked. query.project names the project (ID or name; default the
  // account's default project), query.account the operator's account.

  /** Gets the project's URL CA: its certificate (PEM) and whether it was uploaded. Throws not_found (404) when it has none. */
  async getURLCA(options: CallOptions<URLCAQuery> = {}): Promise<URLCA> {
    return this.#call("getURLCA", [], "json", this.#plain(options));
  }

  /**
   * Sets the project's URL CA: `body.certificate` (a CA certificate, PEM)
   * uploads it, and you issue its client certificates yourself; no body, or
   * one without a certificate, has the server make a new CA (ECDSA P-256,
   * its key sealed in the server's secret store) that issueClientCert
   * issues from. The old CA's certificates stop working unless the new CA
   * has its key, and requests and connections they opened are cut;
   * revocations stay. An empty
   * `body.certificate` throws invalid here, so that it is never taken for
   * none.
   */
  async setURLCA(options: CallOptions<URLCAQuery, URLCARequest> = {}): Promise<URLCA> {
    const certificate: unknown = options.body?.certificate;
    if (certificate !== undefined && (typeof certificate !== "string" || certificate.trim() === "")) {
      throw new HareBoxError(0, "invalid", "setURLCA: body.certificate must be a CA certificate (PEM text); leave it out for the server to make a new CA", "certificate");
    }
    return this.#call("setURLCA", [], "json", this.#withBody(options));
  }

  /**
   * Deletes the project's URL CA and its key: its mtls URLs refuse every
   * client until a new one is set. Revocations stay.
   */
  async deleteURLCA(options: CallOptions<URLCAQuery> = {}): Promise<void> {
    await this.#call("deleteURLCA", [], "none", this.#plain(options));
  }

  /**
   * Issues a client certificate (ECDSA P-256, extended key usage
   * clientAuth) for `body.name` (its subject's common name), valid for
   * `body.ttl` (a Go duration, default 2160h, at most 8760h), from the
   * project's CA, which the server made (an uploaded CA: invalid, 400).
   * Returns it with its `certificate` and `private_key` (PEM, PKCS#8): the
   * key is in this answer only, the server does not keep it.
   */
  async issueClientCert(options: CallOptions<URLCAQuery, ClientCertRequest>): Promise<ClientCert> {
    return this.#call("issueClientCert", [], "json", this.#withBody(options));
  }

  /** Lists the certificates the project issued and the serials it revoked, oldest first, without keys. */
  async listClientCerts(options: CallOptions<URLCAQuery> = {}): Promise<ClientCertList> {
    const list = await this.#call<ClientCertList>("listClientCerts", [], "json", this.#plain(options));
    return { ...list, certs: list.certs ?? [] };
  }

  /**
   * Revokes a client certificate by its serial number (hex; issued here or
   * by an uploaded CA): when this returns, the project's mtls URLs refuse
   * it, and requests, streams, WebSockets and HTTP/1.1 connections it
   * opened are cut. Returns the revoked certificate's record.
   */
  async revokeClientCert(serial: string, options: CallOptions<URLCAQuery> = {}): Promise<ClientCert> {
    return this.#call("revokeClientCert", [serial], "json", this.#plain(options));
  }

  /** Runs a command and waits for it. A non-zero exit is a result, not an error. */
  async exec(id: string, options: CallOptions<never, ExecRequest>): Promise<ExecResult> {
    const body = options?.body ?? {};
    return this.#call("exec", [id], "json", {
      json: execBody(body),
      signal: options?.signal,
      timeoutMs: this.#timeout(options ?? {}, execTimeoutMs(body)),
    });
  }

  /**
   * Runs a command and yields its output as it comes: `stdout` and
   * `stderr` events with the bytes, then one `exit` event with the result
   * (its stdout and stderr empty). An `error` event from the server throws
   * a HareBoxError. Breaking out of the loop cancels the request.
   *
   *     for await (const ev of hb.execStream(id, { body: { cmd: "ls" } })) { ... }
   */
  async *execStream(id: string, options: CallOptions<never, ExecRequest>): AsyncGenerator<ExecEvent, void, undefined> {
    const body = options?.body ?? {};
    const send: Send = {
      json: execBody(body),
      signal: options?.signal,
      timeoutMs: this.#timeout(options ?? {}, execTimeoutMs(body)),
    };
    const { res, fail } = await this.#send("execStream", [id], send);
    if (!res.body) throw new HareBoxError(0, "network", "execStream: the response has no body");
    let ended = false;
    try {
      for await (const msg of readSSE(res.body)) {
        switch (msg.event) {
          case "stdout":
          case "stderr": {
            const v = parseEvent("execStream", msg.event, msg.data) as { data?: unknown };
            if (typeof v?.data !== "string") throw malformed("execStream", msg.event);
            yield { type: msg.event, data: fromBase64(v.data) };
            break;
          }
          case "exit": {
            const v = parseEvent("execStream", msg.event, msg.data) as ExecResult;
            if (!v || typeof v !== "object" || typeof v.exit_code !== "number") throw malformed("execStream", msg.event);
            ended = true;
            yield { type: "exit", result: v };
            return;
          }
          case "error":
            ended = true;
            throw streamError("execStream", msg.data, "the command failed");
          default:
          // An event this client does not know: skip it.
        }
      }
    } catch (err) {
      throw fail(err);
    }
    if (!ended) throw new HareBoxError(0, "network", "execStream: the stream ended before the exit event");
  }

  /** Starts a command in the background (keep_stdin: its stdin stays open for sendProcessInput). */
  async startProcess(id: string, options: CallOptions<never, StartProcessRequest>): Promise<Process> {
    return this.#call("startProcess", [id], "json", {
      json: execBody(options?.body ?? {}),
      signal: options?.signal,
      timeoutMs: this.#timeout(options ?? {}, 0),
    });
  }

  /** Lists background processes. */
  async listProcesses(id: string, options: CallOptions = {}): Promise<ProcessList> {
    return this.#call("listProcesses", [id], "json", this.#plain(options));
  }

  /** Gets a background process; with query.wait, waits for it to exit. */
  async getProcess(id: string, pid: string, options: CallOptions<GetProcessQuery> = {}): Promise<Process> {
    const q = options.query ?? {};
    const wait = q.wait ? (q.timeout_seconds ?? DEFAULT_WAIT_TIMEOUT_S) * 1000 + EXEC_MARGIN_MS : 0;
    return this.#call("getProcess", [id, pid], "json", {
      query: q,
      signal: options.signal,
      timeoutMs: this.#timeout(options, wait),
    });
  }

  /**
   * A background process's output, as the guest's agent keeps it (the last
   * 4 MiB of each stream), from `query.stdout_offset` and
   * `query.stderr_offset` (bytes already seen; default 0) on: `stdout` and
   * `stderr` events with their `offset` (the bytes of that stream before
   * `data`) and bytes, then `{ event: "exit", result }` once the process
   * has ended (its result, stdout and stderr empty). An offset past the
   * end of the stream's previous chunk, or past the offset asked for, means
   * the guest dropped the bytes between. Without `query.follow` the
   * iteration ends once what is kept has been sent, with no exit event if
   * the process still runs; with it, it goes on until the exit event, and
   * a stream that ends before it throws code "network": to go on, call
   * again with the offsets reached (each chunk's offset plus its length).
   * An `error` event throws a HareBoxError with the server's code; an
   * offset that goes back, or a malformed event, throws code "network".
   * Errors before the stream (not_found, forbidden, a bad offset) throw
   * as any call's. Leaving the loop cancels the request.
   *
   * `timeoutMs` bounds silence, not the stream: nothing from the server
   * for that long (default: the client's timeout, and with follow at least
   * 60 s; a following server sends a keepalive every 15 s; 0: no bound)
   * throws code "timeout". The time the loop's body takes does not count.
   *
   *     for await (const ev of hb.getProcessOutput(id, pid, { query: { follow: true } })) { ... }
   */
  async *getProcessOutput(id: string, pid: string, options: CallOptions<ProcessOutputQuery> = {}): AsyncGenerator<ProcessOutputEvent, void, undefined> {
    const query = options.query ?? {};
    if (query.follow !== undefined && typeof query.follow !== "boolean") {
      throw new HareBoxError(0, "invalid", "getProcessOutput: follow must be true or false", "follow");
    }
    const follow = query.follow === true;
    // Where each stream has got to: the offset asked for (the server
    // judges the values it is sent), then each chunk's end.
    const at = { stdout: startOffset(query.stdout_offset), stderr: startOffset(query.stderr_offset) };
    const idleMs = this.#timeout(options, follow ? FOLLOW_IDLE_MS : 0);
    for await (const msg of this.#events("getProcessOutput", "getProcessOutput", [id, pid], query, options.signal, idleMs)) {
      switch (msg.event) {
        case "stdout":
        case "stderr": {
          const v = parseEvent("getProcessOutput", msg.event, msg.data) as { offset?: unknown; data?: unknown } | null;
          const offset = v?.offset;
          if (typeof v?.data !== "string" || typeof offset !== "number" || !Number.isSafeInteger(offset) || offset < 0) {
            throw malformed("getProcessOutput", msg.event);
          }
          if (offset < at[msg.event]) {
            throw new HareBoxError(0, "network", `getProcessOutput: ${msg.event} went back from offset ${at[msg.event]} to ${offset}`);
          }
          const data = fromBase64(v.data);
          at[msg.event] = offset + data.length;
          yield { event: msg.event, offset, data };
          break;
        }
        case "exit": {
          const v = parseEvent("getProcessOutput", msg.event, msg.data) as ExecResult | null;
          if (!v || typeof v !== "object" || typeof v.exit_code !== "number") throw malformed("getProcessOutput", msg.event);
          yield { event: "exit", result: v };
          return;
        }
        case "error":
          throw streamError("getProcessOutput", msg.data, "the process's output could not be read");
        default:
        // An event this client does not know: skip it.
      }
    }
    if (follow) throw new HareBoxError(0, "network", "getProcessOutput: the stream ended before the exit event");
  }

  /**
   * Opens an interactive terminal in the sandbox, over a WebSocket (ws://
   * or wss:// at the client's URL): the user's login shell, or
   * `query.cmd`, on a pseudo-terminal of `query.rows` by `query.cols`
   * (default 24 by 80). Resolves once the server has accepted the session,
   * with a {@link Pty}: iterate it for what the terminal shows; write()
   * types, resize(), signal() and eof() control, close() ends it, and
   * `result` is the command's ExecResult.
   *
   * The upgrade request carries the API key and goes through the client's
   * TLS trust (`ca` or HAREBOX_CA) as its other requests do; without
   * either, and with a `fetch` given in the options (which is not used
   * here), it connects through undici's global dispatcher. An error answer before
   * the upgrade (not_found, forbidden, a bad query) throws a HareBoxError
   * as any call's does. `timeoutMs` bounds the opening only (default: the
   * client's timeout); the session lasts until the command exits, the
   * server's `timeout_seconds` ends it, or it is closed. The caller's
   * `signal` aborts the opening and, once open, closes the session.
   *
   *     const pty = await hb.openPty(id, { query: { rows: 30, cols: 90 } });
   *     pty.write("ls; exit\n");
   *     for await (const chunk of pty) process.stdout.write(chunk);
   *     const { exit_code } = await pty.result;
   */
  async openPty(id: string, options: CallOptions<PtyQuery> = {}): Promise<Pty> {
    const url = this.#url("openPty", [id], options.query);
    const timeoutMs = this.#timeout(options, 0);
    const headers: Record<string, string> = { "user-agent": `harebox-typescript/${VERSION}` };
    if (this.#apiKey) headers.authorization = `Bearer ${this.#apiKey}`;
    return dialPty({
      url,
      headers,
      dispatcher: this.#agent ? await this.#agent() : undefined,
      signal: options.signal,
      timeoutMs,
      networkError: (err) => this.#networkError("openPty", err),
    });
  }

  /** Signals a background process's process group (default SIGKILL). */
  async killProcess(id: string, pid: string, options: CallOptions<never, KillRequest> = {}): Promise<void> {
    await this.#call("killProcess", [id, pid], "none", {
      json: options.body,
      signal: options.signal,
      timeoutMs: this.#timeout(options, 0),
    });
  }

  /**
   * Gives a running background process input (its stdin must have been
   * kept open when it started): a terminal size, stdin bytes, their end.
   */
  async sendProcessInput(id: string, pid: string, options: CallOptions<never, ProcessInput>): Promise<void> {
    const { stdin, ...rest } = options.body ?? {};
    const bytes = typeof stdin === "string" ? new TextEncoder().encode(stdin) : stdin;
    await this.#call("sendProcessInput", [id, pid], "none", {
      json: bytes === undefined ? rest : { ...rest, stdin: toBase64(bytes) },
      signal: options.signal,
      timeoutMs: this.#timeout(options, 0),
    });
  }

  // The code interpreter: a sandbox made from an image with one
  // (code-interpreter) runs cells of code in contexts, kernels whose state
  // lasts from one cell to the next. Any other sandbox answers conflict (409).

  /**
   * Runs a cell (`body.code`) and waits for it. It runs in the context
   * `body.context_id`, else in the default one of `body.language` (python's
   * is "default", bash's "default-bash", javascript's
   * "default-javascript", typescript's "default-typescript"). The cell's own exception is the
   * answer's `error` (status "error"), not a throw; `body.timeout_seconds`
   * (default 300) interrupts the cell and leaves the context usable (status
   * "timeout"); a kernel that died answers status "died" until
   * restartCodeContext.
   */
  async runCode(id: string, options: CallOptions<never, CodeRequest>): Promise<CodeExecution> {
    const body = options?.body ?? ({} as CodeRequest);
    return this.#call("runCode", [id], "json", {
      json: body,
      signal: options?.signal,
      timeoutMs: this.#timeout(options ?? {}, codeTimeoutMs(body)),
    });
  }

  /**
   * Runs a cell as runCode does, and yields what it makes as it comes (the
   * same operation, answered with server-sent events): `stdout` and
   * `stderr` events with the text, `result` with each CodeResult,
   * `exception` with the cell's CodeError, then one `end` event with the
   * finished cell (its stdout, stderr and results empty). An `error` event
   * from the server throws a HareBoxError; so does a stream that ends before
   * the `end` event (code "network"). Errors before the stream (not_found,
   * conflict for a sandbox without a code interpreter, invalid) throw as
   * runCode's. Breaking out of the loop cancels the request.
   *
   *     for await (const ev of hb.runCodeStream(id, { body: { code: "print(1)" } })) { ... }
   */
  async *runCodeStream(id: string, options: CallOptions<never, CodeRequest>): AsyncGenerator<CodeEvent, void, undefined> {
    const body = options?.body ?? ({} as CodeRequest);
    const send: Send = {
      json: body,
      accept: "text/event-stream",
      signal: options?.signal,
      timeoutMs: this.#timeout(options ?? {}, codeTimeoutMs(body)),
    };
    const { res, fail } = await this.#send("runCode", [id], send);
    if (!res.body) throw new HareBoxError(0, "network", "runCodeStream: the response has no body");
    let ended = false;
    try {
      for await (const msg of readSSE(res.body)) {
        switch (msg.event) {
          case "stdout":
          case "stderr": {
            const v = parseEvent("runCodeStream", msg.event, msg.data) as { text?: unknown } | null;
            if (typeof v?.text !== "string") throw malformed("runCodeStream", msg.event);
            yield { type: msg.event, text: v.text };
            break;
          }
          case "result": {
            const v = parseEvent("runCodeStream", msg.event, msg.data) as CodeResult | null;
            if (!v || typeof v !== "object" || typeof v.is_main_result !== "boolean") throw malformed("runCodeStream", msg.event);
            yield { type: "result", result: v };
            break;
          }
          case "exception": {
            const v = parseEvent("runCodeStream", msg.event, msg.data) as CodeError | null;
            if (!v || typeof v !== "object" || typeof v.name !== "string" || typeof v.value !== "string") throw malformed("runCodeStream", msg.event);
            yield { type: "exception", error: v };
            break;
          }
          case "end": {
            const v = parseEvent("runCodeStream", msg.event, msg.data) as CodeExecution | null;
            if (!v || typeof v !== "object" || typeof v.status !== "string") throw malformed("runCodeStream", msg.event);
            ended = true;
            yield { type: "end", execution: v };
            return;
          }
          case "error":
            ended = true;
            throw streamError("runCodeStream", msg.data, "the cell could not be run");
          default:
          // An event this client does not know: skip it.
        }
      }
    } catch (err) {
      throw fail(err);
    }
    if (!ended) throw new HareBoxError(0, "network", "runCodeStream: the stream ended before the end event");
  }

  /** The code interpreter's contexts. */
  async listCodeContexts(id: string, options: CallOptions = {}): Promise<CodeContextList> {
    return this.#call("listCodeContexts", [id], "json", this.#plain(options));
  }

  /**
   * Starts a context: a kernel of its own ("python", the default,
   * "javascript", "typescript" or "bash"), sharing only the filesystem with the others, its code running
   * in `body.cwd` (default the user's home) with `body.env` added. Run
   * cells in it with `context_id` set to its `id`.
   */
  async createCodeContext(id: string, options: CallOptions<never, CodeContextRequest> = {}): Promise<CodeContext> {
    return this.#call("createCodeContext", [id], "json", { ...this.#withBody(options), timeoutMs: this.#timeout(options, LIFECYCLE_TIMEOUT_MS) });
  }

  /** Gives a context a fresh kernel: its state is lost, and a kernel that died comes back. */
  async restartCodeContext(id: string, context: string, options: CallOptions = {}): Promise<CodeContext> {
    return this.#call("restartCodeContext", [id, context], "json", this.#plain(options, LIFECYCLE_TIMEOUT_MS));
  }

  /** Shuts a context's kernel down. */
  async deleteCodeContext(id: string, context: string, options: CallOptions = {}): Promise<void> {
    await this.#call("deleteCodeContext", [id, context], "none", this.#plain(options));
  }

  /** Writes a file (raw bytes; a string is UTF-8); it appears whole or not at all. */
  async writeFile(id: string, options: PathCallOptions<WriteFileQuery, FileData>): Promise<FileInfo> {
    if (options?.body === undefined || options.body === null) {
      throw new HareBoxError(0, "invalid", "writeFile: body (the file's bytes) is required", "body");
    }
    return this.#call("writeFile", [id], "json", {
      query: options.query,
      raw: options.body,
      signal: options.signal,
      timeoutMs: this.#timeout(options, FILE_TIMEOUT_MS),
    });
  }

  /** Reads a file's bytes. */
  async readFile(id: string, options: PathCallOptions<PathQuery>): Promise<Uint8Array> {
    return this.#call("readFile", [id], "bytes", {
      query: options?.query,
      signal: options?.signal,
      timeoutMs: this.#timeout(options ?? {}, FILE_TIMEOUT_MS),
    });
  }

  /** Removes a file or directory (a non-empty one with query.recursive). */
  async removeFile(id: string, options: PathCallOptions<RemoveFileQuery>): Promise<void> {
    await this.#call("removeFile", [id], "none", { query: options?.query, signal: options?.signal, timeoutMs: this.#timeout(options ?? {}, 0) });
  }

  /** Describes a path. */
  async statFile(id: string, options: PathCallOptions<PathQuery>): Promise<FileInfo> {
    return this.#call("statFile", [id], "json", { query: options?.query, signal: options?.signal, timeoutMs: this.#timeout(options ?? {}, 0) });
  }

  /** Lists a directory. */
  async listFiles(id: string, options: PathCallOptions<PathQuery>): Promise<FileList> {
    return this.#call("listFiles", [id], "json", { query: options?.query, signal: options?.signal, timeoutMs: this.#timeout(options ?? {}, 0) });
  }

  /** Creates a directory and its parents. */
  async mkdir(id: string, options: PathCallOptions<MkdirQuery>): Promise<FileInfo> {
    return this.#call("mkdir", [id], "json", { query: options?.query, signal: options?.signal, timeoutMs: this.#timeout(options ?? {}, 0) });
  }

  /** Renames a file or directory (within one file system). */
  async moveFile(id: string, options: RequestOptions & { query: MoveFileQuery }): Promise<FileInfo> {
    return this.#call("moveFile", [id], "json", { query: options?.query, signal: options?.signal, timeoutMs: this.#timeout(options ?? {}, 0) });
  }

  /**
   * The sandbox's command history, oldest first: exec, execStream and
   * startProcess commands, with their output bounded and kept as the
   * account's retention says; `query.limit` keeps the newest N (1 to
   * 10000, default all). A sandbox created with `monitoring: false` has
   * none.
   */
  async listCommands(id: string, options: CallOptions<CommandsQuery> = {}): Promise<CommandList> {
    return this.#call("listCommands", [id], "json", this.#plain(options));
  }

  /** The sandbox's firewall policy. */
  async getFirewall(id: string, options: CallOptions = {}): Promise<FirewallPolicy> {
    return this.#call("getFirewall", [id], "json", this.#plain(options));
  }

  /** Replaces the firewall policy (atomically; first match wins). */
  async setFirewall(id: string, options: CallOptions<never, FirewallPolicy>): Promise<FirewallPolicy> {
    if (options?.body === undefined) {
      throw new HareBoxError(0, "invalid", "setFirewall: body (the policy) is required", "body");
    }
    return this.#call("setFirewall", [id], "json", { json: options.body, signal: options.signal, timeoutMs: this.#timeout(options, 0) });
  }

  // Accounts. Creating and deleting one is for the operator (the root key).

  /** Creates an account, with its default project (the operator only). */
  async createAccount(options: CallOptions<never, NameRequest>): Promise<Account> {
    return this.#call("createAccount", [], "json", this.#withBody(options));
  }

  /** Lists the accounts the caller sees (all for the operator, its own for a key). */
  async listAccounts(options: CallOptions = {}): Promise<AccountList> {
    return this.#call("listAccounts", [], "json", this.#plain(options));
  }

  /** Gets an account by ID (acc_...) or name. */
  async getAccount(account: string, options: CallOptions = {}): Promise<Account> {
    return this.#call("getAccount", [account], "json", this.#plain(options));
  }

  /**
   * Changes an account's settings: `retention` replaces its command-history
   * retention (days; a field left out keeps forever, 0 keeps nothing, {}
   * keeps everything). Lowering it purges at once.
   */
  async updateAccount(account: string, options: CallOptions<never, AccountUpdate>): Promise<Account> {
    return this.#call("updateAccount", [account], "json", this.#withBody(options));
  }

  /**
   * Deletes an account without live sandboxes: its projects and fleets go
   * and its keys are revoked (the operator only).
   */
  async deleteAccount(account: string, options: CallOptions = {}): Promise<void> {
    await this.#call("deleteAccount", [account], "none", this.#plain(options));
  }

  // Projects and fleets: query.account names the operator's account (ID or
  // name; default the default account); a key always acts in its own.

  /** Creates a project. */
  async createProject(options: CallOptions<AccountQuery, NameRequest>): Promise<Project> {
    return this.#call("createProject", [], "json", this.#withBody(options));
  }

  /** Lists an account's projects. */
  async listProjects(options: CallOptions<AccountQuery> = {}): Promise<ProjectList> {
    return this.#call("listProjects", [], "json", this.#plain(options));
  }

  /** Gets a project by ID (prj_...) or name. */
  async getProject(project: string, options: CallOptions<AccountQuery> = {}): Promise<Project> {
    return this.#call("getProject", [project], "json", this.#plain(options));
  }

  /**
   * Changes a project's settings: with `third_party_default` every new
   * sandbox of the project is third-party (only third-party-safe
   * environments).
   */
  async updateProject(project: string, options: CallOptions<AccountQuery, ProjectUpdate>): Promise<Project> {
    return this.#call("updateProject", [project], "json", this.#withBody(options));
  }

  /** Deletes a project without live sandboxes, and its fleets (not the default project). */
  async deleteProject(project: string, options: CallOptions<AccountQuery> = {}): Promise<void> {
    await this.#call("deleteProject", [project], "none", this.#plain(options));
  }

  /** Creates a fleet in a project. */
  async createFleet(project: string, options: CallOptions<AccountQuery, NameRequest>): Promise<Fleet> {
    return this.#call("createFleet", [project], "json", this.#withBody(options));
  }

  /** Lists a project's fleets. */
  async listFleets(project: string, options: CallOptions<AccountQuery> = {}): Promise<FleetList> {
    return this.#call("listFleets", [project], "json", this.#plain(options));
  }

  /** Gets a fleet by ID (flt_...) or name. */
  async getFleet(project: string, fleet: string, options: CallOptions<AccountQuery> = {}): Promise<Fleet> {
    return this.#call("getFleet", [project, fleet], "json", this.#plain(options));
  }

  /** Deletes a fleet without live sandboxes. */
  async deleteFleet(project: string, fleet: string, options: CallOptions<AccountQuery> = {}): Promise<void> {
    await this.#call("deleteFleet", [project, fleet], "none", this.#plain(options));
  }

  // API keys.

  /**
   * Creates a scoped API key; its secret (hbk_...) is in this answer only.
   * A key creates keys no wider than itself, in its own account.
   */
  async createKey(options: CallOptions<never, KeyRequest>): Promise<KeyWithSecret> {
    return this.#call("createKey", [], "json", this.#withBody(options));
  }

  /** Lists the keys the caller sees (a key sees itself and the keys it created). */
  async listKeys(options: CallOptions<AccountQuery> = {}): Promise<KeyList> {
    return this.#call("listKeys", [], "json", this.#plain(options));
  }

  /** Gets a key (never its secret). */
  async getKey(key: string, options: CallOptions = {}): Promise<Key> {
    return this.#call("getKey", [key], "json", this.#plain(options));
  }

  /** Revokes a key and every key it created, at once and for good; returns it, revoked. */
  async revokeKey(key: string, options: CallOptions = {}): Promise<Key> {
    return this.#call("revokeKey", [key], "json", this.#plain(options));
  }

  /** Replaces a key's secret; the old secret stops working when this returns. */
  async rotateKey(key: string, options: CallOptions = {}): Promise<KeyWithSecret> {
    return this.#call("rotateKey", [key], "json", this.#plain(options));
  }

  // Environments: query.project names the project (ID or name; default the
  // default project), query.account the operator's account. Secret values
  // are never in an answer: a secret variable shows as { secret: true }.

  /** Creates an environment and its version 1. */
  async createEnvironment(options: CallOptions<EnvironmentQuery, EnvironmentRequest>): Promise<Environment> {
    return this.#call("createEnvironment", [], "json", this.#withBody(options));
  }

  /** Lists a project's environments with their latest versions. */
  async listEnvironments(options: CallOptions<EnvironmentQuery> = {}): Promise<EnvironmentList> {
    return this.#call("listEnvironments", [], "json", this.#plain(options));
  }

  /** Gets an environment by ID (env_...) or name, with its latest version. */
  async getEnvironment(environment: string, options: CallOptions<EnvironmentQuery> = {}): Promise<Environment> {
    return this.#call("getEnvironment", [environment], "json", this.#plain(options));
  }

  /**
   * Makes a new version from the latest one (variables set and unset;
   * files, credentials and third_party_safe replaced when given); running
   * sandboxes keep the version they pinned.
   */
  async updateEnvironment(environment: string, options: CallOptions<EnvironmentQuery, EnvironmentUpdate>): Promise<Environment> {
    return this.#call("updateEnvironment", [environment], "json", this.#withBody(options));
  }

  /** Deletes an environment no live sandbox pinned, with its versions and sealed values. */
  async deleteEnvironment(environment: string, options: CallOptions<EnvironmentQuery> = {}): Promise<void> {
    await this.#call("deleteEnvironment", [environment], "none", this.#plain(options));
  }

  /** Lists an environment's versions, oldest first. */
  async listEnvironmentVersions(environment: string, options: CallOptions<EnvironmentQuery> = {}): Promise<EnvironmentVersionList> {
    return this.#call("listEnvironmentVersions", [environment], "json", this.#plain(options));
  }

  /** Gets one version (from 1) of an environment. */
  async getEnvironmentVersion(environment: string, version: number | string, options: CallOptions<EnvironmentQuery> = {}): Promise<EnvironmentVersion> {
    if (typeof version === "number" && !(Number.isSafeInteger(version) && version >= 1)) {
      throw new HareBoxError(0, "invalid", "getEnvironmentVersion: the version is a whole number from 1", "version");
    }
    return this.#call("getEnvironmentVersion", [environment, typeof version === "number" ? String(version) : version], "json", this.#plain(options));
  }

  // Volumes: query.project names the project, as for environments.

  /** Creates a volume, encrypted under its own key, on the server's host. */
  async createVolume(options: CallOptions<EnvironmentQuery, VolumeRequest>): Promise<Volume> {
    return this.#call("createVolume", [], "json", this.#withBody(options));
  }

  /** Lists a project's volumes. */
  async listVolumes(options: CallOptions<EnvironmentQuery> = {}): Promise<VolumeList> {
    return this.#call("listVolumes", [], "json", this.#plain(options));
  }

  /** Gets a volume by ID (vol_...) or name. */
  async getVolume(volume: string, options: CallOptions<EnvironmentQuery> = {}): Promise<Volume> {
    return this.#call("getVolume", [volume], "json", this.#plain(options));
  }

  /** Grows a volume no sandbox has attached. */
  async resizeVolume(volume: string, sizeGB: number, options: CallOptions<EnvironmentQuery> = {}): Promise<Volume> {
    return this.#call("resizeVolume", [volume], "json", this.#withBody({ ...options, body: { size_gb: sizeGB } }));
  }

  /** Deletes a volume no sandbox has attached: its key first, then its file. */
  async deleteVolume(volume: string, options: CallOptions<EnvironmentQuery> = {}): Promise<void> {
    await this.#call("deleteVolume", [volume], "none", this.#plain(options));
  }

  // The audit log: every change and every read of sandbox contents, denied
  // attempts too (who, from where, what, how it ended; never request
  // data). A key sees its own account's entries.

  /**
   * A page of audit entries, oldest first, by the query's filters; `next`,
   * present when the page is full, is the `after` of the next page
   * ({@link HareBox.auditEntries} follows it for you).
   */
  async listAudit(options: CallOptions<AuditQuery> = {}): Promise<AuditList> {
    const format: unknown = options.query?.format;
    if (format !== undefined && format !== "json") {
      throw new HareBoxError(0, "invalid", "listAudit reads JSON pages; auditEntries() iterates every entry", "format");
    }
    return this.#call("listAudit", [], "json", this.#plain(options));
  }

  /**
   * Every audit entry that matches the query, oldest first, one listAudit
   * page at a time (`limit` is the page size, default 1000), following each
   * page's `next`; `after` starts past a cursor. Breaking out of the loop
   * stops it.
   *
   *     for await (const e of hb.auditEntries({ query: { outcome: "denied" } })) { ... }
   */
  async *auditEntries(options: CallOptions<AuditQuery> = {}): AsyncGenerator<AuditEntry, void, undefined> {
    const query: AuditQuery = { limit: 1000, ...options.query };
    for (;;) {
      const page = await this.listAudit({ ...options, query });
      yield* page.entries ?? [];
      if (!page.next) return;
      if (page.next === query.after) throw new HareBoxError(0, "network", `listAudit: the next cursor ${page.next} does not move past the page`);
      query.after = page.next;
    }
  }

  /**
   * Checks the audit log's hash chain and signed checkpoints (the operator
   * only). When `ok` is false, `first_bad` is the first entry altered,
   * removed or reordered and `reason` says how it shows.
   */
  async verifyAudit(options: CallOptions = {}): Promise<AuditReport> {
    return this.#call("verifyAudit", [], "json", this.#plain(options, LIFECYCLE_TIMEOUT_MS));
  }

  /** The ed25519 public key (base64) that verifies the audit log's checkpoints. */
  async getAuditKey(options: CallOptions = {}): Promise<AuditKey> {
    return this.#call("getAuditKey", [], "json", this.#plain(options));
  }

  // Budgets and usage: query.account names the operator's account (ID or
  // name; default the default account, but every account for getUsage); a
  // key always acts in its own. Money is a decimal string ("25.00"), never
  // a number. A create, resume or start that a covering budget has no room
  // for throws code "budget_exceeded" (HTTP 402).

  /**
   * Creates a budget: a dollar limit on an account, project, fleet, label
   * selector or API key, with the action taken when it is reached. A
   * scoped key sets budgets only within what it sees.
   */
  async createBudget(options: CallOptions<AccountQuery, BudgetRequest>): Promise<Budget> {
    return this.#call("createBudget", [], "json", this.#withBody(options));
  }

  /** Lists an account's budgets with their spend and reservations. */
  async listBudgets(options: CallOptions<AccountQuery> = {}): Promise<BudgetList> {
    return this.#call("listBudgets", [], "json", this.#plain(options));
  }

  /** Gets a budget (bgt_...) with its spend and reservations. */
  async getBudget(budget: string, options: CallOptions = {}): Promise<Budget> {
    return this.#call("getBudget", [budget], "json", this.#plain(options));
  }

  /** Removes a budget (an API key's budget_usd goes with its key instead). */
  async deleteBudget(budget: string, options: CallOptions = {}): Promise<void> {
    await this.#call("deleteBudget", [budget], "none", this.#plain(options));
  }

  /**
   * Metered usage and its cost, one row per group (`group_by`, default
   * sandbox), sorted by group; intervals that overlap `from`..`to` count
   * whole. A key sees its own account's; the operator, without
   * `query.account`, every account's.
   */
  async getUsage(options: CallOptions<UsageQuery> = {}): Promise<UsageList> {
    return this.#call("getUsage", [], "json", this.#plain(options));
  }

  // Events: the engine's own acts, as audit entries: a budget's warnings,
  // its being reached and each sandbox it paused or deleted (principal
  // budget:ID), a guest using a placeholder where it is not swapped
  // (sandbox:ID), a VM that stopped on its own (engine). A key sees those
  // of the sandboxes and budgets it may see; the operator every account's,
  // or query.account's.

  /**
   * A page of events, oldest first. `next` is always there: the cursor to
   * pass as `after` (it moves past entries the caller may not see too).
   * {@link HareBox.followEvents} streams them as they come.
   */
  async listEvents(options: CallOptions<EventQuery> = {}): Promise<EventList> {
    const follow: unknown = (options.query as { follow?: unknown } | undefined)?.follow;
    if (follow !== undefined && follow !== false && follow !== "false") {
      throw new HareBoxError(0, "invalid", "listEvents reads JSON pages; followEvents() streams them", "follow");
    }
    return this.#call("listEvents", [], "json", this.#plain(options));
  }

  /**
   * Every event after `query.after` (default: all), oldest first, then
   * each one as it is appended: listEvents with follow=true, read as
   * server-sent events. It goes on until the caller's signal aborts (then
   * it rejects with the signal's reason) or the loop is left (the request
   * is then cancelled). An `error` event throws a HareBoxError with the
   * server's code. The server ends a stream after a while, to
   * authenticate the key again; this opens it again after the last
   * entry's `seq`, so nothing is missed or repeated. `timeoutMs`
   * bounds silence here, not the stream: the server sends a keepalive
   * every 15 s, and nothing at all for `timeoutMs` (default 60 s; 0: no
   * bound) throws code "timeout". The time the loop's body takes does not
   * count.
   *
   *     for await (const e of hb.followEvents({ query: { after: "120" }, signal })) { ... }
   */
  async *followEvents(options: CallOptions<EventQuery> = {}): AsyncGenerator<AuditEntry, void, undefined> {
    const idleMs = this.#timeout(options, FOLLOW_IDLE_MS);
    const query: EventQuery & { follow: true } = { ...options.query, follow: true };
    for (;;) {
      const opened = Date.now();
      for await (const msg of this.#events("followEvents", "listEvents", [], query, options.signal, idleMs)) {
        if (msg.event === "event") {
          const v = parseEvent("followEvents", msg.event, msg.data) as AuditEntry | null;
          if (!v || typeof v !== "object" || typeof v.seq !== "number") throw malformed("followEvents", msg.event);
          query.after = v.seq;
          yield v;
        } else if (msg.event === "error") {
          throw streamError("followEvents", msg.data, "the event stream failed");
        }
        // An event this client does not know: skip it.
      }
      // (A server that ends streams at once is not hammered.)
      if (Date.now() - opened < 1000) await pause(1000, options.signal);
    }
  }

  // Monitoring.

  /**
   * A sandbox's monitoring samples, oldest first: its VMM's CPU time and
   * resident memory, its disk files' size and its link's traffic, measured
   * on the host every 15 s (hareboxd --metrics-interval) while it runs or
   * is paused. `from` (at or after) and `to` (before) are RFC 3339;
   * `limit` is 1 to 10000 (default 1000). A sandbox created with
   * `monitoring: false` has none. They are kept as the account's
   * `history_days` says, after the sandbox is deleted too.
   */
  async getSandboxMetrics(id: string, options: CallOptions<MetricsQuery> = {}): Promise<MetricSampleList> {
    return this.#call("getSandboxMetrics", [id], "json", this.#plain(options));
  }

  /**
   * The server's metrics in the Prometheus text format, as the text it
   * sent: sandboxes by state, what admission reserved and allows, this
   * process and the Go runtime. They are the host's, across accounts: for
   * the root key, or a key whose scope's actions name `getServerMetrics`
   * (or `metrics:read`); any other key, `*` too, gets `forbidden`.
   */
  async getServerMetrics(options: CallOptions = {}): Promise<string> {
    return this.#call("getServerMetrics", [], "text", { ...this.#plain(options), accept: "text/plain" });
  }

  // ---- Plumbing -----------------------------------------------------

  /** A call with a JSON body ({} when the caller gave none: the server says what is missing). */
  #withBody(options: RequestOptions & { query?: unknown; body?: unknown } | undefined): Send {
    const o = options ?? {};
    return { query: o.query, json: o.body ?? {}, signal: o.signal, timeoutMs: this.#timeout(o, 0) };
  }

  #plain(options: RequestOptions & { query?: unknown }, atLeastMs = 0): Send {
    return { query: options.query, signal: options.signal, timeoutMs: this.#timeout(options, atLeastMs) };
  }

  /** A request's timeout: the caller's, else the larger of the default and the operation's. */
  #timeout(options: RequestOptions, atLeastMs: number): number {
    if (options.timeoutMs !== undefined) {
      if (!(options.timeoutMs >= 0) || !Number.isFinite(options.timeoutMs)) {
        throw new HareBoxError(0, "invalid", "timeoutMs must be a number of milliseconds, 0 or more", "timeoutMs");
      }
      return options.timeoutMs;
    }
    if (this.timeoutMs === 0) return 0;
    return Math.max(this.timeoutMs, atLeastMs);
  }

  /**
   * Sends a GET answered with server-sent events and yields them. A
   * watchdog aborts it, with a timeout error, when nothing (an event, a
   * keepalive) came for idleMs (0: no bound); the time the caller holds an
   * event is not counted. Leaving the loop cancels the request.
   */
  async *#events(name: string, op: OperationId, params: string[], query: unknown, callerSignal: AbortSignal | undefined, idleMs: number): AsyncGenerator<SSEMessage, void, undefined> {
    const idle = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    let busy = false;
    const touch = (): void => {
      clearTimeout(timer);
      if (idleMs <= 0 || busy) return;
      timer = setTimeout(() => {
        idle.abort(new HareBoxError(0, "timeout", `${name}: nothing from ${this.url} for ${idleMs / 1000} s`));
      }, idleMs);
      timer.unref?.();
    };
    const signal = callerSignal ? AbortSignal.any([callerSignal, idle.signal]) : idle.signal;
    try {
      touch();
      const { res, fail } = await this.#send(op, params, { query, accept: "text/event-stream", signal, timeoutMs: 0 });
      if (!res.body) throw new HareBoxError(0, "network", `${name}: the response has no body`);
      const body = res.body.pipeThrough(
        new TransformStream<Uint8Array, Uint8Array>({
          transform(chunk, out) {
            touch();
            out.enqueue(chunk);
          },
        }),
      );
      try {
        for await (const msg of readSSE(body)) {
          busy = true;
          clearTimeout(timer);
          yield msg;
          busy = false;
          touch();
        }
      } catch (err) {
        throw fail(err);
      }
    } finally {
      clearTimeout(timer);
      idle.abort(); // the request too, whatever ended the loop
    }
  }

  async #call<T>(op: OperationId, params: string[], kind: Kind, send: Send): Promise<T> {
    const { res, fail } = await this.#send(op, params, send);
    try {
      if (kind === "none" || res.status === 204) {
        await res.body?.cancel();
        return undefined as T;
      }
      if (kind === "bytes") return new Uint8Array(await res.arrayBuffer()) as T;
      const text = await res.text();
      if (kind === "text") return text as T;
      try {
        return JSON.parse(text) as T;
      } catch {
        throw new HareBoxError(0, "network", `${op}: the server's answer is not JSON (HTTP ${res.status})`);
      }
    } catch (err) {
      throw fail(err);
    }
  }

  /** The error a request that met err on the way (no answer, an untrusted certificate) throws. */
  #networkError(op: OperationId, err: unknown): HareBoxError {
    const cert = certificateError(err);
    if (cert) {
      // A pin's own error says it all; Node's verification errors say only what failed.
      const why = (cert as { code?: unknown }).code === PIN_MISMATCH ? cert.message : `the server's certificate was not trusted${this.#trustNote}: ${cert.message}`;
      return new HareBoxError(0, "network", `${op}: ${why} (${this.url})`, undefined, { cause: err });
    }
    return new HareBoxError(0, "network", `${op}: ${describe(err)} (${this.url})`, undefined, { cause: err });
  }

  /** An operation's URL: its path with the parameters in order, and the query. */
  #url(op: OperationId, params: string[], query: unknown): string {
    const path = OPERATIONS[op].path.replace(/\{(\w+)\}/g, (_, name: string) => {
      const v = params.shift();
      if (typeof v !== "string" || v === "") {
        throw new HareBoxError(0, "invalid", `${op}: the ${name} path parameter must be a non-empty string`, name);
      }
      return encodeURIComponent(v);
    });
    return this.url + path + queryString(query);
  }

  /**
   * Sends one request and returns a 2xx response, with a function that
   * turns an error met while reading its body into the one to throw.
   */
  async #send(op: OperationId, params: string[], send: Send): Promise<{ res: Response; fail: (err: unknown) => unknown }> {
    const spec = OPERATIONS[op];
    const url = this.#url(op, params, send.query);

    const headers: Record<string, string> = {
      accept: send.accept ?? (op === "execStream" ? "text/event-stream" : op === "readFile" ? "application/octet-stream" : "application/json"),
      "user-agent": `harebox-typescript/${VERSION}`,
    };
    if (this.#apiKey && !("public" in spec && spec.public)) headers.authorization = `Bearer ${this.#apiKey}`;
    let body: RequestInit["body"];
    if (send.raw !== undefined) {
      headers["content-type"] = "application/octet-stream";
      body = typeof send.raw === "string" ? new TextEncoder().encode(send.raw) : send.raw;
    } else if (send.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(send.json);
    } else if (spec.method === "POST" || spec.method === "PUT") {
      body = new Uint8Array(0);
    }

    const timer = send.timeoutMs > 0 ? AbortSignal.timeout(send.timeoutMs) : undefined;
    const signals = [send.signal, timer].filter((s): s is AbortSignal => s !== undefined);
    const signal = signals.length > 1 ? AbortSignal.any(signals) : signals[0];
    const fail = (err: unknown): unknown => {
      if (err instanceof HareBoxError) return err;
      if (send.signal?.aborted) return send.signal.reason ?? err;
      if (timer?.aborted) {
        return new HareBoxError(0, "timeout", `${op}: no answer from ${this.url} within ${send.timeoutMs / 1000} s`, undefined, { cause: err });
      }
      return this.#networkError(op, err);
    };

    let res: Response;
    try {
      const init: RequestInit = { method: spec.method, headers, redirect: "error" };
      if (body !== undefined) init.body = body;
      if (signal) init.signal = signal;
      res = await this.#fetch(url, init);
    } catch (err) {
      throw fail(err);
    }
    if (!res.ok && !send.ok?.includes(res.status)) {
      let text = "";
      try {
        text = await res.text();
      } catch (err) {
        throw fail(err);
      }
      throw errorFromBody(res.status, res.statusText, text, res.headers.get("retry-after"));
    }
    return { res, fail };
  }
}

/** The query string for a call's query object ("" if none). */
/** Waits ms, or rejects with the signal's reason when it aborts first. */
function pause(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      if (signal?.aborted) reject(signal.reason);
      else resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

function queryString(query: unknown): string {
  if (query === undefined || query === null) return "";
  if (typeof query !== "object") throw new HareBoxError(0, "invalid", "query must be an object", "query");
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(query as Record<string, unknown>)) {
    for (const item of Array.isArray(v) ? v : [v]) {
      if (item === undefined || item === null) continue;
      if (typeof item === "object") throw new HareBoxError(0, "invalid", `query parameter ${k} must be a string, a number or a boolean`, k);
      p.append(k, String(item));
    }
  }
  const s = p.toString();
  return s ? `?${s}` : "";
}

/** The offset a stream starts at: the one asked for, if it is one. */
function startOffset(v: unknown): number {
  return typeof v === "number" && Number.isSafeInteger(v) && v > 0 ? v : 0;
}

/** An ExecRequest as JSON: stdin bytes become base64. */
function execBody(body: ExecRequest): Record<string, unknown> {
  if (body.stdin instanceof Uint8Array) return { ...body, stdin: toBase64(body.stdin) };
  return { ...body };
}

function execTimeoutMs(body: ExecRequest): number {
  const t = typeof body.timeout_seconds === "number" && body.timeout_seconds > 0 ? body.timeout_seconds : DEFAULT_EXEC_TIMEOUT_S;
  return t * 1000 + EXEC_MARGIN_MS;
}

/** A cell's timeout, the server's grace to interrupt it and a margin: the server always answers first. */
function codeTimeoutMs(body: CodeRequest): number {
  const t = typeof body.timeout_seconds === "number" && body.timeout_seconds > 0 ? body.timeout_seconds : DEFAULT_CODE_TIMEOUT_S;
  return t * 1000 + CODE_GRACE_MS + EXEC_MARGIN_MS;
}

function parseEvent(op: OperationId | "followEvents" | "runCodeStream", event: string, data: string): unknown {
  try {
    return JSON.parse(data);
  } catch {
    throw malformed(op, event);
  }
}

function malformed(op: OperationId | "followEvents" | "runCodeStream", event: string): HareBoxError {
  return new HareBoxError(0, "network", `${op}: malformed ${event} event`);
}

/**
 * The HareBoxError an event stream's `error` event stands for (its data is
 * an error body: {"error": {"code", "message", "field"}}); its status is
 * the one the code has in a response.
 */
function streamError(op: OperationId | "followEvents" | "runCodeStream", data: string, fallback: string): HareBoxError {
  const v = parseEvent(op, "error", data) as { error?: { code?: unknown; message?: unknown; field?: unknown } } | null;
  const e = v?.error;
  const code = typeof e?.code === "string" ? e.code : "internal";
  return new HareBoxError(
    statusForCode(code),
    code,
    typeof e?.message === "string" ? e.message : fallback,
    typeof e?.field === "string" ? e.field : undefined,
  );
}

export function toBase64(b: Uint8Array): string {
  return Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString("base64");
}

export function fromBase64(s: string): Uint8Array {
  // A copy: small Buffers share a pool, and callers may keep .buffer.
  return new Uint8Array(Buffer.from(s, "base64"));
}

function describe(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as { cause?: unknown }).cause;
    if (cause instanceof Error && cause.message) return `${err.message}: ${cause.message}`;
    return err.message;
  }
  return String(err);
}
