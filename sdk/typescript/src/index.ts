// HareBox: a TypeScript client of the HareBox REST API.
//
//     import { HareBox } from "harebox";
//     const hb = new HareBox(); // $HAREBOX_URL, $HAREBOX_API_KEY
//     const box = await hb.create({ image: "minimal" });
//     const r = await box.run("echo hi");
//     await box.delete();

export { HareBox, VERSION } from "./client.js";
export type { HareBoxOptions, RequestOptions, CallOptions, PathCallOptions, SandboxList } from "./client.js";
export { HareBoxError, RateLimitedError } from "./errors.js";
export { Sandbox } from "./sandbox.js";
export type { RunOptions, WriteOptions } from "./sandbox.js";
export { OPERATIONS } from "./operations.js";
export type { Operation, OperationId } from "./operations.js";
export type {
  State,
  ErrorCode,
  Error,
  ErrorBody,
  Site,
  Info,
  Size,
  Resources,
  CreateRequest,
  Sandbox as SandboxData,
  ExecRequest,
  ExecResult,
  Process,
  Command,
  FileInfo,
  FirewallRule,
  FirewallPolicy,
  NameRequest,
  Retention,
  Account,
  AccountUpdate,
  Project,
  ProjectUpdate,
  Fleet,
  Rate,
  Scope,
  KeyRequest,
  Key,
  KeyWithSecret,
  EnvVar,
  EnvFile,
  CredentialRule,
  EnvironmentRequest,
  EnvironmentUpdate,
  EnvironmentVersion,
  Environment,
  AuditOutcome,
  AuditEntry,
  AuditReport,
  AuditKey,
  Health,
  ProcessList,
  CommandList,
  FileList,
  AccountList,
  ProjectList,
  FleetList,
  KeyList,
  EnvironmentList,
  EnvironmentVersionList,
  AuditList,
  KillRequest,
  ListSandboxesQuery,
  AccountQuery,
  EnvironmentQuery,
  AuditQuery,
  CommandsQuery,
  GetProcessQuery,
  PathQuery,
  WriteFileQuery,
  RemoveFileQuery,
  MkdirQuery,
  FileData,
  ExecEvent,
} from "./types.js";
