// Tests of the client that need no HareBox server: configuration, URL
// checks, the API key kept out of sight, timeouts and aborts (against a
// local HTTP server that never answers), error mapping of non-JSON
// answers, and the event-stream reader.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { inspect } from "node:util";
import { after, before, describe, test } from "node:test";

import { HareBox, HareBoxError, OPERATIONS, Sandbox } from "harebox";
import { readSSE } from "../dist/sse.js";

const KEY = "hbk_test_secret_do_not_print_0123456789";

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

  test("path parameters must be non-empty strings", async () => {
    const hb = new HareBox({ url: "http://127.0.0.1:9", apiKey: KEY });
    await assert.rejects(hb.getSandbox(""), (e) => e instanceof HareBoxError && e.field === "id");
    await assert.rejects(hb.getProcess("sbx_x", ""), (e) => e instanceof HareBoxError && e.field === "pid");
  });
});

describe("against a local HTTP server", () => {
  /** @type {import("node:http").Server} */
  let server;
  let url = "";
  const seen = [];
  before(async () => {
    server = createServer((req, res) => {
      seen.push({ url: req.url, auth: req.headers.authorization });
      if (req.url?.startsWith("/hang")) return; // never answers
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
