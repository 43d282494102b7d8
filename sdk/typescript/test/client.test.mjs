// Tests of the client that need no HareBox server: configuration, URL
// checks, the API key kept out of sight, the operations against the
// repository's api/openapi.yaml, timeouts and aborts (against a
// local HTTP server that never answers), error mapping (non-JSON answers,
// 402, 403, and 429 with Retry-After), the routes of every operation, the
// server's metrics read as text, the audit pages auditEntries follows,
// followed events (canned streams: their keepalives, entries, error event,
// end, silence and cancellation), a background process's output (a fake
// ring of chunks read from offsets: gaps, exit, error events, errors
// before the stream), the code interpreter's cells (answered as JSON and
// as canned event streams) and contexts, the sandbox's fields, and the
// event-stream reader.
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { createServer } from "node:http";
import { fileURLToPath } from "node:url";
import { inspect } from "node:util";
import { after, before, describe, test } from "node:test";

import { Execution, HareBox, HareBoxError, OPERATIONS, RateLimitedError, Result, Sandbox } from "harebox";
import { errorFromBody, parseRetryAfter, statusForCode } from "../dist/errors.js";
import { readSSE } from "../dist/sse.js";

const KEY = "hbk_test_secret_do_not_print_0123456789";
const REPO_OPENAPI = fileURLToPath(new URL("../../../api/openapi.yaml", import.meta.url));

describe("configuration", () => {
  test("refuses URLs that are not http or https", () => {
    for (const url of ["ftp://example.com", "file:///etc/passwd", "unix:/tmp/hb.sock", "javascript:alert(1)", "ws://127.0.0.1:1"]) {
      assert.throws(
        () => new HareBox({ url, apiKey: KEY }),
        (e) => e instanceof HareBoxError && e.code === "invalid" && e.field === "url" && e.status === 0,
        url,
      );
    }
  });

  test("refuses a missing or malformed URL, and credentials in it", () => {
    const saved = process.env.HAREBOX_URL;
    delete process.env.HAREBOX_URL;
    try {
      assert.throws(() => new HareBox({ apiKey: KEY }), /HAREBOX_URL/);
    } finally {
      if (saved !== undefined) process.env.HAREBOX_URL = saved;
    }
    assert.throws(() => new HareBox({ url: "not a url" }), HareBoxError);
    assert.throws(() => new HareBox({ url: "http://u:p@127.0.0.1:1" }), /credentials/);
    assert.throws(() => new HareBox({ url: "http://127.0.0.1:1", apiKey: "a\nb" }), /white space/);
  });

  test("reads HAREBOX_URL and HAREBOX_API_KEY; options win", () => {
    const saved = { u: process.env.HAREBOX_URL, k: process.env.HAREBOX_API_KEY };
    process.env.HAREBOX_URL = "http://127.0.0.1:7070/";
    process.env.HAREBOX_API_KEY = KEY;
    try {
      assert.equal(new HareBox().url, "http://127.0.0.1:7070");
      assert.equal(new HareBox({ url: "https://hb.example/api/" }).url, "https://hb.example/api");
    } finally {
      for (const [k, v] of [["HAREBOX_URL", saved.u], ["HAREBOX_API_KEY", saved.k]]) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    }
  });

  test("never shows the API key", () => {
    const hb = new HareBox({ url: "http://127.0.0.1:7070", apiKey: KEY });
    assert.ok(!inspect(hb, { showHidden: true, depth: 10 }).includes(KEY));
    assert.ok(!JSON.stringify(hb).includes(KEY));
    assert.ok(!String(hb).includes(KEY));
    assert.ok(!Object.values(hb).some((v) => String(v).includes(KEY)));
    const box = new Sandbox(hb, { id: "sbx_x", state: "running", image: "minimal", size: { vcpus: 1, memory_mb: 512, disk_gb: 1 }, no_env: false, site: { name: "l", country: "" }, created_at: "2025-01-01T00:00:00Z" });
    assert.ok(!inspect(box, { showHidden: true, depth: 10 }).includes(KEY));
    assert.deepEqual(Object.keys(JSON.parse(JSON.stringify(box))).sort(), ["created_at", "id", "image", "no_env", "site", "size", "state"]);
  });

  test("every operation is a method", () => {
    for (const op of Object.keys(OPERATIONS)) assert.equal(typeof HareBox.prototype[op], "function", op);
  });

  test("every operationId in the repository's api/openapi.yaml is a HareBox method and a route, and vice versa", { skip: existsSync(REPO_OPENAPI) ? false : "api/openapi.yaml is not beside this SDK" }, () => {
    // The server test's check against /openapi.json, on the document in
    // the repository, so a new route shows up without a server. The
    // document's paths are at two spaces, their methods at four and
    // each operationId at six.
    const documented = new Map();
    let path = "";
    let method = "";
    for (const line of readFileSync(REPO_OPENAPI, "utf8").split("\n")) {
      let m;
      if ((m = /^  (\/\S*):\s*$/.exec(line))) [path, method] = [m[1], ""];
      else if (/^\S/.test(line)) [path, method] = ["", ""];
      else if ((m = /^    (get|put|post|delete|patch):\s*$/.exec(line))) method = m[1].toUpperCase();
      else if ((m = /^      operationId:\s*(\w+)\s*$/.exec(line)) && path && method) documented.set(m[1], { method, path });
    }
    assert.equal(documented.size, (readFileSync(REPO_OPENAPI, "utf8").match(/^\s*operationId:/gm) ?? []).length, "every operationId is under a path and a method");
    const methods = Object.getOwnPropertyNames(HareBox.prototype).filter(
      (m) => typeof HareBox.prototype[m] === "function" && !["constructor", "create", "auditEntries", "followEvents", "runCodeStream", "toJSON"].includes(m),
    );
    assert.deepEqual([...methods].sort(), [...documented.keys()].sort(), "HareBox methods vs operationIds");
    assert.deepEqual(Object.keys(OPERATIONS).sort(), [...documented.keys()].sort(), "route table vs operationIds");
    for (const [id, want] of documented) {
      assert.deepEqual({ method: OPERATIONS[id].method, path: OPERATIONS[id].path }, want, id);
    }
  });

  test("path parameters must be non-empty strings", async () => {
    const hb = new HareBox({ url: "http://127.0.0.1:9", apiKey: KEY });
    await assert.rejects(hb.getSandbox(""), (e) => e instanceof HareBoxError && e.field === "id");
    await assert.rejects(hb.getProcess("sbx_x", ""), (e) => e instanceof HareBoxError && e.field === "pid");
    await assert.rejects(hb.getFleet("web", ""), (e) => e instanceof HareBoxError && e.field === "fleet");
    await assert.rejects(hb.rotateKey(/** @type {any} */ (undefined)), (e) => e instanceof HareBoxError && e.field === "key");
  });
});

describe("error mapping", () => {
  test("forbidden and rate_limited codes, with Retry-After", () => {
    const f = errorFromBody(403, "Forbidden", JSON.stringify({ error: { code: "forbidden", message: "this API key may not createSandbox" } }));
    assert.ok(f instanceof HareBoxError && !(f instanceof RateLimitedError));
    assert.deepEqual([f.status, f.code, f.message], [403, "forbidden", "this API key may not createSandbox"]);
    const r = errorFromBody(429, "Too Many Requests", JSON.stringify({ error: { code: "rate_limited", message: "spent" } }), "2");
    assert.ok(r instanceof RateLimitedError && r instanceof HareBoxError);
    assert.deepEqual([r.name, r.status, r.code, r.retryAfter], ["RateLimitedError", 429, "rate_limited", 2]);
    assert.match(String(r), /retry after 2 s/);
    // Without an API error body, the status picks the code.
    assert.equal(errorFromBody(403, "Forbidden", "<html>no</html>").code, "forbidden");
    const bare = errorFromBody(429, "Too Many Requests", "slow down", "1");
    assert.ok(bare instanceof RateLimitedError);
    assert.equal(bare.retryAfter, 1);
    assert.equal(/** @type {RateLimitedError} */ (errorFromBody(429, "", "{}")).retryAfter, undefined);
  });

  test("budget_exceeded is HTTP 402", () => {
    const b = errorFromBody(402, "Payment Required", JSON.stringify({ error: { code: "budget_exceeded", message: "budget tight has 0.00 left" } }));
    assert.ok(b instanceof HareBoxError && !(b instanceof RateLimitedError));
    assert.deepEqual([b.status, b.code, b.message, b.field], [402, "budget_exceeded", "budget tight has 0.00 left", undefined]);
    assert.equal(errorFromBody(402, "Payment Required", "<html>pay</html>").code, "budget_exceeded");
    assert.equal(statusForCode("budget_exceeded"), 402); // an error event of execStream
  });

  test("Retry-After: seconds or an HTTP date", () => {
    assert.equal(parseRetryAfter(null), undefined);
    assert.equal(parseRetryAfter(""), undefined);
    assert.equal(parseRetryAfter("3"), 3);
    assert.equal(parseRetryAfter(" 0.5 "), 0.5);
    assert.equal(parseRetryAfter("-1"), undefined);
    assert.equal(parseRetryAfter("soon"), undefined);
    assert.equal(parseRetryAfter("Wed, 21 Oct 2015 07:28:00 GMT"), 0);
    const later = parseRetryAfter(new Date(Date.now() + 60_000).toUTCString());
    assert.ok(later !== undefined && later > 50 && later <= 60, String(later));
  });
});

describe("against a local HTTP server", () => {
  /** @type {import("node:http").Server} */
  let server;
  let url = "";
  const seen = [];
  /** The URLs of the followed event streams whose connection closed. */
  const closed = [];
  /** An event of the audit log, as /v1/events sends it. */
  const entry = (seq, action) => ({
    seq,
    time: "2026-11-30T23:00:00Z",
    account_id: "acc_1",
    principal: "budget:bgt_1",
    action,
    target: "bgt_1",
    outcome: "ok",
    prev: `h${seq - 1}`,
    hash: `h${seq}`,
  });
  const sse = (e) => `event: event\ndata: ${JSON.stringify(e)}\n\n`;
  /** A sandbox, as the server describes one. */
  const SANDBOX = { id: "sbx_1", account_id: "acc_1", project_id: "prj_1", project: "default", state: "running", image: "minimal", size: { vcpus: 1, memory_mb: 512, disk_gb: 1 }, no_env: false, site: { name: "l", country: "" }, created_at: "2025-01-01T00:00:00Z" };
  /** An image built from a registry, as the server describes one. */
  const IMAGE = { name: "myimg", from: "registry:ghcr.io/org/app:1", digest: "sha256:ab", kernel_version: "6.1.0", built_at: "2026-12-01T12:00:00Z", root_disk: true };
  /** A snapshot of sbx_1, as the server describes one. */
  const SNAPSHOT = { id: "snap_1", name: "base", account_id: "acc_1", project_id: "prj_1", sandbox_id: "sbx_1", image: "minimal", size: { vcpus: 1, memory_mb: 512, disk_gb: 1 }, labels: { role: "web" }, bytes: 536870912, created_at: "2026-11-30T12:00:00Z" };
  /** A URL of sbx_1 without its token, as listURLs and getURL show it. */
  const URL1 = { id: "url_1", sandbox_id: "sbx_1", account_id: "acc_1", project_id: "prj_1", port: 8080, auth: "token", url: "https://8080-1.ingress.example/", path_url: "https://ingress.example/s/sbx_1/8080/", created_at: "2026-11-30T12:00:00Z" };
  const URL2 = { ...URL1, id: "url_2", port: 3000, url: "https://3000-1.ingress.example/", path_url: "https://ingress.example/s/sbx_1/3000/" };
  /** URL1 as createURL returns it: with its token and link. */
  const CREATED = { ...URL1, token: "hburl_first", link: "https://8080-1.ingress.example/?harebox_token=hburl_first" };
  /** URL1 as rotateURL returns it: with the new token. */
  const ROTATED = { ...URL1, token: "hburl_second", link: "https://8080-1.ingress.example/?harebox_token=hburl_second", rotated_at: "2026-11-30T13:00:00Z" };
  /** An oidc URL's rule. */
  const RULE = { issuer: "https://issuer.example", audience: "harebox-web", emails: ["ada@example.com"], groups: ["eng"] };
  /** An oidc URL of sbx_oidc, as every URL operation shows it: with its rule, never a token or link. */
  const OIDC_URL = { ...URL1, id: "url_3", sandbox_id: "sbx_oidc", port: 9000, auth: "oidc", oidc: RULE, url: "https://9000-oidc.ingress.example/", path_url: "https://ingress.example/s/sbx_oidc/9000/" };
  /** An mtls URL of sbx_mtls: behind client certificates from its project's URL CA. */
  const MTLS_URL = { ...URL1, id: "url_4", sandbox_id: "sbx_mtls", port: 8443, auth: "mtls", url: "https://8443-mtls.ingress.example/", path_url: "https://ingress.example/s/sbx_mtls/8443/" };
  /** A CA certificate, as PEM text (its bytes do not matter here). */
  const CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBcaCA\n-----END CERTIFICATE-----\n";
  /** The URL CA of prj_1, as the server shows it. */
  const CA = { project_id: "prj_1", certificate: CA_PEM, uploaded: false, created_at: "2026-11-30T12:00:00Z" };
  /** A client certificate's record, as listClientCerts shows it: without its PEM and key. */
  const CERT = { project_id: "prj_1", serial: "0a1b", name: "ada", issued: true, not_after: "2027-02-28T12:00:00Z", created_at: "2026-11-30T12:00:00Z" };
  /** CERT as issueClientCert returns it: with its PEM and key. */
  const ISSUED = { ...CERT, certificate: "-----BEGIN CERTIFICATE-----\nMIIBada\n-----END CERTIFICATE-----\n", private_key: "-----BEGIN PRIVATE KEY-----\nMIGHada\n-----END PRIVATE KEY-----\n" };
  /** A serial of an uploaded CA's certificate, recorded when it was revoked. */
  const REVOKED_SERIAL = { project_id: "prj_1", serial: "ff", issued: false, created_at: "2026-12-01T09:00:00Z", revoked_at: "2026-12-01T09:00:00Z" };
  /** The clones a fork of sbx_1 makes. */
  const CLONES = [
    { ...SANDBOX, id: "sbx_2", name: "w-1", labels: { role: "web", fork: "yes" } },
    { ...SANDBOX, id: "sbx_3", name: "w-2", labels: { role: "web", fork: "yes" } },
  ];
  /**
   * What the fake agent keeps of a background process: its chunks, in the
   * order it sends them (stdout's bytes 8 to 20 dropped), and its exit.
   */
  const KEPT = [
    ["stdout", 0, "one\n"],
    ["stderr", 0, "oops\n"],
    ["stdout", 4, "two\n"],
    ["stdout", 20, "five\n"],
  ];
  const EXIT = { exit_code: 3, stdout: "", stderr: "", duration_ms: 1500, timed_out: false, stdout_truncated: false, stderr_truncated: false };
  /** A chart's bytes, as a cell's result carries them (base64 on the wire). */
  const CHART = Buffer.from("89504e470d0a1a0a0000000d4948445200000190000001200806000000", "hex");
  const CHART_RESULT = { is_main_result: false, text: "<Figure size 400x288 with 1 Axes>", png: CHART.toString("base64"), width: 400, height: 288 };
  const MAIN_RESULT = { is_main_result: true, text: "42", json: null };
  const CODE_ERROR = { name: "ZeroDivisionError", value: "division by zero", traceback: "Traceback (most recent call last):\n  return 1 / 0\nZeroDivisionError: division by zero" };
  /** A finished cell, as runCode answers it. */
  const CELL = { context_id: "default", execution_count: 3, status: "ok", stdout: "plotted\n", stderr: "", results: [CHART_RESULT, MAIN_RESULT], duration_ms: 12, stdout_truncated: false, stderr_truncated: false, results_dropped: 1 };
  /** The end event of a streamed cell that raised: what was streamed is not in it. */
  const CELL_END = { ...CELL, execution_count: 4, status: "error", stdout: "", results: [], error: CODE_ERROR };
  /** Code interpreter contexts. */
  const DEFAULT_CTX = { id: "default", language: "python", cwd: "/home/user" };
  const BASH_CTX = { id: "c1", language: "bash", cwd: "/tmp" };
  const PROM = '# HELP harebox_sandboxes Live sandboxes by state.\n# TYPE harebox_sandboxes gauge\nharebox_sandboxes{state="running"} 1\n# HELP go_goroutines Number of goroutines that currently exist.\n# TYPE go_goroutines gauge\ngo_goroutines 12\n';
  before(async () => {
    server = createServer((req, res) => {
      let body = "";
      req.on("data", (d) => (body += d));
      req.on("end", () => seen.push({ method: req.method, url: req.url, auth: req.headers.authorization, accept: req.headers.accept, body }));
      if (req.url?.startsWith("/hang")) return; // never answers
      if (req.url?.startsWith("/events-")) {
        // Followed events: canned streams, by the prefix.
        const timers = [];
        const later = (ms, fn) => timers.push(setTimeout(fn, ms));
        res.on("close", () => {
          timers.forEach(clearTimeout);
          closed.push(req.url);
        });
        res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-store" });
        res.flushHeaders();
        if (req.url.startsWith("/events-canned/")) {
          // A keepalive, two events (the second split across writes and with
          // CRLF endings), then an error event that ends the stream.
          res.write(": keepalive\n\n");
          later(20, () => res.write(sse(entry(3, "budgetWarning"))));
          later(40, () => res.write(`event: event\r\ndata: ${JSON.stringify(entry(4, "budgetReached")).slice(0, 30)}`));
          later(60, () => res.write(`${JSON.stringify(entry(4, "budgetReached")).slice(30)}\r\n\r\n: keepalive\n\n`));
          later(80, () => res.end('event: error\ndata: {"error":{"code":"unavailable","message":"the audit log is closed"}}\n\n'));
        } else if (req.url.startsWith("/events-end/")) {
          // The server's end of the stream; opened again after event 1,
          // one more event, then an error (the key was revoked).
          if (!req.url.includes("after=1")) res.end(sse(entry(1, "vmExited")));
          else res.end(`${sse(entry(2, "vmExited"))}event: error\ndata: {"error":{"code":"unauthorized","message":"revoked"}}\n\n`);
        } else if (req.url.includes("/events-alive/") && req.url.includes("after=7")) {
          res.end('event: error\ndata: {"error":{"code":"unauthorized","message":"revoked"}}\n\n');
        } else if (req.url.startsWith("/events-alive/")) {
          // Keepalives only, every 100 ms for 700 ms, then one event and the end.
          for (let t = 100; t <= 700; t += 100) later(t, () => res.write(": keepalive\n\n"));
          later(750, () => res.end(sse(entry(7, "budgetReached"))));
        } else if (req.url.startsWith("/events-two/")) {
          // An event, keepalives at 100 and 200 ms, another event at 500 ms, then silence.
          res.write(sse(entry(1, "budgetWarning")));
          later(100, () => res.write(": keepalive\n\n"));
          later(200, () => res.write(": keepalive\n\n"));
          later(500, () => res.write(sse(entry(2, "budgetReached"))));
        } else if (req.url.startsWith("/events-forever/")) {
          res.write(sse(entry(1, "budgetWarning")));
          const tick = setInterval(() => res.write(": keepalive\n\n"), 50);
          res.on("close", () => clearInterval(tick));
        } // else /events-quiet/: nothing after the headers
        return;
      }
      if (req.url?.startsWith("/procout/")) {
        // getProcessOutput. The process is by its ID: done (exits 3),
        // running (no exit: a followed stream just ends), broken (an error
        // event after a chunk), back (a chunk before the offset asked for),
        // garbled (a chunk without a number for its offset), quiet
        // (nothing), slow (keepalives for 700 ms, then its exit); any other
        // is not found. Offsets must be whole numbers, as the server says.
        const u = new URL(req.url, "http://x");
        const m = /^\/procout\/v1\/sandboxes\/([^/]+)\/processes\/([^/]+)\/output$/.exec(u.pathname);
        const json = (status, body) => {
          res.writeHead(status, { "content-type": "application/json" });
          res.end(JSON.stringify(body));
        };
        if (req.method !== "GET" || !m) return json(404, { error: { code: "not_found", message: `no route ${req.method} ${req.url}` } });
        const pid = decodeURIComponent(m[2]);
        if (!["done", "running", "broken", "back", "garbled", "quiet", "slow"].includes(pid)) return json(404, { error: { code: "not_found", message: `no process ${pid}` } });
        const offsets = {};
        for (const name of ["stdout", "stderr"]) {
          const v = u.searchParams.get(`${name}_offset`) ?? "0";
          if (!/^[0-9]+$/.test(v)) return json(400, { error: { code: "invalid", message: "must be a byte offset (a whole number from 0)", field: `${name}_offset` } });
          offsets[name] = Number(v);
        }
        const follow = u.searchParams.get("follow") === "true";
        const timers = [];
        res.on("close", () => timers.forEach(clearTimeout));
        res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-store" });
        res.flushHeaders();
        const ev = (name, data) => res.write(`event: ${name}\r\ndata: ${JSON.stringify(data)}\r\n\r\n`);
        const chunk = (name, offset, text) => ev(name, { offset, data: Buffer.from(text).toString("base64") });
        if (pid === "quiet") return;
        if (pid === "slow") {
          for (let t = 100; t <= 700; t += 100) timers.push(setTimeout(() => res.write(": keepalive\n\n"), t));
          timers.push(setTimeout(() => res.end(`event: exit\ndata: ${JSON.stringify(EXIT)}\n\n`), 750));
          return;
        }
        if (pid === "back") {
          chunk("stdout", 0, "one\n");
          return res.end();
        }
        if (pid === "garbled") {
          ev("stdout", { offset: "0", data: "b25lCg==" });
          return res.end();
        }
        res.write(": keepalive\n\n");
        ev("hello", { unknown: true }); // an event this client does not know
        // What is kept from the offsets on: a chunk the offset falls in is cut there.
        for (const [name, offset, text] of KEPT) {
          const end = offset + text.length;
          if (end <= offsets[name]) continue;
          const from = Math.max(offset, offsets[name]);
          chunk(name, from, text.slice(from - offset));
          if (pid === "broken") {
            res.end('event: error\ndata: {"error":{"code":"unavailable","message":"the sandbox\'s agent went away"}}\n\n');
            return;
          }
        }
        if (pid === "done") ev("exit", EXIT);
        if (pid === "done" && follow) ev("stdout", { offset: 25, data: "bm90IHJlYWQ=" }); // past the exit: never read
        res.end();
        return;
      }
      if (req.url?.startsWith("/code/")) {
        // The code interpreter. A cell's answer is by its sandbox: sbx_1
        // answers CELL as JSON, or as events (ending with CELL_END) to an
        // Accept of text/event-stream; sbx_broken an error event after its
        // first output; sbx_cut ends the stream after it; sbx_garbled sends
        // a stdout event without text; sbx_plain has no code interpreter.
        const path = req.url.slice(5).split("?")[0];
        const json = (status, body) => {
          res.writeHead(status, { "content-type": "application/json" });
          res.end(body === undefined ? "" : JSON.stringify(body));
        };
        const cell = /^\/v1\/sandboxes\/([^/]+)\/code$/.exec(path);
        if (cell && req.method === "POST") {
          const sbx = decodeURIComponent(cell[1]);
          if (sbx === "sbx_plain") return json(409, { error: { code: "conflict", message: "sandbox sbx_plain has no code interpreter: its image (minimal) has none" } });
          if (!req.headers.accept?.includes("text/event-stream")) return json(200, CELL);
          res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-store" });
          res.flushHeaders();
          const ev = (name, data) => res.write(`event: ${name}\ndata: ${JSON.stringify(data)}\n\n`);
          ev("stdout", { text: "a\n" });
          if (sbx === "sbx_broken") return res.end('event: error\ndata: {"error":{"code":"unavailable","message":"the sandbox\'s code interpreter answered wrongly"}}\n\n');
          if (sbx === "sbx_cut") return res.end();
          if (sbx === "sbx_garbled") {
            ev("stdout", { text: 5 });
            return res.end();
          }
          res.write(": keepalive\n\n");
          ev("stderr", { text: "warning\n" });
          ev("result", CHART_RESULT);
          ev("hello", { unknown: true }); // an event this client does not know
          ev("stdout", { text: "b\n" });
          ev("result", MAIN_RESULT);
          ev("exception", CODE_ERROR);
          ev("end", CELL_END);
          ev("stdout", { text: "past the end: never read\n" });
          return res.end();
        }
        const route = `${req.method} ${path.replace(/^\/v1\/sandboxes\/[^/]+/, "/v1/sandboxes/X").replace(/\/contexts\/[^/]+/, "/contexts/Y")}`;
        const answer = {
          "GET /v1/sandboxes/X/code/contexts": [200, { contexts: [DEFAULT_CTX, BASH_CTX] }],
          "POST /v1/sandboxes/X/code/contexts": [201, BASH_CTX],
          "POST /v1/sandboxes/X/code/contexts/Y/restart": [200, BASH_CTX],
          "DELETE /v1/sandboxes/X/code/contexts/Y": [204, undefined],
        }[route] ?? [404, { error: { code: "not_found", message: `no route ${req.method} ${req.url}` } }];
        return json(answer[0], answer[1]);
      }
      if (req.url?.startsWith("/echo/")) {
        // Answers the method and path it was sent, minus the /echo prefix.
        res.writeHead(req.method === "DELETE" ? 204 : 200, { "content-type": "application/json" });
        res.end(req.method === "DELETE" ? "" : JSON.stringify({ method: req.method, url: req.url.slice(5) }));
        return;
      }
      if (req.url?.startsWith("/box/")) {
        // stopSandbox, startSandbox, hibernateSandbox and resumeSandbox: the sandbox, in the state each leaves it in.
        const m = /^\/box\/v1\/sandboxes\/([^/?]+)\/(stop|start|hibernate|resume)$/.exec(req.url);
        if (req.method !== "POST" || !m) {
          res.writeHead(404, { "content-type": "application/json" });
          res.end(JSON.stringify({ error: { code: "not_found", message: `no route ${req.method} ${req.url}` } }));
          return;
        }
        res.writeHead(200, { "content-type": "application/json" });
        const state = { stop: "stopped", hibernate: "hibernated" }[m[2]] ?? "running";
        res.end(JSON.stringify({ ...SANDBOX, id: decodeURIComponent(m[1]), state }));
        return;
      }
      if (req.url?.startsWith("/urls/")) {
        // The URL operations. Sandbox sbx_taken has port 8080 published already.
        const path = req.url.slice(5).split("?")[0];
        const route = `${req.method} ${path.replace(/^\/v1\/sandboxes\/[^/]+/, "/v1/sandboxes/X").replace(/\/urls\/[^/]+/, "/urls/Y")}`;
        const answer = path.startsWith("/v1/sandboxes/sbx_taken/")
          ? [409, { error: { code: "conflict", message: "port 8080 of sbx_taken is published already", field: "port" } }]
          : path.startsWith("/v1/sandboxes/sbx_mtls/") // Its URLs are mtls URLs.
          ? { "POST /v1/sandboxes/X/urls": [201, MTLS_URL] }[route] ?? [404, { error: { code: "not_found", message: `no route ${req.method} ${req.url}` } }]
          : path.startsWith("/v1/sandboxes/sbx_oidc/") // Its URLs are oidc URLs: no token to rotate.
          ? {
              "POST /v1/sandboxes/X/urls": [201, OIDC_URL],
              "GET /v1/sandboxes/X/urls": [200, { urls: [OIDC_URL] }],
              "GET /v1/sandboxes/X/urls/Y": [200, OIDC_URL],
              "POST /v1/sandboxes/X/urls/Y/rotate": [400, { error: { code: "invalid", message: "URL url_3 has no token to rotate (auth oidc)" } }],
            }[route] ?? [404, { error: { code: "not_found", message: `no route ${req.method} ${req.url}` } }]
          : {
              "POST /v1/sandboxes/X/urls": [201, CREATED],
              "GET /v1/sandboxes/X/urls": [200, { urls: [URL1, URL2] }],
              "GET /v1/sandboxes/X/urls/Y": [200, URL1],
              "POST /v1/sandboxes/X/urls/Y/rotate": [200, ROTATED],
              "DELETE /v1/sandboxes/X/urls/Y": [204, undefined],
            }[route] ?? [404, { error: { code: "not_found", message: `no route ${req.method} ${req.url}` } }];
        res.writeHead(answer[0], { "content-type": "application/json" });
        res.end(answer[1] === undefined ? "" : JSON.stringify(answer[1]));
        return;
      }
      if (req.url?.startsWith("/urlca/")) {
        // The URL CA and client certificate operations, by the query's
        // project: none has no CA, uploaded's CA was uploaded (the server
        // issues nothing from it), empty has no certificates (and answers
        // null for them).
        const u = new URL(req.url.slice(6), "http://x");
        const project = u.searchParams.get("project");
        const route = `${req.method} ${u.pathname.replace(/\/certs\/[^/]+\/revoke$/, "/certs/S/revoke")}`;
        const answer = project === "none"
          ? [404, { error: { code: "not_found", message: "project none has no URL CA" } }]
          : project === "uploaded" && route === "POST /v1/url-ca/certs"
          ? [409, { error: { code: "conflict", message: "the project's URL CA was uploaded: issue its certificates yourself" } }]
          : project === "empty" && route === "GET /v1/url-ca/certs"
          ? [200, { certs: null }]
          : {
              "GET /v1/url-ca": [200, CA],
              "PUT /v1/url-ca": [200, CA],
              "DELETE /v1/url-ca": [204, undefined],
              "POST /v1/url-ca/certs": [201, ISSUED],
              "GET /v1/url-ca/certs": [200, { certs: [CERT, REVOKED_SERIAL] }],
              "POST /v1/url-ca/certs/S/revoke": [200, { ...CERT, revoked_at: "2026-12-01T09:00:00Z" }],
            }[route] ?? [404, { error: { code: "not_found", message: `no route ${req.method} ${req.url}` } }];
        res.writeHead(answer[0], { "content-type": "application/json" });
        res.end(answer[1] === undefined ? "" : JSON.stringify(answer[1]));
        return;
      }
      if (req.url?.startsWith("/snap/")) {
        // forkSandbox, the snapshot operations and a create from a snapshot.
        const path = req.url.slice(5).split("?")[0];
        const route = `${req.method} ${path.replace(/^(\/v1\/(?:sandboxes|snapshots))\/[^/]+/, "$1/X")}`;
        const answer = {
          "POST /v1/sandboxes/X/fork": [201, { sandboxes: CLONES }],
          "POST /v1/sandboxes/X/snapshots": [201, SNAPSHOT],
          "GET /v1/snapshots": [200, { snapshots: [SNAPSHOT] }],
          "GET /v1/snapshots/X": [200, SNAPSHOT],
          "DELETE /v1/snapshots/X": [204, undefined],
          "POST /v1/sandboxes": [201, { ...SANDBOX, id: "sbx_4", name: "restored" }],
          "GET /v1/images": [200, { images: [IMAGE] }],
          "POST /v1/images": [201, IMAGE],
          "DELETE /v1/images/my%2Fimg": [204, undefined],
        }[route] ?? [404, { error: { code: "not_found", message: `no route ${req.method} ${req.url}` } }];
        res.writeHead(answer[0], { "content-type": "application/json" });
        res.end(answer[1] === undefined ? "" : JSON.stringify(answer[1]));
        return;
      }
      if (req.url?.startsWith("/conflict/")) {
        res.writeHead(409, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { code: "conflict", message: "sandbox sbx_1 is running; only a stopped sandbox starts" } }));
        return;
      }
      if (req.url === "/prom/metrics") {
        // getServerMetrics: the Prometheus text format, as promhttp sends it.
        res.writeHead(200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" });
        res.end(PROM);
        return;
      }
      if (req.url?.startsWith("/pages/v1/audit?")) {
        // listAudit over five entries: a page of `limit` after `after`, with
        // next when it is full, as the server pages.
        const q = new URL(req.url, "http://x").searchParams;
        const limit = Number(q.get("limit") ?? 100);
        const entries = [1, 2, 3, 5, 8].filter((seq) => seq > Number(q.get("after") ?? 0)).slice(0, limit).map((seq) => ({ seq, outcome: q.get("outcome") ?? "ok" }));
        const page = entries.length === limit ? { entries, next: String(entries[entries.length - 1].seq) } : { entries };
        if (q.get("after") === "stuck") page.next = "stuck"; // a cursor that does not move
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify(page));
        return;
      }
      if (req.url?.startsWith("/limited/")) {
        res.writeHead(429, { "content-type": "application/json", "retry-after": "3" });
        res.end(JSON.stringify({ error: { code: "rate_limited", message: "this API key's rate is spent; retry in 2.5s" } }));
        return;
      }
      if (req.url?.startsWith("/budget/")) {
        res.writeHead(402, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { code: "budget_exceeded", message: "budget tight (account, deny_new) has 0.00 left of 0.000001 this period and this needs 0.00007" } }));
        return;
      }
      if (req.url?.startsWith("/forbidden/")) {
        res.writeHead(403, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { code: "forbidden", message: "a key can only create keys narrower than itself", field: "scope.actions" } }));
        return;
      }
      if (req.url === "/v1/info") {
        res.writeHead(502, { "content-type": "text/html" });
        res.end("<html><body>Bad gateway</body></html>");
        return;
      }
      if (req.url === "/health") {
        res.writeHead(200, { "content-type": "application/json" });
        res.end("not json");
        return;
      }
      if (req.url === "/ready") {
        res.writeHead(503, { "content-type": "application/json" });
        res.end(JSON.stringify({ status: "not_ready", checks: { database: "ok", hypervisor: "unavailable" } }));
        return;
      }
      if (req.url === "/down/ready") {
        res.writeHead(500, { "content-type": "application/json" });
        res.end(JSON.stringify({ error: { code: "internal", message: "boom" } }));
        return;
      }
      res.writeHead(404, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { code: "not_found", message: "no such thing", field: "id" } }));
    });
    await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${/** @type {any} */ (server.address()).port}`;
  });
  after(() => {
    server.closeAllConnections();
    server.close();
  });

  test("a request that gets no answer times out with code timeout", async () => {
    const hb = new HareBox({ url: url + "/hang", apiKey: KEY, timeoutMs: 300 });
    const t0 = Date.now();
    await assert.rejects(hb.getInfo(), (e) => {
      assert.ok(e instanceof HareBoxError);
      assert.equal(e.code, "timeout");
      assert.equal(e.status, 0);
      assert.ok(!e.message.includes(KEY));
      return true;
    });
    assert.ok(Date.now() - t0 < 5000);
    // A per-call timeout overrides the client's.
    const hb2 = new HareBox({ url: url + "/hang", apiKey: KEY });
    await assert.rejects(hb2.getInfo({ timeoutMs: 200 }), (e) => e instanceof HareBoxError && e.code === "timeout");
  });

  test("the caller's signal aborts with its own reason", async () => {
    const hb = new HareBox({ url: url + "/hang", apiKey: KEY });
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 100);
    await assert.rejects(hb.getInfo({ signal: ac.signal }), (e) => e instanceof Error && e.name === "AbortError" && !(e instanceof HareBoxError));
  });

  test("a non-JSON error page becomes a HareBoxError with its status", async () => {
    const hb = new HareBox({ url, apiKey: KEY });
    await assert.rejects(hb.getInfo(), (e) => e instanceof HareBoxError && e.status === 502 && /Bad gateway/.test(e.message));
    await assert.rejects(hb.getHealth(), (e) => e instanceof HareBoxError && e.code === "network");
  });

  test("getReady returns a 503 not_ready answer; other failures still throw", async () => {
    const hb = new HareBox({ url, apiKey: KEY });
    assert.deepEqual(await hb.getReady(), { status: "not_ready", checks: { database: "ok", hypervisor: "unavailable" } });
    await assert.rejects(new HareBox({ url: url + "/down", apiKey: KEY }).getReady(), (e) => e instanceof HareBoxError && e.status === 500);
  });

  test("a JSON error maps to status, code, message and field; the key goes only to /v1", async () => {
    const hb = new HareBox({ url, apiKey: KEY });
    await assert.rejects(hb.getSandbox("sbx_nope"), (e) => {
      assert.ok(e instanceof HareBoxError);
      assert.deepEqual([e.status, e.code, e.message, e.field], [404, "not_found", "no such thing", "id"]);
      return true;
    });
    const v1 = seen.find((s) => s.url === "/v1/sandboxes/sbx_nope");
    assert.equal(v1?.auth, `Bearer ${KEY}`);
    const health = seen.find((s) => s.url === "/health");
    assert.equal(health?.auth, undefined);
  });

  test("403 is forbidden; 429 is a RateLimitedError with retryAfter from Retry-After", async () => {
    const limited = new HareBox({ url: url + "/limited", apiKey: KEY });
    await assert.rejects(limited.listSandboxes(), (e) => {
      assert.ok(e instanceof RateLimitedError, `want a RateLimitedError, got ${e}`);
      assert.deepEqual([e.status, e.code, e.retryAfter], [429, "rate_limited", 3]);
      return true;
    });
    const forbidden = new HareBox({ url: url + "/forbidden", apiKey: KEY });
    await assert.rejects(forbidden.createKey({ body: { scope: { actions: ["*"] } } }), (e) => {
      assert.ok(e instanceof HareBoxError && !(e instanceof RateLimitedError));
      assert.deepEqual([e.status, e.code, e.field], [403, "forbidden", "scope.actions"]);
      return true;
    });
  });

  test("the tenancy and key operations send their methods, paths, queries and bodies", async () => {
    const hb = new HareBox({ url: url + "/echo", apiKey: KEY });
    const acme = { query: { account: "acme" } };
    assert.deepEqual(await hb.createAccount({ body: { name: "acme" } }), { method: "POST", url: "/v1/accounts" });
    await hb.listAccounts();
    await hb.getAccount("acme");
    assert.equal(await hb.deleteAccount("acme"), undefined);
    await hb.createProject({ ...acme, body: { name: "web" } });
    await hb.listProjects(acme);
    await hb.getProject("web");
    await hb.deleteProject("web", acme);
    await hb.createFleet("web", { ...acme, body: { name: "workers" } });
    await hb.listFleets("web");
    assert.deepEqual(await hb.getFleet("web", "workers", acme), { method: "GET", url: "/v1/projects/web/fleets/workers?account=acme" });
    await hb.deleteFleet("prj_1", "a/b");
    await hb.createKey({ body: { account_id: "acme", scope: { actions: ["sandboxes:read"], rate: { per_second: 1, burst: 1 } } } });
    await hb.listKeys(acme);
    await hb.getKey("key_1");
    await hb.revokeKey("key_1");
    await hb.rotateKey("key_1");
    await hb.listSandboxes({ query: { project: "web", fleet: "workers" } });
    await new Promise((resolve) => setImmediate(resolve));
    const sent = seen.filter((s) => s.url.startsWith("/echo/")).map((s) => `${s.method} ${s.url.slice(5)} ${s.body}`.trim());
    assert.deepEqual(sent, [
      'POST /v1/accounts {"name":"acme"}',
      "GET /v1/accounts",
      "GET /v1/accounts/acme",
      "DELETE /v1/accounts/acme",
      'POST /v1/projects?account=acme {"name":"web"}',
      "GET /v1/projects?account=acme",
      "GET /v1/projects/web",
      "DELETE /v1/projects/web?account=acme",
      'POST /v1/projects/web/fleets?account=acme {"name":"workers"}',
      "GET /v1/projects/web/fleets",
      "GET /v1/projects/web/fleets/workers?account=acme",
      "DELETE /v1/projects/prj_1/fleets/a%2Fb",
      'POST /v1/keys {"account_id":"acme","scope":{"actions":["sandboxes:read"],"rate":{"per_second":1,"burst":1}}}',
      "GET /v1/keys?account=acme",
      "GET /v1/keys/key_1",
      "DELETE /v1/keys/key_1",
      "POST /v1/keys/key_1/rotate",
      "GET /v1/sandboxes?project=web&fleet=workers",
    ]);
    assert.ok(seen.filter((s) => s.url.startsWith("/echo/")).every((s) => s.auth === `Bearer ${KEY}`));
  });

  test("the environment and project update operations send their methods, paths, queries and bodies", async () => {
    const hb = new HareBox({ url: url + "/echo", apiKey: KEY });
    const web = { query: { project: "web", account: "acme" } };
    const env = {
      name: "prod",
      variables: { MODE: { value: "prod" }, TOKEN: { value: "v", secret: true } },
      files: [{ path: "/etc/app.conf", content: "token={{TOKEN}}", template: true }],
      credentials: [{ secret: "TOKEN", hosts: ["api.example.com"], header: "Authorization", format: "Bearer {value}" }],
    };
    const update = { set: { MODE: { value: "staging" } }, unset: ["OLD"], third_party_safe: true };
    const start = seen.length;
    assert.deepEqual(await hb.updateProject("web", { query: { account: "acme" }, body: { third_party_default: true } }), {
      method: "PATCH",
      url: "/v1/projects/web?account=acme",
    });
    await hb.createEnvironment({ ...web, body: env });
    await hb.listEnvironments({ query: { project: "prj_1" } });
    await hb.getEnvironment("env_1");
    assert.deepEqual(await hb.updateEnvironment("prod", { query: { project: "web" }, body: update }), {
      method: "PATCH",
      url: "/v1/environments/prod?project=web",
    });
    assert.equal(await hb.deleteEnvironment("prod"), undefined);
    await hb.listEnvironmentVersions("prod", web);
    await hb.getEnvironmentVersion("prod", 2, { query: { project: "web" } });
    await hb.getEnvironmentVersion("a/b", "1");
    await new Promise((resolve) => setImmediate(resolve));
    const sent = seen.slice(start).map((s) => `${s.method} ${s.url.slice(5)} ${s.body}`.trim());
    assert.deepEqual(sent, [
      'PATCH /v1/projects/web?account=acme {"third_party_default":true}',
      `POST /v1/environments?project=web&account=acme ${JSON.stringify(env)}`,
      "GET /v1/environments?project=prj_1",
      "GET /v1/environments/env_1",
      `PATCH /v1/environments/prod?project=web ${JSON.stringify(update)}`,
      "DELETE /v1/environments/prod",
      "GET /v1/environments/prod/versions?project=web&account=acme",
      "GET /v1/environments/prod/versions/2?project=web",
      "GET /v1/environments/a%2Fb/versions/1",
    ]);
    await assert.rejects(hb.getEnvironmentVersion("prod", 0), (e) => e instanceof HareBoxError && e.field === "version");
    await assert.rejects(hb.getEnvironmentVersion("prod", 1.5), (e) => e instanceof HareBoxError && e.field === "version");
    await assert.rejects(hb.getEnvironmentVersion("", 1), (e) => e instanceof HareBoxError && e.field === "environment");
    await assert.rejects(hb.getEnvironmentVersion("prod", ""), (e) => e instanceof HareBoxError && e.field === "version");
  });

  test("the audit operations send their methods, paths and queries", async () => {
    const hb = new HareBox({ url: url + "/echo", apiKey: KEY });
    const start = seen.length;
    const query = {
      from: "2026-11-30T00:00:00Z",
      to: "2026-12-01T00:00:00+01:00",
      principal: "key_1",
      target: "prj_1",
      action: "createProject",
      outcome: "denied",
      account: "acme",
      after: 6,
      limit: 1,
      format: "json",
    };
    assert.deepEqual(await hb.listAudit({ query }), {
      method: "GET",
      url: "/v1/audit?from=2026-11-30T00%3A00%3A00Z&to=2026-12-01T00%3A00%3A00%2B01%3A00&principal=key_1&target=prj_1&action=createProject&outcome=denied&account=acme&after=6&limit=1&format=json",
    });
    await hb.listAudit();
    await hb.listAudit({ query: { after: "7" } });
    await hb.verifyAudit();
    await hb.getAuditKey();
    await new Promise((resolve) => setImmediate(resolve));
    const sent = seen.slice(start).map((s) => `${s.method} ${s.url.slice(5)} ${s.body}`.trim());
    assert.deepEqual(sent, [
      `GET /v1/audit?from=2026-11-30T00%3A00%3A00Z&to=2026-12-01T00%3A00%3A00%2B01%3A00&principal=key_1&target=prj_1&action=createProject&outcome=denied&account=acme&after=6&limit=1&format=json`,
      "GET /v1/audit",
      "GET /v1/audit?after=7",
      "GET /v1/audit/verify",
      "GET /v1/audit/key",
    ]);
    assert.ok(seen.slice(start).every((s) => s.auth === `Bearer ${KEY}`));
    // JSON Lines are for auditEntries to replace, not for listAudit to parse.
    await assert.rejects(hb.listAudit({ query: /** @type {any} */ ({ format: "jsonl" }) }), (e) => e instanceof HareBoxError && e.field === "format");
    assert.equal(seen.length, start + 5);
  });

  test("listEvents sends its method, path and query", async () => {
    const hb = new HareBox({ url: url + "/echo", apiKey: KEY });
    const start = seen.length;
    assert.deepEqual(await hb.listEvents(), { method: "GET", url: "/v1/events" });
    assert.deepEqual(await hb.listEvents({ query: { after: 120, limit: 5, account: "acme" } }), {
      method: "GET",
      url: "/v1/events?after=120&limit=5&account=acme",
    });
    await hb.listEvents({ query: { after: "7", account: "acc_1" } });
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.slice(start).map((s) => `${s.method} ${s.url.slice(5)} ${s.accept} ${s.body}`.trim()), [
      "GET /v1/events application/json",
      "GET /v1/events?after=120&limit=5&account=acme application/json",
      "GET /v1/events?after=7&account=acc_1 application/json",
    ]);
    assert.ok(seen.slice(start).every((s) => s.auth === `Bearer ${KEY}`));
    // A stream is for followEvents to read, not for listEvents to parse.
    await assert.rejects(hb.listEvents({ query: /** @type {any} */ ({ follow: true }) }), (e) => e instanceof HareBoxError && e.field === "follow");
    assert.equal(seen.length, start + 3);
  });

  test("the monitoring operations send their methods, paths and queries; getServerMetrics returns the text", async () => {
    const hb = new HareBox({ url: url + "/echo", apiKey: KEY });
    const start = seen.length;
    assert.deepEqual(await hb.getSandboxMetrics("sbx_1"), { method: "GET", url: "/v1/sandboxes/sbx_1/metrics" });
    assert.deepEqual(await hb.getSandboxMetrics("sbx_1", { query: { from: "2026-11-30T00:00:00Z", to: "2026-12-01T00:00:00+01:00", limit: 10 } }), {
      method: "GET",
      url: "/v1/sandboxes/sbx_1/metrics?from=2026-11-30T00%3A00%3A00Z&to=2026-12-01T00%3A00%3A00%2B01%3A00&limit=10",
    });
    await hb.getSandboxMetrics("a/b", { query: { limit: undefined } });
    // The Sandbox's convenience: its query fields, without signal and timeoutMs.
    const box = new Sandbox(hb, /** @type {any} */ ({ id: "sbx_2", state: "running" }));
    assert.deepEqual(await box.metrics(), { method: "GET", url: "/v1/sandboxes/sbx_2/metrics" });
    await box.metrics({ limit: 1, timeoutMs: 5000, signal: AbortSignal.timeout(5000) });
    // The server's metrics: the text as it came, with the key, asking for text.
    const prom = new HareBox({ url: url + "/prom", apiKey: KEY });
    const text = await prom.getServerMetrics();
    assert.equal(typeof text, "string");
    assert.equal(text, PROM);
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.slice(start).map((s) => `${s.method} ${s.url.replace(/^\/(echo|prom)/, "")} ${s.accept} ${s.body}`.trim()), [
      "GET /v1/sandboxes/sbx_1/metrics application/json",
      "GET /v1/sandboxes/sbx_1/metrics?from=2026-11-30T00%3A00%3A00Z&to=2026-12-01T00%3A00%3A00%2B01%3A00&limit=10 application/json",
      "GET /v1/sandboxes/a%2Fb/metrics application/json",
      "GET /v1/sandboxes/sbx_2/metrics application/json",
      "GET /v1/sandboxes/sbx_2/metrics?limit=1 application/json",
      "GET /metrics text/plain",
    ]);
    assert.ok(seen.slice(start).every((s) => s.auth === `Bearer ${KEY}`), "the key goes to /metrics too");
    await assert.rejects(hb.getSandboxMetrics(""), (e) => e instanceof HareBoxError && e.field === "id");
    // A JSON error (a key without metrics:read) is a HareBoxError, not text.
    const forbidden = new HareBox({ url: url + "/forbidden", apiKey: KEY });
    await assert.rejects(forbidden.getServerMetrics(), (e) => e instanceof HareBoxError && e.status === 403 && e.code === "forbidden");
    assert.equal(seen.length, start + 7);
  });

  test("followEvents reads a followed stream: keepalives skipped, entries in order, an error event throws", async () => {
    const hb = new HareBox({ url: url + "/events-canned", apiKey: KEY });
    const start = seen.length;
    const got = [];
    await assert.rejects(
      (async () => {
        for await (const e of hb.followEvents({ query: { after: 2, account: "acme" } })) got.push(e);
      })(),
      (e) => {
        assert.ok(e instanceof HareBoxError && !(e instanceof RateLimitedError), `want a HareBoxError, got ${e}`);
        assert.deepEqual([e.status, e.code, e.message, e.field], [503, "unavailable", "the audit log is closed", undefined]);
        return true;
      },
    );
    assert.deepEqual(got, [entry(3, "budgetWarning"), entry(4, "budgetReached")]);
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.slice(start).map((s) => [s.method, s.url, s.accept, s.auth]), [
      ["GET", "/events-canned/v1/events?after=2&account=acme&follow=true", "text/event-stream", `Bearer ${KEY}`],
    ]);
  });

  test("followEvents: a stream the server ends is opened again after the last seq; errors before it throw as a call's", async () => {
    const hb = new HareBox({ url: url + "/events-end", apiKey: KEY });
    const start = seen.length;
    const got = [];
    await assert.rejects(
      (async () => {
        for await (const e of hb.followEvents()) got.push(e.seq);
      })(),
      (e) => e instanceof HareBoxError && e.code === "unauthorized" && e.message === "revoked",
    );
    assert.deepEqual(got, [1, 2]);
    assert.deepEqual(seen.slice(start).map((s) => s.url), ["/events-end/v1/events?follow=true", "/events-end/v1/events?follow=true&after=1"]);
    const denied = new HareBox({ url: url + "/forbidden", apiKey: KEY }).followEvents();
    await assert.rejects(denied.next(), (e) => e instanceof HareBoxError && e.status === 403 && e.code === "forbidden");
  });

  test("followEvents: silence past timeoutMs throws timeout; keepalives and the loop's own time do not count", async () => {
    const t0 = Date.now();
    const quiet = new HareBox({ url: url + "/events-quiet", apiKey: KEY }).followEvents({ timeoutMs: 300 });
    await assert.rejects(quiet.next(), (e) => e instanceof HareBoxError && e.code === "timeout" && e.status === 0 && /nothing from/.test(e.message));
    assert.ok(Date.now() - t0 < 5000);
    // Keepalives every 100 ms hold a 300 ms bound for 750 ms, to the event.
    const alive = [];
    await assert.rejects(
      (async () => {
        for await (const e of new HareBox({ url: url + "/events-alive", apiKey: KEY }).followEvents({ timeoutMs: 300 })) alive.push(e.seq);
      })(),
      (e) => e instanceof HareBoxError && e.code === "unauthorized",
    );
    assert.deepEqual(alive, [7]);
    // A loop body slower than the bound (800 ms on the first entry) loses
    // nothing, though keepalives and the next event came meanwhile; then
    // the silence times out.
    const two = [];
    await assert.rejects(
      (async () => {
        for await (const e of new HareBox({ url: url + "/events-two", apiKey: KEY }).followEvents({ timeoutMs: 300 })) {
          two.push(e.seq);
          if (e.seq === 1) await new Promise((resolve) => setTimeout(resolve, 800));
        }
      })(),
      (e) => e instanceof HareBoxError && e.code === "timeout",
    );
    assert.deepEqual(two, [1, 2]);
  });

  test("followEvents: breaking out closes the stream; the caller's signal rejects with its reason", async () => {
    const hb = new HareBox({ url: url + "/events-forever", apiKey: KEY });
    const waitClosed = async (n) => {
      for (let i = 0; i < 200 && closed.filter((u) => u.startsWith("/events-forever/")).length < n; i++) await new Promise((resolve) => setTimeout(resolve, 10));
      assert.equal(closed.filter((u) => u.startsWith("/events-forever/")).length, n, "the server saw the stream close");
    };
    const before_ = closed.filter((u) => u.startsWith("/events-forever/")).length;
    for await (const e of hb.followEvents()) {
      assert.equal(e.seq, 1);
      break;
    }
    await waitClosed(before_ + 1);
    const ac = new AbortController();
    const got = [];
    await assert.rejects(
      (async () => {
        for await (const e of hb.followEvents({ signal: ac.signal })) {
          got.push(e.seq);
          setTimeout(() => ac.abort(), 120); // during the keepalives
        }
      })(),
      (e) => e instanceof Error && e.name === "AbortError" && !(e instanceof HareBoxError),
    );
    assert.deepEqual(got, [1]);
    await waitClosed(before_ + 2);
  });

  /** getProcessOutput's events, their bytes as text. */
  const outputOf = async (iter) => {
    const got = [];
    for await (const ev of iter) got.push(ev.event === "exit" ? ev : { event: ev.event, offset: ev.offset, text: new TextDecoder().decode(ev.data) });
    return got;
  };

  test("getProcessOutput: GET .../processes/{pid}/output with its query; stdout, stderr and exit decoded, with their offsets", async () => {
    const hb = new HareBox({ url: url + "/procout", apiKey: KEY });
    const start = seen.length;
    // Everything kept: the gap in stdout shows as an offset past the previous chunk's end.
    const all = await outputOf(hb.getProcessOutput("sbx_1", "done"));
    assert.deepEqual(all, [
      { event: "stdout", offset: 0, text: "one\n" },
      { event: "stderr", offset: 0, text: "oops\n" },
      { event: "stdout", offset: 4, text: "two\n" },
      { event: "stdout", offset: 20, text: "five\n" },
      { event: "exit", result: EXIT },
    ]);
    // From offsets, following: the rest, then the exit; the iteration ends there.
    const rest = await outputOf(hb.getProcessOutput("sbx_1", "done", { query: { follow: true, stdout_offset: 6, stderr_offset: 5 } }));
    assert.deepEqual(rest, [
      { event: "stdout", offset: 6, text: "o\n" },
      { event: "stdout", offset: 20, text: "five\n" },
      { event: "exit", result: EXIT },
    ]);
    // The bytes are bytes (a Uint8Array of their own).
    for await (const ev of hb.getProcessOutput("sbx_1", "done", { query: { stderr_offset: 0 } })) {
      if (ev.event === "stderr") {
        assert.ok(ev.data instanceof Uint8Array);
        assert.deepEqual([...ev.data], [...Buffer.from("oops\n")]);
        break;
      }
    }
    // The Sandbox form, with a pid that needs escaping (not found here).
    const box = new Sandbox(hb, SANDBOX);
    assert.deepEqual((await outputOf(box.processOutput("done", { follow: false, stdout_offset: 8, stderr_offset: 5 }))).map((e) => e.event), ["stdout", "exit"]);
    await assert.rejects(outputOf(box.processOutput("a/b")), (e) => e instanceof HareBoxError && e.status === 404 && e.code === "not_found");
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.slice(start).map((s) => [s.method, s.url, s.accept, s.auth]), [
      ["GET", "/procout/v1/sandboxes/sbx_1/processes/done/output", "text/event-stream", `Bearer ${KEY}`],
      ["GET", "/procout/v1/sandboxes/sbx_1/processes/done/output?follow=true&stdout_offset=6&stderr_offset=5", "text/event-stream", `Bearer ${KEY}`],
      ["GET", "/procout/v1/sandboxes/sbx_1/processes/done/output?stderr_offset=0", "text/event-stream", `Bearer ${KEY}`],
      ["GET", "/procout/v1/sandboxes/sbx_1/processes/done/output?follow=false&stdout_offset=8&stderr_offset=5", "text/event-stream", `Bearer ${KEY}`],
      ["GET", "/procout/v1/sandboxes/sbx_1/processes/a%2Fb/output", "text/event-stream", `Bearer ${KEY}`],
    ]);
  });

  test("getProcessOutput: without follow a running process's output just ends; with follow that end throws network", async () => {
    const hb = new HareBox({ url: url + "/procout", apiKey: KEY });
    const partial = await outputOf(hb.getProcessOutput("sbx_1", "running", { query: { stdout_offset: 4 } }));
    assert.deepEqual(partial, [
      { event: "stderr", offset: 0, text: "oops\n" },
      { event: "stdout", offset: 4, text: "two\n" },
      { event: "stdout", offset: 20, text: "five\n" },
    ]);
    const got = [];
    await assert.rejects(
      (async () => {
        for await (const ev of hb.getProcessOutput("sbx_1", "running", { query: { follow: true, stdout_offset: 25, stderr_offset: 5 } })) got.push(ev);
      })(),
      (e) => e instanceof HareBoxError && e.status === 0 && e.code === "network" && /ended before the exit event/.test(e.message),
    );
    assert.deepEqual(got, []);
  });

  test("getProcessOutput: an error event throws its code after the chunks before it; errors before the stream throw as a call's", async () => {
    const hb = new HareBox({ url: url + "/procout", apiKey: KEY });
    const got = [];
    await assert.rejects(
      (async () => {
        for await (const ev of hb.getProcessOutput("sbx_1", "broken", { query: { follow: true } })) got.push(ev.event);
      })(),
      (e) => {
        assert.ok(e instanceof HareBoxError, `want a HareBoxError, got ${e}`);
        assert.deepEqual([e.status, e.code, e.message, e.field], [503, "unavailable", "the sandbox's agent went away", undefined]);
        return true;
      },
    );
    assert.deepEqual(got, ["stdout"]);
    // 404 and 400 are plain JSON answers: the first next() throws them.
    await assert.rejects(hb.getProcessOutput("sbx_1", "nope", { query: { follow: true } }).next(), (e) => e instanceof HareBoxError && e.status === 404 && e.code === "not_found" && /no process nope/.test(e.message));
    await assert.rejects(
      hb.getProcessOutput("sbx_1", "done", { query: { stdout_offset: -1 } }).next(),
      (e) => e instanceof HareBoxError && e.status === 400 && e.code === "invalid" && e.field === "stdout_offset",
    );
    await assert.rejects(hb.getProcessOutput("sbx_1", "done", { query: { follow: /** @type {any} */ ("yes") } }).next(), (e) => e instanceof HareBoxError && e.status === 0 && e.field === "follow");
    await assert.rejects(hb.getProcessOutput("sbx_1", "").next(), (e) => e instanceof HareBoxError && e.field === "pid");
    // A chunk before the offset asked for, or one without a numeric offset, is the server's fault.
    await assert.rejects(outputOf(hb.getProcessOutput("sbx_1", "back", { query: { stdout_offset: 4 } })), (e) => e instanceof HareBoxError && e.code === "network" && /went back from offset 4 to 0/.test(e.message));
    await assert.rejects(outputOf(hb.getProcessOutput("sbx_1", "garbled")), (e) => e instanceof HareBoxError && e.code === "network" && /malformed stdout event/.test(e.message));
  });

  test("getProcessOutput: timeoutMs bounds silence, not the stream", async () => {
    const hb = new HareBox({ url: url + "/procout", apiKey: KEY });
    const t0 = Date.now();
    await assert.rejects(hb.getProcessOutput("sbx_1", "quiet", { query: { follow: true }, timeoutMs: 300 }).next(), (e) => e instanceof HareBoxError && e.code === "timeout" && /getProcessOutput: nothing from/.test(e.message));
    assert.ok(Date.now() - t0 < 5000);
    // Keepalives every 100 ms hold a 300 ms bound for the 750 ms the stream takes.
    assert.deepEqual(await outputOf(hb.getProcessOutput("sbx_1", "slow", { query: { follow: true }, timeoutMs: 300 })), [{ event: "exit", result: EXIT }]);
    // The caller's signal rejects with its own reason.
    await assert.rejects(hb.getProcessOutput("sbx_1", "quiet", { query: { follow: true }, signal: AbortSignal.timeout(100) }).next(), (e) => e instanceof Error && e.name === "TimeoutError" && !(e instanceof HareBoxError));
  });

  test("runCode: POST .../code answers the cell; Sandbox.runCode sends its fields and decodes the results", async () => {
    const hb = new HareBox({ url: url + "/code", apiKey: KEY });
    const start = seen.length;
    assert.deepEqual(await hb.runCode("sbx_1", { body: { code: "x + 1" } }), CELL);
    const box = new Sandbox(hb, SANDBOX);
    const x = await box.runCode("x + 1", { context: "ctx-1", language: "python", env: { A: "1" }, timeoutMs: 10_000 });
    assert.ok(x instanceof Execution);
    assert.deepEqual(
      [x.context_id, x.execution_count, x.status, x.stdout, x.stderr, x.error, x.duration_ms, x.stdout_truncated, x.stderr_truncated, x.results_dropped],
      ["default", 3, "ok", "plotted\n", "", undefined, 12, false, false, 1],
    );
    assert.equal(x.text, "42");
    assert.equal(x.mainResult, x.results[1]);
    const [chart, main] = x.results;
    assert.ok(chart instanceof Result && main instanceof Result);
    assert.ok(chart.png instanceof Uint8Array);
    assert.deepEqual([...chart.png], [...CHART]);
    assert.deepEqual([...chart.png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
    assert.deepEqual([chart.width, chart.height, chart.is_main_result, chart.jpeg, chart.html], [400, 288, false, undefined, undefined]);
    assert.deepEqual(chart.formats(), ["text", "png"]);
    assert.deepEqual(main.formats(), ["text", "json"]); // a null JSON value is still a format
    assert.equal(main.json, null);
    assert.ok(!("html" in chart), "a format it lacks is no property");
    assert.deepEqual(JSON.parse(JSON.stringify(chart)), CHART_RESULT);
    assert.deepEqual(JSON.parse(JSON.stringify(x)), CELL);
    // A context may be given as the CodeContext createCodeContext returned.
    await box.runCode("1", { context: BASH_CTX, signal: AbortSignal.timeout(5000) });
    await assert.rejects(box.runCode("1", { timeoutMs: 0 }), (e) => e instanceof HareBoxError && e.field === "timeoutMs");
    await assert.rejects(box.runCode("1", { timeoutMs: Number.NaN }), (e) => e instanceof HareBoxError && e.field === "timeoutMs");
    // A sandbox without a code interpreter is a conflict.
    await assert.rejects(hb.runCode("sbx_plain", { body: { code: "1" } }), (e) => e instanceof HareBoxError && e.status === 409 && e.code === "conflict");
    await assert.rejects(hb.runCode("", { body: { code: "1" } }), (e) => e instanceof HareBoxError && e.field === "id");
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.slice(start).map((s) => [s.method, s.url, s.accept, s.body]), [
      ["POST", "/code/v1/sandboxes/sbx_1/code", "application/json", '{"code":"x + 1"}'],
      ["POST", "/code/v1/sandboxes/sbx_1/code", "application/json", '{"code":"x + 1","context_id":"ctx-1","language":"python","env":{"A":"1"},"timeout_seconds":10}'],
      ["POST", "/code/v1/sandboxes/sbx_1/code", "application/json", '{"code":"1","context_id":"c1"}'],
      ["POST", "/code/v1/sandboxes/sbx_plain/code", "application/json", '{"code":"1"}'],
    ]);
    assert.deepEqual(OPERATIONS.runCode, { method: "POST", path: "/v1/sandboxes/{id}/code" });
  });

  test("runCodeStream yields the cell's events in order; Sandbox.runCode with callbacks gets them as they come", async () => {
    const hb = new HareBox({ url: url + "/code", apiKey: KEY });
    const start = seen.length;
    const events = [];
    for await (const ev of hb.runCodeStream("sbx_1", { body: { code: "run()" } })) events.push(ev);
    assert.deepEqual(events, [
      { type: "stdout", text: "a\n" },
      { type: "stderr", text: "warning\n" },
      { type: "result", result: CHART_RESULT },
      { type: "stdout", text: "b\n" },
      { type: "result", result: MAIN_RESULT },
      { type: "exception", error: CODE_ERROR },
      { type: "end", execution: CELL_END },
    ]);
    // Any callback streams; each gets its events in order, awaited.
    const box = new Sandbox(hb, SANDBOX);
    const calls = [];
    const x = await box.runCode("run()", {
      timeoutMs: 20_000,
      onStdout: (text) => calls.push(["stdout", text]),
      onStderr: async (text) => {
        await new Promise((resolve) => setTimeout(resolve, 20));
        calls.push(["stderr", text]);
      },
      onResult: (r) => calls.push(["result", r]),
      onError: (e) => calls.push(["error", e]),
    });
    assert.deepEqual(calls.map(([name]) => name), ["stdout", "stderr", "result", "stdout", "result", "error"]);
    assert.deepEqual([calls[0][1], calls[1][1], calls[3][1]], ["a\n", "warning\n", "b\n"]);
    assert.ok(calls[2][1] instanceof Result && calls[2][1].png instanceof Uint8Array);
    assert.deepEqual([...calls[2][1].png], [...CHART]);
    assert.equal(calls[4][1].text, "42");
    assert.deepEqual(calls[5][1], CODE_ERROR);
    // The Execution has what was streamed, and the end's own fields.
    assert.deepEqual([x.stdout, x.stderr, x.status, x.execution_count, x.text], ["a\nb\n", "warning\n", "error", 4, "42"]);
    assert.deepEqual(x.results, [calls[2][1], calls[4][1]]);
    assert.deepEqual(x.error, CODE_ERROR);
    const printed = [];
    assert.equal((await box.runCode("run()", { onStdout: (t) => printed.push(t) })).stdout, "a\nb\n");
    assert.deepEqual(printed, ["a\n", "b\n"]);
    // Breaking out cancels the request.
    for await (const ev of hb.runCodeStream("sbx_1", { body: { code: "run()" } })) {
      assert.equal(ev.type, "stdout");
      break;
    }
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.slice(start).map((s) => [s.method, s.url, s.accept, s.body]), [
      ["POST", "/code/v1/sandboxes/sbx_1/code", "text/event-stream", '{"code":"run()"}'],
      ["POST", "/code/v1/sandboxes/sbx_1/code", "text/event-stream", '{"code":"run()","timeout_seconds":20}'],
      ["POST", "/code/v1/sandboxes/sbx_1/code", "text/event-stream", '{"code":"run()"}'],
      ["POST", "/code/v1/sandboxes/sbx_1/code", "text/event-stream", '{"code":"run()"}'],
    ]);
  });

  test("runCodeStream: an error event throws its code after the events before it; a cut or garbled stream throws network; errors before it throw as a call's", async () => {
    const hb = new HareBox({ url: url + "/code", apiKey: KEY });
    const got = [];
    await assert.rejects(
      (async () => {
        for await (const ev of hb.runCodeStream("sbx_broken", { body: { code: "1" } })) got.push(ev);
      })(),
      (e) => {
        assert.ok(e instanceof HareBoxError, `want a HareBoxError, got ${e}`);
        assert.deepEqual([e.status, e.code, e.message], [503, "unavailable", "the sandbox's code interpreter answered wrongly"]);
        return true;
      },
    );
    assert.deepEqual(got, [{ type: "stdout", text: "a\n" }]);
    // Sandbox.runCode throws it too, after the callbacks of what came before.
    const box = new Sandbox(hb, { ...SANDBOX, id: "sbx_broken" });
    const printed = [];
    await assert.rejects(box.runCode("1", { onStdout: (t) => printed.push(t) }), (e) => e instanceof HareBoxError && e.code === "unavailable");
    assert.deepEqual(printed, ["a\n"]);
    const cut = new Sandbox(hb, { ...SANDBOX, id: "sbx_cut" });
    await assert.rejects(cut.runCode("1", { onStdout: () => {} }), (e) => e instanceof HareBoxError && e.code === "network" && /runCodeStream: the stream ended before the end event/.test(e.message));
    await assert.rejects(
      (async () => {
        for await (const _ of hb.runCodeStream("sbx_garbled", { body: { code: "1" } }));
      })(),
      (e) => e instanceof HareBoxError && e.code === "network" && /runCodeStream: malformed stdout event/.test(e.message),
    );
    // Errors before the stream are JSON answers: the first next() throws them.
    await assert.rejects(hb.runCodeStream("sbx_plain", { body: { code: "1" } }).next(), (e) => e instanceof HareBoxError && e.status === 409 && e.code === "conflict");
    const plain = new Sandbox(hb, { ...SANDBOX, id: "sbx_plain" });
    await assert.rejects(plain.runCode("1", { onError: () => {} }), (e) => e instanceof HareBoxError && e.status === 409);
    await assert.rejects(plain.runCode("1"), (e) => e instanceof HareBoxError && e.status === 409);
  });

  test("the code context operations send their methods, paths and bodies; the Sandbox's context methods", async () => {
    const hb = new HareBox({ url: url + "/code", apiKey: KEY });
    const start = seen.length;
    assert.deepEqual(await hb.listCodeContexts("sbx_1"), { contexts: [DEFAULT_CTX, BASH_CTX] });
    assert.deepEqual(await hb.createCodeContext("sbx_1", { body: { language: "bash", cwd: "/tmp" } }), BASH_CTX);
    await hb.createCodeContext("sbx_1");
    assert.deepEqual(await hb.restartCodeContext("sbx_1", "c1"), BASH_CTX);
    assert.equal(await hb.deleteCodeContext("sbx_1", "c1"), undefined);
    await hb.deleteCodeContext("a/b", "c?1");
    const box = new Sandbox(hb, SANDBOX);
    assert.deepEqual(await box.codeContexts(), [DEFAULT_CTX, BASH_CTX]);
    assert.deepEqual(await box.createCodeContext({ language: "bash", cwd: "/tmp", env: { A: "1" }, timeoutMs: 5000 }), BASH_CTX);
    assert.deepEqual(await box.restartCodeContext("c1"), BASH_CTX);
    assert.equal(await box.deleteCodeContext("c1"), undefined);
    await assert.rejects(hb.restartCodeContext("sbx_1", ""), (e) => e instanceof HareBoxError && e.field === "context_id");
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.slice(start).map((s) => `${s.method} ${s.url.slice(5)} ${s.body}`.trim()), [
      "GET /v1/sandboxes/sbx_1/code/contexts",
      'POST /v1/sandboxes/sbx_1/code/contexts {"language":"bash","cwd":"/tmp"}',
      "POST /v1/sandboxes/sbx_1/code/contexts {}",
      "POST /v1/sandboxes/sbx_1/code/contexts/c1/restart",
      "DELETE /v1/sandboxes/sbx_1/code/contexts/c1",
      "DELETE /v1/sandboxes/a%2Fb/code/contexts/c%3F1",
      "GET /v1/sandboxes/sbx_1/code/contexts",
      'POST /v1/sandboxes/sbx_1/code/contexts {"language":"bash","cwd":"/tmp","env":{"A":"1"}}',
      "POST /v1/sandboxes/sbx_1/code/contexts/c1/restart",
      "DELETE /v1/sandboxes/sbx_1/code/contexts/c1",
    ]);
    for (const op of ["listCodeContexts", "createCodeContext", "restartCodeContext", "deleteCodeContext"]) assert.equal(typeof HareBox.prototype[op], "function", op);
    assert.deepEqual(OPERATIONS.restartCodeContext, { method: "POST", path: "/v1/sandboxes/{id}/code/contexts/{context_id}/restart" });
  });

  test("the command history and account update operations send their methods, paths, queries and bodies", async () => {
    const hb = new HareBox({ url: url + "/echo", apiKey: KEY });
    const start = seen.length;
    const update = { retention: { history_days: 30, output_days: 0 } };
    assert.deepEqual(await hb.listCommands("sbx_1"), { method: "GET", url: "/v1/sandboxes/sbx_1/commands" });
    await hb.listCommands("sbx_1", { query: { limit: 5 } });
    await hb.listCommands("a/b", { query: { limit: undefined } });
    assert.deepEqual(await hb.updateAccount("default", { body: update }), { method: "PATCH", url: "/v1/accounts/default" });
    await hb.updateAccount("acc_2", { body: { retention: {} } });
    await hb.create({ monitoring: false, snapshots: false }).catch(() => {}); // the echo is no sandbox
    await new Promise((resolve) => setImmediate(resolve));
    const sent = seen.slice(start).map((s) => `${s.method} ${s.url.slice(5)} ${s.body}`.trim());
    assert.deepEqual(sent, [
      "GET /v1/sandboxes/sbx_1/commands",
      "GET /v1/sandboxes/sbx_1/commands?limit=5",
      "GET /v1/sandboxes/a%2Fb/commands",
      `PATCH /v1/accounts/default ${JSON.stringify(update)}`,
      'PATCH /v1/accounts/acc_2 {"retention":{}}',
      'POST /v1/sandboxes {"monitoring":false,"snapshots":false}',
    ]);
    assert.ok(seen.slice(start).every((s) => s.auth === `Bearer ${KEY}`));
    await assert.rejects(hb.listCommands(""), (e) => e instanceof HareBoxError && e.field === "id");
    await assert.rejects(hb.updateAccount("", { body: {} }), (e) => e instanceof HareBoxError && e.field === "account");
  });

  test("the budget and usage operations send their methods, paths, queries and bodies", async () => {
    const hb = new HareBox({ url: url + "/echo", apiKey: KEY });
    const start = seen.length;
    const acme = { query: { account: "acme" } };
    const budget = { name: "team-red", scope: { kind: "label", labels: { team: "red" } }, period: "monthly", limit_usd: "25.00", action: "pause", warn_at_percent: [50, 80] };
    assert.deepEqual(await hb.createBudget({ ...acme, body: budget }), { method: "POST", url: "/v1/budgets?account=acme" });
    await hb.createBudget({ body: { scope: { kind: "project", ref: "web" }, period: "total", limit_usd: "0.000001", action: "deny_new" } });
    await hb.listBudgets();
    await hb.listBudgets(acme);
    assert.deepEqual(await hb.getBudget("bgt_1"), { method: "GET", url: "/v1/budgets/bgt_1" });
    assert.equal(await hb.deleteBudget("bgt_1"), undefined);
    await hb.getBudget("a/b");
    assert.deepEqual(await hb.getUsage(), { method: "GET", url: "/v1/usage" });
    await hb.getUsage({ query: { account: "acme", from: "2026-11-01T00:00:00Z", to: "2026-12-01T00:00:00+01:00", group_by: "label:team" } });
    await new Promise((resolve) => setImmediate(resolve));
    const sent = seen.slice(start).map((s) => `${s.method} ${s.url.slice(5)} ${s.body}`.trim());
    assert.deepEqual(sent, [
      `POST /v1/budgets?account=acme ${JSON.stringify(budget)}`,
      'POST /v1/budgets {"scope":{"kind":"project","ref":"web"},"period":"total","limit_usd":"0.000001","action":"deny_new"}',
      "GET /v1/budgets",
      "GET /v1/budgets?account=acme",
      "GET /v1/budgets/bgt_1",
      "DELETE /v1/budgets/bgt_1",
      "GET /v1/budgets/a%2Fb",
      "GET /v1/usage",
      "GET /v1/usage?account=acme&from=2026-11-01T00%3A00%3A00Z&to=2026-12-01T00%3A00%3A00%2B01%3A00&group_by=label%3Ateam",
    ]);
    assert.ok(seen.slice(start).every((s) => s.auth === `Bearer ${KEY}`));
    await assert.rejects(hb.getBudget(""), (e) => e instanceof HareBoxError && e.field === "budget");
    await assert.rejects(hb.deleteBudget(""), (e) => e instanceof HareBoxError && e.field === "budget");
  });

  test("stopSandbox and startSandbox send POST .../stop and .../start with no body; Sandbox.stop and boot update it", async () => {
    const hb = new HareBox({ url: url + "/box", apiKey: KEY });
    const start = seen.length;
    const stopped = await hb.stopSandbox("sbx_1");
    assert.ok(stopped instanceof Sandbox);
    assert.deepEqual([stopped.id, stopped.state], ["sbx_1", "stopped"]);
    assert.equal(stopped.client, hb);
    const started = await hb.startSandbox("sbx_1", { timeoutMs: 5000 });
    assert.ok(started instanceof Sandbox);
    assert.deepEqual([started.id, started.state], ["sbx_1", "running"]);
    assert.equal((await hb.stopSandbox("a/b", { signal: AbortSignal.timeout(5000) })).id, "a/b");
    // The Sandbox's methods: the same requests, and this, updated.
    const box = new Sandbox(hb, /** @type {any} */ ({ ...SANDBOX, id: "sbx_2" }));
    const same = await box.stop();
    assert.equal(same, box);
    assert.equal(box.state, "stopped");
    assert.equal(await box.boot(), box);
    assert.equal(box.state, "running");
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.slice(start).map((s) => `${s.method} ${s.url.slice(4)} ${s.body}`.trim()), [
      "POST /v1/sandboxes/sbx_1/stop",
      "POST /v1/sandboxes/sbx_1/start",
      "POST /v1/sandboxes/a%2Fb/stop",
      "POST /v1/sandboxes/sbx_2/stop",
      "POST /v1/sandboxes/sbx_2/start",
    ]);
    assert.ok(seen.slice(start).every((s) => s.auth === `Bearer ${KEY}`));
    await assert.rejects(hb.stopSandbox(""), (e) => e instanceof HareBoxError && e.field === "id");
    await assert.rejects(hb.startSandbox(""), (e) => e instanceof HareBoxError && e.field === "id");
    assert.equal(seen.length, start + 5, "a bad id sends nothing");
    // A start that is refused: a conflict (409) leaves the Sandbox as it was; a budget with no room is 402.
    const refused = new Sandbox(new HareBox({ url: url + "/conflict", apiKey: KEY }), /** @type {any} */ ({ ...SANDBOX }));
    await assert.rejects(refused.boot(), (e) => e instanceof HareBoxError && e.status === 409 && e.code === "conflict" && /only a stopped sandbox starts/.test(e.message));
    assert.equal(refused.state, "running");
    await assert.rejects(new HareBox({ url: url + "/budget", apiKey: KEY }).startSandbox("sbx_1"), (e) => e instanceof HareBoxError && e.status === 402 && e.code === "budget_exceeded");
  });

  test("hibernateSandbox and resumeSandbox send POST .../hibernate and .../resume with no body; Sandbox.hibernate and resume update it", async () => {
    const hb = new HareBox({ url: url + "/box", apiKey: KEY });
    const start = seen.length;
    const hibernated = await hb.hibernateSandbox("sbx_1");
    assert.ok(hibernated instanceof Sandbox);
    assert.deepEqual([hibernated.id, hibernated.state], ["sbx_1", "hibernated"]);
    assert.equal(hibernated.client, hb);
    const resumed = await hb.resumeSandbox("sbx_1", { timeoutMs: 5000 });
    assert.ok(resumed instanceof Sandbox);
    assert.deepEqual([resumed.id, resumed.state], ["sbx_1", "running"]);
    assert.equal((await hb.hibernateSandbox("a/b", { signal: AbortSignal.timeout(5000) })).id, "a/b");
    // The Sandbox's methods: the same requests, and this, updated.
    const box = new Sandbox(hb, /** @type {any} */ ({ ...SANDBOX, id: "sbx_2" }));
    assert.equal(await box.hibernate(), box);
    assert.equal(box.state, "hibernated");
    assert.equal(await box.resume({ timeoutMs: 5000 }), box);
    assert.equal(box.state, "running");
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.slice(start).map((s) => `${s.method} ${s.url.slice(4)} ${s.body}`.trim()), [
      "POST /v1/sandboxes/sbx_1/hibernate",
      "POST /v1/sandboxes/sbx_1/resume",
      "POST /v1/sandboxes/a%2Fb/hibernate",
      "POST /v1/sandboxes/sbx_2/hibernate",
      "POST /v1/sandboxes/sbx_2/resume",
    ]);
    assert.ok(seen.slice(start).every((s) => s.auth === `Bearer ${KEY}`));
    assert.deepEqual(OPERATIONS.hibernateSandbox, { method: "POST", path: "/v1/sandboxes/{id}/hibernate" });
    await assert.rejects(hb.hibernateSandbox(""), (e) => e instanceof HareBoxError && e.field === "id");
    assert.equal(seen.length, start + 5, "a bad id sends nothing");
    // A refused hibernate leaves the Sandbox as it was; a resume a budget has no room for is 402.
    const refused = new Sandbox(new HareBox({ url: url + "/conflict", apiKey: KEY }), /** @type {any} */ ({ ...SANDBOX }));
    await assert.rejects(refused.hibernate(), (e) => e instanceof HareBoxError && e.status === 409 && e.code === "conflict");
    assert.equal(refused.state, "running");
    await assert.rejects(new HareBox({ url: url + "/budget", apiKey: KEY }).resumeSandbox("sbx_1"), (e) => e instanceof HareBoxError && e.status === 402 && e.code === "budget_exceeded");
  });

  test("the State type lists the repository's api/openapi.yaml State enum", { skip: existsSync(REPO_OPENAPI) ? false : "api/openapi.yaml is not beside this SDK" }, () => {
    const doc = /^    State:\n      type: string\n      enum: \[([^\]]*)\]/m.exec(readFileSync(REPO_OPENAPI, "utf8"));
    assert.ok(doc, "no State schema in api/openapi.yaml");
    const src = /^export type State = ([^;]*);/m.exec(readFileSync(fileURLToPath(new URL("../src/types.ts", import.meta.url)), "utf8"));
    assert.ok(src, "no State type in src/types.ts");
    const documented = doc[1].split(",").map((s) => s.trim());
    assert.ok(documented.includes("hibernated"));
    assert.deepEqual(src[1].split("|").map((s) => JSON.parse(s.trim())), documented);
  });

  test("the URLRequest auth type lists the repository's api/openapi.yaml URLRequest auth enum", { skip: existsSync(REPO_OPENAPI) ? false : "api/openapi.yaml is not beside this SDK" }, () => {
    const doc = /^    URLRequest:\n(?:      .*\n)*?        auth: \{type: string, enum: \[([^\]]*)\]/m.exec(readFileSync(REPO_OPENAPI, "utf8"));
    assert.ok(doc, "no URLRequest auth enum in api/openapi.yaml");
    const src = /^export interface URLRequest \{[^}]*?\n  auth\?: ([^;]*);/m.exec(readFileSync(fileURLToPath(new URL("../src/types.ts", import.meta.url)), "utf8"));
    assert.ok(src, "no URLRequest auth in src/types.ts");
    const documented = doc[1].split(",").map((s) => s.trim());
    assert.ok(documented.includes("mtls"));
    assert.deepEqual(src[1].split("|").map((s) => JSON.parse(s.trim())), documented);
  });

  test("forkSandbox and the snapshot operations send their methods, paths, queries and bodies; Sandbox.fork and snapshot", async () => {
    const hb = new HareBox({ url: url + "/snap", apiKey: KEY });
    const start = seen.length;
    const fork = { count: 2, name: "w", labels: { fork: "yes" }, ttl_seconds: 600 };
    const { sandboxes } = await hb.forkSandbox("sbx_1", { body: fork });
    assert.ok(sandboxes.every((s) => s instanceof Sandbox && s.client === hb));
    assert.deepEqual(sandboxes.map((s) => s.toJSON()), CLONES);
    assert.deepEqual((await hb.forkSandbox("a/b", { timeoutMs: 5000 })).sandboxes.map((s) => s.id), ["sbx_2", "sbx_3"]);
    assert.deepEqual(await hb.createSnapshot("sbx_1", { body: { name: "base" } }), SNAPSHOT);
    await hb.createSnapshot("a/b", { signal: AbortSignal.timeout(5000) });
    assert.deepEqual(await hb.listSnapshots(), { snapshots: [SNAPSHOT] });
    await hb.listSnapshots({ query: { sandbox: "sbx_1" } });
    await hb.listSnapshots({ query: { sandbox: undefined } });
    assert.deepEqual(await hb.getSnapshot("snap_1"), SNAPSHOT);
    await hb.getSnapshot("a/b");
    assert.equal(await hb.deleteSnapshot("snap_1"), undefined);
    const restored = await hb.create({ snapshot: "snap_1", name: "restored" });
    assert.ok(restored instanceof Sandbox);
    assert.deepEqual([restored.id, restored.name], ["sbx_4", "restored"]);
    // The Sandbox's methods: the clones as Sandbox objects, the source left as it was.
    const box = new Sandbox(hb, /** @type {any} */ ({ ...SANDBOX }));
    const clones = await box.fork({ count: 2, name: "w", signal: AbortSignal.timeout(5000) });
    assert.ok(clones.every((c) => c instanceof Sandbox && c.client === hb));
    assert.deepEqual(clones.map((c) => [c.id, c.name, c.state]), [["sbx_2", "w-1", "running"], ["sbx_3", "w-2", "running"]]);
    assert.deepEqual(box.toJSON(), SANDBOX);
    await box.fork();
    assert.deepEqual(await box.snapshot({ name: "base", timeoutMs: 5000 }), SNAPSHOT);
    await box.snapshot();
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.slice(start).map((s) => `${s.method} ${s.url.slice(5)} ${s.body}`.trim()), [
      `POST /v1/sandboxes/sbx_1/fork ${JSON.stringify(fork)}`,
      "POST /v1/sandboxes/a%2Fb/fork",
      'POST /v1/sandboxes/sbx_1/snapshots {"name":"base"}',
      "POST /v1/sandboxes/a%2Fb/snapshots",
      "GET /v1/snapshots",
      "GET /v1/snapshots?sandbox=sbx_1",
      "GET /v1/snapshots",
      "GET /v1/snapshots/snap_1",
      "GET /v1/snapshots/a%2Fb",
      "DELETE /v1/snapshots/snap_1",
      'POST /v1/sandboxes {"snapshot":"snap_1","name":"restored"}',
      'POST /v1/sandboxes/sbx_1/fork {"count":2,"name":"w"}',
      "POST /v1/sandboxes/sbx_1/fork {}",
      'POST /v1/sandboxes/sbx_1/snapshots {"name":"base"}',
      "POST /v1/sandboxes/sbx_1/snapshots {}",
    ]);
    assert.ok(seen.slice(start).every((s) => s.auth === `Bearer ${KEY}`));
    await assert.rejects(hb.forkSandbox(""), (e) => e instanceof HareBoxError && e.field === "id");
    await assert.rejects(hb.createSnapshot(""), (e) => e instanceof HareBoxError && e.field === "id");
    await assert.rejects(hb.getSnapshot(""), (e) => e instanceof HareBoxError && e.field === "snapshot");
    await assert.rejects(hb.deleteSnapshot(""), (e) => e instanceof HareBoxError && e.field === "snapshot");
    assert.equal(seen.length, start + 15, "a bad id sends nothing");
    // A delete while a create from the snapshot is in flight is a conflict.
    await assert.rejects(new HareBox({ url: url + "/conflict", apiKey: KEY }).deleteSnapshot("snap_1"), (e) => e instanceof HareBoxError && e.status === 409 && e.code === "conflict");
  });

  test("the image operations send their methods, paths and bodies", async () => {
    const hb = new HareBox({ url: url + "/snap", apiKey: KEY });
    const start = seen.length;
    assert.deepEqual(await hb.listImages(), { images: [IMAGE] });
    assert.deepEqual(await hb.buildImage({ body: { name: "myimg", from: "registry:ghcr.io/org/app:1" } }), IMAGE);
    assert.equal(await hb.deleteImage("my/img"), undefined);
    assert.deepEqual(seen.slice(start).map((s) => `${s.method} ${s.url.slice(5)} ${s.body}`.trim()), [
      "GET /v1/images",
      'POST /v1/images {"name":"myimg","from":"registry:ghcr.io/org/app:1"}',
      "DELETE /v1/images/my%2Fimg",
    ]);
    await assert.rejects(hb.deleteImage(""), (e) => e instanceof HareBoxError && e.field === "name");
    assert.equal(seen.length, start + 3, "a bad name sends nothing");
  });

  test("the URL operations send their methods, paths and bodies and return the URLs; the Sandbox's URL methods", async () => {
    const hb = new HareBox({ url: url + "/urls", apiKey: KEY });
    const start = seen.length;
    const created = await hb.createURL("sbx_1", { body: { port: 8080, auth: "token" } });
    assert.deepEqual(created, CREATED);
    assert.deepEqual([created.id, created.port, created.token, created.link], ["url_1", 8080, "hburl_first", "https://8080-1.ingress.example/?harebox_token=hburl_first"]);
    await hb.createURL("a/b", { body: { port: 22 }, timeoutMs: 5000 });
    const listed = await hb.listURLs("sbx_1");
    assert.deepEqual(listed, { urls: [URL1, URL2] });
    assert.ok(listed.urls.every((u) => u.token === undefined && u.link === undefined));
    assert.deepEqual(await hb.getURL("sbx_1", "url_1"), URL1);
    const rotated = await hb.rotateURL("sbx_1", "url_1", { signal: AbortSignal.timeout(5000) });
    assert.deepEqual(rotated, ROTATED);
    assert.deepEqual([rotated.token, rotated.rotated_at], ["hburl_second", "2026-11-30T13:00:00Z"]);
    await hb.rotateURL("a/b", "url_1");
    assert.equal(await hb.deleteURL("sbx_1", "url_1"), undefined);
    await hb.deleteURL("sbx_1", "../url_1");
    // The Sandbox's methods.
    const box = new Sandbox(hb, /** @type {any} */ ({ ...SANDBOX }));
    assert.deepEqual(await box.createURL(8080), CREATED);
    await box.createURL(8080, { auth: "token", timeoutMs: 5000 });
    assert.deepEqual((await box.listURLs()).urls.map((u) => u.id), ["url_1", "url_2"]);
    assert.deepEqual(await box.getURL("url_1"), URL1);
    assert.equal((await box.rotateURL("url_1")).token, "hburl_second");
    assert.equal(await box.deleteURL("url_1"), undefined);
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.slice(start).map((s) => `${s.method} ${s.url.slice(5)} ${s.body}`.trim()), [
      'POST /v1/sandboxes/sbx_1/urls {"port":8080,"auth":"token"}',
      'POST /v1/sandboxes/a%2Fb/urls {"port":22}',
      "GET /v1/sandboxes/sbx_1/urls",
      "GET /v1/sandboxes/sbx_1/urls/url_1",
      "POST /v1/sandboxes/sbx_1/urls/url_1/rotate",
      "POST /v1/sandboxes/a%2Fb/urls/url_1/rotate",
      "DELETE /v1/sandboxes/sbx_1/urls/url_1",
      "DELETE /v1/sandboxes/sbx_1/urls/..%2Furl_1",
      'POST /v1/sandboxes/sbx_1/urls {"port":8080}',
      'POST /v1/sandboxes/sbx_1/urls {"auth":"token","port":8080}',
      "GET /v1/sandboxes/sbx_1/urls",
      "GET /v1/sandboxes/sbx_1/urls/url_1",
      "POST /v1/sandboxes/sbx_1/urls/url_1/rotate",
      "DELETE /v1/sandboxes/sbx_1/urls/url_1",
    ]);
    assert.ok(seen.slice(start).every((s) => s.auth === `Bearer ${KEY}`));
    assert.ok(seen.slice(start).filter((s) => s.body).every((s) => s.method === "POST"));
    for (const op of ["createURL", "listURLs", "getURL", "rotateURL", "deleteURL"]) assert.equal(typeof HareBox.prototype[op], "function", op);
    assert.deepEqual(OPERATIONS.rotateURL, { method: "POST", path: "/v1/sandboxes/{id}/urls/{url_id}/rotate" });
    await assert.rejects(hb.createURL("", { body: { port: 8080 } }), (e) => e instanceof HareBoxError && e.field === "id");
    await assert.rejects(hb.listURLs(""), (e) => e instanceof HareBoxError && e.field === "id");
    await assert.rejects(hb.getURL("sbx_1", ""), (e) => e instanceof HareBoxError && e.field === "url_id");
    await assert.rejects(hb.rotateURL("sbx_1", ""), (e) => e instanceof HareBoxError && e.field === "url_id");
    await assert.rejects(hb.deleteURL("", "url_1"), (e) => e instanceof HareBoxError && e.field === "id");
    assert.equal(seen.length, start + 14, "a bad id sends nothing");
    // A port published already is a conflict, with its field.
    await assert.rejects(hb.createURL("sbx_taken", { body: { port: 8080 } }), (e) => e instanceof HareBoxError && e.status === 409 && e.code === "conflict" && e.field === "port");
    // An oidc URL: its rule goes in the body and comes back with the URL, which has no token to show or rotate.
    const before = seen.length;
    const oidc = await hb.createURL("sbx_oidc", { body: { port: 9000, auth: "oidc", oidc: RULE } });
    assert.deepEqual(oidc, OIDC_URL);
    assert.deepEqual([oidc.auth, oidc.oidc, oidc.token, oidc.link], ["oidc", RULE, undefined, undefined]);
    assert.deepEqual((await hb.getURL("sbx_oidc", "url_3")).oidc, RULE);
    await assert.rejects(hb.rotateURL("sbx_oidc", "url_3"), (e) => e instanceof HareBoxError && e.status === 400 && e.code === "invalid");
    const oidcBox = new Sandbox(hb, /** @type {any} */ ({ ...SANDBOX, id: "sbx_oidc" }));
    assert.deepEqual(await oidcBox.createURL(9000, { auth: "oidc", oidc: RULE, timeoutMs: 5000 }), OIDC_URL);
    assert.deepEqual((await oidcBox.listURLs()).urls.map((u) => [u.auth, u.oidc]), [["oidc", RULE]]);
    await new Promise((resolve) => setImmediate(resolve));
    const body = '{"port":9000,"auth":"oidc","oidc":{"issuer":"https://issuer.example","audience":"harebox-web","emails":["ada@example.com"],"groups":["eng"]}}';
    assert.deepEqual(seen.slice(before).map((s) => `${s.method} ${s.url.slice(5)} ${s.body}`.trim()), [
      `POST /v1/sandboxes/sbx_oidc/urls ${body}`,
      "GET /v1/sandboxes/sbx_oidc/urls/url_3",
      "POST /v1/sandboxes/sbx_oidc/urls/url_3/rotate",
      'POST /v1/sandboxes/sbx_oidc/urls {"auth":"oidc","oidc":{"issuer":"https://issuer.example","audience":"harebox-web","emails":["ada@example.com"],"groups":["eng"]},"port":9000}',
      "GET /v1/sandboxes/sbx_oidc/urls",
    ]);
    assert.deepEqual(seen.slice(before).filter((s) => s.body).map((s) => JSON.parse(s.body)), [
      { port: 9000, auth: "oidc", oidc: RULE },
      { port: 9000, auth: "oidc", oidc: RULE },
    ]);
  });

  test("an mtls URL: createURL and Sandbox.createURL send auth mtls", async () => {
    const hb = new HareBox({ url: url + "/urls", apiKey: KEY });
    const start = seen.length;
    const mtls = await hb.createURL("sbx_mtls", { body: { port: 8443, auth: "mtls" } });
    assert.deepEqual(mtls, MTLS_URL);
    assert.deepEqual([mtls.auth, mtls.project_id], ["mtls", "prj_1"]);
    const box = new Sandbox(hb, /** @type {any} */ ({ ...SANDBOX, id: "sbx_mtls" }));
    assert.deepEqual(await box.createURL(8443, { auth: "mtls" }), MTLS_URL);
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.slice(start).map((s) => `${s.method} ${s.url.slice(5)} ${s.body}`.trim()), [
      'POST /v1/sandboxes/sbx_mtls/urls {"port":8443,"auth":"mtls"}',
      'POST /v1/sandboxes/sbx_mtls/urls {"auth":"mtls","port":8443}',
    ]);
  });

  test("the URL CA and client certificate operations send their methods, paths, queries and bodies", async () => {
    const hb = new HareBox({ url: url + "/urlca", apiKey: KEY });
    const web = { query: { project: "web", account: "acme" } };
    const start = seen.length;
    const ca = await hb.getURLCA();
    assert.deepEqual(ca, CA);
    assert.deepEqual([ca.certificate, ca.uploaded], [CA_PEM, false]);
    await hb.getURLCA(web);
    // No certificate: the server makes a new CA. A certificate: it is uploaded.
    assert.deepEqual(await hb.setURLCA({ query: { project: "web" } }), CA);
    await hb.setURLCA();
    await hb.setURLCA({ ...web, body: { certificate: CA_PEM }, timeoutMs: 5000 });
    assert.equal(await hb.deleteURLCA({ query: { project: "old" } }), undefined);
    // The key is in issueClientCert's answer only.
    const issued = await hb.issueClientCert({ query: { project: "web" }, body: { name: "ada", ttl: "720h" } });
    assert.deepEqual(issued, ISSUED);
    assert.deepEqual([issued.serial, issued.name, issued.issued], ["0a1b", "ada", true]);
    assert.match(issued.private_key ?? "", /^-----BEGIN PRIVATE KEY-----/);
    await hb.issueClientCert({ query: { account: "acme" }, body: { name: "ada" }, signal: AbortSignal.timeout(5000) });
    const listed = await hb.listClientCerts({ query: { project: "web" } });
    assert.deepEqual(listed, { certs: [CERT, REVOKED_SERIAL] });
    assert.deepEqual(listed.certs.map((c) => [c.serial, c.issued, c.revoked_at, c.private_key]), [
      ["0a1b", true, undefined, undefined],
      ["ff", false, "2026-12-01T09:00:00Z", undefined],
    ]);
    assert.deepEqual(await hb.listClientCerts({ query: { project: "empty" } }), { certs: [] });
    const revoked = await hb.revokeClientCert("0a1b", web);
    assert.deepEqual(revoked, { ...CERT, revoked_at: "2026-12-01T09:00:00Z" });
    await hb.revokeClientCert("0a:1b");
    await hb.revokeClientCert("../0a1b");
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.slice(start).map((s) => `${s.method} ${s.url.slice(6)} ${s.body}`.trim()), [
      "GET /v1/url-ca",
      "GET /v1/url-ca?project=web&account=acme",
      "PUT /v1/url-ca?project=web {}",
      "PUT /v1/url-ca {}",
      `PUT /v1/url-ca?project=web&account=acme ${JSON.stringify({ certificate: CA_PEM })}`,
      "DELETE /v1/url-ca?project=old",
      'POST /v1/url-ca/certs?project=web {"name":"ada","ttl":"720h"}',
      'POST /v1/url-ca/certs?account=acme {"name":"ada"}',
      "GET /v1/url-ca/certs?project=web",
      "GET /v1/url-ca/certs?project=empty",
      "POST /v1/url-ca/certs/0a1b/revoke?project=web&account=acme",
      "POST /v1/url-ca/certs/0a%3A1b/revoke",
      "POST /v1/url-ca/certs/..%2F0a1b/revoke",
    ]);
    assert.ok(seen.slice(start).every((s) => s.auth === `Bearer ${KEY}`));
    assert.deepEqual(
      ["getURLCA", "setURLCA", "deleteURLCA", "issueClientCert", "listClientCerts", "revokeClientCert"].map((op) => [typeof HareBox.prototype[op], OPERATIONS[op].method, OPERATIONS[op].path]),
      [
        ["function", "GET", "/v1/url-ca"],
        ["function", "PUT", "/v1/url-ca"],
        ["function", "DELETE", "/v1/url-ca"],
        ["function", "POST", "/v1/url-ca/certs"],
        ["function", "GET", "/v1/url-ca/certs"],
        ["function", "POST", "/v1/url-ca/certs/{serial}/revoke"],
      ],
    );
    // An empty certificate is never sent (the server would take it for
    // none and make a new CA); nor is an empty serial.
    for (const certificate of ["", " \n", /** @type {any} */ (42)]) {
      await assert.rejects(hb.setURLCA({ body: { certificate } }), (e) => e instanceof HareBoxError && e.code === "invalid" && e.field === "certificate");
    }
    await assert.rejects(hb.revokeClientCert(""), (e) => e instanceof HareBoxError && e.field === "serial");
    assert.equal(seen.length, start + 13, "a bad certificate or serial sends nothing");
    // The server's refusals, with their codes.
    await assert.rejects(hb.getURLCA({ query: { project: "none" } }), (e) => e instanceof HareBoxError && e.status === 404 && e.code === "not_found");
    await assert.rejects(hb.deleteURLCA({ query: { project: "none" } }), (e) => e instanceof HareBoxError && e.status === 404);
    await assert.rejects(hb.issueClientCert({ query: { project: "uploaded" }, body: { name: "ada" } }), (e) => e instanceof HareBoxError && e.status === 409 && e.code === "conflict");
    await assert.rejects(hb.revokeClientCert("0a1b", { query: { project: "none" } }), (e) => e instanceof HareBoxError && e.status === 404);
  });

  test("a create a budget refuses throws budget_exceeded with status 402", async () => {
    const hb = new HareBox({ url: url + "/budget", apiKey: KEY });
    await assert.rejects(hb.create({ image: "minimal" }), (e) => {
      assert.ok(e instanceof HareBoxError && !(e instanceof RateLimitedError), `want a HareBoxError, got ${e}`);
      assert.deepEqual([e.status, e.code, e.field], [402, "budget_exceeded", undefined]);
      assert.match(e.message, /^budget tight /);
      assert.match(String(e), /\(budget_exceeded, HTTP 402\)$/);
      return true;
    });
  });

  test("auditEntries follows next to the last page", async () => {
    const hb = new HareBox({ url: url + "/pages", apiKey: KEY });
    const start = seen.length;
    const got = [];
    for await (const e of hb.auditEntries({ query: { outcome: "denied", limit: 2 } })) got.push(e);
    assert.deepEqual(got.map((e) => [e.seq, e.outcome]), [[1, "denied"], [2, "denied"], [3, "denied"], [5, "denied"], [8, "denied"]]);
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.slice(start).map((s) => s.url.slice(6)), [
      "/v1/audit?limit=2&outcome=denied",
      "/v1/audit?limit=2&outcome=denied&after=2",
      "/v1/audit?limit=2&outcome=denied&after=5",
    ]);
    // A full last page: one more request, which is empty. Pages are 1000
    // entries by default; after starts past a cursor; breaking out stops.
    const mid = seen.length;
    const tail = [];
    for await (const e of hb.auditEntries({ query: { after: 3, limit: 2 } })) tail.push(e.seq);
    assert.deepEqual(tail, [5, 8]);
    for await (const e of hb.auditEntries({ query: { after: 1 } })) tail.push(e.seq);
    for await (const e of hb.auditEntries({ query: { limit: 1 } })) {
      tail.push(e.seq);
      break;
    }
    assert.deepEqual(tail, [5, 8, 2, 3, 5, 8, 1]);
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(seen.slice(mid).map((s) => s.url.slice(6)), [
      "/v1/audit?limit=2&after=3",
      "/v1/audit?limit=2&after=8",
      "/v1/audit?limit=1000&after=1",
      "/v1/audit?limit=1",
    ]);
    // A cursor that does not move would loop for ever.
    await assert.rejects(
      (async () => {
        for await (const e of hb.auditEntries({ query: { after: "stuck" } })) void e;
      })(),
      (e) => e instanceof HareBoxError && /does not move/.test(e.message),
    );
    // Errors throw from the loop: the first page's too.
    const denied = new HareBox({ url: url + "/forbidden", apiKey: KEY }).auditEntries();
    await assert.rejects(denied.next(), (e) => e instanceof HareBoxError && e.code === "forbidden");
  });

  test("a sandbox keeps its environment and third_party fields", () => {
    const hb = new HareBox({ url, apiKey: KEY });
    const data = { id: "sbx_x", account_id: "acc_1", project_id: "prj_1", project: "default", state: "running", image: "minimal", size: { vcpus: 1, memory_mb: 512, disk_gb: 1 }, no_env: false, environment: "prod@2", third_party: true, site: { name: "l", country: "" }, created_at: "2025-01-01T00:00:00Z" };
    const box = new Sandbox(hb, /** @type {any} */ (data));
    assert.deepEqual([box.environment, box.third_party], ["prod@2", true]);
    assert.deepEqual(box.toJSON(), data);
  });

  test("a sandbox keeps its mesh address and name", () => {
    const hb = new HareBox({ url, apiKey: KEY });
    const data = { id: "sbx_x", account_id: "acc_1", project_id: "prj_1", project: "shop", state: "running", image: "minimal", size: { vcpus: 1, memory_mb: 512, disk_gb: 1 }, no_env: false, site: { name: "l", country: "" }, mesh_address: "10.240.0.1", mesh_name: "web.shop.internal", created_at: "2025-01-01T00:00:00Z" };
    const box = new Sandbox(hb, /** @type {any} */ (data));
    assert.deepEqual([box.mesh_address, box.mesh_name], ["10.240.0.1", "web.shop.internal"]);
    assert.deepEqual(box.toJSON(), data);
  });

  test("a sandbox keeps its monitoring and snapshots fields", () => {
    const hb = new HareBox({ url, apiKey: KEY });
    const data = { id: "sbx_x", account_id: "acc_1", project_id: "prj_1", project: "default", state: "running", image: "minimal", size: { vcpus: 1, memory_mb: 512, disk_gb: 1 }, no_env: false, monitoring: false, snapshots: true, site: { name: "l", country: "" }, created_at: "2025-01-01T00:00:00Z" };
    const box = new Sandbox(hb, /** @type {any} */ (data));
    assert.deepEqual([box.monitoring, box.snapshots], [false, true]);
    assert.deepEqual(box.toJSON(), data);
  });

  test("an unreachable server is a network error", async () => {
    const hb = new HareBox({ url: "http://127.0.0.1:9", apiKey: KEY });
    await assert.rejects(hb.getInfo(), (e) => e instanceof HareBoxError && e.code === "network" && !e.message.includes(KEY));
  });
});

describe("event-stream reader", () => {
  /** A stream of the given chunks. */
  const stream = (...chunks) =>
    new ReadableStream({
      start(c) {
        for (const s of chunks) c.enqueue(new TextEncoder().encode(s));
        c.close();
      },
    });
  const all = async (s) => {
    const out = [];
    for await (const m of readSSE(s)) out.push(m);
    return out;
  };

  test("events, split anywhere, with any line ending", async () => {
    const text = 'event: stdout\ndata: {"data":"aGk="}\n\n: comment\r\nevent: exit\r\ndata: {"exit_code":0}\r\n\r\n';
    for (let i = 0; i <= text.length; i++) {
      assert.deepEqual(await all(stream(text.slice(0, i), text.slice(i))), [
        { event: "stdout", data: '{"data":"aGk="}' },
        { event: "exit", data: '{"exit_code":0}' },
      ]);
    }
  });

  test("multi-line data, CR endings, and an unterminated event dropped", async () => {
    assert.deepEqual(await all(stream("data: a\rdata:b\r\revent: x\ndata: lost")), [{ event: "message", data: "a\nb" }]);
  });
});
