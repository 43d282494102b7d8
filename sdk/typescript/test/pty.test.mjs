// Tests of openPty that need no HareBox server: a local node:http server
// answers the WebSocket upgrade itself (test/ws-server.mjs: the handshake,
// masked client frames, unmasked server frames) and plays the server's
// side of the terminal protocol. They check the upgrade request (path,
// query, API key), that typed bytes arrive as binary messages and controls
// as JSON text, the output, the exit message and the close; errors before
// the upgrade (JSON error answers), an error message, a close without the
// exit, close(), the caller's signal, timeouts and refused connections.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { createServer as createNetServer } from "node:net";
import { after, before, describe, test } from "node:test";

import { HareBox, HareBoxError, Pty, RateLimitedError, Sandbox } from "harebox";

import { accept, refuse } from "./ws-server.mjs";

const KEY = "hbk_test_secret_do_not_print_0123456789";
const EXIT = { exit_code: 4, stdout: "", stderr: "", duration_ms: 20, timed_out: false, stdout_truncated: false, stderr_truncated: false };
const dec = (b) => new TextDecoder().decode(b);

/** Reads a pty's output until it contains want (or the session ends); returns what was read. */
async function readUntil(pty, want) {
  let text = "";
  for await (const chunk of pty) {
    assert.ok(chunk instanceof Uint8Array);
    text += dec(chunk);
    if (text.includes(want)) return text;
  }
  return text;
}

/** Reads a pty's output to its end; returns it. */
async function readAll(pty) {
  let text = "";
  for await (const chunk of pty) text += dec(chunk);
  return text;
}

describe("openPty against a local WebSocket server", () => {
  /** @type {import("node:http").Server} */
  let server;
  let url = "";
  /** The upgrade requests the server got: { url, auth, headers }. */
  const upgrades = [];
  /** What each session's server side saw, by the session's cmd: its messages, then the client's close. */
  const sessions = new Map();
  /** Sessions waiting for the test to drive them, by cmd. */
  const conns = new Map();

  /** The server's side of each session, by its cmd query parameter. */
  const scripts = {
    // Shows the size, then echoes what is typed until eof, then exits 4.
    async echo(c, q) {
      c.sendBinary(`${q.get("rows")} ${q.get("cols")}\r\n`);
      const got = [];
      for (;;) {
        const m = await c.next();
        got.push(m);
        if (m.type === "binary") c.sendBinary(m.data.length > 100 ? `got ${m.data.length} bytes\r\n` : m.data);
        if (m.type === "text" && JSON.parse(m.data).type === "eof") break;
        if (m.type === "close" || m.type === "end") return got;
      }
      c.sendBinary(Buffer.from([0xe2, 0x86, 0x92, 0x00, 0xff])); // bytes pass as they are
      c.sendText({ type: "exit", result: EXIT });
      c.close(1000);
      got.push(await c.next());
      return got;
    },
    // Some output, then an error message and a normal close.
    async error(c) {
      c.sendBinary("partial\r\n");
      c.sendText({ type: "error", error: { code: "unavailable", message: "the sandbox's agent does not answer" } });
      c.close(1000);
      return [await c.next()];
    },
    // Closes as the server does for a message against the protocol.
    async violation(c) {
      c.sendBinary("before\r\n");
      c.close(1008, "unknown or bad control \"reboot\"");
      return [await c.next()];
    },
    // The connection is lost: no close frame.
    async lost(c) {
      c.sendBinary("before\r\n");
      setTimeout(() => c.socket.destroy(), 50);
      return [await c.next()];
    },
    // Waits for the client to close; records each message until then.
    async wait(c) {
      c.sendBinary("$ ");
      const got = [];
      for (;;) {
        const m = await c.next();
        got.push(m);
        if (m.type === "close" || m.type === "end") return got;
      }
    },
    // Many small messages, then the exit.
    async flood(c) {
      for (let i = 0; i < 3000; i++) c.sendBinary(`${i}\n`);
      c.sendText({ type: "exit", result: EXIT });
      c.close(1000);
      return [await c.next()];
    },
    // A text message that is not JSON.
    async garbage(c) {
      c.sendText("not json");
      const got = [];
      for (;;) {
        const m = await c.next();
        got.push(m);
        if (m.type === "close" || m.type === "end") return got;
      }
    },
  };

  before(async () => {
    server = createServer((req, res) => {
      res.writeHead(426, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { code: "invalid", message: "this is a WebSocket endpoint: ask for Upgrade: websocket" } }));
    });
    server.on("upgrade", (req, socket, head) => {
      const u = new URL(req.url, "http://x");
      upgrades.push({ url: req.url, auth: req.headers.authorization, headers: req.headers });
      if (u.pathname.startsWith("/hang/")) return; // never answers
      const m = /^\/v1\/sandboxes\/([^/]+)\/pty$/.exec(u.pathname);
      if (!m) return refuse(socket, 404, "Not Found", { error: { code: "not_found", message: "no such route" } });
      if (req.headers.authorization !== `Bearer ${KEY}`) {
        return refuse(socket, 401, "Unauthorized", { error: { code: "unauthorized", message: "a valid API key is required" } });
      }
      if (m[1] === "sbx_theirs") return refuse(socket, 403, "Forbidden", { error: { code: "forbidden", message: "this API key may not openPty" } });
      if (m[1] === "sbx_limited") return refuse(socket, 429, "Too Many Requests", { error: { code: "rate_limited", message: "slow down" } }, { "retry-after": "3" });
      if (m[1] === "sbx_proxy") return refuse(socket, 502, "Bad Gateway", "<html>bad gateway</html>");
      if (m[1] === "sbx_plain") {
        socket.end("HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 5\r\n\r\nhello");
        return;
      }
      if (m[1] === "sbx_slow") {
        // The answer's head, then its body a moment later.
        const body = JSON.stringify({ error: { code: "conflict", message: "the sandbox is paused", field: "" } });
        socket.write(`HTTP/1.1 409 Conflict\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n`);
        setTimeout(() => socket.end(body), 100);
        return;
      }
      if (m[1] !== "sbx_1") return refuse(socket, 404, "Not Found", { error: { code: "not_found", message: `no sandbox ${m[1]}` } });
      for (const dim of ["rows", "cols"]) {
        const v = u.searchParams.get(dim);
        if (v !== null && !(Number(v) >= 1 && Number(v) <= 1000)) {
          return refuse(socket, 400, "Bad Request", { error: { code: "invalid", message: `${dim}: must be 1 to 1000`, field: dim } });
        }
      }
      const cmd = u.searchParams.get("cmd") ?? "";
      const script = scripts[cmd];
      if (!script) return refuse(socket, 400, "Bad Request", { error: { code: "invalid", message: "no such script", field: "cmd" } });
      const c = accept(req, socket, head);
      conns.set(cmd, c);
      sessions.set(cmd, script(c, u.searchParams));
    });
    await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${server.address().port}`;
  });

  after(() => {
    server?.closeAllConnections();
    server?.close();
  });

  const client = (opts) => new HareBox({ url, apiKey: KEY, timeoutMs: 10_000, ...opts });

  test("a session: the upgrade's path, query and key; typed bytes as binary messages, controls as JSON text; output, the exit, a normal close", async () => {
    const hb = client();
    const pty = await hb.openPty("sbx_1", { query: { rows: 30, cols: 90, cmd: "echo", user: "root", cwd: "/tmp", timeout_seconds: 5 } });
    assert.ok(pty instanceof Pty);
    assert.equal(pty.open, true);

    const up = upgrades.at(-1);
    const u = new URL(up.url, "http://x");
    assert.equal(u.pathname, "/v1/sandboxes/sbx_1/pty");
    assert.deepEqual(Object.fromEntries(u.searchParams), { rows: "30", cols: "90", cmd: "echo", user: "root", cwd: "/tmp", timeout_seconds: "5" });
    assert.equal(up.auth, `Bearer ${KEY}`);
    assert.equal(up.headers.upgrade, "websocket");
    assert.equal(up.headers["sec-websocket-version"], "13");
    assert.match(up.headers["user-agent"], /^harebox-typescript\//);

    // Leaving a loop keeps the session; the next loop goes on.
    assert.match(await readUntil(pty, "30 90"), /^30 90\r\n$/);
    assert.equal(pty.write("hi\n"), true);
    assert.equal(await readUntil(pty, "hi\n"), "hi\n");
    assert.equal(pty.write(new Uint8Array([0, 255, 10])), true);
    const big = new Uint8Array(100_000).fill(0x61);
    assert.equal(pty.write(big), true);
    assert.equal(pty.resize(40, 120), true);
    assert.equal(pty.signal(2), true);
    assert.equal(pty.eof(), true);
    const rest = [];
    for await (const chunk of pty) rest.push(...chunk);
    const text = Buffer.from(rest);
    assert.ok(text.includes(Buffer.from([0, 255, 10])), "the bytes typed come back as they were");
    assert.ok(text.includes(Buffer.from("got 32768 bytes")), "a large write goes in messages of 32 KiB");
    assert.ok(text.subarray(-5).equals(Buffer.from([0xe2, 0x86, 0x92, 0x00, 0xff])), "output bytes pass as they are");
    assert.deepEqual(await pty.result, EXIT);
    assert.equal(pty.open, false);
    assert.equal(pty.write("late\n"), false, "nothing is sent after the exit");
    assert.equal(pty.resize(10, 10), false);

    const got = await sessions.get("echo");
    const messages = got.map((m) => (m.type === "text" ? JSON.parse(m.data) : m.type === "binary" ? m.data.length : m));
    assert.deepEqual(messages, [
      3, // "hi\n"
      3, // 0 255 10
      32768,
      32768,
      32768,
      100_000 - 3 * 32768,
      { type: "resize", rows: 40, cols: 120 },
      { type: "signal", signal: 2 },
      { type: "eof" },
      { type: "close", code: 1000, reason: "" },
    ]);
    assert.equal(got[0].data.toString(), "hi\n");
    assert.deepEqual([...got[1].data], [0, 255, 10]);
    const c = conns.get("echo");
    assert.ok(c.masked.length > 0 && c.masked.every(Boolean), "every client frame is masked");
    await c.ended;
  });

  test("Sandbox.pty opens the same session with its query", async () => {
    const hb = client();
    const box = new Sandbox(hb, { id: "sbx_1", account_id: "acc_1", project_id: "prj_1", project: "default", state: "running", image: "minimal", size: { vcpus: 1, memory_mb: 512, disk_gb: 1 }, no_env: false, site: { name: "l", country: "" }, created_at: "2025-01-01T00:00:00Z" });
    const pty = await box.pty({ rows: 12, cols: 34, cmd: "echo" });
    assert.deepEqual(Object.fromEntries(new URL(upgrades.at(-1).url, "http://x").searchParams), { rows: "12", cols: "34", cmd: "echo" });
    assert.equal(await readUntil(pty, "\r\n"), "12 34\r\n");
    pty.eof();
    await readAll(pty);
    assert.equal((await pty.result).exit_code, 4);
  });

  test("errors before the upgrade are HareBoxErrors with the answer's status, code and field", async () => {
    const hb = client();
    const rejects = (p, want) =>
      assert.rejects(p, (e) => {
        assert.ok(e instanceof HareBoxError, String(e));
        for (const [k, v] of Object.entries(want)) assert.equal(e[k], v, `${k}: ${e}`);
        assert.ok(!e.message.includes(KEY));
        return true;
      });
    await rejects(hb.openPty("sbx_missing"), { status: 404, code: "not_found", message: "no sandbox sbx_missing" });
    await rejects(hb.openPty("sbx_1", { query: { rows: 0, cmd: "echo" } }), { status: 400, code: "invalid", field: "rows" });
    await rejects(hb.openPty("sbx_1", { query: { cols: 1001, cmd: "echo" } }), { status: 400, code: "invalid", field: "cols" });
    await rejects(hb.openPty("sbx_theirs"), { status: 403, code: "forbidden" });
    await rejects(client({ apiKey: "hbk_wrong" }).openPty("sbx_1"), { status: 401, code: "unauthorized" });
    await rejects(hb.openPty("sbx_proxy"), { status: 502, code: "internal" });
    await rejects(hb.openPty("sbx_slow"), { status: 409, code: "conflict", message: "the sandbox is paused", field: undefined });
    await assert.rejects(hb.openPty("sbx_limited"), (e) => e instanceof RateLimitedError && e.status === 429 && e.retryAfter === 3);
    await rejects(hb.openPty("sbx_plain"), { status: 0, code: "network", message: `openPty: the server answered HTTP 200 instead of switching to a WebSocket (${url})` });
    await rejects(hb.openPty(""), { status: 0, code: "invalid", field: "id" });
    await rejects(hb.openPty("sbx_1", { query: { rows: { n: 1 } } }), { status: 0, code: "invalid", field: "rows" });
  });

  test("an error message rejects result with its code; a loop yields the output first, then throws it", async () => {
    const pty = await client().openPty("sbx_1", { query: { cmd: "error" } });
    let text = "";
    await assert.rejects(
      async () => {
        for await (const chunk of pty) text += dec(chunk);
      },
      (e) => e instanceof HareBoxError && e.code === "unavailable" && e.status === 503 && /agent does not answer/.test(e.message),
    );
    assert.equal(text, "partial\r\n");
    await assert.rejects(pty.result, (e) => e instanceof HareBoxError && e.code === "unavailable");
    assert.deepEqual(await sessions.get("error"), [{ type: "close", code: 1000, reason: "" }]);
  });

  test("a close without the exit rejects with code network and the close's status: 1008, or 1006 when the connection is lost", async () => {
    const hb = client();
    const v = await hb.openPty("sbx_1", { query: { cmd: "violation" } });
    await assert.rejects(readAll(v), (e) => e instanceof HareBoxError && e.code === "network" && /1008 \(policy violation\): unknown or bad control "reboot"/.test(e.message));
    await assert.rejects(v.result, (e) => e instanceof HareBoxError && e.code === "network" && e.status === 0);

    const lost = await hb.openPty("sbx_1", { query: { cmd: "lost" } });
    const text = [];
    await assert.rejects(
      async () => {
        for await (const chunk of lost) text.push(dec(chunk));
      },
      (e) => e instanceof HareBoxError && e.code === "network" && /1006/.test(e.message),
    );
    assert.deepEqual(text, ["before\r\n"]);
    assert.equal(lost.write("x"), false);
  });

  test("output read late comes whole and in order", async () => {
    const pty = await client().openPty("sbx_1", { query: { cmd: "flood" } });
    await pty.result; // everything has come before the exit
    let n = 0;
    let first = true;
    for await (const chunk of pty) {
      assert.equal(dec(chunk), `${n++}\n`);
      if (first) {
        first = false;
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
    }
    assert.equal(n, 3000);
  });

  test("a text message that is not JSON rejects with code network and closes the session", async () => {
    const pty = await client().openPty("sbx_1", { query: { cmd: "garbage" } });
    await assert.rejects(pty.result, (e) => e instanceof HareBoxError && e.code === "network" && /not JSON/.test(e.message));
    const got = await sessions.get("garbage");
    assert.equal(got.at(-1).type, "close");
  });

  test("close() ends the session with a normal close: result rejects with an AbortError, a loop ends", async () => {
    const pty = await client().openPty("sbx_1", { query: { cmd: "wait" } });
    assert.equal(await readUntil(pty, "$ "), "$ ");
    const loop = readAll(pty);
    pty.write("typed");
    pty.close();
    assert.equal(await loop, "");
    await assert.rejects(pty.result, (e) => e.name === "AbortError");
    assert.equal(pty.open, false);
    assert.equal(pty.write("x"), false);
    const got = await sessions.get("wait");
    assert.deepEqual(got.map((m) => m.type), ["binary", "close"]);
    assert.equal(got[1].code, 1000);
  });

  test("the caller's signal closes an open session; result rejects with its reason", async () => {
    const ac = new AbortController();
    const pty = await client().openPty("sbx_1", { query: { cmd: "wait" }, signal: ac.signal });
    await readUntil(pty, "$ ");
    ac.abort(new Error("enough"));
    await assert.rejects(pty.result, /enough/);
    assert.equal((await sessions.get("wait")).at(-1).type, "close");
  });

  test("arguments are checked before anything is sent", async () => {
    const pty = await client().openPty("sbx_1", { query: { cmd: "wait" } });
    const invalid = (field) => (e) => e instanceof HareBoxError && e.code === "invalid" && e.field === field;
    assert.throws(() => pty.resize(0, 80), invalid("rows"));
    assert.throws(() => pty.resize(24, 1001), invalid("cols"));
    assert.throws(() => pty.resize(24.5, 80), invalid("rows"));
    assert.throws(() => pty.signal(0), invalid("signal"));
    assert.throws(() => pty.signal(65), invalid("signal"));
    assert.throws(() => pty.write(/** @type {any} */ (42)), invalid("data"));
    pty.close();
    const got = await sessions.get("wait");
    assert.deepEqual(got.map((m) => m.type), ["close"], "nothing but the close was sent");
  });

  test("opening: a server that never answers times out; the caller's signal aborts; a refused connection is code network", async () => {
    const slow = new HareBox({ url: url + "/hang", apiKey: KEY, timeoutMs: 300 });
    await assert.rejects(slow.openPty("sbx_1"), (e) => e instanceof HareBoxError && e.code === "timeout" && /0\.3 s/.test(e.message));
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 100);
    await assert.rejects(slow.openPty("sbx_1", { signal: ac.signal, timeoutMs: 0 }), (e) => e.name === "AbortError");
    await assert.rejects(slow.openPty("sbx_1", { signal: AbortSignal.abort() }), (e) => e.name === "AbortError");

    const free = createNetServer();
    await new Promise((resolve) => free.listen(0, "127.0.0.1", resolve));
    const port = free.address().port;
    await new Promise((resolve) => free.close(resolve));
    const gone = new HareBox({ url: `http://127.0.0.1:${port}`, apiKey: KEY });
    await assert.rejects(gone.openPty("sbx_1"), (e) => e instanceof HareBoxError && e.code === "network" && e.status === 0 && /openPty: .*ECONNREFUSED/.test(e.message) && !e.message.includes(KEY));
  });
});
