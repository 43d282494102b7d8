// Types for every schema of the HareBox REST API (api/openapi.yaml), with
// the names the document gives them. Field names are the wire names.

/** A sandbox's lifecycle state. */
/** "lost": the host that runs it stopped renewing its lease; it is "running" again when that host is back. */
export type State = "creating" | "running" | "paused" | "stopped" | "hibernated" | "deleted" | "lost";

/** The error codes the server uses. */
export type ErrorCode =
  | "invalid"
  | "unauthorized"
  | "forbidden"
  | "not_found"
  | "conflict"
  | "too_large"
  | "rate_limited"
  | "budget_exceeded"
  | "over_capacity"
  | "unavailable"
  | "timeout"
  | "internal";

/** The error body every failed request returns. */
export interface Error {
  error: {
    code: ErrorCode;
    message: string;
    /** The request field at fault, as a JSON path (e.g. "outbound[0].ports"). */
    field?: string;
  };
}
/** Alias of {@link Error} that does not shadow the global Error. */
export type ErrorBody = Error;

/** Where the server runs. */
export interface Site {
  /** e.g. "fr-par-1" */
  name: string;
  /** ISO 3166-1 alpha-2, e.g. "FR" */
  country: string;
}

/** Server version, hypervisor backend and site. */
export interface Info {
  version: string;
  backend: {
    name?: string;
    accelerator?: string;
    notice?: string;
    version?: string;
  };
  site: Site;
}

/** A preset, or custom vcpus and memory_mb (not both). */
export interface Size {
  preset?: "small" | "medium" | "large";
  vcpus?: number;
  memory_mb?: number;
  disk_gb?: number;
}

/** The resources a sandbox has. */
export interface Resources {
  vcpus: number;
  memory_mb: number;
  disk_gb: number;
}

/** The body of createSandbox. */
export interface CreateRequest {
  /** Lowercase DNS label, at most 63 characters; unique among live sandboxes. */
  name?: string;
  size?: Size;
  /** "default" (Debian 12, the default) or "minimal". */
  image?: string;
  /** Delete the sandbox this many seconds after creation (0: never). */
  ttl_seconds?: number;
  labels?: Record<string, string>;
  /** The account (ID or name; the operator only). Default the default account. */
  account_id?: string;
  /** A project ID or name; default the account's default project. */
  project?: string;
  /** A fleet ID or name in that project. */
  fleet?: string;
  /**
   * An environment of the sandbox's project: its name or ID (env_...),
   * with "@VERSION" to pin an older version (default its latest).
   */
  environment?: string;
  /** A sandbox handed to a third party gets only environments marked third_party_safe. */
  third_party?: boolean;
  /** The sandbox's firewall policy, in force before it boots; default: the server's. */
  firewall?: FirewallPolicy;
  /** false keeps no command history for this sandbox (default true). */
  monitoring?: boolean;
  /** false refuses every snapshot and fork of this sandbox (default true). */
  snapshots?: boolean;
  /**
   * Make the sandbox from this snapshot (snap_...: memory, processes and
   * disk as they were) instead of booting the image. Image and size come
   * from the snapshot (give neither); project, fleet, environment pin,
   * firewall policy, labels and the source's own env default to the
   * source's. The new sandbox gets its own data key, machine-id, kernel
   * entropy, network, placeholders and CA.
   */
  snapshot?: string;
  /** Keep every stored environment out of this sandbox. */
  no_env?: boolean;
  /** Put the sandbox on its project's private mesh (true) or keep it off (false); default: as the project says. */
  mesh?: boolean;
  /** Run it in this site (e.g. "fr-par-1"); default: the site of the host that takes the create. */
  site?: string;
  /** Run it in any site of this country (ISO 3166-1 alpha-2, upper case, e.g. "FR"). */
  country?: string;
  /** Volumes of its project to attach: one writer at a time; a reader sees a volume as it was when it attached. */
  volumes?: VolumeMount[];
  env?: Record<string, string>;
}

/** A sandbox as the server describes it. */
export interface Sandbox {
  /** e.g. "sbx_01j8z3k5m6n7p8q9r0s1t2v3w4" */
  id: string;
  name?: string;
  /** e.g. "acc_01j8z3k5m6n7p8q9r0s1t2v3w4" */
  account_id: string;
  project_id: string;
  /** The project's name. */
  project: string;
  fleet_id?: string;
  /** The fleet's name. */
  fleet?: string;
  state: State;
  image: string;
  size: Resources;
  labels?: Record<string, string>;
  no_env: boolean;
  /** The pinned environment, "NAME@VERSION". */
  environment?: string;
  /** A third-party sandbox gets only third_party_safe environments. */
  third_party?: boolean;
  /** Whether the sandbox keeps command history (false: none at all). */
  monitoring?: boolean;
  /** Whether snapshots and forks of the sandbox are allowed. */
  snapshots?: boolean;
  /** How its create was served: its image booted, restored from a snapshot (a golden one, a fork's or a named one), or claimed from the warm pool. */
  served?: "boot" | "snapshot" | "pool";
  /** How long each step of its create took, in milliseconds ("total" the whole). */
  create_phases_ms?: Record<string, number>;
  /** While running: the guest agent's health from the engine's checks. */
  agent?: "ok" | "unresponsive";
  site: Site;
  /** The hareboxd that runs it (hosts that share a store each run their own; any of them answers for all). */
  host?: string;
  /** Its address on its project's private mesh, if it is on it. */
  mesh_address?: string;
  /** Its name there, "NAME.PROJECT.internal", which the project's mesh sandboxes resolve. */
  mesh_name?: string;
  /** The volumes attached to it. */
  volumes?: VolumeMount[];
  /** RFC 3339 date-time. */
  created_at: string;
  /** RFC 3339 date-time. */
  expires_at?: string;
  error?: string;
}

/** The body of forkSandbox; every field is optional. */
export interface ForkRequest {
  /** How many clones (at most 16; default 1). */
  count?: number;
  /** Names the clones NAME-1 ... NAME-count (a DNS label, at most 60 characters). */
  name?: string;
  /** Added to the source's labels. */
  labels?: Record<string, string>;
  /** Deletes each clone this many seconds after it is made. */
  ttl_seconds?: number;
  /** The volumes each clone attaches; absent: the source's; [] for none. */
  volumes?: VolumeMount[];
}

/** The body of createSnapshot. */
export interface SnapshotRequest {
  /** A DNS label, at most 63 characters; unique in the account. */
  name?: string;
}

/**
 * A snapshot of a sandbox: its memory, device state and its disk's writes.
 * Create a sandbox from it with `create({ snapshot: id })`.
 */
export interface Snapshot {
  /** e.g. "snap_01j8z3k5m6n7p8q9r0s1t2v3w4" */
  id: string;
  name?: string;
  account_id: string;
  project_id: string;
  /** The source sandbox (it may since be deleted). */
  sandbox_id: string;
  image: string;
  size: Resources;
  labels?: Record<string, string>;
  /** What the snapshot's files take on the host. */
  bytes: number;
  /** RFC 3339 date-time. */
  created_at: string;
}

/**
 * Whose OpenID Connect ID tokens an oidc URL accepts: signed by `issuer`
 * (checked against its published keys, which the server fetches and
 * caches), for `audience`, not expired, and naming one of the `subjects`,
 * one of the `emails` (unless the token's email_verified is false), or one
 * of the `groups` (its groups claim). At least one of subjects, emails and
 * groups is required (invalid, 400, otherwise).
 */
export interface OIDCRule {
  /** The issuer, an https URL (without query or fragment). */
  issuer: string;
  /** The aud the tokens must carry (the client ID). */
  audience: string;
  subjects?: string[];
  /** Compared without case. */
  emails?: string[];
  groups?: string[];
}

/** The body of createURL. */
export interface URLRequest {
  /** The guest's TCP port, 1 to 65535 (plain HTTP in the guest; the ingress speaks TLS to clients). */
  port: number;
  /**
   * How a client proves access: "token" (the default; a bearer token, or a
   * link that swaps it for a cookie), "oidc" (an OpenID Connect ID token
   * from `oidc.issuer` as `Authorization: Bearer`), or "mtls" (a TLS client
   * certificate signed by the project's URL CA and not revoked; host form
   * only, so the ingress's host must be a name).
   */
  auth?: "token" | "oidc" | "mtls";
  /** Required with auth "oidc", refused otherwise. */
  oidc?: OIDCRule;
}

/**
 * A sandbox's TCP port published on the server's ingress, behind a token,
 * OpenID Connect or client certificates (the URL schema; named so as not
 * to shadow the global URL class). A client sends a token in the
 * X-HareBox-Token header or as `Authorization: Bearer hburl_...`, or visits
 * `link` once to swap it for a cookie; an oidc URL takes an ID token its
 * rule allows as `Authorization: Bearer`; an mtls URL a TLS client
 * certificate from its project's URL CA, not revoked. The ingress takes a
 * token or ID token off every request before the guest sees it.
 */
export interface SandboxURL {
  /** e.g. "url_01j8z3k5m6n7p8q9r0s1t2v3w4" */
  id: string;
  sandbox_id: string;
  account_id: string;
  /** The sandbox's project, whose URL CA an mtls URL checks clients against. */
  project_id: string;
  port: number;
  /** "token", "oidc" or "mtls" */
  auth: string;
  /** The rule of an oidc URL (which has no `token` and no `link`). */
  oidc?: OIDCRule;
  /** The host form, https://PORT-ULID.HOST/ (the path form when the ingress's host is an address). */
  url: string;
  /** The path form, https://HOST/s/SANDBOX/PORT/, for hosts without wildcard DNS. */
  path_url: string;
  /** The token (hburl_...): only in the answers of createURL and rotateURL. */
  token?: string;
  /**
   * `url` with the token as the harebox_token query parameter, to share: the
   * first visit swaps it for an HttpOnly, Secure, SameSite=Lax cookie. Only
   * with `token`.
   */
  link?: string;
  /** RFC 3339 date-time. */
  created_at: string;
  /** RFC 3339 date-time: when the token was last rotated. */
  rotated_at?: string;
}

/**
 * The body of setURLCA: a CA certificate (PEM) to upload, or none (no
 * `certificate`) for the server to make a new CA.
 */
export interface URLCARequest {
  /** A CA certificate, PEM (at most 64 KiB). */
  certificate?: string;
}

/**
 * A project's URL certificate authority: the CA its mtls URLs check client
 * certificates against.
 */
export interface URLCA {
  project_id: string;
  /** The CA's certificate, PEM. */
  certificate: string;
  /** Uploaded by the user (who issues its certificates), not made by the server. */
  uploaded: boolean;
  /** RFC 3339 date-time. */
  created_at: string;
}

/** The body of issueClientCert. */
export interface ClientCertRequest {
  /** The certificate's subject common name (up to 64 characters): who holds it. */
  name: string;
  /** How long it is valid, a Go duration ("720h"); default 2160h, at most 8760h. */
  ttl?: string;
}

/** A client certificate a project issued, or the serial of one it revoked. */
export interface ClientCert {
  project_id: string;
  /** The serial number, lower-case hex. */
  serial: string;
  name?: string;
  /** Issued by the server (false: a serial of an uploaded CA's certificate, recorded when revoked). */
  issued: boolean;
  /** SHA-256 (hex) of the public keys of the CAs the serial is of: a revocation holds for these keys. */
  issuer_keys?: string[];
  /** RFC 3339 date-time. */
  not_after?: string;
  /** RFC 3339 date-time. */
  created_at: string;
  /** RFC 3339 date-time. */
  revoked_at?: string;
  /** The certificate (PEM): in the answer of issueClientCert only. */
  certificate?: string;
  /** Its private key (PEM, PKCS#8): in the answer of issueClientCert only; the server does not keep it. */
  private_key?: string;
}

/** A command to run: exactly one of cmd (a shell string) and argv. */
export interface ExecRequest {
  /** A shell string, run with /bin/sh -c. */
  cmd?: string;
  /** A program and its arguments, run directly. */
  argv?: string[];
  /** Kills the whole process group; default 300, at most 86400. */
  timeout_seconds?: number;
  env?: Record<string, string>;
  cwd?: string;
  /** Default "user" (uid 1000); "root" for root. */
  user?: string;
  /**
   * Bytes fed to the command. On the wire this is base64: a string is sent
   * as is (it must already be base64); a Uint8Array is encoded by the
   * client.
   */
  stdin?: string | Uint8Array;
}

/** The body of startProcess: an ExecRequest, and how it starts. */
export interface StartProcessRequest extends ExecRequest {
  /** Keeps its stdin open after `stdin`, for sendProcessInput. */
  keep_stdin?: boolean;
  /** A name it is listed with (at most 256 bytes). */
  tag?: string;
}

/** A finished command. */
export interface ExecResult {
  exit_code: number;
  /** The signal that killed the command, if any. */
  signal?: number;
  stdout: string;
  stderr: string;
  duration_ms: number;
  timed_out: boolean;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  /** Why the command could not start. */
  error?: string;
}

/** A background process. */
export interface Process {
  id: string;
  sandbox_id: string;
  cmd?: string;
  argv?: string[];
  /** The pid in the guest. */
  pid?: number;
  running: boolean;
  /** RFC 3339 date-time. */
  started_at: string;
  /** The tag it was started with. */
  tag?: string;
  /** The environment its start gave (not the sandbox's). */
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  /** It runs on a terminal. */
  pty?: boolean;
  /** Set once the process has exited. */
  result?: ExecResult;
}

/** A code interpreter context's language. */
export type CodeLanguage = "python" | "javascript" | "typescript" | "bash";

/** A cell of code to run (the body of runCode and runCodeStream). */
export interface CodeRequest {
  /** At most 1 MiB. */
  code: string;
  /** The context it runs in; default the default context of `language` (python's is "default", bash's "default-bash", javascript's "default-javascript", typescript's "default-typescript"). */
  context_id?: string;
  /** Default "python". */
  language?: CodeLanguage;
  /** Variables for this cell, over the sandbox's own. */
  env?: Record<string, string>;
  /** Interrupts the cell (the context stays usable); default 300, at most 3600. */
  timeout_seconds?: number;
}

/** The body of createCodeContext; every field is optional. */
export interface CodeContextRequest {
  /** Default "python". */
  language?: CodeLanguage;
  /** Where its code runs (an absolute path); default the user's home. */
  cwd?: string;
  env?: Record<string, string>;
}

/** A context of a sandbox's code interpreter: a kernel whose state lasts from one cell to the next. */
export interface CodeContext {
  id: string;
  language: CodeLanguage;
  cwd: string;
}

/**
 * What a Matplotlib figure draws, as data: its type, title, axes and
 * elements, whose shape the type gives (a superchart's are charts, one
 * for each of the figure's axes). Points and ticks are numbers, or
 * strings on a categorical or date axis.
 */
export interface Chart {
  type: "line" | "scatter" | "bar" | "pie" | "box_and_whisker" | "superchart" | "unknown";
  title: string;
  x_label?: string;
  y_label?: string;
  x_unit?: string;
  y_unit?: string;
  x_ticks?: (number | string)[];
  x_scale?: string;
  x_tick_labels?: string[];
  y_ticks?: (number | string)[];
  y_scale?: string;
  y_tick_labels?: string[];
  elements: unknown[];
}

/**
 * One rich result of a cell, in each format the kernel gave that the host
 * keeps. `png` and `jpeg` are base64; HTML, SVG, Markdown and LaTeX are the
 * sandbox's own text (never render them trusted).
 */
export interface CodeResult {
  /** The value of the cell's last expression (else something it displayed). */
  is_main_result: boolean;
  text?: string;
  html?: string;
  markdown?: string;
  svg?: string;
  png?: string;
  jpeg?: string;
  latex?: string;
  /** application/json: any JSON value. */
  json?: unknown;
  /** What a Matplotlib figure draws, as data. */
  chart?: Chart;
  /** The PNG's (else the JPEG's) width in pixels. */
  width?: number;
  height?: number;
}

/**
 * The exception a cell raised: TimeoutError for a timeout, KernelDied for a
 * dead kernel, ExitCode for a bash cell's non-zero status.
 */
export interface CodeError {
  name: string;
  value: string;
  traceback?: string;
}

/**
 * A finished cell: runCode's answer, and runCodeStream's `end` event (there
 * with stdout, stderr and results empty: they were streamed).
 */
export interface CodeExecution {
  context_id: string;
  execution_count: number;
  /** "died": the kernel died; the context answers so until it is restarted. */
  status: "ok" | "error" | "timeout" | "died";
  stdout: string;
  stderr: string;
  results: CodeResult[];
  error?: CodeError;
  duration_ms: number;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  /** Results past the host's bounds, or in no format it keeps. */
  results_dropped?: number;
}

/** One entry of a sandbox's command history. */
export interface Command {
  id: string;
  sandbox_id: string;
  /** exec, execStream, startProcess, or a cell of runCode (code). */
  kind: "exec" | "stream" | "background" | "code";
  cmd?: string;
  argv?: string[];
  user?: string;
  cwd?: string;
  /** RFC 3339 date-time. */
  started_at: string;
  /** RFC 3339 date-time. */
  ended_at: string;
  /** Its output is bounded at 64 KiB per stream (stdout_truncated when cut), and empty once purged. */
  result?: ExecResult;
  /** The output is gone (the account's retention), or was never kept. */
  output_purged: boolean;
}

/** A path in a sandbox. */
export interface FileInfo {
  path: string;
  name: string;
  type: "file" | "dir" | "symlink" | "other";
  size: number;
  /** Permission bits (e.g. 0o644 = 420). */
  mode: number;
  uid: number;
  gid: number;
  /** RFC 3339 date-time. */
  mtime: string;
  link_target?: string;
}

/** One outbound rule; the first that matches decides. */
export interface FirewallRule {
  action: "allow" | "deny";
  /** Default "any". */
  protocol?: "tcp" | "udp" | "icmp" | "any";
  /** A port, a list or a range: "443", "80,443", "8000-9000". */
  ports?: string;
  /** Host names, or "*." and a domain. */
  hosts?: string[];
  cidrs?: string[];
}

/** What a sandbox opens to its project's other mesh sandboxes in a fleet and/or with labels (neither: all of them); the first that matches decides. */
export interface MeshRule {
  action: "allow" | "deny";
  /** Default "any". */
  protocol?: "tcp" | "udp" | "any";
  ports?: string;
  /** A fleet's name or ID. */
  fleet?: string;
  /** The labels a peer must all carry. */
  labels?: Record<string, string>;
}

/** A sandbox's firewall policy. Inbound is always denied. */
export interface FirewallPolicy {
  default_outbound: "allow" | "deny";
  outbound?: FirewallRule[];
  /** Rules for the project's mesh; none matching, the project's mesh_default decides. */
  mesh?: MeshRule[];
}

/** The body of createAccount, createProject and createFleet. */
export interface NameRequest {
  /** Lowercase DNS label, at most 63 characters. */
  name: string;
}

/**
 * How long an account's command history is kept, in days: a field left out
 * keeps forever, 0 keeps nothing. The audit log is kept whatever this says.
 */
export interface Retention {
  /** Entries older than this go (0 to 36500). */
  history_days?: number;
  /** Output older than this is dropped from its entry (0 to 36500). */
  output_days?: number;
}

/** An account: it owns projects, sandboxes and keys. */
export interface Account {
  /** e.g. "acc_01j8z3k5m6n7p8q9r0s1t2v3w4" */
  id: string;
  name: string;
  /** RFC 3339 date-time. */
  created_at: string;
  /** Its command-history retention; {} keeps everything forever. */
  retention: Retention;
}

/** The body of updateAccount: the settings to change. */
export interface AccountUpdate {
  /** Replaces the account's retention ({} keeps forever); lowering it purges at once. */
  retention?: Retention;
}

/** A project of an account (each account has one named "default"). */
export interface Project {
  /** e.g. "prj_01j8z3k5m6n7p8q9r0s1t2v3w4" */
  id: string;
  account_id: string;
  name: string;
  /** RFC 3339 date-time. */
  created_at: string;
  /** Every new sandbox of the project is third-party (only third-party-safe environments). */
  third_party_default: boolean;
  /** New sandboxes of the project are on its private mesh. */
  mesh: boolean;
  /** "deny": its mesh sandboxes open nothing to each other that no mesh rule of theirs allows; absent: allowed. */
  mesh_default?: "deny";
}

/** The body of updateProject: the settings to change. */
export interface ProjectUpdate {
  /** New sandboxes of the project are third-party (only third-party-safe environments). */
  third_party_default?: boolean;
  /** New sandboxes of the project are on its private mesh. */
  mesh?: boolean;
  /** What its mesh sandboxes open to each other when no mesh rule of theirs matches. */
  mesh_default?: "allow" | "deny";
}

/** A named group of sandboxes in a project. */
export interface Fleet {
  /** e.g. "flt_01j8z3k5m6n7p8q9r0s1t2v3w4" */
  id: string;
  account_id: string;
  project_id: string;
  name: string;
  /** RFC 3339 date-time. */
  created_at: string;
}

/** A key's request rate: a token bucket. */
export interface Rate {
  per_second: number;
  burst: number;
}

/** What a key may do; every field is optional and they combine with AND. */
export interface Scope {
  /**
   * operationIds, or groups: "*", info, sandboxes:read, sandboxes:write,
   * exec, files:read, files:write, firewall:read, firewall:write,
   * accounts:read, projects:read, projects:write, keys:read, keys:write,
   * budgets:read, budgets:write.
   */
  actions?: string[];
  /** The only sandbox IDs the key sees; such a key cannot create sandboxes. */
  sandboxes?: string[];
  /** The only projects (IDs or names; stored as IDs) the key sees and creates in. */
  projects?: string[];
  /** The key sees only sandboxes with these labels, and the sandboxes it creates get them. */
  labels?: Record<string, string>;
  /** Where the caller's address must be. */
  cidrs?: string[];
  rate?: Rate;
  /** A dollar limit on what the key may spend, e.g. "25.00". */
  budget_usd?: string;
}

/** The body of createKey. A key creates keys no wider than itself. */
export interface KeyRequest {
  /** The key's account (ID or name; the operator only: a key creates keys in its own). */
  account_id?: string;
  description?: string;
  scope?: Scope;
  /** The key expires that long after creation (at most 31536000). */
  ttl_seconds?: number;
  /** The secret's form: "harebox" ("hbk_...", the default) or "e2b" ("e2b_" and hex digits, which E2B's SDKs accept); rotations keep it. */
  format?: "harebox" | "e2b";
}

/** An API key (never its secret). */
export interface Key {
  /** e.g. "key_01j8z3k5m6n7p8q9r0s1t2v3w4" */
  id: string;
  account_id: string;
  description?: string;
  /** The key that created this one. */
  parent_id?: string;
  ancestors?: string[];
  scope: Scope;
  /** RFC 3339 date-time. */
  created_at: string;
  expires_at?: string;
  revoked_at?: string;
  rotated_at?: string;
  /** The secret's first characters. */
  hint: string;
}

/** A key and its secret, as createKey and rotateKey return it (only then). */
export interface KeyWithSecret extends Key {
  /** The key (hbk_...), shown only once. */
  secret: string;
}

/** A variable of an environment. In answers a secret has no value: `{ secret: true }`. */
export interface EnvVar {
  /** The value; in answers, absent for a secret. */
  value?: string;
  /** Sealed in the host; a sandbox sees a placeholder (hbph_...) instead. */
  secret?: boolean;
}

/** A file an environment puts in its sandboxes. */
export interface EnvFile {
  /** An absolute path in the sandbox. */
  path: string;
  /** Permission bits; default 0o644. */
  mode?: number;
  /** "user", "root" or "name:group". */
  owner?: string;
  content: string;
  /** `{{NAME}}` is replaced by the variable's value (a secret's by the sandbox's placeholder). */
  template?: boolean;
}

/** Where a secret may be used, and how the host puts it in requests. */
export interface CredentialRule {
  /** The secret variable. */
  secret: string;
  hosts: string[];
  ports?: string;
  /** A header to set to format; without it the placeholder is replaced where it appears. */
  header?: string;
  /** e.g. "Bearer {value}". */
  format?: string;
  allow_http?: boolean;
}

/** The body of createEnvironment: the environment and its version 1. */
export interface EnvironmentRequest {
  /** Lowercase DNS label, at most 63 characters; unique in the project. */
  name: string;
  /** A project ID or name (the query's project also works); default the default project. */
  project?: string;
  variables?: Record<string, EnvVar>;
  files?: EnvFile[];
  credentials?: CredentialRule[];
  third_party_safe?: boolean;
}

/**
 * The body of updateEnvironment: a new version from the latest one.
 * Variables are set and unset; files, credentials and third_party_safe
 * replace the latest version's when given.
 */
export interface EnvironmentUpdate {
  set?: Record<string, EnvVar>;
  unset?: string[];
  files?: EnvFile[];
  credentials?: CredentialRule[];
  third_party_safe?: boolean;
}

/** One immutable version of an environment (secret values are never shown). */
export interface EnvironmentVersion {
  environment_id: string;
  /** From 1. */
  version: number;
  /** RFC 3339 date-time. */
  created_at: string;
  third_party_safe: boolean;
  variables: Record<string, EnvVar>;
  files: EnvFile[];
  credentials: CredentialRule[];
}

/** A named, versioned set of variables and files in a project. */
export interface Environment {
  /** e.g. "env_01j8z3k5m6n7p8q9r0s1t2v3w4" */
  id: string;
  account_id: string;
  project_id: string;
  /** The project's name. */
  project: string;
  name: string;
  /** The newest version's number. */
  latest: number;
  /** RFC 3339 date-time. */
  created_at: string;
  /** RFC 3339 date-time. */
  updated_at: string;
  /** The version this answer describes (the latest, or the one just made). */
  version: EnvironmentVersion;
}

/** How an audited action ended: denied is a refusal (forbidden, not_found, unauthorized). */
export type AuditOutcome = "ok" | "denied" | "error";

/** One entry of the audit log: who did what to what, and how it ended (never request data). */
export interface AuditEntry {
  /** From 1, without gaps; the cursor of listAudit's and listEvents' `after`. */
  seq: number;
  /** RFC 3339 date-time. */
  time: string;
  account_id?: string;
  /**
   * A key ID, or "operator"; an event's is the engine's: "budget:ID",
   * "sandbox:ID" or "engine".
   */
  principal: string;
  /** The caller's address. */
  source?: string;
  /** An operationId. */
  action: string;
  target?: string;
  outcome: AuditOutcome;
  /** The error's code (not_found, forbidden, ...). */
  error?: string;
  /** The request's X-Request-ID. */
  request_id?: string;
  /** The previous entry's hash. */
  prev: string;
  /** SHA-256 of this entry's JSON without hash. */
  hash: string;
}

/** The result of verifyAudit. */
export interface AuditReport {
  ok: boolean;
  entries: number;
  checkpoints: number;
  /** The first entry altered, removed or reordered. */
  first_bad?: number;
  reason?: string;
}

/** The body of getAuditKey: the key that verifies the audit log's signed checkpoints. */
export interface AuditKey {
  algorithm: "ed25519";
  /** Base64. */
  public_key: string;
}

/** What a budget covers. */
export type BudgetScopeKind = "account" | "project" | "fleet" | "label" | "key";

/** The sandboxes a budget covers, in its account. */
export interface BudgetScope {
  kind: BudgetScopeKind;
  /**
   * A project (ID or name; stored as its ID), fleet (ID) or API key (ID);
   * none for account and label.
   */
  ref?: string;
  /** A label scope's selector (at most 16 labels); every label must match. */
  labels?: Record<string, string>;
}

/** monthly: calendar months in UTC; total: from the budget's creation on. */
export type BudgetPeriod = "monthly" | "total";

/**
 * What a budget does when it is reached. notify: an audit event only;
 * deny_new: creates, resumes and starts in scope are refused
 * (budget_exceeded); pause, stop or delete: also the sandboxes in scope are
 * paused, stopped or deleted.
 */
export type BudgetAction = "notify" | "deny_new" | "pause" | "stop" | "delete";

/** The body of createBudget. */
export interface BudgetRequest {
  /** Lowercase DNS label, at most 63 characters. */
  name?: string;
  scope: BudgetScope;
  period: BudgetPeriod;
  /** A decimal dollar amount, at most six decimals, e.g. "25.00" (a string, never a number). */
  limit_usd: string;
  action: BudgetAction;
  /** Percentages of the limit (1 to 99, at most 4), each announced once a period in the audit log. */
  warn_at_percent?: number[];
}

/** A budget with its spend and reservations. Money is a decimal string. */
export interface Budget {
  /** e.g. "bgt_01j8z3k5m6n7p8q9r0s1t2v3w4" */
  id: string;
  account_id: string;
  name?: string;
  scope: BudgetScope;
  /** The budget an API key's budget_usd makes (on the key and the keys it makes; total, deny_new). */
  from_key?: boolean;
  /** The project a project or fleet scope is in. */
  project_id?: string;
  period: BudgetPeriod;
  /** e.g. "25.00" */
  limit_usd: string;
  action: BudgetAction;
  warn_at_percent?: number[];
  /** RFC 3339 date-time. */
  created_at: string;
  /** RFC 3339 date-time: the start of the current period. */
  period_start: string;
  /** Settled spend in the current period. */
  spent_usd: string;
  /** What the live sandboxes in scope hold for their next metering interval. */
  reserved_usd: string;
  /** RFC 3339 date-time: when the budget was reached this period. */
  reached_at?: string;
  /** The budget was reached and its action is not yet done. */
  action_pending?: boolean;
  /** The warning percentages announced this period. */
  warned_percent?: number[];
}

/** The metered usage of one group, and its cost. */
export interface UsageGroup {
  /** The group's ID (or label value) as group_by says; "" for usage outside any (e.g. no fleet). */
  group: string;
  /** What the ID stands for: the account's, project's, fleet's or sandbox's name, the key's description (for a key that may read keys); absent for a label's value. */
  name?: string;
  vcpu_seconds: number;
  memory_gib_seconds: number;
  paused_seconds: number;
  /** What the guests sent out of their network links, counted on the host. */
  egress_bytes: number;
  /** Snapshot storage held (10^9 bytes), in seconds: a snapshot's files, or a hibernated sandbox's. */
  snapshot_gb_seconds: number;
  /** A decimal dollar amount, e.g. "0.0504". */
  cost_usd: string;
}

/**
 * One monitoring sample of a sandbox, measured on the host (never asked of
 * the guest) every 15 s (hareboxd --metrics-interval) while it runs or is
 * paused.
 */
export interface MetricSample {
  sandbox_id: string;
  /** RFC 3339 date-time of the sample. */
  time: string;
  /** The VMM's CPU time (user and system) since it started. */
  cpu_seconds: number;
  /** The VMM's resident memory. */
  memory_bytes: number;
  /** What the sandbox's own files take on the host's disk. */
  disk_bytes: number;
  /** What the guest sent on its link since it was made (0 without a network). */
  net_sent_bytes: number;
  /** What the guest received on its link since it was made (0 without a network). */
  net_received_bytes: number;
}

/** The body of getHealth. */
export interface Health {
  status: "ok";
}

/** The body of getReady. */
export interface Readiness {
  status: "ready" | "not_ready";
  /** Each part (database, hypervisor, network where there is one): ok or unavailable. */
  checks: Record<string, "ok" | "unavailable">;
}

/** The body of listSandboxes. */
export interface SandboxList {
  sandboxes: Sandbox[];
}

/** The body of listSnapshots: oldest first. */
export interface SnapshotList {
  snapshots: Snapshot[];
}

/** A guest image sandboxes can be created from (`create({ image })`). */
export interface Image {
  name: string;
  /** The OCI image it was built from (oci:DIR, docker-archive:FILE or registry:REF), if any. */
  from?: string;
  /** That OCI image's digest. */
  digest?: string;
  kernel_version: string;
  /** RFC 3339 date-time. */
  built_at: string;
  /** Whether it boots from a root disk (every image but minimal). */
  root_disk: boolean;
}

/** The body of listImages: by name. */
export interface ImageList {
  images: Image[];
}

/** A host's tunnel to another host, as it last reported it. */
export interface HostTunnel {
  /** The other host (empty if no host publishes that key now). */
  host: string;
  public_key: string;
  endpoint?: string;
  /** RFC 3339 date-time; absent before the first handshake. */
  last_handshake?: string;
  rx_bytes: number;
  tx_bytes: number;
}

/** A host's end of the mesh's tunnels (hareboxd --mesh-endpoint). */
export interface HostMesh {
  public_key: string;
  /** ADDR:PORT on the network between the hosts (UDP). */
  endpoint: string;
  tunnels?: HostTunnel[];
  /** RFC 3339 date-time. */
  reported_at?: string;
}

/** A host of the deployment (a hareboxd that shares the store). */
export interface Host {
  name: string;
  site: string;
  /** Its site's country (ISO 3166-1 alpha-2), if it was given one. */
  country?: string;
  /** Its internal endpoint (https://HOST:PORT), where the other hosts forward requests for its sandboxes; absent when it has none. */
  address?: string;
  capacity: Resources;
  /** What its sandboxes reserve, as of its last write. */
  used: Resources;
  /** False once another host found its lease lapsed (its running sandboxes are then "lost"). */
  up: boolean;
  /** RFC 3339 date-time. */
  started_at: string;
  /** RFC 3339 date-time. */
  renewed_at: string;
  /** RFC 3339 date-time. */
  lease_until: string;
  /** Its end of the mesh's tunnels, if it has one. */
  mesh?: HostMesh;
}

/** The body of listHosts: by name. */
export interface HostList {
  hosts: Host[];
}

/** The body of moveSandbox: the sandbox on its new host, the hosts, and how long it did not run. */
export interface MoveResult {
  sandbox: Sandbox;
  from: string;
  to: string;
  paused_ms: number;
}

/** The body of drainHost: what moved where, and what stayed, with why. */
export interface DrainReport {
  host: string;
  moved: { id: string; to: string; paused_ms: number }[];
  stayed: { id: string; error: string }[];
}

/** The body of getPool, setPool and resetPool: the warm pool as the host that answered keeps it. */
export interface Pool {
  /** "IMAGE:PRESET" to how many idle sandboxes the host keeps. */
  pool: Record<string, number>;
  /** "deployment": set with setPool, for every host; "host": the host's own hareboxd --pool. */
  source: "deployment" | "host";
  /** When the deployment's pool was set. */
  set_at?: string;
  host: string;
  /** false on a host that keeps no pool at all (golden snapshots off). */
  kept: boolean;
  /** The idle sandboxes the host holds now. */
  idle: number;
}

/** The body of rotateMeshKey and undrainHost. */
export interface HostName {
  host: string;
}

/** The body of deleteHost: the sandboxes it deleted. */
export interface HostRemoval {
  host: string;
  deleted_sandboxes: string[];
}

/** The body of buildImage. */
export interface ImageBuildRequest {
  /** Lower-case letters, digits and dashes; not minimal or default. */
  name: string;
  /** "registry:REF", e.g. "registry:ghcr.io/org/app:1". */
  from: string;
}

/** The body of listURLs: oldest first, without tokens. */
export interface URLList {
  urls: SandboxURL[];
}

/** The answer of listClientCerts: oldest first, without keys. */
export interface ClientCertList {
  certs: ClientCert[];
}

/** The body of listProcesses. */
export interface ProcessList {
  processes: Process[];
}

/** The body of listCodeContexts. */
export interface CodeContextList {
  contexts: CodeContext[];
}

/** The body of listCommands: oldest first. */
export interface CommandList {
  commands: Command[];
}

/** The body of listFiles. */
export interface FileList {
  entries: FileInfo[];
  truncated: boolean;
}

/** The body of listAccounts. */
export interface AccountList {
  accounts: Account[];
}

/** The body of listProjects. */
export interface ProjectList {
  projects: Project[];
}

/** The body of listFleets. */
export interface FleetList {
  fleets: Fleet[];
}

/** The body of listKeys. */
export interface KeyList {
  keys: Key[];
}

/** A project's disk that outlives sandboxes, encrypted under its own key. */
export interface Volume {
  id: string;
  account_id: string;
  project_id: string;
  project: string;
  name: string;
  size_gb: number;
  /** The host that holds its file. */
  host?: string;
  created_at: string;
  /** What its encrypted files take on the host's disk. */
  used_bytes: number;
  attachments: VolumeAttachment[];
  /** Files over its first: a writer that attached beside readers writes to one of its own; a reader that attached beside a writer took the one the writer left. */
  layers?: number;
  /** What is being done to its files (resizing, folding its layers). */
  busy?: string;
}

export interface VolumeAttachment {
  sandbox_id: string;
  path: string;
  read_only?: boolean;
  /** The layer it opens. */
  layer?: number;
}

/** A volume to attach at create (CreateRequest.volumes). */
export interface VolumeMount {
  name: string;
  path: string;
  read_only?: boolean;
}

/** The body of createVolume. */
export interface VolumeRequest {
  name: string;
  size_gb: number;
  project?: string;
}

/** The body of listVolumes. */
export interface VolumeList {
  volumes: Volume[];
}

/** The body of listEnvironments. */
export interface EnvironmentList {
  environments: Environment[];
}

/** The body of listEnvironmentVersions. */
export interface EnvironmentVersionList {
  versions: EnvironmentVersion[];
}

/** The body of listAudit: a page of entries, oldest first. */
export interface AuditList {
  entries: AuditEntry[];
  /** The cursor (`after`) of the next page; present when this page is full. */
  next?: string;
}

/**
 * The body of listEvents: a page of events (audit entries of the engine's
 * own acts), oldest first.
 */
export interface EventList {
  events: AuditEntry[];
  /**
   * The cursor (a sequence number) to pass as `after`: the last entry the
   * page looked at, shown or not. Always present; `after` itself when
   * nothing is new.
   */
  next: string;
}

/** The body of listBudgets. */
export interface BudgetList {
  budgets: Budget[];
}

/** The body of getUsage: one row per group, sorted by group. */
export interface UsageList {
  usage: UsageGroup[];
}

/**
 * The body of getSandboxMetrics: oldest first; none for a sandbox created
 * with `monitoring: false`.
 */
export interface MetricSampleList {
  samples: MetricSample[];
}

/**
 * The body of sendProcessInput: a new terminal size (rows with cols), then
 * stdin bytes (a string is UTF-8; at most 1 MiB), then (eof) their end.
 */
export interface ProcessInput {
  stdin?: Uint8Array | string;
  eof?: boolean;
  rows?: number;
  cols?: number;
}

/** The body of killProcess. */
export interface KillRequest {
  /** Default SIGKILL (9). */
  signal?: number;
}

// Query parameters, per operation.

export interface ListSandboxesQuery {
  state?: State;
  /**
   * "key=value"; several are all required. A record is sent as one
   * key=value per entry.
   */
  label?: string | string[] | Record<string, string>;
  /** The operator's filter by account (ID or name). */
  account?: string;
  /** A project ID or name. */
  project?: string;
  /** A fleet ID or name (in the project, default the default project). */
  fleet?: string;
}

/** The query of listSnapshots. */
export interface SnapshotsQuery {
  /** Only the snapshots of this source sandbox (its ID). */
  sandbox?: string;
}

/**
 * The query of the project, fleet, key, budget and usage operations: the
 * operator names the account (ID or name; default the default account). A
 * key always acts in its own.
 */
export interface AccountQuery {
  account?: string;
}

/**
 * The query of the environment operations: the project (ID or name;
 * default the account's default project) and, for the operator, the
 * account.
 */
export interface EnvironmentQuery extends AccountQuery {
  project?: string;
}

/**
 * The query of the URL CA and client certificate operations: the project
 * (ID or name; default the account's default project) and, for the
 * operator, the account.
 */
export interface URLCAQuery extends AccountQuery {
  project?: string;
}

/** The query of listAudit (and auditEntries): filters that combine with AND, and the page. */
export interface AuditQuery {
  /** RFC 3339 date-time: entries at or after it. */
  from?: string;
  /** RFC 3339 date-time: entries before it. */
  to?: string;
  /** A key ID, or "operator". */
  principal?: string;
  target?: string;
  /** An operationId. */
  action?: string;
  outcome?: AuditOutcome;
  /** The operator's filter by account ID (a key sees its own account's entries). */
  account?: string;
  /** The cursor: entries after this sequence number (a page's `next`). */
  after?: number | string;
  /** 1 to 1000; default 100 (auditEntries: 1000 per page). */
  limit?: number;
  /** The last `limit` entries that match instead of the first (still oldest first; no `next`). */
  newest?: boolean;
  /** JSON pages only; auditEntries iterates every entry. */
  format?: "json";
}

/** The query of listEvents and followEvents. */
export interface EventQuery {
  /** The cursor: events after this sequence number (a page's `next`, or an entry's `seq`). */
  after?: number | string;
  /** 1 to 1000; default 100 (followEvents: each read of the stream). */
  limit?: number;
  /**
   * The operator's filter by account (ID or name); without it, every
   * account's. A key sees its own account's events.
   */
  account?: string;
}

/** How getUsage groups: by account, project, fleet, key, sandbox (the default) or a label's value. */
export type UsageGroupBy = "account" | "project" | "fleet" | "key" | "sandbox" | `label:${string}`;

/** The query of getUsage (the operator without account: every account's usage). */
export interface UsageQuery extends AccountQuery {
  /** RFC 3339 date-time; intervals that overlap from..to count whole. */
  from?: string;
  /** RFC 3339 date-time, after from. */
  to?: string;
  group_by?: UsageGroupBy;
}

/** The query of listCommands. */
export interface CommandsQuery {
  /** The newest this many entries (1 to 10000; default all). */
  limit?: number;
}

/** The query of getSandboxMetrics (and Sandbox.metrics). */
export interface MetricsQuery {
  /** RFC 3339 date-time: samples at or after it. */
  from?: string;
  /** RFC 3339 date-time: samples before it. */
  to?: string;
  /** At most this many samples (1 to 10000; default 1000). */
  limit?: number;
}

export interface GetProcessQuery {
  /** Wait for the process to exit (at most timeout_seconds). */
  wait?: boolean;
  /** How long to wait (default 60, at most 3600). */
  timeout_seconds?: number;
}

/** The query of getProcessOutput (and Sandbox.processOutput). */
export interface ProcessOutputQuery {
  /** After what the guest keeps, go on with what comes until the process ends. */
  follow?: boolean;
  /** Bytes of stdout already seen (default 0). */
  stdout_offset?: number;
  /** Bytes of stderr already seen (default 0). */
  stderr_offset?: number;
}

/** The query of openPty (and Sandbox.pty). */
export interface PtyQuery {
  /** The terminal's rows, 1 to 1000 (default 24). */
  rows?: number;
  /** The terminal's columns, 1 to 1000 (default 80). */
  cols?: number;
  /** A shell string to run instead of the user's login shell. */
  cmd?: string;
  /** Default "user" (uid 1000); "root" for root. */
  user?: string;
  cwd?: string;
  /** Ends the session after this many seconds (default: none). */
  timeout_seconds?: number;
}

export interface PathQuery {
  /** An absolute, clean path in the sandbox. */
  path: string;
}

export interface WriteFileQuery extends PathQuery {
  /** Octal permission bits, e.g. "0644" (the default). */
  mode?: string;
  owner?: string;
  make_parents?: boolean;
}

export interface RemoveFileQuery extends PathQuery {
  recursive?: boolean;
}

export interface MkdirQuery extends PathQuery {
  /** Octal permission bits, e.g. "0755". */
  mode?: string;
  /** "user", "root" or "name:group" (default the default user). */
  owner?: string;
}

export interface MoveFileQuery {
  /** The absolute path to move. */
  from: string;
  /** Its new absolute path. */
  to: string;
}

/** The body of writeFile: raw bytes (a string is sent as UTF-8). */
export type FileData = Uint8Array | ArrayBuffer | string | Blob;

/** One event of execStream. The last one is always "exit". */
export type ExecEvent =
  | { type: "stdout"; data: Uint8Array }
  | { type: "stderr"; data: Uint8Array }
  | { type: "exit"; result: ExecResult };

/**
 * One event of runCodeStream, as the cell runs: its output, each rich
 * result, the exception it raised; the last one is always "end", with the
 * finished cell (its stdout, stderr and results empty: they came as
 * events).
 */
export type CodeEvent =
  | { type: "stdout"; text: string }
  | { type: "stderr"; text: string }
  | { type: "result"; result: CodeResult }
  | { type: "exception"; error: CodeError }
  | { type: "end"; execution: CodeExecution };

/**
 * One event of getProcessOutput. `offset` is the number of bytes of that
 * stream before `data`; an offset past the end of the stream's previous
 * chunk (or past the offset asked for) means the guest dropped the bytes
 * between. "exit" comes once the process has ended: its result, with
 * stdout and stderr empty.
 */
export type ProcessOutputEvent =
  | { event: "stdout"; offset: number; data: Uint8Array }
  | { event: "stderr"; offset: number; data: Uint8Array }
  | { event: "exit"; result: ExecResult };
