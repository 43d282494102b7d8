// The API's routes, by OpenAPI operationId. The client sends every request
// through this table, and a test checks it against the server's
// /openapi.json: same operations, same methods, same paths.

export interface Operation {
  readonly method: "GET" | "POST" | "PUT" | "PATCH" | "DELETE";
  readonly path: string;
  /** No API key needed (and none is sent). */
  readonly public?: boolean;
}

export const OPERATIONS = {
  getHealth: { method: "GET", path: "/health", public: true },
  getOpenAPI: { method: "GET", path: "/openapi.json", public: true },
  getInfo: { method: "GET", path: "/v1/info" },
  createSandbox: { method: "POST", path: "/v1/sandboxes" },
  listSandboxes: { method: "GET", path: "/v1/sandboxes" },
  getSandbox: { method: "GET", path: "/v1/sandboxes/{id}" },
  deleteSandbox: { method: "DELETE", path: "/v1/sandboxes/{id}" },
  pauseSandbox: { method: "POST", path: "/v1/sandboxes/{id}/pause" },
  resumeSandbox: { method: "POST", path: "/v1/sandboxes/{id}/resume" },
  stopSandbox: { method: "POST", path: "/v1/sandboxes/{id}/stop" },
  startSandbox: { method: "POST", path: "/v1/sandboxes/{id}/start" },
  exec: { method: "POST", path: "/v1/sandboxes/{id}/exec" },
  execStream: { method: "POST", path: "/v1/sandboxes/{id}/exec/stream" },
  startProcess: { method: "POST", path: "/v1/sandboxes/{id}/processes" },
  listProcesses: { method: "GET", path: "/v1/sandboxes/{id}/processes" },
  getProcess: { method: "GET", path: "/v1/sandboxes/{id}/processes/{pid}" },
  killProcess: { method: "POST", path: "/v1/sandboxes/{id}/processes/{pid}/kill" },
  writeFile: { method: "PUT", path: "/v1/sandboxes/{id}/files" },
  readFile: { method: "GET", path: "/v1/sandboxes/{id}/files" },
  removeFile: { method: "DELETE", path: "/v1/sandboxes/{id}/files" },
  statFile: { method: "GET", path: "/v1/sandboxes/{id}/files/stat" },
  listFiles: { method: "GET", path: "/v1/sandboxes/{id}/files/list" },
  mkdir: { method: "POST", path: "/v1/sandboxes/{id}/files/mkdir" },
  listCommands: { method: "GET", path: "/v1/sandboxes/{id}/commands" },
  getFirewall: { method: "GET", path: "/v1/sandboxes/{id}/firewall" },
  setFirewall: { method: "PUT", path: "/v1/sandboxes/{id}/firewall" },
  createAccount: { method: "POST", path: "/v1/accounts" },
  listAccounts: { method: "GET", path: "/v1/accounts" },
  getAccount: { method: "GET", path: "/v1/accounts/{account}" },
  updateAccount: { method: "PATCH", path: "/v1/accounts/{account}" },
  deleteAccount: { method: "DELETE", path: "/v1/accounts/{account}" },
  createProject: { method: "POST", path: "/v1/projects" },
  listProjects: { method: "GET", path: "/v1/projects" },
  getProject: { method: "GET", path: "/v1/projects/{project}" },
  updateProject: { method: "PATCH", path: "/v1/projects/{project}" },
  deleteProject: { method: "DELETE", path: "/v1/projects/{project}" },
  createFleet: { method: "POST", path: "/v1/projects/{project}/fleets" },
  listFleets: { method: "GET", path: "/v1/projects/{project}/fleets" },
  getFleet: { method: "GET", path: "/v1/projects/{project}/fleets/{fleet}" },
  deleteFleet: { method: "DELETE", path: "/v1/projects/{project}/fleets/{fleet}" },
  createKey: { method: "POST", path: "/v1/keys" },
  listKeys: { method: "GET", path: "/v1/keys" },
  getKey: { method: "GET", path: "/v1/keys/{key}" },
  revokeKey: { method: "DELETE", path: "/v1/keys/{key}" },
  rotateKey: { method: "POST", path: "/v1/keys/{key}/rotate" },
  createEnvironment: { method: "POST", path: "/v1/environments" },
  listEnvironments: { method: "GET", path: "/v1/environments" },
  getEnvironment: { method: "GET", path: "/v1/environments/{environment}" },
  updateEnvironment: { method: "PATCH", path: "/v1/environments/{environment}" },
  deleteEnvironment: { method: "DELETE", path: "/v1/environments/{environment}" },
  listEnvironmentVersions: { method: "GET", path: "/v1/environments/{environment}/versions" },
  getEnvironmentVersion: { method: "GET", path: "/v1/environments/{environment}/versions/{version}" },
  listAudit: { method: "GET", path: "/v1/audit" },
  verifyAudit: { method: "GET", path: "/v1/audit/verify" },
  getAuditKey: { method: "GET", path: "/v1/audit/key" },
  createBudget: { method: "POST", path: "/v1/budgets" },
  listBudgets: { method: "GET", path: "/v1/budgets" },
  getBudget: { method: "GET", path: "/v1/budgets/{budget}" },
  deleteBudget: { method: "DELETE", path: "/v1/budgets/{budget}" },
  getUsage: { method: "GET", path: "/v1/usage" },
  listEvents: { method: "GET", path: "/v1/events" },
  getSandboxMetrics: { method: "GET", path: "/v1/sandboxes/{id}/metrics" },
  getServerMetrics: { method: "GET", path: "/metrics" },
} as const satisfies Record<string, Operation>;

/** An OpenAPI operationId; each is a method of HareBox. */
export type OperationId = keyof typeof OPERATIONS;
