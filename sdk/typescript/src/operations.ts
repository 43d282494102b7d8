// The API's routes, by OpenAPI operationId. The client sends every request
// through this table, and a test checks it against the server's
// /openapi.json: same operations, same methods, same paths.

export interface Operation {
  readonly method: "GET" | "POST" | "PUT" | "DELETE";
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
  getFirewall: { method: "GET", path: "/v1/sandboxes/{id}/firewall" },
  setFirewall: { method: "PUT", path: "/v1/sandboxes/{id}/firewall" },
} as const satisfies Record<string, Operation>;

/** An OpenAPI operationId; each is a method of HareBox. */
export type OperationId = keyof typeof OPERATIONS;
