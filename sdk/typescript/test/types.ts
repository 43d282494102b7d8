// Compiled (never run) by `npm run check`: the README's TypeScript
// walkthrough, verbatim, and the rest of the public API's types, as a user
// of the published package sees them.
import { writeFile } from "node:fs/promises";
import { Execution, HareBox, HareBoxError, Pty, RateLimitedError, Result, RESULT_FORMATS, Sandbox } from "harebox";
import type {
  Account,
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
  CodeError,
  CodeEvent,
  CodeExecution,
  CodeLanguage,
  CodeRequest,
  CodeResult,
  Command,
  CommandList,
  CredentialRule,
  EnvFile,
  Environment,
  EnvironmentRequest,
  EnvironmentUpdate,
  EnvironmentVersion,
  EnvVar,
  EventList,
  EventQuery,
  ExecEvent,
  ExecResult,
  FileInfo,
  FirewallPolicy,
  Fleet,
  ForkRequest,
  Info,
  Key,
  KeyWithSecret,
  MetricSample,
  MetricSampleList,
  MetricsQuery,
  OIDCRule,
  Process,
  ProcessOutputEvent,
  ProcessOutputQuery,
  Project,
  PtyOptions,
  PtyQuery,
  Retention,
  ResultFormat,
  RunCodeOptions,
  SandboxData,
  SandboxURL,
  Snapshot,
  SnapshotList,
  SnapshotRequest,
  SnapshotsQuery,
  State,
  Scope,
  URLCA,
  URLCAQuery,
  URLCARequest,
  URLList,
  URLRequest,
  UsageGroup,
  UsageQuery,
} from "harebox";
import { Agent, fetch as undiciFetch } from "undici";

export async function walkthrough(): Promise<void> {
  const hb = new HareBox();
  const box = await hb.create({ name: "untrusted", size: { preset: "small" }, no_env: true, ttl_seconds: 900 });
  await hb.setFirewall(box.id, { body: { default_outbound: "deny", outbound: [
    { action: "allow", protocol: "tcp", ports: "443", hosts: ["pypi.org", "files.pythonhosted.org"] }] } });
  const r = await box.run("python3 /home/user/job.py", { timeout_seconds: 300 });
  console.log(r.exit_code, r.stdout);
  await hb.deleteSandbox(box.id);
}

export async function everything(hb: HareBox, id: string): Promise<void> {
  const info: Info = await hb.getInfo();
  const box: Sandbox = await hb.getSandbox(id);
  const plain: SandboxData = box.toJSON();
  const list: Sandbox[] = (await hb.listSandboxes({ query: { label: ["a=b"], state: "running" } })).sandboxes;
  const res: ExecResult = await hb.exec(id, { body: { argv: ["ls"], stdin: new Uint8Array(1) }, timeoutMs: 1000 });
  for await (const ev of hb.execStream(id, { body: { cmd: "ls" }, signal: AbortSignal.timeout(10) })) {
    const e: ExecEvent = ev;
    if (ev.type === "exit") ev.result.exit_code satisfies number;
    else ev.data satisfies Uint8Array;
    void e;
  }
  const p: Process = await hb.startProcess(id, { body: { cmd: "sleep 1" } });
  await hb.getProcess(id, p.id, { query: { wait: true, timeout_seconds: 5 } });
  await hb.killProcess(id, p.id, { body: { signal: 15 } });
  const from: ProcessOutputQuery = { follow: true, stdout_offset: 0, stderr_offset: 12 };
  for await (const ev of hb.getProcessOutput(id, p.id, { query: from, signal: AbortSignal.timeout(10), timeoutMs: 0 })) {
    const e: ProcessOutputEvent = ev;
    if (ev.event === "exit") ev.result.exit_code satisfies number;
    else [ev.offset, ev.data] satisfies [number, Uint8Array];
    void e;
  }
  for await (const ev of (await hb.getSandbox(id)).processOutput(p.id, { follow: false, stdout_offset: 4, timeoutMs: 1000 })) void ev;
  // @ts-expect-error: follow is a boolean.
  hb.getProcessOutput(id, p.id, { query: { follow: "yes" } });
  const size: PtyQuery = { rows: 30, cols: 90, cmd: "top", user: "root", cwd: "/tmp", timeout_seconds: 60 };
  const pty: Pty = await hb.openPty(id, { query: size, signal: AbortSignal.timeout(1000), timeoutMs: 500 });
  pty.write("ls\n") satisfies boolean;
  pty.write(new Uint8Array([3]));
  pty.resize(40, 120);
  pty.signal(2);
  pty.eof();
  for await (const chunk of pty) chunk satisfies Uint8Array;
  (await pty.result).exit_code satisfies number;
  pty.open satisfies boolean;
  pty.close();
  const opts: PtyOptions = { rows: 24, cols: 80, signal: AbortSignal.timeout(10) };
  (await box.pty(opts)).close();
  // @ts-expect-error: rows is a number.
  hb.openPty(id, { query: { rows: "30" } });
  const fi: FileInfo = await hb.writeFile(id, { query: { path: "/tmp/x", mode: "0600" }, body: "text" });
  const bytes: Uint8Array = await hb.readFile(id, { query: { path: "/tmp/x" } });
  await hb.removeFile(id, { query: { path: "/tmp/x", recursive: true } });
  await hb.mkdir(id, { query: { path: "/tmp/d" } });
  (await hb.listFiles(id, { query: { path: "/tmp" } })).entries satisfies FileInfo[];
  const fw: FirewallPolicy = await hb.getFirewall(id);
  await box.writeFile("/tmp/y", bytes, { make_parents: true });
  await box.pause();
  await box.resume();
  const stopped: Sandbox = await box.stop();
  stopped.state satisfies State;
  await box.boot({ timeoutMs: 600_000 });
  (await hb.stopSandbox(id)).state satisfies State;
  (await hb.startSandbox(id, { signal: AbortSignal.timeout(1000) })) satisfies Sandbox;
  const hibernated: Sandbox = await box.hibernate({ timeoutMs: 600_000 });
  hibernated.state satisfies State;
  "hibernated" satisfies State;
  (await hb.hibernateSandbox(id, { signal: AbortSignal.timeout(1000) })) satisfies Sandbox;
  await hb.listSandboxes({ query: { state: "hibernated" } });
  // @ts-expect-error: "hibernating" is not a state.
  "hibernating" satisfies State;
  // @ts-expect-error: a sandbox's start runs a command; boot starts the sandbox.
  await box.start();
  await box.refresh();
  const forkReq: ForkRequest = { count: 2, name: "worker", labels: { role: "worker" }, ttl_seconds: 900 };
  const clones: Sandbox[] = (await hb.forkSandbox(id, { body: forkReq, timeoutMs: 600_000 })).sandboxes;
  (await box.fork({ count: 3, signal: AbortSignal.timeout(1000) })) satisfies Sandbox[];
  await box.fork();
  const snapReq: SnapshotRequest = { name: "warm" };
  const snap: Snapshot = await hb.createSnapshot(id, { body: snapReq });
  (await box.snapshot({ name: "warm-2", timeoutMs: 600_000 })).bytes satisfies number;
  await box.snapshot();
  snap.sandbox_id satisfies string;
  snap.size satisfies { vcpus: number; memory_mb: number; disk_gb: number };
  snap.name satisfies string | undefined;
  const snapQuery: SnapshotsQuery = { sandbox: id };
  const snaps: SnapshotList = await hb.listSnapshots({ query: snapQuery });
  snaps.snapshots satisfies Snapshot[];
  await hb.listSnapshots();
  (await hb.getSnapshot(snap.id)).created_at satisfies string;
  const restored: Sandbox = await hb.create({ snapshot: snap.id, name: "restored", labels: { from: "warm" } });
  await hb.deleteSnapshot(snap.id) satisfies void;
  void [clones, restored];
  // @ts-expect-error: a fork's count is a number.
  await box.fork({ count: "2" });
  // @ts-expect-error: a snapshot has only a name.
  await hb.createSnapshot(id, { body: { image: "minimal" } });
  // @ts-expect-error: listSnapshots filters by sandbox only.
  await hb.listSnapshots({ query: { state: "running" } });
  const urlReq: URLRequest = { port: 8080, auth: "token" };
  const published: SandboxURL = await hb.createURL(id, { body: urlReq });
  published.token satisfies string | undefined;
  published.link satisfies string | undefined;
  [published.url, published.path_url, published.created_at] satisfies string[];
  (await box.createURL(3000, { auth: "token", timeoutMs: 1000 })).port satisfies number;
  const urls: URLList = await hb.listURLs(id);
  urls.urls satisfies SandboxURL[];
  (await box.listURLs()).urls satisfies SandboxURL[];
  (await hb.getURL(id, published.id)).rotated_at satisfies string | undefined;
  await box.getURL(published.id, { signal: AbortSignal.timeout(1000) });
  (await hb.rotateURL(id, published.id)).token satisfies string | undefined;
  await box.rotateURL(published.id);
  await hb.deleteURL(id, published.id) satisfies void;
  await box.deleteURL(published.id) satisfies void;
  // @ts-expect-error: createURL needs its body (the port).
  await hb.createURL(id);
  // @ts-expect-error: a port is a number.
  await hb.createURL(id, { body: { port: "8080" } });
  // @ts-expect-error: the auth modes are "token", "oidc" and "mtls".
  await box.createURL(8080, { auth: "basic" });
  const mtlsReq: URLRequest = { port: 8443, auth: "mtls" };
  (await hb.createURL(id, { body: mtlsReq })).project_id satisfies string;
  (await box.createURL(8443, { auth: "mtls", timeoutMs: 1000 })).auth satisfies string;
  // The project's URL CA and its client certificates.
  const caQuery: URLCAQuery = { project: "web", account: "acme" };
  const ca: URLCA = await hb.getURLCA({ query: caQuery });
  [ca.project_id, ca.certificate, ca.created_at] satisfies string[];
  ca.uploaded satisfies boolean;
  await hb.getURLCA();
  await hb.setURLCA() satisfies URLCA;
  const upload: URLCARequest = { certificate: ca.certificate };
  (await hb.setURLCA({ query: { project: "web" }, body: upload })).uploaded satisfies boolean;
  await hb.deleteURLCA({ query: caQuery }) satisfies void;
  const certReq: ClientCertRequest = { name: "ada", ttl: "720h" };
  const cert: ClientCert = await hb.issueClientCert({ query: { project: "web" }, body: certReq });
  [cert.serial, cert.project_id, cert.created_at] satisfies string[];
  [cert.name, cert.not_after, cert.revoked_at, cert.certificate, cert.private_key] satisfies (string | undefined)[];
  cert.issued satisfies boolean;
  const certs: ClientCertList = await hb.listClientCerts({ query: caQuery });
  certs.certs satisfies ClientCert[];
  (await hb.listClientCerts()).certs satisfies ClientCert[];
  (await hb.revokeClientCert(cert.serial, { query: { project: "web" } })).revoked_at satisfies string | undefined;
  await hb.revokeClientCert(cert.serial);
  // @ts-expect-error: issueClientCert needs its body (the name).
  await hb.issueClientCert();
  // @ts-expect-error: a certificate's name is required.
  await hb.issueClientCert({ body: { ttl: "720h" } });
  // @ts-expect-error: the query names a project and an account only.
  await hb.getURLCA({ query: { sandbox: id } });
  // @ts-expect-error: a CA is uploaded as PEM text.
  await hb.setURLCA({ body: { certificate: new Uint8Array() } });
  const oidcRule: OIDCRule = { issuer: "https://accounts.google.com", audience: "my-client-id", emails: ["ada@example.com"] };
  const oidcReq: URLRequest = { port: 8080, auth: "oidc", oidc: oidcRule };
  const app: SandboxURL = await hb.createURL(id, { body: oidcReq });
  app.oidc satisfies OIDCRule | undefined;
  [app.oidc?.issuer, app.oidc?.audience] satisfies (string | undefined)[];
  app.oidc?.subjects satisfies string[] | undefined;
  (await box.createURL(3000, { auth: "oidc", oidc: { issuer: "https://issuer.example", audience: "web", groups: ["eng"] }, timeoutMs: 1000 })).oidc?.groups satisfies string[] | undefined;
  // @ts-expect-error: a rule needs its audience.
  await box.createURL(8080, { auth: "oidc", oidc: { issuer: "https://issuer.example", emails: ["ada@example.com"] } });
  // @ts-expect-error: a rule's emails are a list.
  await box.createURL(8080, { auth: "oidc", oidc: { issuer: "https://issuer.example", audience: "web", emails: "ada@example.com" } });
  await box.delete();
  try {
    await hb.getSandbox("nope");
  } catch (e) {
    if (e instanceof HareBoxError) console.log(e.status, e.code, e.message, e.field);
  }
  void [info, plain, list, res, fi, fw];
  const acc: Account = await hb.createAccount({ body: { name: "acme" } });
  (await hb.listAccounts()).accounts satisfies Account[];
  await hb.getAccount(acc.id);
  const prj: Project = await hb.createProject({ query: { account: acc.name }, body: { name: "web" } });
  (await hb.listProjects({ query: { account: acc.id } })).projects satisfies Project[];
  await hb.getProject(prj.id, { query: { account: acc.id } });
  const flt: Fleet = await hb.createFleet(prj.name, { query: { account: acc.id }, body: { name: "workers" } });
  (await hb.listFleets(prj.name)).fleets satisfies Fleet[];
  await hb.getFleet(prj.name, flt.id);
  const inProject: Sandbox[] = (await hb.listSandboxes({ query: { project: prj.name, fleet: flt.name } })).sandboxes;
  await hb.create({ account_id: acc.id, project: prj.name, fleet: flt.name });
  box.project satisfies string;
  box.fleet satisfies string | undefined;
  const scope: Scope = { actions: ["sandboxes:read"], projects: [prj.id], rate: { per_second: 1, burst: 1 }, budget_usd: "5.00" };
  const made: KeyWithSecret = await hb.createKey({ body: { account_id: acc.id, description: "ci", scope, ttl_seconds: 3600 } });
  const scoped = new HareBox({ apiKey: made.secret });
  const keys: Key[] = (await scoped.listKeys()).keys;
  const k: Key = await hb.getKey(made.id);
  (await hb.rotateKey(k.id)).secret satisfies string;
  (await hb.revokeKey(k.id)).revoked_at satisfies string | undefined;
  await hb.deleteFleet(prj.name, flt.name, { query: { account: acc.id } });
  await hb.deleteProject(prj.id, { query: { account: acc.id } });
  await hb.deleteAccount(acc.id) satisfies void;
  try {
    await scoped.listSandboxes();
  } catch (e) {
    if (e instanceof RateLimitedError) e.retryAfter satisfies number | undefined;
    else if (e instanceof HareBoxError && e.code === "forbidden") console.log(e.message);
  }
  void [inProject, keys];
  const tp: Project = await hb.updateProject(prj.name, { query: { account: acc.id }, body: { third_party_default: true } });
  tp.third_party_default satisfies boolean;
  const token: EnvVar = { value: "s3cret", secret: true };
  const file: EnvFile = { path: "/etc/app.conf", content: "token={{TOKEN}}", template: true, mode: 0o600, owner: "root" };
  const rule: CredentialRule = { secret: "TOKEN", hosts: ["api.example.com"], ports: "443", header: "Authorization", format: "Bearer {value}" };
  const envReq: EnvironmentRequest = { name: "prod", variables: { MODE: { value: "prod" }, TOKEN: token }, files: [file], credentials: [rule] };
  const env: Environment = await hb.createEnvironment({ query: { project: prj.name, account: acc.id }, body: envReq });
  env.latest satisfies number;
  env.version.variables["TOKEN"]?.secret satisfies boolean | undefined;
  (await hb.listEnvironments({ query: { project: prj.id } })).environments satisfies Environment[];
  await hb.getEnvironment(env.id);
  const change: EnvironmentUpdate = { set: { MODE: { value: "staging" } }, unset: ["OLD"], third_party_safe: true };
  (await hb.updateEnvironment("prod", { query: { project: prj.name }, body: change })).version.version satisfies number;
  (await hb.listEnvironmentVersions("prod", { query: { project: prj.name } })).versions satisfies EnvironmentVersion[];
  const v1: EnvironmentVersion = await hb.getEnvironmentVersion(env.id, 1);
  await hb.getEnvironmentVersion("prod", "2", { query: { project: prj.name } });
  v1.files satisfies EnvFile[];
  v1.credentials satisfies CredentialRule[];
  const pinned: Sandbox = await hb.create({ project: prj.name, environment: "prod@1", third_party: true });
  pinned.environment satisfies string | undefined;
  pinned.third_party satisfies boolean | undefined;
  await hb.deleteEnvironment("prod", { query: { project: prj.name } }) satisfies void;
  const auditQuery: AuditQuery = { from: "2026-11-30T00:00:00Z", principal: "operator", outcome: "denied", after: "42", limit: 1000 };
  const page: AuditList = await hb.listAudit({ query: auditQuery });
  page.next satisfies string | undefined;
  const first: AuditEntry | undefined = page.entries[0];
  first?.outcome satisfies "ok" | "denied" | "error" | undefined;
  for await (const e of hb.auditEntries({ query: { action: "exec", account: acc.id } })) {
    e.seq satisfies number;
    e.request_id satisfies string | undefined;
  }
  const report: AuditReport = await hb.verifyAudit();
  if (!report.ok) console.log(report.first_bad, report.reason);
  const auditKey: AuditKey = await hb.getAuditKey();
  auditKey.algorithm satisfies "ed25519";
  const eventQuery: EventQuery = { after: "120", limit: 1000, account: acc.name };
  const events: EventList = await hb.listEvents({ query: eventQuery });
  events.next satisfies string;
  const event: AuditEntry | undefined = events.events[0];
  event?.principal satisfies string | undefined;
  await hb.listEvents({ query: { after: 120 } });
  for await (const e of hb.followEvents({ query: { after: events.next, account: acc.id }, signal: AbortSignal.timeout(20_000), timeoutMs: 0 })) {
    e.seq satisfies number;
    if (e.action === "budgetReached") break;
  }
  const watched: Sandbox = await hb.create({ monitoring: false, snapshots: false });
  watched.monitoring satisfies boolean | undefined;
  watched.snapshots satisfies boolean | undefined;
  const history: CommandList = await hb.listCommands(watched.id, { query: { limit: 20 } });
  const cmd: Command | undefined = history.commands[0];
  cmd?.kind satisfies "exec" | "stream" | "background" | "code" | undefined;
  cmd?.result?.stdout satisfies string | undefined;
  cmd?.output_purged satisfies boolean | undefined;
  const metricsQuery: MetricsQuery = { from: "2026-11-30T00:00:00Z", to: "2026-12-01T00:00:00Z", limit: 100 };
  const samples: MetricSampleList = await hb.getSandboxMetrics(watched.id, { query: metricsQuery });
  const sample: MetricSample | undefined = samples.samples[0];
  sample?.cpu_seconds satisfies number | undefined;
  sample?.memory_bytes satisfies number | undefined;
  sample?.net_received_bytes satisfies number | undefined;
  sample?.time satisfies string | undefined;
  (await watched.metrics({ limit: 1, signal: AbortSignal.timeout(1000) })).samples satisfies MetricSample[];
  await hb.getSandboxMetrics(watched.id);
  const exposition: string = await hb.getServerMetrics();
  void exposition;
  const retention: Retention = { history_days: 30, output_days: 7 };
  const change2: AccountUpdate = { retention };
  const updated: Account = await hb.updateAccount("default", { body: change2 });
  updated.retention.output_days satisfies number | undefined;
  await hb.updateAccount(acc.id, { body: { retention: {} } });
  const budgetReq: BudgetRequest = { name: "team-red", scope: { kind: "label", labels: { team: "red" } }, period: "monthly", limit_usd: "25.00", action: "pause", warn_at_percent: [80] };
  const budget: Budget = await hb.createBudget({ query: { account: acc.id }, body: budgetReq });
  budget.spent_usd satisfies string;
  budget.reserved_usd satisfies string;
  budget.reached_at satisfies string | undefined;
  budget.scope.ref satisfies string | undefined;
  await hb.createBudget({ body: { scope: { kind: "project", ref: "web" }, period: "total", limit_usd: "100", action: "deny_new" } });
  const budgets: BudgetList = await hb.listBudgets({ query: { account: acc.name } });
  budgets.budgets satisfies Budget[];
  (await hb.getBudget(budget.id)).action satisfies "notify" | "deny_new" | "pause" | "stop" | "delete";
  await hb.deleteBudget(budget.id) satisfies void;
  const usageQuery: UsageQuery = { account: acc.id, from: "2026-11-01T00:00:00Z", to: "2026-12-01T00:00:00Z", group_by: "label:team" };
  const row: UsageGroup | undefined = (await hb.getUsage({ query: usageQuery })).usage[0];
  row?.cost_usd satisfies string | undefined;
  row?.vcpu_seconds satisfies number | undefined;
  await hb.getUsage();
  try {
    await hb.create({ project: "web" });
  } catch (e) {
    if (e instanceof HareBoxError && e.code === "budget_exceeded") console.log(e.status, e.message);
  }
  // @ts-expect-error: money is a decimal string, never a number.
  await hb.createBudget({ body: { scope: { kind: "account" }, period: "total", limit_usd: 25, action: "notify" } });
  await hb.createBudget({ body: { scope: { kind: "account" }, period: "total", limit_usd: "25", action: "stop" } });
  // @ts-expect-error: explode is no budget action.
  await hb.createBudget({ body: { scope: { kind: "account" }, period: "total", limit_usd: "25", action: "explode" } });
  // @ts-expect-error: a budget needs a scope.
  await hb.createBudget({ body: { period: "monthly", limit_usd: "25", action: "notify" } });
  // @ts-expect-error: usage groups by account, project, fleet, key, sandbox or label:KEY.
  await hb.getUsage({ query: { group_by: "team" } });
  // @ts-expect-error: a limit is a number.
  await hb.getSandboxMetrics(id, { query: { limit: "10" } });
  // @ts-expect-error: getServerMetrics returns the text, not an object.
  (await hb.getServerMetrics()).samples;
  // @ts-expect-error: getServerMetrics takes no query.
  await hb.getServerMetrics({ query: { format: "json" } });
  // @ts-expect-error: days are numbers.
  await hb.updateAccount("default", { body: { retention: { history_days: "30" } } });
  // @ts-expect-error: a retention has only history_days and output_days.
  await hb.updateAccount("default", { body: { retention: { days: 1 } } });
  // @ts-expect-error: an outcome is ok, denied or error.
  await hb.listAudit({ query: { outcome: "failed" } });
  // @ts-expect-error: listAudit reads JSON pages; auditEntries iterates.
  await hb.listAudit({ query: { format: "jsonl" } });
  // @ts-expect-error: listEvents reads JSON pages; followEvents streams.
  await hb.listEvents({ query: { follow: true } });
  // @ts-expect-error: a limit is a number.
  await hb.listEvents({ query: { limit: "10" } });
  // @ts-expect-error: an environment needs a name.
  await hb.createEnvironment({ body: { variables: {} } });
  // @ts-expect-error: a file needs its content.
  await hb.updateEnvironment("prod", { body: { files: [{ path: "/x" }] } });
  // @ts-expect-error: a credential rule needs hosts.
  await hb.updateEnvironment("prod", { body: { credentials: [{ secret: "TOKEN" }] } });
  // @ts-expect-error: third_party_default is a boolean.
  await hb.updateProject("web", { body: { third_party_default: "yes" } });
  // @ts-expect-error: a project needs a name.
  await hb.createProject({ body: {} });
  // @ts-expect-error: a rate needs burst.
  await hb.createKey({ body: { scope: { rate: { per_second: 1 } } } });
  // @ts-expect-error: writeFile needs its path.
  await hb.writeFile(id, { body: "x" });
  // @ts-expect-error: a policy needs default_outbound.
  await hb.setFirewall(id, { body: { outbound: [] } });
}

export function trust(): void {
  // README, "TLS".
  const hb = new HareBox({ url: "https://hb.example:7443", ca: "/etc/harebox/ca.pem" });
  const pinned = new HareBox({ url: "https://10.0.0.5:7443", ca: "sha256:3f1c...e9a0" });
  void [hb, pinned];
  // @ts-expect-error: ca is a path or a sha256: fingerprint, a string.
  new HareBox({ ca: Buffer.from("") });
}

export async function mtls(hb: HareBox): Promise<void> {
  // README, auth "mtls" (undici's fetch imported as undiciFetch).
  const web = { query: { project: "web" } };
  await hb.setURLCA(web);
  const cert = await hb.issueClientCert({ ...web, body: { name: "ada", ttl: "720h" } });
  const box = await hb.create({ project: "web" });
  const app = await box.createURL(8080, { auth: "mtls" });
  const dispatcher = new Agent({ connect: { cert: cert.certificate, key: cert.private_key } });
  await undiciFetch(app.url, { dispatcher });
  await hb.revokeClientCert(cert.serial, web);
}

export async function codeInterpreter(): Promise<void> {
  // README, "Code interpreter".
  const hb = new HareBox();
  const box = await hb.create({ image: "code-interpreter", ttl_seconds: 900 });
  await box.runCode("import matplotlib.pyplot as plt\nxs = [1, 2, 3, 4]");
  const x = await box.runCode("plt.plot(xs, [v * v for v in xs])\nplt.show()\nsum(xs)");
  console.log(x.text);                                  // 10: the value of the cell's last expression
  const chart = x.results.find((r) => r.png);           // the chart plt.show() displayed
  if (chart?.png) await writeFile("chart.png", chart.png);   // the PNG's bytes
  await box.delete();

  await box.runCode("import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(1)", {
    onStdout: (text) => void process.stdout.write(text),
  });

  const ctx = await box.createCodeContext({ language: "bash", cwd: "/tmp" });
  await box.runCode("X=5", { context: ctx });
  (await box.runCode("echo $X", { context: ctx })).stdout;   // "5\n"
  await box.restartCodeContext(ctx.id);
  await box.deleteCodeContext(ctx.id);
}

export async function code(hb: HareBox, id: string): Promise<void> {
  const body: CodeRequest = { code: "1", context_id: "c1", language: "bash", env: { A: "1" }, timeout_seconds: 5 };
  const cell: CodeExecution = await hb.runCode(id, { body, timeoutMs: 1000 });
  cell.status satisfies "ok" | "error" | "timeout" | "died";
  const raw: CodeResult | undefined = cell.results[0];
  raw?.png satisfies string | undefined;
  for await (const ev of hb.runCodeStream(id, { body, signal: AbortSignal.timeout(10) })) {
    const e: CodeEvent = ev;
    if (ev.type === "stdout" || ev.type === "stderr") ev.text satisfies string;
    else if (ev.type === "result") ev.result.is_main_result satisfies boolean;
    else if (ev.type === "exception") ev.error.name satisfies string;
    else ev.execution.execution_count satisfies number;
    void e;
  }
  const request: CodeContextRequest = { language: "python", cwd: "/tmp", env: { A: "1" } };
  const ctx: CodeContext = await hb.createCodeContext(id, { body: request });
  ctx.language satisfies CodeLanguage;
  const contexts: CodeContextList = await hb.listCodeContexts(id);
  await hb.restartCodeContext(id, ctx.id);
  await hb.deleteCodeContext(id, ctx.id);
  const box = await hb.getSandbox(id);
  const options: RunCodeOptions = {
    context: ctx,
    language: "python",
    env: { A: "1" },
    timeoutMs: 5000,
    signal: AbortSignal.timeout(10_000),
    onStdout: (text) => void process.stdout.write(text),
    onStderr: async (text) => void text,
    onResult: (r: Result) => void r.png?.byteLength,
    onError: (e: CodeError) => void e.traceback,
  };
  const x: Execution = await box.runCode("1", options);
  x.text satisfies string | undefined;
  x.error?.name satisfies string | undefined;
  x.mainResult satisfies Result | undefined;
  const first = x.results[0];
  if (first) {
    first.png satisfies Uint8Array | undefined;
    first.formats() satisfies ResultFormat[];
    first.toJSON() satisfies CodeResult;
  }
  x.toJSON() satisfies CodeExecution;
  RESULT_FORMATS satisfies readonly ResultFormat[];
  new Execution(cell).results satisfies Result[];
  (await box.codeContexts()) satisfies CodeContext[];
  await box.createCodeContext({ language: "bash", cwd: "/tmp", timeoutMs: 1000 });
  await box.restartCodeContext(ctx.id);
  await box.deleteCodeContext(ctx.id, { signal: AbortSignal.timeout(10) });
  // @ts-expect-error: a cell needs its code.
  await hb.runCode(id, { body: { language: "python" } });
  // @ts-expect-error: the languages are python, javascript, typescript and bash.
  await box.runCode("1", { language: "r" });
  void contexts;
}
