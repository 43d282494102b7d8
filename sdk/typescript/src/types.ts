// Types for every schema of the HareBox REST API (api/openapi.yaml), with
// the names the document gives them. Field names are the wire names.

/** A sandbox's lifecycle state. */
export type State = "creating" | "running" | "paused" | "stopped" | "deleted";

/** The error codes the server uses. */
export type ErrorCode =
  | "invalid"
  | "unauthorized"
  | "not_found"
  | "conflict"
  | "too_large"
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
  /** Keep every stored environment out of this sandbox. */
  no_env?: boolean;
  env?: Record<string, string>;
}

/** A sandbox as the server describes it. */
export interface Sandbox {
  /** e.g. "sbx_01j8z3k5m6n7p8q9r0s1t2v3w4" */
  id: string;
  name?: string;
  state: State;
  image: string;
  size: Resources;
  labels?: Record<string, string>;
  no_env: boolean;
  site: Site;
  /** RFC 3339 date-time. */
  created_at: string;
  /** RFC 3339 date-time. */
  expires_at?: string;
  error?: string;
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
  /** Set once the process has exited. */
  result?: ExecResult;
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

/** A sandbox's firewall policy. Inbound is always denied. */
export interface FirewallPolicy {
  default_outbound: "allow" | "deny";
  outbound?: FirewallRule[];
}

/** The body of getHealth. */
export interface Health {
  status: "ok";
}

/** The body of listSandboxes. */
export interface SandboxList {
  sandboxes: Sandbox[];
}

/** The body of listProcesses. */
export interface ProcessList {
  processes: Process[];
}

/** The body of listFiles. */
export interface FileList {
  entries: FileInfo[];
  truncated: boolean;
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
}

export interface GetProcessQuery {
  /** Wait for the process to exit (at most timeout_seconds). */
  wait?: boolean;
  /** How long to wait (default 60, at most 3600). */
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
}

/** The body of writeFile: raw bytes (a string is sent as UTF-8). */
export type FileData = Uint8Array | ArrayBuffer | string | Blob;

/** One event of execStream. The last one is always "exit". */
export type ExecEvent =
  | { type: "stdout"; data: Uint8Array }
  | { type: "stderr"; data: Uint8Array }
  | { type: "exit"; result: ExecResult };
