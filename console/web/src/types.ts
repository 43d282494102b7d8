// The shapes of the API's requests and answers the console uses
// (api/openapi.yaml's schemas, the fields the console reads).

export const STATES = ["creating", "running", "paused", "stopped", "hibernated", "deleted", "lost"] as const;
export type State = (typeof STATES)[number];

export interface Principal {
  operator: boolean;
  account_id?: string;
  key_id?: string;
  scope?: Scope;
}

export interface Session {
  csrf_token: string;
  expires_at: string;
  principal: Principal;
}

export interface Resources {
  vcpus: number;
  memory_mb: number;
  disk_gb: number;
}

export interface Site {
  name: string;
  country: string;
}

export interface VolumeMount {
  name: string;
  path: string;
  read_only?: boolean;
}

export interface Sandbox {
  id: string;
  name?: string;
  account_id: string;
  project_id: string;
  project: string;
  fleet_id?: string;
  fleet?: string;
  state: State;
  image: string;
  size?: Resources;
  labels?: Record<string, string>;
  no_env?: boolean;
  environment?: string;
  third_party?: boolean;
  monitoring?: boolean;
  snapshots?: boolean;
  create_phases_ms?: Record<string, number>;
  served?: string;
  agent?: string;
  site?: Site;
  host?: string;
  mesh_address?: string;
  mesh_name?: string;
  volumes?: VolumeMount[];
  created_at: string;
  expires_at?: string;
  error?: string;
}

export interface Image {
  name: string;
  from?: string;
  kernel_version?: string;
  built_at?: string;
  root_disk?: boolean;
}

export interface ExecResult {
  exit_code: number;
  signal?: number;
  stdout: string;
  stderr: string;
  duration_ms: number;
  timed_out: boolean;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  error?: string;
}

export interface FileInfo {
  path: string;
  name: string;
  type: "file" | "dir" | "symlink" | "other";
  size: number;
  mode: number;
  mtime: string;
  link_target?: string;
}

export interface Scope {
  actions?: string[];
  sandboxes?: string[];
  projects?: string[];
  labels?: Record<string, string>;
  cidrs?: string[];
  rate?: { per_second: number; burst: number };
  budget_usd?: string;
}

export interface Key {
  id: string;
  account_id: string;
  description?: string;
  parent_id?: string;
  scope: Scope;
  created_at: string;
  expires_at?: string;
  revoked_at?: string;
  rotated_at?: string;
  hint: string;
}

export interface KeyWithSecret extends Key {
  secret: string;
}

export interface AuditEntry {
  seq: number;
  time: string;
  account_id?: string;
  principal: string;
  source?: string;
  action: string;
  target?: string;
  outcome: "ok" | "denied" | "error";
  error?: string;
  request_id?: string;
}

export interface AuditReport {
  ok: boolean;
  entries: number;
  checkpoints: number;
  first_bad?: number;
  reason?: string;
  anchor: string;
  anchored: number;
  unanchored: number;
}
