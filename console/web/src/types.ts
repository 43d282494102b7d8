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
  digest?: string;
  kernel_version?: string;
  built_at?: string;
  root_disk?: boolean;
  golden?: { vcpus: number; memory_mb: number; disk_gb: number; state: string }[];
  pool_idle?: number;
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

// ---- Environments ----

// EnvVar: in answers a secret's value is absent (and never shown if not).
export interface EnvVar {
  value?: string;
  secret?: boolean;
}

export interface EnvFile {
  path: string;
  mode?: number;
  owner?: string;
  content: string;
  template?: boolean;
}

export interface CredentialRule {
  secret: string;
  hosts: string[];
  ports?: string;
  header?: string;
  format?: string;
  allow_http?: boolean;
}

export interface EnvironmentVersion {
  environment_id: string;
  version: number;
  created_at: string;
  third_party_safe: boolean;
  variables: Record<string, EnvVar>;
  files: EnvFile[];
  credentials: CredentialRule[];
}

export interface Environment {
  id: string;
  account_id: string;
  project_id: string;
  project: string;
  name: string;
  latest: number;
  created_at: string;
  updated_at: string;
  version?: EnvironmentVersion;
}

// ---- Budgets and usage ----

export const BUDGET_KINDS = ["account", "project", "fleet", "label", "key"] as const;
export const BUDGET_PERIODS = ["monthly", "total"] as const;
export const BUDGET_ACTIONS = ["notify", "deny_new", "pause", "stop", "delete"] as const;

export interface BudgetScope {
  kind: (typeof BUDGET_KINDS)[number];
  ref?: string;
  labels?: Record<string, string>;
}

export interface Budget {
  id: string;
  account_id: string;
  name?: string;
  scope: BudgetScope;
  from_key?: boolean;
  project_id?: string;
  period: (typeof BUDGET_PERIODS)[number];
  limit_usd: string;
  action: (typeof BUDGET_ACTIONS)[number];
  warn_at_percent?: number[];
  created_at: string;
  period_start: string;
  spent_usd: string;
  reserved_usd: string;
  reached_at?: string;
  action_pending?: boolean;
  warned_percent?: number[];
}

export interface UsageGroup {
  group: string;
  name?: string;
  vcpu_seconds: number;
  memory_gib_seconds: number;
  snapshot_gb_seconds?: number;
  paused_seconds: number;
  egress_bytes: number;
  cost_usd: string;
}

// ---- Hosts ----

export interface MeshTunnel {
  host: string;
  public_key: string;
  endpoint?: string;
  last_handshake?: string;
  rx_bytes: number;
  tx_bytes: number;
}

export interface HostMesh {
  public_key: string;
  endpoint: string;
  tunnels?: MeshTunnel[];
  reported_at?: string;
}

export interface Host {
  name: string;
  site: string;
  country?: string;
  address?: string;
  capacity: Resources;
  used: Resources;
  up: boolean;
  started_at: string;
  renewed_at: string;
  lease_until: string;
  mesh?: HostMesh;
}

// ---- A sandbox's monitoring, processes, history and URLs ----

export interface MetricSample {
  sandbox_id: string;
  time: string;
  cpu_seconds: number;
  memory_bytes: number;
  disk_bytes: number;
  net_sent_bytes: number;
  net_received_bytes: number;
}

export interface Process {
  id: string;
  sandbox_id: string;
  cmd?: string;
  argv?: string[];
  pid?: number;
  running: boolean;
  started_at: string;
  tag?: string;
  cwd?: string;
  user?: string;
  pty?: boolean;
  result?: ExecResult;
}

export interface Command {
  id: string;
  sandbox_id: string;
  kind: "exec" | "stream" | "background" | "code";
  cmd?: string;
  argv?: string[];
  user?: string;
  cwd?: string;
  started_at: string;
  ended_at: string;
  result?: ExecResult;
  output_purged: boolean;
}

export const URL_AUTHS = ["token", "oidc", "mtls"] as const;

export interface OIDCRule {
  issuer: string;
  audience: string;
  subjects?: string[];
  emails?: string[];
  groups?: string[];
}

// PublishedURL is the API's URL schema (named so as not to hide the
// browser's URL).
export interface PublishedURL {
  id: string;
  sandbox_id?: string;
  port: number;
  auth?: string;
  oidc?: OIDCRule;
  url?: string;
  path_url?: string;
  token?: string;
  link?: string;
  created_at?: string;
  rotated_at?: string;
}

export const SIZE_PRESETS = ["small", "medium", "large"] as const;
