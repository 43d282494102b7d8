// Tests of how the client trusts an https server (HAREBOX_CA or the ca
// option), offline: throwaway certificates made with /usr/bin/openssl in a
// temporary directory and a local node:https server on 127.0.0.1 that
// answers getHealth, the file calls, execStream, followed events and a
// terminal session's WebSocket upgrade (and never answers under /hang/).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { X509Certificate } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer as createHttpServer } from "node:http";
import { createServer } from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { HareBox, HareBoxError } from "harebox";

import { accept } from "./ws-server.mjs";

const OPENSSL = "/usr/bin/openssl";
const KEY = "hbk_test_secret_do_not_print_0123456789";

/** Makes a self-signed P-256 certificate for the names in san, in dir/NAME.pem and dir/NAME.key. */
function makeCert(dir, name, san) {
  const cert = join(dir, `${name}.pem`);
  const key = join(dir, `${name}.key`);
  execFileSync(OPENSSL, [
    "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
    "-keyout", key, "-out", cert, "-days", "1", "-subj", `/CN=${name}`, "-addext", `subjectAltName=${san}`,
  ], { stdio: ["ignore", "ignore", "pipe"] });
  const pem = readFileSync(cert, "utf8");
  return { cert, key, pem, keyPem: readFileSync(key, "utf8"), fp: new X509Certificate(pem).fingerprint256 };
}

/** Runs fn with the environment variables in vars set (undefined: unset), then puts them back. */
async function withEnv(vars, fn) {
  const saved = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
  const set = (k, v) => (v === undefined ? delete process.env[k] : (process.env[k] = v));
  for (const [k, v] of Object.entries(vars)) set(k, v);
  try {
    return await fn();
  } finally {
    for (const [k, v] of Object.entries(saved)) set(k, v);
  }
}

/** A rejection a certificate the client does not trust causes. */
const untrusted = (e) => {
  assert.ok(e instanceof HareBoxError, String(e));
  assert.equal(e.status, 0);
  assert.equal(e.code, "network");
  assert.match(e.message, /certificate was not trusted/);
  assert.ok(!e.message.includes(KEY));
  return true;
};

/** A construction refused for a bad HAREBOX_CA or ca. */
const badCA = (name, why) => (e) => {
  assert.ok(e instanceof HareBoxError, String(e));
  assert.deepEqual([e.status, e.code, e.field], [0, "invalid", "ca"]);
  assert.ok(e.message.includes(name), `${e.message} names ${name}`);
  if (why) assert.match(e.message, why);
  return true;
};

const haveOpenSSL = existsSync(OPENSSL);

describe("TLS trust (HAREBOX_CA, ca)", { skip: haveOpenSSL ? false : `${OPENSSL} is missing` }, () => {
  let dir;
  let server; // https, with the "server" certificate (localhost, 127.0.0.1)
  let plain; // http
  let url;
  let httpUrl;
  let srv; // the server's certificate
  let other; // another self-signed certificate, another CA
  let wrongName; // a certificate for another host name only
  /** Requests the https server got, by path. */
  let seen = [];
  /** WebSocket upgrades the https server got, by path. */
  const upgrades = [];
  /** A terminal session: "ok", then the exit and a normal close. */
  const upgrade = (req, socket, head) => {
    upgrades.push(req.url);
    const c = accept(req, socket, head);
    c.sendBinary("ok\r\n");
    c.sendText({ type: "exit", result: { exit_code: 0, stdout: "", stderr: "", duration_ms: 1 } });
    c.close(1000);
  };
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "harebox-tls-"));
    srv = makeCert(dir, "server", "DNS:localhost,IP:127.0.0.1");
    other = makeCert(dir, "other", "DNS:localhost,IP:127.0.0.1");
    wrongName = makeCert(dir, "elsewhere", "DNS:elsewhere.example");
    const handler = (req, res) => {
      if (req.url.startsWith("/hang/")) return; // never answers
      let body = 0;
      req.on("data", (d) => (body += d.length));
      req.on("end", () => {
        seen.push(req.url);
        const path = req.url.split("?")[0];
        if (path === "/health") {
          res.writeHead(200, { "content-type": "application/json" });
          res.end(JSON.stringify({ status: "ok" }));
        } else if (path === "/v1/sandboxes/sbx_1/exec/stream") {
          res.writeHead(200, { "content-type": "text/event-stream" });
          res.write(`event: stdout\ndata: ${JSON.stringify({ data: Buffer.from("hi\n").toString("base64") })}\n\n`);
          res.end(`event: exit\ndata: ${JSON.stringify({ exit_code: 0, stdout: "", stderr: "", duration_ms: 1 })}\n\n`);
        } else if (path === "/v1/sandboxes/sbx_1/files" && req.method === "PUT") {
          res.writeHead(200, { "content-type": "application/json" });
          res.end(JSON.stringify({ path: "/tmp/f", size: body, mode: "0644", is_dir: false, mod_time: "2025-01-01T00:00:00Z" }));
        } else if (path === "/v1/sandboxes/sbx_1/files") {
          res.writeHead(200, { "content-type": "application/octet-stream" });
          res.end("bytes");
        } else if (path === "/v1/events") {
          res.writeHead(200, { "content-type": "text/event-stream" });
          res.end(`event: event\ndata: ${JSON.stringify({ seq: 1, action: "vmExited" })}\n\n`);
        } else {
          res.writeHead(404, { "content-type": "application/json" });
          res.end(JSON.stringify({ error: { code: "not_found", message: "no such thing" } }));
        }
      });
    };
    server = createServer({ cert: srv.pem, key: srv.keyPem, minVersion: "TLSv1.3" }, handler);
    server.on("upgrade", upgrade);
    await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `https://127.0.0.1:${server.address().port}`;
    plain = createHttpServer(handler);
    await new Promise((resolve) => plain.listen(0, "127.0.0.1", resolve));
    httpUrl = `http://127.0.0.1:${plain.address().port}`;
  });
  after(() => {
    for (const s of [server, plain]) {
      s?.closeAllConnections();
      s?.close();
    }
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const client = (opts) => new HareBox({ url, apiKey: KEY, timeoutMs: 10_000, ...opts });

  test("a CA file that signed the server's certificate is trusted, by IP address and host name", async () => {
    await withEnv({ HAREBOX_CA: undefined }, async () => {
      assert.deepEqual(await client({ ca: srv.cert }).getHealth(), { status: "ok" });
      const byName = new HareBox({ url: url.replace("127.0.0.1", "localhost"), ca: srv.cert, timeoutMs: 10_000 });
      assert.deepEqual(await byName.getHealth(), { status: "ok" });
    });
  });

  test("a CA file with several certificates trusts each", async () => {
    const both = join(dir, "both.pem");
    writeFileSync(both, other.pem + "\n" + srv.pem);
    assert.deepEqual(await client({ ca: both }).getHealth(), { status: "ok" });
  });

  test("another CA is not trusted, and neither are Node's default CAs for a self-signed server", async () => {
    await withEnv({ HAREBOX_CA: undefined }, async () => {
      await assert.rejects(client({ ca: other.cert }).getHealth(), (e) => untrusted(e) && /ca option/.test(e.message) && e.message.includes(other.cert));
      await assert.rejects(client().getHealth(), (e) => untrusted(e) && /Node's default CA certificates/.test(e.message));
    });
  });

  test("with a CA file the host name is verified", async () => {
    const s = createServer({ cert: wrongName.pem, key: wrongName.keyPem }, (req, res) => res.end("{}"));
    await new Promise((resolve) => s.listen(0, "127.0.0.1", resolve));
    try {
      const hb = new HareBox({ url: `https://127.0.0.1:${s.address().port}`, ca: wrongName.cert, timeoutMs: 10_000 });
      await assert.rejects(hb.getHealth(), untrusted);
      // The pin of the same certificate trusts it: the name is not checked.
      const pinned = new HareBox({ url: `https://127.0.0.1:${s.address().port}`, ca: `sha256:${wrongName.fp}`, timeoutMs: 10_000 });
      assert.deepEqual(await pinned.getHealth(), {});
    } finally {
      s.closeAllConnections();
      s.close();
    }
  });

  test("the server certificate's pin is trusted: plain or with colons, any case", async () => {
    const hex = srv.fp.replaceAll(":", "");
    for (const ca of [`sha256:${hex.toLowerCase()}`, `sha256:${hex}`, `sha256:${srv.fp}`, `sha256:${srv.fp.toLowerCase()}`]) {
      assert.deepEqual(await client({ ca }).getHealth(), { status: "ok" }, ca);
    }
  });

  test("a wrong pin fails before any request is sent", async () => {
    const before = seen.length;
    for (const ca of [`sha256:${other.fp}`, `sha256:${"00".repeat(32)}`]) {
      await assert.rejects(client({ ca }).getHealth(), (e) => {
        untrusted(e);
        assert.ok(e.message.includes(`sha256:${srv.fp.replaceAll(":", "").toLowerCase()}`), "names the certificate it got");
        return true;
      });
    }
    assert.equal(seen.length, before, "the server saw no request");
  });

  test("every connection is checked against the pin, not just the first", async () => {
    const hb = client({ ca: `sha256:${srv.fp}` });
    assert.deepEqual(await hb.getHealth(), { status: "ok" });
    // The server now presents another certificate; the kept connection goes.
    server.setSecureContext({ cert: other.pem, key: other.keyPem, minVersion: "TLSv1.3" });
    server.closeAllConnections();
    try {
      await assert.rejects(hb.getHealth(), untrusted);
    } finally {
      server.setSecureContext({ cert: srv.pem, key: srv.keyPem, minVersion: "TLSv1.3" });
      server.closeAllConnections();
    }
    assert.deepEqual(await hb.getHealth(), { status: "ok" });
  });

  test("streaming calls, uploads and downloads go through the same trust", async () => {
    const good = client({ ca: `sha256:${srv.fp}` });
    const events = [];
    for await (const ev of good.execStream("sbx_1", { body: { cmd: "echo hi" } })) events.push(ev);
    assert.equal(new TextDecoder().decode(events[0].data), "hi\n");
    assert.equal(events[1].result.exit_code, 0);
    for await (const e of good.followEvents()) {
      assert.equal(e.seq, 1);
      break;
    }
    assert.equal((await good.writeFile("sbx_1", { query: { path: "/tmp/f" }, body: "12345" })).size, 5);
    assert.equal(new TextDecoder().decode(await good.readFile("sbx_1", { query: { path: "/tmp/f" } })), "bytes");

    const before = seen.length;
    for (const bad of [client({ ca: `sha256:${other.fp}` }), client({ ca: other.cert })]) {
      await assert.rejects(async () => {
        for await (const _ of bad.execStream("sbx_1", { body: { cmd: "echo hi" } })) assert.fail("an event from an untrusted server");
      }, untrusted);
      await assert.rejects(async () => {
        for await (const _ of bad.followEvents()) assert.fail("an event from an untrusted server");
      }, untrusted);
      await assert.rejects(bad.writeFile("sbx_1", { query: { path: "/tmp/f" }, body: "12345" }), untrusted);
      await assert.rejects(bad.readFile("sbx_1", { query: { path: "/tmp/f" } }), untrusted);
    }
    assert.equal(seen.length, before, "the server saw no request");
  });

  test("a terminal session (openPty, wss://) goes through the same trust: its pin or CA file, or HAREBOX_CA", async () => {
    const session = async (hb) => {
      const pty = await hb.openPty("sbx_1");
      let text = "";
      for await (const chunk of pty) text += new TextDecoder().decode(chunk);
      assert.equal(text, "ok\r\n");
      assert.equal((await pty.result).exit_code, 0);
    };
    await withEnv({ HAREBOX_CA: undefined }, async () => {
      await session(client({ ca: `sha256:${srv.fp}` }));
      await session(client({ ca: srv.cert }));
      const before = upgrades.length;
      for (const bad of [client({ ca: `sha256:${other.fp}` }), client({ ca: other.cert }), client()]) {
        await assert.rejects(bad.openPty("sbx_1"), (e) => untrusted(e) && /^openPty: /.test(e.message));
      }
      assert.equal(upgrades.length, before, "the server saw no upgrade");
    });
    await withEnv({ HAREBOX_CA: `sha256:${srv.fp}` }, () => session(client()));
    await withEnv({ HAREBOX_CA: `sha256:${other.fp}` }, () => assert.rejects(client().openPty("sbx_1"), (e) => untrusted(e) && /HAREBOX_CA/.test(e.message)));
    assert.equal(new URL(upgrades.at(-1), "https://x").pathname, "/v1/sandboxes/sbx_1/pty");
  });

  test("timeouts and the caller's signal work as with the global fetch", async () => {
    const hb = new HareBox({ url: url + "/hang", ca: `sha256:${srv.fp}`, timeoutMs: 300 });
    await assert.rejects(hb.getHealth(), (e) => e instanceof HareBoxError && e.code === "timeout");
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 100);
    await assert.rejects(hb.getHealth({ signal: ac.signal, timeoutMs: 0 }), (e) => e.name === "AbortError");
  });

  test("HAREBOX_CA is read, and the ca option wins over it", async () => {
    await withEnv({ HAREBOX_CA: srv.cert }, async () => {
      assert.deepEqual(await client().getHealth(), { status: "ok" });
      await assert.rejects(client({ ca: `sha256:${other.fp}` }).getHealth(), (e) => untrusted(e) && /ca option/.test(e.message));
    });
    await withEnv({ HAREBOX_CA: `sha256:${other.fp}` }, async () => {
      await assert.rejects(client().getHealth(), (e) => untrusted(e) && /HAREBOX_CA/.test(e.message));
      assert.deepEqual(await client({ ca: `sha256:${srv.fp}` }).getHealth(), { status: "ok" });
    });
    // A malformed HAREBOX_CA is not read when the option is given.
    await withEnv({ HAREBOX_CA: "sha256:nope" }, async () => {
      assert.deepEqual(await client({ ca: srv.cert }).getHealth(), { status: "ok" });
      assert.throws(() => client(), badCA("HAREBOX_CA"));
    });
  });

  test("bad values throw when the client is constructed, naming HAREBOX_CA or ca", async () => {
    const noCert = join(dir, "empty.pem");
    writeFileSync(noCert, "not a certificate\n");
    const broken = join(dir, "broken.pem");
    writeFileSync(broken, "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n");
    const cases = [
      [join(dir, "missing.pem"), /no such file/],
      [dir, /directory/],
      [noCert, /no PEM certificate/],
      [srv.key, /no PEM certificate/], // a key is not a certificate
      [broken, /not a valid PEM certificate/],
      ["sha256:", /fingerprint/],
      ["sha256:abc", /fingerprint/],
      [`sha256:${"0".repeat(63)}`, /fingerprint/],
      [`sha256:${"0".repeat(65)}`, /fingerprint/],
      [`sha256:${"g".repeat(64)}`, /fingerprint/],
    ];
    await withEnv({ HAREBOX_CA: undefined }, () => {
      for (const [ca, why] of cases) {
        assert.throws(() => client({ ca }), badCA("ca option", why), ca);
      }
      assert.throws(() => client({ ca: 42 }), badCA("ca"));
    });
    for (const [ca, why] of cases) {
      await withEnv({ HAREBOX_CA: ca }, () => assert.throws(() => client(), badCA("HAREBOX_CA", why), ca));
    }
    // The key's contents are never in the message.
    await withEnv({ HAREBOX_CA: srv.key }, () =>
      assert.throws(() => client(), (e) => !e.message.includes(srv.keyPem.split("\n")[1])),
    );
  });

  test("fetch and ca together are refused; a fetch of the caller's is used as it is, without HAREBOX_CA", async () => {
    assert.throws(() => client({ ca: srv.cert, fetch: globalThis.fetch }), (e) => e instanceof HareBoxError && e.code === "invalid" && e.field === "ca" && /fetch/.test(e.message));
    await withEnv({ HAREBOX_CA: "sha256:nope" }, async () => {
      let called = 0;
      const hb = client({ fetch: (input, init) => (called++, globalThis.fetch(input, init)) });
      await assert.rejects(hb.getHealth(), (e) => untrusted(e) && !/Node's default CA certificates/.test(e.message));
      assert.equal(called, 1);
    });
  });

  test("an http URL ignores HAREBOX_CA and ca", async () => {
    const hb = new HareBox({ url: httpUrl, ca: join(dir, "missing.pem") });
    assert.deepEqual(await hb.getHealth(), { status: "ok" });
    await withEnv({ HAREBOX_CA: "sha256:nope" }, async () => {
      assert.deepEqual(await new HareBox({ url: httpUrl }).getHealth(), { status: "ok" });
      assert.deepEqual(await new HareBox({ url: httpUrl, ca: `sha256:${other.fp}` }).getHealth(), { status: "ok" });
    });
  });
});
