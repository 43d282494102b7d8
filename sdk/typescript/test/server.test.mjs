// Tests against a real hareboxd with real VMs. Start one with
//   eval "$(scripts/devserver.sh)"
// from the repository root; these tests read HAREBOX_URL and
// HAREBOX_API_KEY, and HAREBOX_TEST_IMAGE (default "minimal") for the
// shared sandbox. Without HAREBOX_URL they are skipped.
//
// To keep boots few, one sandbox serves every test but the walkthrough
// (which boots the server's default image, as the README's snippet does),
// the environment tests (one sandbox of their own, with their environment)
// the stop and start tests (one sandbox of their own, stopped and
// booted again), the command history tests (one sandbox of their own,
// while they change the default account's retention), the events tests
// (one sandbox of their own, created and deleted to reach a budget) and
// the monitoring tests (one sandbox of their own, monitored, to be
// sampled; made early, while the first suites run).
// The tenancy, key, audit log and budget tests boot nothing: they are
// quick.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";
import { after, before, describe, test } from "node:test";

import { HareBox, HareBoxError, OPERATIONS, RateLimitedError, Sandbox } from "harebox";

const URL_ = process.env.HAREBOX_URL;
const IMAGE = process.env.HAREBOX_TEST_IMAGE || "minimal";
const skip = URL_ ? false : 'HAREBOX_URL is not set: these tests need a running hareboxd (eval "$(scripts/devserver.sh)" from the repository root)';
// HAREBOX_TEST_WALKTHROUGH: a copy of it in a project that installed the
// packed package (the e2e suite makes one), to run it as users would.
const WALKTHROUGH = process.env.HAREBOX_TEST_WALKTHROUGH || fileURLToPath(new URL("../../../examples/untrusted/walkthrough.mjs", import.meta.url));

const dec = (b) => new TextDecoder().decode(b);
const b64 = (s) => Buffer.from(s).toString("base64");
/** Asserts that a promise rejects with a HareBoxError with these fields. */
const rejectsWith = (p, want) =>
  assert.rejects(p, (e) => {
    assert.ok(e instanceof HareBoxError, `want a HareBoxError, got ${e}`);
    for (const [k, v] of Object.entries(want)) {
      if (v instanceof RegExp) assert.match(String(e[k]), v, k);
      else assert.equal(e[k], v, `${k} (${e})`);
    }
    return true;
  });

// The monitoring tests' sandbox. Its create is started early (by the
// hareboxd suite's before, once that suite's own sandbox is up) and awaited
// by the monitoring suite, the last: by then the server's sampler (every
// 15 s) has sampled it, where a sandbox made there waited up to 15 s for
// its first sample. The monitoring suite's after deletes it (by its run
// label).
const monitoringRun = randomBytes(4).toString("hex");
const monitoringLabels = { "harebox.test/suite": "sdk-typescript-metrics", "harebox.test/run": monitoringRun };
/** @type {Promise<Sandbox> | undefined} */
let monitoredCreate;
const monitoredBox = () => {
  if (!monitoredCreate) {
    monitoredCreate = new HareBox().create({ image: IMAGE, labels: monitoringLabels, ttl_seconds: 1800, monitoring: true });
    monitoredCreate.catch(() => {}); // awaited (and its error thrown) by the monitoring suite
  }
  return monitoredCreate;
};

describe("the API document", { skip }, () => {
  // Boots nothing: it runs without a VM (and before the suite that boots one).
  /** @type {HareBox} */
  let hb;

  before(() => {
    hb = new HareBox();
  });

  test("every operationId in /openapi.json is a HareBox method, and vice versa", async () => {
    const doc = await hb.getOpenAPI();
    const documented = new Map();
    for (const [path, item] of Object.entries(doc.paths)) {
      for (const [method, op] of Object.entries(item)) {
        if (op && typeof op === "object" && "operationId" in op) documented.set(op.operationId, { method: method.toUpperCase(), path });
      }
    }
    assert.ok(documented.size > 20, `only ${documented.size} operations documented`);
    const methods = Object.getOwnPropertyNames(HareBox.prototype).filter(
      // The conveniences: create is createSandbox, auditEntries pages
      // listAudit, followEvents is listEvents with follow=true,
      // runCodeStream is runCode answered with events.
      (m) => typeof HareBox.prototype[m] === "function" && !["constructor", "create", "auditEntries", "followEvents", "runCodeStream", "toJSON"].includes(m),
    );
    assert.deepEqual([...methods].sort(), [...documented.keys()].sort(), "HareBox methods vs operationIds");
    assert.deepEqual(Object.keys(OPERATIONS).sort(), [...documented.keys()].sort(), "route table vs operationIds");
    for (const [id, want] of documented) {
      assert.deepEqual({ method: OPERATIONS[id].method, path: OPERATIONS[id].path }, want, id);
    }
  });
});

describe("hareboxd", { skip }, () => {
  /** @type {HareBox} */
  let hb;
  /** @type {Sandbox | undefined} */
  let box;
  const run = randomBytes(4).toString("hex");
  const labels = { "harebox.test/suite": "sdk-typescript", "harebox.test/run": run };

  before(async () => {
    hb = new HareBox();
    box = await hb.create({ name: `ts-sdk-${run}`, image: IMAGE, labels, ttl_seconds: 1800 });
    monitoredBox(); // not awaited: it is made while these tests run
  });

  after(async () => {
    // Every sandbox this run made, even if a test failed half way.
    const { sandboxes } = await hb.listSandboxes({ query: { label: { "harebox.test/run": run } } });
    for (const s of sandboxes) if (s.state !== "deleted") await hb.deleteSandbox(s.id).catch((e) => console.error(`deleting ${s.id}: ${e}`));
  });

  test("health and info", async () => {
    assert.deepEqual(await hb.getHealth(), { status: "ok" });
    const ready = await hb.getReady();
    assert.equal(ready.status, "ready");
    assert.ok("database" in ready.checks && "hypervisor" in ready.checks, JSON.stringify(ready));
    assert.deepEqual([...new Set(Object.values(ready.checks))], ["ok"]);
    const info = await hb.getInfo();
    assert.equal(typeof info.version, "string");
    assert.equal(typeof info.backend.name, "string");
    assert.equal(typeof info.site.name, "string");
  });

  test("lifecycle: create, get, list by label, pause, resume", async () => {
    assert.ok(box instanceof Sandbox);
    assert.match(box.id, /^sbx_[0-9a-z]{26}$/);
    assert.equal(box.state, "running");
    assert.equal(box.image, IMAGE);
    assert.equal(box.name, `ts-sdk-${run}`);
    assert.deepEqual(box.labels, labels);
    assert.ok(box.expires_at, "ttl_seconds gives expires_at");

    const got = await hb.getSandbox(box.id);
    assert.ok(got instanceof Sandbox);
    // agent is the agent's last health check, which the server may have
    // made since the create answered.
    const settled = ({ agent, ...rest }) => rest;
    assert.ok([undefined, "ok"].includes(got.agent), `agent: ${got.agent}`);
    assert.deepEqual(settled(got.toJSON()), settled(box.toJSON()));

    const byLabel = await hb.listSandboxes({ query: { label: `harebox.test/run=${run}` } });
    assert.deepEqual(byLabel.sandboxes.map((s) => s.id), [box.id]);
    const byRecord = await hb.listSandboxes({ query: { label: labels, state: "running" } });
    assert.deepEqual(byRecord.sandboxes.map((s) => s.id), [box.id]);
    const none = await hb.listSandboxes({ query: { label: [`harebox.test/run=${run}`, "harebox.test/other=x"] } });
    assert.deepEqual(none.sandboxes, []);
    const paused = await hb.listSandboxes({ query: { label: labels, state: "paused" } });
    assert.deepEqual(paused.sandboxes, []);

    const p = await hb.pauseSandbox(box.id);
    assert.equal(p.state, "paused");
    await box.refresh();
    assert.equal(box.state, "paused");
    await rejectsWith(box.run("true"), { status: 409, code: "conflict" });
    assert.equal((await box.resume()).state, "running");
    assert.equal(box.state, "running");
    const r = await box.run("echo back");
    assert.equal(r.stdout, "back\n");
    // The Sandbox methods too.
    assert.equal((await box.pause()).state, "paused");
    assert.equal((await hb.resumeSandbox(box.id)).state, "running");
  });

  test("exec: stdout, stderr, exit code, argv, user, cwd, env", async () => {
    const r = await hb.exec(box.id, { body: { cmd: "echo out; echo err >&2; exit 3" } });
    assert.equal(r.exit_code, 3);
    assert.equal(r.stdout, "out\n");
    assert.equal(r.stderr, "err\n");
    assert.equal(r.timed_out, false);
    assert.equal(typeof r.duration_ms, "number");

    const a = await box.run(["/bin/sh", "-c", 'printf "%s|%s|%s" "$(id -u)" "$PWD" "$GREETING"'], {
      user: "root",
      cwd: "/tmp",
      env: { GREETING: "héllo" },
    });
    assert.equal(a.exit_code, 0, a.stderr);
    assert.equal(a.stdout, "0|/tmp|héllo");
    assert.equal((await box.run("id -u")).stdout.trim(), "1000");

    const missing = await box.run(["/no/such/program"]);
    assert.notEqual(missing.exit_code, 0);
  });

  test("exec: a timeout kills the command and says timed_out", async () => {
    const t0 = Date.now();
    const r = await box.run("echo started; sleep 60; echo never", { timeout_seconds: 1 });
    assert.equal(r.timed_out, true);
    assert.equal(r.stdout, "started\n");
    assert.ok(Date.now() - t0 < 30_000, "returned soon after the timeout");
  });

  test("exec: stdin as base64 (a string) or bytes", async () => {
    const r = await hb.exec(box.id, { body: { cmd: "cat", stdin: b64("hello stdin\n") } });
    assert.equal(r.stdout, "hello stdin\n");
    const bytes = new Uint8Array([0x61, 0x00, 0x62, 0x0a]);
    const w = await box.run("od -An -tx1 | tr -d ' \\n'", { stdin: bytes });
    assert.equal(w.stdout, "6100620a");
    await rejectsWith(hb.exec(box.id, { body: { cmd: "cat", stdin: "not base64!" } }), { status: 400, code: "invalid" });
  });

  test("execStream: events in order, exit last", async () => {
    const events = [];
    for await (const ev of hb.execStream(box.id, {
      body: { cmd: "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three; exit 7" },
    })) {
      events.push(ev.type === "exit" ? ev : { type: ev.type, text: dec(ev.data) });
    }
    const last = events.at(-1);
    assert.equal(last?.type, "exit");
    assert.equal(last.result.exit_code, 7);
    assert.equal(last.result.stdout, "");
    const out = events.slice(0, -1);
    assert.deepEqual(out, [
      { type: "stdout", text: "one\n" },
      { type: "stderr", text: "two\n" },
      { type: "stdout", text: "three\n" },
    ]);
    for (const ev of events.slice(0, -1)) assert.ok(ev.type !== "exit");

    // Bytes survive; stdin works; the Sandbox form too.
    const chunks = [];
    let exit;
    for await (const ev of box.stream("cat", { stdin: new Uint8Array([0, 255, 10]) })) {
      if (ev.type === "stdout") chunks.push(...ev.data);
      if (ev.type === "exit") exit = ev.result;
    }
    assert.deepEqual(chunks, [0, 255, 10]);
    assert.equal(exit?.exit_code, 0);
  });

  test("execStream: errors before the stream throw; breaking out cancels", async () => {
    const iter = hb.execStream("sbx_00000000000000000000000000", { body: { cmd: "true" } });
    await rejectsWith(iter.next(), { status: 404, code: "not_found" });
    await rejectsWith(hb.execStream(box.id, { body: { cmd: "true", argv: ["true"] } }).next(), { status: 400, field: "cmd" });

    const t0 = Date.now();
    for await (const ev of box.stream("echo first; sleep 60")) {
      assert.equal(ev.type, "stdout");
      break;
    }
    assert.ok(Date.now() - t0 < 30_000);
  });

  test("background processes: start, list, wait, kill", async () => {
    const p = await hb.startProcess(box.id, { body: { cmd: "sleep 0.5; echo done" } });
    assert.equal(p.sandbox_id, box.id);
    assert.equal(typeof p.id, "string");
    const { processes } = await hb.listProcesses(box.id);
    assert.ok(processes.some((q) => q.id === p.id));
    const done = await hb.getProcess(box.id, p.id, { query: { wait: true, timeout_seconds: 60 } });
    assert.equal(done.running, false);
    assert.equal(done.result?.exit_code, 0);
    assert.equal(done.result?.stdout, "done\n");

    const long = await box.start(["sleep", "300"]);
    assert.equal(long.running, true);
    const still = await hb.getProcess(box.id, long.id, { query: { wait: true, timeout_seconds: 0.5 } });
    assert.equal(still.running, true);
    // Its stdin was not kept open (E2B's process service keeps it): input is refused.
    await rejectsWith(hb.sendProcessInput(box.id, long.id, { body: { stdin: "x" } }), { status: 409 });
    await rejectsWith(hb.sendProcessInput(box.id, long.id, { body: {} }), { status: 400 });
    // Kept open: input, then its end.
    const reader = await hb.startProcess(box.id, { body: { argv: ["cat"], keep_stdin: true, tag: "reader" } });
    assert.equal(reader.tag, "reader");
    await hb.sendProcessInput(box.id, reader.id, { body: { stdin: "ping\n" } });
    await hb.sendProcessInput(box.id, reader.id, { body: { eof: true } });
    const read = await hb.getProcess(box.id, reader.id, { query: { wait: true, timeout_seconds: 30 } });
    assert.equal(read.result?.stdout, "ping\n");
    await hb.killProcess(box.id, long.id, { body: { signal: 15 } });
    const killed = await hb.getProcess(box.id, long.id, { query: { wait: true, timeout_seconds: 30 } });
    assert.equal(killed.running, false);
    assert.equal(killed.result?.signal, 15);

    const other = await box.start("sleep 300");
    await hb.killProcess(box.id, other.id); // no body: SIGKILL
    const k9 = await hb.getProcess(box.id, other.id, { query: { wait: true, timeout_seconds: 30 } });
    assert.equal(k9.result?.signal, 9);

    await rejectsWith(hb.getProcess(box.id, "no-such-process"), { status: 404, code: "not_found" });
    await rejectsWith(hb.killProcess(box.id, long.id, { body: { signal: 99 } }), { status: 400 });
  });

  test("background processes: output without follow (what there is, no exit), then followed from the offsets seen, then all of it after the exit", async () => {
    /**
     * Reads getProcessOutput's events from offsets: each stream's text,
     * whether it ended with exit, and the offsets reached. A chunk starts
     * where the one before it ended (nothing here is dropped).
     */
    const read = async (iter, from = { stdout: 0, stderr: 0 }) => {
      const got = { stdout: "", stderr: "", exit: undefined, at: { ...from } };
      for await (const ev of iter) {
        assert.equal(got.exit, undefined, "an event after exit");
        if (ev.event === "exit") got.exit = ev.result;
        else {
          assert.equal(ev.offset, got.at[ev.event], `${ev.event} offset`);
          got[ev.event] += dec(ev.data);
          got.at[ev.event] += ev.data.length;
        }
      }
      return got;
    };
    // It waits for a file between its first lines and the rest (a fixed
    // sleep there made the test wait 4 s, and fail had the reads taken longer).
    const go = `/tmp/harebox-output-${randomBytes(4).toString("hex")}`;
    const p = await box.start(`echo one; echo e1 >&2; while [ ! -e ${go} ]; do sleep 0.1; done; echo two; echo e2 >&2; sleep 1; echo three; exit 5`);

    // Without follow: what is kept now, no exit (it waits). Read again
    // until the first lines are there.
    let first;
    for (let i = 0; i < 30; i++) {
      first = await read(hb.getProcessOutput(box.id, p.id));
      if (first.stdout && first.stderr) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    assert.deepEqual([first?.stdout, first?.stderr, first?.exit], ["one\n", "e1\n", undefined]);
    assert.deepEqual(first?.at, { stdout: 4, stderr: 3 });

    // Followed from there: the rest (the file comes a second after the
    // follow began), then the exit.
    await hb.startProcess(box.id, { body: { cmd: `sleep 1; touch ${go}` } });
    const rest = await read(hb.getProcessOutput(box.id, p.id, { query: { follow: true, stdout_offset: 4, stderr_offset: 3 } }), { stdout: 4, stderr: 3 });
    assert.deepEqual([rest.stdout, rest.stderr], ["two\nthree\n", "e2\n"]);
    assert.equal(rest.exit?.exit_code, 5);
    assert.deepEqual([rest.exit?.stdout, rest.exit?.stderr, rest.exit?.timed_out], ["", "", false]);
    assert.equal(typeof rest.exit?.duration_ms, "number");

    // After the exit, from 0 (the Sandbox form, without follow): everything, and the exit.
    const all = await read(box.processOutput(p.id, { stdout_offset: 0, stderr_offset: 0 }));
    assert.deepEqual([all.stdout, all.stderr, all.exit?.exit_code], ["one\ntwo\nthree\n", "e1\ne2\n", 5]);
    assert.deepEqual(all.at, { stdout: 14, stderr: 6 });

    // Errors before the stream are plain answers.
    await rejectsWith(hb.getProcessOutput(box.id, "no-such-process").next(), { status: 404, code: "not_found" });
    await rejectsWith(hb.getProcessOutput(box.id, p.id, { query: { stdout_offset: -1 } }).next(), { status: 400, code: "invalid", field: "stdout_offset" });
    await box.run(["rm", "-f", go]);
  });

  test("files: binary round trip, stat, list, mkdir, remove", async () => {
    const dir = `/tmp/ts-sdk-${run}`;
    const made = await hb.mkdir(box.id, { query: { path: `${dir}/sub/deeper`, mode: "0750" } });
    assert.equal(made.type, "dir");
    assert.equal(made.mode & 0o777, 0o750);

    const every = new Uint8Array(256).map((_, i) => i);
    const big = new Uint8Array(randomBytes(300_000));
    const fi = await hb.writeFile(box.id, { query: { path: `${dir}/every.bin` }, body: every });
    assert.equal(fi.size, 256);
    assert.equal(fi.type, "file");
    assert.deepEqual(await hb.readFile(box.id, { query: { path: `${dir}/every.bin` } }), every);
    await box.writeFile(`${dir}/big.bin`, Buffer.from(big), { mode: "0600" });
    const back = await box.readFile(`${dir}/big.bin`);
    assert.ok(back instanceof Uint8Array);
    assert.equal(back.length, big.length);
    assert.ok(Buffer.from(back).equals(Buffer.from(big)), "300 kB of random bytes come back the same");

    await box.writeFile(`${dir}/text.txt`, "héllo\n");
    assert.equal(await box.readText(`${dir}/text.txt`), "héllo\n");
    assert.equal((await box.run(`cat ${dir}/text.txt`)).stdout, "héllo\n");
    await hb.writeFile(box.id, { query: { path: `${dir}/new/parents/f`, make_parents: true }, body: "x" });

    const st = await hb.statFile(box.id, { query: { path: `${dir}/big.bin` } });
    assert.equal(st.size, big.length);
    assert.equal(st.mode & 0o777, 0o600);
    assert.equal(st.name, "big.bin");
    assert.equal(st.path, `${dir}/big.bin`);
    assert.equal(typeof st.mtime, "string");

    const { entries, truncated } = await hb.listFiles(box.id, { query: { path: dir } });
    assert.equal(truncated, false);
    assert.deepEqual(entries.map((e) => `${e.name}:${e.type}`).sort(), ["big.bin:file", "every.bin:file", "new:dir", "sub:dir", "text.txt:file"]);

    await hb.removeFile(box.id, { query: { path: `${dir}/every.bin` } });
    await rejectsWith(hb.statFile(box.id, { query: { path: `${dir}/every.bin` } }), { status: 404, code: "not_found" });
    await rejectsWith(hb.readFile(box.id, { query: { path: `${dir}/every.bin` } }), { status: 404 });
    await rejectsWith(hb.removeFile(box.id, { query: { path: `${dir}/sub` } }), { status: /^4/ });
    await box.removeFile(dir, { recursive: true });
    await rejectsWith(box.stat(dir), { status: 404 });
    await rejectsWith(hb.statFile(box.id, { query: { path: "relative/path" } }), { status: 400, field: "path" });
  });

  test("firewall: get, set, and a bad policy changes nothing", async () => {
    const before_ = await hb.getFirewall(box.id);
    assert.ok(before_.default_outbound === "allow" || before_.default_outbound === "deny");
    const policy = {
      default_outbound: "deny",
      outbound: [{ action: "allow", protocol: "tcp", ports: "443", hosts: ["pypi.org", "files.pythonhosted.org"] }],
    };
    const set = await hb.setFirewall(box.id, { body: policy });
    assert.equal(set.default_outbound, "deny");
    assert.equal(set.outbound?.length, 1);
    assert.deepEqual(set.outbound?.[0]?.hosts, policy.outbound[0].hosts);
    assert.equal(set.outbound?.[0]?.ports, "443");
    assert.deepEqual(await box.getFirewall(), set);

    await rejectsWith(
      hb.setFirewall(box.id, { body: { default_outbound: "deny", outbound: [{ action: "allow", protocol: "tcp", ports: "99999" }] } }),
      { status: 400, code: "invalid", field: "outbound[0].ports" },
    );
    assert.deepEqual(await hb.getFirewall(box.id), set, "the bad policy changed nothing");
  });

  test("errors: missing sandbox 404, bad size 400 with field, wrong key 401", async () => {
    await rejectsWith(hb.getSandbox("sbx_00000000000000000000000000"), { status: 404, code: "not_found" });
    await rejectsWith(hb.deleteSandbox("sbx_00000000000000000000000000"), { status: 404, code: "not_found" });
    await rejectsWith(hb.create({ size: { preset: /** @type {any} */ ("huge") }, labels }), {
      status: 400,
      code: "invalid",
      field: "size.preset",
    });
    await rejectsWith(hb.create({ size: { vcpus: 99 }, labels }), { status: 400, field: "size.vcpus" });
    await rejectsWith(hb.createSandbox({ body: /** @type {any} */ ({ bogus: 1, labels }) }), { status: 400, field: "bogus" });
    await rejectsWith(box.run(""), { status: 400, field: "cmd" });

    const wrong = new HareBox({ url: URL_, apiKey: "hbk_wrong" });
    await rejectsWith(wrong.getInfo(), { status: 401, code: "unauthorized" });
    await rejectsWith(wrong.getSandbox(box.id), { status: 401, code: "unauthorized" });
    const none = new HareBox({ url: URL_, apiKey: "" });
    await rejectsWith(none.listSandboxes(), { status: 401, code: "unauthorized" });
    assert.deepEqual(await none.getHealth(), { status: "ok" }, "health needs no key");
    // Nothing was made by the failed creates.
    const { sandboxes } = await hb.listSandboxes({ query: { label: labels } });
    assert.deepEqual(sandboxes.map((s) => s.id), [box.id]);
  });

  test("openPty: a terminal of the size asked for, typed input, the exit code; a resize; a signal; errors before the upgrade", async () => {
    /** Collects a pty's output as it comes, in the background. */
    const screen = (pty) => {
      const t = { text: "", ended: undefined };
      t.ended = (async () => {
        for await (const chunk of pty) t.text += dec(chunk);
      })();
      t.ended.catch(() => {});
      return t;
    };
    /** Waits until the screen shows want. */
    const waitFor = async (t, want, ms = 30_000) => {
      for (const end = Date.now() + ms; !t.text.includes(want); await new Promise((resolve) => setTimeout(resolve, 50))) {
        if (Date.now() > end) assert.fail(`${JSON.stringify(want)} not shown after ${ms / 1000} s: ${JSON.stringify(t.text)}`);
      }
    };

    const pty = await hb.openPty(box.id, { query: { cmd: "stty size; read x; echo got-$x; exit 4", rows: 30, cols: 90, timeout_seconds: 120 } });
    try {
      const t = screen(pty);
      await waitFor(t, "30 90");
      assert.equal(pty.write("hi\n"), true);
      await waitFor(t, "got-hi");
      const r = await pty.result;
      assert.equal(r.exit_code, 4);
      await t.ended;
    } finally {
      pty.close();
    }

    // A resize reaches the terminal: each line typed runs stty size.
    const sh = await box.pty({ cmd: "while read l; do stty size; done", rows: 24, cols: 80, timeout_seconds: 120 });
    try {
      const t = screen(sh);
      sh.write("\n");
      await waitFor(t, "24 80");
      assert.equal(sh.resize(40, 120), true);
      // (The size and the typed line travel apart: type until the new size shows.)
      for (let i = 0; !t.text.includes("40 120"); i++) {
        if (i === 20) assert.fail(`the new size did not show: ${JSON.stringify(t.text)}`);
        sh.write("\n");
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
      assert.equal(sh.eof(), true);
      assert.equal((await sh.result).exit_code, 0);
    } finally {
      sh.close();
    }

    // A signal reaches the session's process group.
    const sleeper = await box.pty({ cmd: "echo sleeping; sleep 100", timeout_seconds: 120 });
    try {
      const t = screen(sleeper);
      await waitFor(t, "sleeping");
      const t0 = Date.now();
      assert.equal(sleeper.signal(9), true);
      const r = await sleeper.result;
      assert.ok(r.signal === 9 || r.exit_code !== 0, JSON.stringify(r));
      assert.ok(Date.now() - t0 < 30_000);
    } finally {
      sleeper.close();
    }

    await rejectsWith(hb.openPty("sbx_00000000000000000000000000"), { status: 404, code: "not_found" });
    await rejectsWith(hb.openPty(box.id, { query: { rows: 0 } }), { status: 400, code: "invalid", field: "rows" });
    await rejectsWith(new HareBox({ url: URL_, apiKey: "hbk_wrong" }).openPty(box.id), { status: 401, code: "unauthorized" });
  });

  test("delete", async () => {
    const gone = await box.delete();
    assert.equal(gone.state, "deleted");
    assert.equal((await hb.getSandbox(box.id)).state, "deleted");
    await rejectsWith(box.run("true"), { code: /conflict|not_found/ });
  });

  test("the walkthrough (examples/untrusted/walkthrough.mjs) on the default image", async () => {
    const started = Date.now();
    const child = spawn(process.execPath, [WALKTHROUGH], { env: process.env, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    const timer = setTimeout(() => child.kill("SIGTERM"), 600_000);
    const code = await new Promise((resolve) => child.on("close", resolve));
    clearTimeout(timer);
    // If it died half way, its sandbox is the live "untrusted" made after we started.
    const left = [];
    for (const s of (await hb.listSandboxes()).sandboxes) {
      if (s.name === "untrusted" && s.state !== "deleted" && Date.parse(s.created_at) >= started - 1000) {
        left.push(s.id);
        await s.delete().catch((e) => console.error(`deleting ${s.id}: ${e}`));
      }
    }
    assert.equal(code, 0, `walkthrough failed (exit ${code}):\n${stderr}\n${stdout}`);
    assert.ok(stdout.startsWith("0 hello from user (uid 1000)"), `walkthrough printed:\n${stdout}`);
    assert.match(stdout, /read \/etc\/shadow: denied/);
    assert.ok(!(stdout + stderr).includes(process.env.HAREBOX_API_KEY || "\0"), "the API key was printed");
    assert.deepEqual(left, [], "the walkthrough left its sandbox behind");
  });
});

describe("stop and start", { skip }, () => {
  // One sandbox of its own: it runs a background sleep and is stopped (it
  // keeps its record, state stopped, and refuses commands and a second
  // stop), then booted again on its disk (it runs commands, refuses a
  // second start, and the sleep is gone). The minimal image's root is in
  // memory, so no file is checked across the boot. `after` deletes the
  // sandbox even when a test failed. The tests run in order; they need a
  // backend that boots a sandbox again on its disk (qemu, not Cloud
  // Hypervisor).
  /** @type {HareBox} */
  let hb;
  /** @type {Sandbox} */
  let box;
  const run = randomBytes(4).toString("hex");
  const labels = { "harebox.test/suite": "sdk-typescript-stop-start", "harebox.test/run": run };
  /** The background command: a duration no other test uses. */
  const SLEEPER = ["sleep", "617"];
  /** Counts the processes whose command line is SLEEPER (the pattern does not match this shell's own): one grep reads them all, not a tr per process. */
  const COUNT = "grep -asH '' /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -c '^/proc/[0-9]*/cmdline:sleep 61[7] $'";
  const sleepers = async () => {
    const r = await box.run(COUNT);
    assert.match(r.stdout, /^\d+\n$/, JSON.stringify(r));
    return Number(r.stdout);
  };
  const bootID = async () => (await box.run("cat /proc/sys/kernel/random/boot_id")).stdout.trim();
  /** The boot before the stop, and the sleep started then. */
  let firstBoot = "";
  /** @type {import("harebox").Process} */
  let sleeper;

  before(async () => {
    hb = new HareBox();
    box = await hb.create({ image: IMAGE, labels, ttl_seconds: 1800 });
  });

  after(async () => {
    const { sandboxes } = await hb.listSandboxes({ query: { label: { "harebox.test/run": run } } });
    for (const s of sandboxes) if (s.state !== "deleted") await hb.deleteSandbox(s.id).catch((e) => console.error(`deleting ${s.id}: ${e}`));
    if (box) assert.equal((await hb.getSandbox(box.id)).state, "deleted");
  });

  test("stop: the sandbox is stopped and keeps its record", async () => {
    assert.equal(box.state, "running");
    firstBoot = await bootID();
    assert.match(firstBoot, /^[0-9a-f-]{36}$/);
    sleeper = await box.start(SLEEPER);
    assert.equal(sleeper.running, true);
    assert.equal(await sleepers(), 1);

    assert.equal(await box.stop(), box, "stop returns the sandbox, updated");
    assert.equal(box.state, "stopped");
    const got = await hb.getSandbox(box.id);
    assert.deepEqual([got.id, got.state, got.image, got.labels, got.error], [box.id, "stopped", IMAGE, labels, undefined]);
    const stopped = await hb.listSandboxes({ query: { label: labels, state: "stopped" } });
    assert.deepEqual(stopped.sandboxes.map((s) => s.id), [box.id]);
    assert.deepEqual((await hb.listSandboxes({ query: { label: labels, state: "running" } })).sandboxes, []);
  });

  test("a stopped sandbox refuses commands and a second stop (conflict)", async () => {
    await rejectsWith(box.run("echo no"), { status: 409, code: "conflict" });
    await rejectsWith(hb.exec(box.id, { body: { cmd: "true" } }), { status: 409, code: "conflict" });
    await rejectsWith(box.stop(), { status: 409, code: "conflict" });
    await rejectsWith(hb.stopSandbox(box.id), { status: 409, code: "conflict" });
    assert.equal(box.state, "stopped", "a refused stop changes nothing");
    assert.equal((await box.refresh()).state, "stopped");
  });

  test("start: running again on its disk; a second start is a conflict", async () => {
    assert.equal(await box.boot(), box, "boot (startSandbox) returns the sandbox, updated");
    assert.deepEqual([box.state, box.image, box.labels], ["running", IMAGE, labels]);
    const got = await hb.getSandbox(box.id);
    assert.ok(got instanceof Sandbox);
    assert.deepEqual([got.id, got.state], [box.id, "running"]);
    assert.equal((await box.run("echo back")).stdout, "back\n");
    await rejectsWith(hb.startSandbox(box.id), { status: 409, code: "conflict", message: /only a stopped sandbox starts/ });
    await rejectsWith(box.boot(), { status: 409, code: "conflict" });
    assert.equal((await hb.getSandbox(box.id)).state, "running");
  });

  test("what ran before the stop is gone: a new boot, no sleep", async () => {
    const now = await bootID();
    assert.match(now, /^[0-9a-f-]{36}$/);
    assert.notEqual(now, firstBoot, "start booted the sandbox again");
    assert.equal(await sleepers(), 0);
    assert.ok(!(await hb.listProcesses(box.id)).processes.some((p) => p.id === sleeper.id && p.running), "the sleep still runs");
  });
});

describe("tenancy and API keys", { skip }, () => {
  /** @type {HareBox} */
  let hb;
  const run = randomBytes(4).toString("hex");
  /** @type {import("harebox").Account} */
  let account;
  /** @type {import("harebox").Project} */
  let project;
  /** @type {import("harebox").Fleet} */
  let fleet;
  /** A client of the same server with this key's secret. */
  const clientFor = (key) => new HareBox({ url: URL_, apiKey: key.secret });
  // The parent key's scope. accounts:read lets it look accounts up, so that
  // another account is not_found (unseen) rather than forbidden (an action
  // the key lacks).
  const PARENT_ACTIONS = ["sandboxes:read", "keys:write", "keys:read", "accounts:read"];

  before(async () => {
    hb = new HareBox();
    account = await hb.createAccount({ body: { name: `ts-sdk-${run}` } });
    project = await hb.createProject({ query: { account: account.id }, body: { name: "web" } });
    fleet = await hb.createFleet(project.name, { query: { account: account.name }, body: { name: "workers" } });
  });

  after(async () => {
    // The last test deletes the account; this is for a run that failed before it.
    if (account) await hb.deleteAccount(account.id).catch((e) => e?.code === "not_found" || console.error(`deleting ${account.id}: ${e}`));
  });

  test("accounts, projects and fleets: create, list, get", async () => {
    assert.match(account.id, /^acc_[0-9a-z]{26}$/);
    assert.equal(account.name, `ts-sdk-${run}`);
    assert.deepEqual(await hb.getAccount(account.name), account);
    assert.deepEqual(await hb.getAccount(account.id), account);
    assert.ok((await hb.listAccounts()).accounts.some((a) => a.id === account.id));

    const mine = { query: { account: account.name } };
    assert.match(project.id, /^prj_/);
    assert.deepEqual([project.account_id, project.name], [account.id, "web"]);
    assert.deepEqual((await hb.listProjects(mine)).projects.map((p) => p.name).sort(), ["default", "web"]);
    assert.deepEqual(await hb.getProject("web", mine), project);
    assert.deepEqual(await hb.getProject(project.id, mine), project);
    // A project ID names its account; a name without ?account= is looked
    // up in the default account.
    assert.deepEqual(await hb.getProject(project.id), project);
    await rejectsWith(hb.getProject("web"), { status: 404, code: "not_found" });

    assert.match(fleet.id, /^flt_/);
    assert.deepEqual([fleet.account_id, fleet.project_id, fleet.name], [account.id, project.id, "workers"]);
    assert.deepEqual((await hb.listFleets("web", mine)).fleets, [fleet]);
    assert.deepEqual(await hb.getFleet(project.id, "workers", mine), fleet);
    assert.deepEqual(await hb.getFleet("web", fleet.id, mine), fleet);

    await rejectsWith(hb.createProject({ ...mine, body: { name: "web" } }), { status: 409, code: "conflict" });
    await rejectsWith(hb.createAccount({ body: { name: "Not A Label" } }), { status: 400, code: "invalid", field: "name" });
  });

  test("a scoped key sees and does only its scope; its children are no wider; revoking it ends them", async () => {
    const parent = await hb.createKey({
      body: { account_id: account.id, description: "sdk-typescript parent", scope: { actions: PARENT_ACTIONS, projects: [project.name] } },
    });
    assert.match(parent.secret, /^hbk_/);
    assert.match(parent.id, /^key_[0-9a-z]{26}$/);
    assert.equal(parent.account_id, account.id);
    assert.deepEqual(parent.scope.projects, [project.id], "project names are stored as IDs");
    assert.ok(parent.hint.startsWith("hbk_") && parent.hint !== parent.secret);
    const got = await hb.getKey(parent.id);
    assert.equal(got.id, parent.id);
    assert.equal(/** @type {any} */ (got).secret, undefined, "getKey never shows the secret");

    const scoped = clientFor(parent);
    assert.deepEqual((await scoped.listSandboxes()).sandboxes, []);
    assert.deepEqual((await scoped.listSandboxes({ query: { project: project.name } })).sandboxes, []);
    await rejectsWith(scoped.create({ image: IMAGE, ttl_seconds: 60 }), { status: 403, code: "forbidden" });
    assert.equal((await scoped.getAccount(account.id)).name, account.name);
    await rejectsWith(scoped.getAccount("default"), { status: 404, code: "not_found" });
    assert.deepEqual((await scoped.listKeys()).keys.map((k) => k.id), [parent.id]);

    await rejectsWith(scoped.createKey({ body: { scope: { actions: ["*"], projects: [project.name] } } }), {
      status: 403,
      code: "forbidden",
      field: "scope.actions",
    });
    await rejectsWith(scoped.createKey({ body: { scope: { actions: ["sandboxes:read"] } } }), { status: 403, field: "scope.projects" });

    const child = await scoped.createKey({ body: { scope: { actions: ["sandboxes:read"], projects: [project.id] } } });
    assert.deepEqual([child.parent_id, child.account_id], [parent.id, account.id]);
    assert.equal((await scoped.getKey(child.id)).parent_id, parent.id);
    const childClient = clientFor(child);
    assert.deepEqual((await childClient.listSandboxes()).sandboxes, []);
    await rejectsWith(childClient.listKeys(), { status: 403, code: "forbidden" });
    await rejectsWith(childClient.getAccount(account.id), { status: 403, code: "forbidden" });

    const revoked = await hb.revokeKey(parent.id);
    assert.equal(revoked.id, parent.id);
    assert.ok(revoked.revoked_at);
    assert.ok((await hb.getKey(child.id)).revoked_at, "revoking a key revokes the keys it made");
    await rejectsWith(childClient.listSandboxes(), { status: 401, code: "unauthorized" });
    await rejectsWith(scoped.listSandboxes(), { status: 401, code: "unauthorized" });
  });

  test("rotating a key: the old secret stops working, the new one works", async () => {
    const key = await hb.createKey({ body: { account_id: account.name, scope: { actions: ["sandboxes:read"] } } });
    const old = clientFor(key);
    assert.deepEqual((await old.listSandboxes()).sandboxes, []);
    const rotated = await hb.rotateKey(key.id);
    assert.equal(rotated.id, key.id);
    assert.match(rotated.secret, /^hbk_/);
    assert.notEqual(rotated.secret, key.secret);
    assert.ok(rotated.rotated_at);
    await rejectsWith(old.listSandboxes(), { status: 401, code: "unauthorized" });
    assert.deepEqual((await clientFor(rotated).listSandboxes()).sandboxes, []);
    assert.ok((await hb.listKeys({ query: { account: account.id } })).keys.some((k) => k.id === key.id));
    await hb.revokeKey(key.id);
  });

  test("a rate-limited key gets rate_limited with retryAfter", async () => {
    const key = await hb.createKey({
      body: { account_id: account.id, scope: { actions: ["sandboxes:read"], rate: { per_second: 1, burst: 1 } } },
    });
    assert.deepEqual(key.scope.rate, { per_second: 1, burst: 1 });
    const limited = clientFor(key);
    await limited.listSandboxes();
    /** @type {RateLimitedError | undefined} */
    let err;
    await assert.rejects(limited.listSandboxes(), (e) => {
      assert.ok(e instanceof RateLimitedError, `want a RateLimitedError, got ${e}`);
      assert.deepEqual([e.status, e.code], [429, "rate_limited"]);
      assert.ok(e.retryAfter !== undefined && e.retryAfter > 0, `retryAfter ${e.retryAfter}`);
      err = e;
      return true;
    });
    await new Promise((resolve) => setTimeout(resolve, (err?.retryAfter ?? 1) * 1000));
    await limited.listSandboxes(); // the bucket refilled
    await hb.revokeKey(key.id);
  });

  test("deleting the fleet, the project and the account", async () => {
    const mine = { query: { account: account.id } };
    const key = await hb.createKey({ body: { account_id: account.id, scope: { actions: ["sandboxes:read"] } } });

    assert.equal(await hb.deleteFleet(project.id, fleet.name, mine), undefined);
    await rejectsWith(hb.getFleet(project.id, fleet.id, mine), { status: 404, code: "not_found" });
    assert.equal(await hb.deleteProject(project.name, mine), undefined);
    await rejectsWith(hb.getProject(project.id, mine), { status: 404, code: "not_found" });
    await rejectsWith(hb.deleteProject("default", mine), { status: 409, code: "conflict" });

    assert.equal(await hb.deleteAccount(account.name), undefined);
    await rejectsWith(hb.getAccount(account.id), { status: 404, code: "not_found" });
    assert.ok(!(await hb.listAccounts()).accounts.some((a) => a.id === account.id));
    await rejectsWith(clientFor(key).listSandboxes(), { status: 401, code: "unauthorized" }, "the account's keys are revoked");
  });
});

describe("environments", { skip }, () => {
  // One project made for this run holds one environment (a plain MODE, a
  // secret TOKEN, a template file) and one sandbox booted with it; the
  // project's third-party switch is flipped only there. The tests run in
  // order; `after` deletes what a failed run left.
  /** @type {HareBox} */
  let hb;
  const run = randomBytes(4).toString("hex");
  const labels = { "harebox.test/suite": "sdk-typescript-environments", "harebox.test/run": run };
  const secret = `sk-ts-sdk-${randomBytes(16).toString("hex")}-canary`;
  const CONF = "/etc/app.conf";
  /** @type {import("harebox").Project} */
  let project;
  /** @type {import("harebox").Environment} */
  let env;
  /** @type {Sandbox} */
  let box;
  const inProject = () => ({ query: { project: project.name } });
  /** Asserts that no answer contains the secret value. */
  const noSecret = (answer, what) => assert.ok(!JSON.stringify(answer).includes(secret), `${what} shows the secret: ${JSON.stringify(answer)}`);
  const ids = async () => (await hb.listSandboxes({ query: { label: { "harebox.test/run": run } } })).sandboxes.map((s) => s.id);

  before(async () => {
    hb = new HareBox();
    project = await hb.createProject({ body: { name: `ts-sdk-env-${run}` } });
    env = await hb.createEnvironment({
      ...inProject(),
      body: {
        name: `app-${run}`,
        variables: { MODE: { value: "prod" }, TOKEN: { value: secret, secret: true } },
        files: [{ path: CONF, content: "token={{TOKEN}}\n", template: true }],
      },
    });
  });

  after(async () => {
    const { sandboxes } = await hb.listSandboxes({ query: { label: { "harebox.test/run": run } } });
    for (const s of sandboxes) if (s.state !== "deleted") await hb.deleteSandbox(s.id).catch((e) => console.error(`deleting ${s.id}: ${e}`));
    if (env) await hb.deleteEnvironment(env.id).catch((e) => e?.code === "not_found" || console.error(`deleting ${env.id}: ${e}`));
    if (project) await hb.deleteProject(project.id).catch((e) => console.error(`deleting ${project.id}: ${e}`));
  });

  test("no answer shows a secret value", async () => {
    assert.match(env.id, /^env_[0-9a-z]{26}$/);
    assert.deepEqual([env.name, env.project, env.project_id, env.account_id, env.latest], [`app-${run}`, project.name, project.id, project.account_id, 1]);
    assert.deepEqual([env.version.environment_id, env.version.version, env.version.third_party_safe], [env.id, 1, false]);
    assert.deepEqual(env.version.variables, { MODE: { value: "prod" }, TOKEN: { secret: true } });
    assert.deepEqual(env.version.files.map((f) => [f.path, f.content, f.template]), [[CONF, "token={{TOKEN}}\n", true]]);

    const byName = await hb.getEnvironment(env.name, inProject());
    const byID = await hb.getEnvironment(env.id); // an ID names its project
    const list = await hb.listEnvironments(inProject());
    const versions = await hb.listEnvironmentVersions(env.name, inProject());
    const v1 = await hb.getEnvironmentVersion(env.id, 1, inProject());
    for (const [what, answer] of Object.entries({ create: env, byName, byID, list, versions, v1 })) noSecret(answer, what);
    assert.deepEqual(byName, env);
    assert.deepEqual(byID, env);
    assert.deepEqual(list.environments.map((e) => e.id), [env.id]);
    assert.deepEqual(versions.versions, [env.version]);
    assert.deepEqual(v1, env.version);
    await rejectsWith(hb.getEnvironment(env.name), { status: 404, code: "not_found" }); // not in the default project
    await rejectsWith(hb.getEnvironmentVersion(env.name, 2, inProject()), { status: 404, code: "not_found" });
    await rejectsWith(hb.createEnvironment({ ...inProject(), body: { name: env.name } }), { status: 409, code: "conflict" });
  });

  test("a sandbox pins the latest version and sees only placeholders", async () => {
    box = await hb.create({ image: IMAGE, project: project.name, environment: env.name, labels, ttl_seconds: 1800 });
    assert.equal(box.state, "running");
    assert.deepEqual([box.environment, box.third_party, box.project], [`${env.name}@1`, false, project.name]);
    assert.equal((await hb.getSandbox(box.id)).environment, `${env.name}@1`);
    noSecret(box, "the sandbox");

    const conf = dec(await hb.readFile(box.id, { query: { path: CONF } }));
    assert.match(conf, /^token=hbph_\S+\n$/);
    assert.ok(!conf.includes(secret), "the file holds the secret");
    // Every exec gets the variables: the plain value, and the same
    // placeholder for the secret as the file.
    const r = await box.run('printf "%s %s" "$MODE" "$TOKEN"');
    assert.equal(r.exit_code, 0, r.stderr);
    assert.equal(r.stdout, `prod ${conf.trim().slice("token=".length)}`);
  });

  test("an update makes version 2; the running sandbox keeps version 1", async () => {
    const conf = await box.readText(CONF);
    const updated = await hb.updateEnvironment(env.name, {
      ...inProject(),
      body: { set: { MODE: { value: "staging" }, REGION: { value: "fr-par" } } },
    });
    noSecret(updated, "the update");
    assert.deepEqual([updated.id, updated.latest, updated.version.version], [env.id, 2, 2]);
    assert.deepEqual(updated.version.variables, { MODE: { value: "staging" }, REGION: { value: "fr-par" }, TOKEN: { secret: true } });
    assert.equal((await hb.getEnvironment(env.id, inProject())).latest, 2);

    const { versions } = await hb.listEnvironmentVersions(env.id, inProject());
    noSecret(versions, "the versions");
    assert.deepEqual(versions.map((v) => v.version), [1, 2]);
    assert.deepEqual((await hb.getEnvironmentVersion(env.name, "1", inProject())).variables.MODE, { value: "prod" });

    assert.equal((await box.refresh()).environment, `${env.name}@1`);
    assert.equal(await box.readText(CONF), conf);
    assert.equal((await box.run('printf "%s" "$MODE"')).stdout, "prod");
  });

  test("a third-party sandbox gets only third-party-safe environments, refused before anything boots", async () => {
    const before_ = await ids();
    const base = { image: IMAGE, project: project.name, labels };
    await rejectsWith(hb.create({ ...base, environment: env.name, third_party: true }), { status: 403, code: "forbidden", field: "environment" });
    await rejectsWith(hb.create({ ...base, environment: `${env.id}@1`, third_party: true }), { status: 403, code: "forbidden" });
    await rejectsWith(hb.create({ ...base, environment: env.name, no_env: true }), { status: 400, code: "invalid", field: "environment" });
    await rejectsWith(hb.create({ ...base, environment: `${env.name}@9` }), { status: 400, field: "environment" });

    // The project's default makes every new sandbox third-party.
    assert.equal(project.third_party_default, false);
    try {
      const flipped = await hb.updateProject(project.name, { query: { account: project.account_id }, body: { third_party_default: true } });
      assert.deepEqual([flipped.id, flipped.third_party_default], [project.id, true]);
      assert.equal((await hb.getProject(project.id)).third_party_default, true);
      await rejectsWith(hb.create({ ...base, environment: env.name }), { status: 403, field: "environment" });
    } finally {
      const back = await hb.updateProject(project.id, { body: { third_party_default: false } });
      assert.equal(back.third_party_default, false);
    }
    assert.deepEqual(await ids(), before_, "a refused create left a sandbox");
  });

  test("deleting the environment: a conflict while the sandbox lives, then gone", async () => {
    await rejectsWith(hb.deleteEnvironment(env.name, inProject()), { status: 409, code: "conflict" });
    assert.equal((await hb.getEnvironment(env.id)).latest, 2);

    assert.equal((await box.delete()).state, "deleted");
    assert.equal(await hb.deleteEnvironment(env.name, inProject()), undefined);
    await rejectsWith(hb.getEnvironment(env.id, inProject()), { status: 404, code: "not_found" });
    assert.deepEqual((await hb.listEnvironments(inProject())).environments, []);
  });
});

describe("audit log", { skip }, () => {
  // One account made for this run holds a project, made by the operator,
  // and a key that may read sandboxes and the audit log only; the key's
  // attempt to create a project is refused. `before` does all that and
  // reads back every entry after the last one it saw; `after` deletes the
  // account (and so revokes the key).
  /** @type {HareBox} */
  let hb;
  /** @type {HareBox} */
  let scoped;
  const run = randomBytes(4).toString("hex");
  /** @type {import("harebox").Account} */
  let account;
  /** @type {import("harebox").Project} */
  let project;
  /** @type {import("harebox").KeyWithSecret} */
  let key;
  let beforeSeq = 0;
  /** @type {import("harebox").AuditEntry[]} */
  let entries = [];
  /** The one entry with these fields. */
  const only = (list, fields) => {
    const found = list.filter((e) => Object.entries(fields).every(([k, v]) => e[k] === v));
    assert.equal(found.length, 1, `entries with ${JSON.stringify(fields)}: ${JSON.stringify(found)}`);
    return found[0];
  };

  before(async () => {
    hb = new HareBox();
    for await (const e of hb.auditEntries()) beforeSeq = e.seq;
    account = await hb.createAccount({ body: { name: `ts-sdk-audit-${run}` } });
    project = await hb.createProject({ query: { account: account.id }, body: { name: "web" } });
    key = await hb.createKey({ body: { account_id: account.id, description: "sdk-typescript audit", scope: { actions: ["sandboxes:read", "audit:read"] } } });
    scoped = new HareBox({ url: URL_, apiKey: key.secret });
    await rejectsWith(scoped.createProject({ body: { name: "denied" } }), { status: 403, code: "forbidden" });
    for await (const e of hb.auditEntries({ query: { after: beforeSeq } })) entries.push(e);
  });

  after(async () => {
    if (account) await hb.deleteAccount(account.id).catch((e) => console.error(`deleting ${account.id}: ${e}`));
  });

  test("the entries name who did what, and how it ended", () => {
    assert.deepEqual(entries.map((e) => e.seq), entries.map((_, i) => beforeSeq + 1 + i), "sequence numbers without gaps");
    for (const e of entries) {
      assert.ok(e.time && e.hash && (e.prev || e.seq === 1) && ["ok", "denied", "error"].includes(e.outcome), JSON.stringify(e));
    }
    assert.deepEqual(entries.slice(1).map((e) => e.prev), entries.slice(0, -1).map((e) => e.hash), "a hash chain");

    assert.deepEqual([only(entries, { action: "createAccount", target: account.id }).principal], ["operator"]);
    const made = only(entries, { action: "createProject", principal: "operator" });
    assert.equal(made.outcome, "ok");
    assert.ok([project.name, project.id].includes(made.target ?? ""), `createProject target ${made.target}`);
    assert.deepEqual([only(entries, { action: "createKey", target: key.id }).principal, only(entries, { action: "createKey" }).outcome], ["operator", "ok"]);
    const denied = only(entries, { action: "createProject", principal: key.id });
    assert.deepEqual([denied.outcome, denied.error, denied.account_id], ["denied", "forbidden", account.id]);
    assert.ok(denied.source && denied.request_id, JSON.stringify(denied));
    assert.ok(!JSON.stringify(entries).includes(key.secret), "an entry holds the key's secret");
  });

  test("filters; a key sees its own account's entries", async () => {
    const mine = await hb.listAudit({ query: { principal: key.id, outcome: "denied", after: beforeSeq } });
    assert.deepEqual(mine.entries.map((e) => e.action), ["createProject"]);
    assert.equal(mine.next, undefined);
    assert.deepEqual((await hb.listAudit({ query: { action: "createKey", target: key.id } })).entries, [only(entries, { action: "createKey" })]);
    assert.deepEqual(await hb.listAudit({ query: { from: "2100-01-01T00:00:00Z" } }), { entries: [] });
    assert.deepEqual(await hb.listAudit({ query: { to: "2000-01-01T00:00:00Z" } }), { entries: [] });
    await rejectsWith(hb.listAudit({ query: { from: "yesterday" } }), { status: 400, code: "invalid", field: "from" });

    const seen = (await scoped.listAudit({ query: { limit: 1000 } })).entries;
    assert.ok(seen.length > 0 && seen.every((e) => e.account_id === account.id), JSON.stringify(seen));
    assert.equal(only(seen, { principal: key.id, outcome: "denied" }).action, "createProject");
    only((await hb.listAudit({ query: { account: account.id, outcome: "denied" } })).entries, { principal: key.id });
  });

  test("pages of one follow next", async () => {
    assert.ok(entries.length >= 3, `${entries.length} entries`);
    const first = await hb.listAudit({ query: { after: beforeSeq, limit: 1 } });
    assert.deepEqual(first, { entries: entries.slice(0, 1), next: String(entries[0].seq) });
    const second = await hb.listAudit({ query: { after: first.next, limit: 1 } });
    assert.deepEqual(second, { entries: entries.slice(1, 2), next: String(entries[1].seq) });
    const paged = [];
    for await (const e of hb.auditEntries({ query: { after: beforeSeq, limit: 1 } })) paged.push(e);
    assert.deepEqual(paged.slice(0, entries.length), entries);
  });

  test("verify is ok, and for the operator only", async () => {
    const report = await hb.verifyAudit();
    assert.equal(report.ok, true, JSON.stringify(report));
    assert.ok(report.entries >= entries[entries.length - 1].seq && report.checkpoints >= 0, JSON.stringify(report));
    assert.equal(report.first_bad, undefined);
    await rejectsWith(scoped.verifyAudit(), { status: 403, code: "forbidden" });
  });

  test("the public key", async () => {
    const k = await hb.getAuditKey();
    assert.equal(k.algorithm, "ed25519");
    assert.equal(Buffer.from(k.public_key, "base64").length, 32);
    assert.deepEqual(await scoped.getAuditKey(), k, "audit:read includes the key");
  });
});

describe("budgets and usage", { skip }, () => {
  // One account made for this run holds a project and the budgets; no VM
  // boots: the only creates tried are refused by a budget first. `after`
  // deletes the account's budgets (deleting an account leaves them), any
  // sandbox a broken refusal let through, and the account, even when a
  // test failed. The tests run in order and need the root key.
  /** @type {HareBox} */
  let hb;
  const run = randomBytes(4).toString("hex");
  const labels = { "harebox.test/suite": "sdk-typescript-budgets", "harebox.test/run": run };
  /** @type {import("harebox").Account} */
  let account;
  /** @type {import("harebox").Project} */
  let project;
  const mine = () => ({ query: { account: account.id } });
  const money = /^\d+\.\d{2,6}$/;

  before(async () => {
    hb = new HareBox();
    account = await hb.createAccount({ body: { name: `ts-sdk-budget-${run}` } });
    project = await hb.createProject({ ...mine(), body: { name: "web" } });
  });

  after(async () => {
    if (!account) return;
    try {
      for (const b of (await hb.listBudgets(mine())).budgets) await hb.deleteBudget(b.id).catch((e) => console.error(`deleting ${b.id}: ${e}`));
      const { sandboxes } = await hb.listSandboxes(mine());
      for (const s of sandboxes) if (s.state !== "deleted") await hb.deleteSandbox(s.id).catch((e) => console.error(`deleting ${s.id}: ${e}`));
    } finally {
      await hb.deleteAccount(account.id).catch((e) => console.error(`deleting ${account.id}: ${e}`));
    }
  });

  test("account, project and label budgets: create, list, get, delete", async () => {
    const acct = await hb.createBudget({
      ...mine(),
      body: { name: "monthly", scope: { kind: "account" }, period: "monthly", limit_usd: "25.00", action: "notify", warn_at_percent: [80, 50] },
    });
    assert.match(acct.id, /^bgt_[0-9a-z]{26}$/);
    assert.deepEqual(
      [acct.account_id, acct.name, acct.scope, acct.period, acct.limit_usd, acct.action, acct.warn_at_percent],
      [account.id, "monthly", { kind: "account" }, "monthly", "25.00", "notify", [50, 80]],
    );
    assert.deepEqual([acct.spent_usd, acct.reserved_usd, acct.from_key, acct.reached_at, acct.action_pending], ["0.00", "0.00", undefined, undefined, undefined]);
    assert.match(acct.period_start, /^\d{4}-\d{2}-01T00:00:00Z$/, "a monthly period starts on the 1st, UTC");
    assert.ok(Date.parse(acct.created_at) >= Date.parse(acct.period_start), JSON.stringify(acct));

    // A project by name: the scope's ref becomes its ID.
    const prj = await hb.createBudget({ query: { account: account.name }, body: { scope: { kind: "project", ref: "web" }, period: "total", limit_usd: "100", action: "deny_new" } });
    assert.deepEqual([prj.scope, prj.project_id, prj.name], [{ kind: "project", ref: project.id }, project.id, undefined]);
    assert.deepEqual([prj.period, prj.limit_usd, prj.action, prj.period_start], ["total", "100.00", "deny_new", prj.created_at]);

    const lbl = await hb.createBudget({ ...mine(), body: { scope: { kind: "label", labels: { team: "red" } }, period: "monthly", limit_usd: "0.5", action: "pause" } });
    assert.deepEqual([lbl.scope, lbl.limit_usd, lbl.action, lbl.project_id], [{ kind: "label", labels: { team: "red" } }, "0.50", "pause", undefined]);
    // A stop budget: its sandboxes are stopped when it is reached.
    const stp = await hb.createBudget({ ...mine(), body: { scope: { kind: "project", ref: project.id }, period: "monthly", limit_usd: "1", action: "stop" } });
    assert.deepEqual([stp.action, stp.limit_usd, stp.project_id], ["stop", "1.00", project.id]);
    assert.equal(await hb.deleteBudget(stp.id), undefined);
    for (const b of [acct, prj, lbl]) assert.ok(money.test(b.spent_usd) && money.test(b.reserved_usd), JSON.stringify(b));

    const { budgets } = await hb.listBudgets(mine());
    assert.deepEqual([...budgets].sort((a, b) => a.id.localeCompare(b.id)), [acct, prj, lbl].sort((a, b) => a.id.localeCompare(b.id)));
    assert.ok(!(await hb.listBudgets()).budgets.some((b) => b.account_id === account.id), "the default account's list shows another account's budgets");
    assert.deepEqual(await hb.getBudget(prj.id), prj);
    assert.deepEqual(await hb.getBudget(lbl.id), lbl);

    assert.equal(await hb.deleteBudget(lbl.id), undefined);
    await rejectsWith(hb.getBudget(lbl.id), { status: 404, code: "not_found" });
    await rejectsWith(hb.deleteBudget(lbl.id), { status: 404, code: "not_found" });
    assert.deepEqual((await hb.listBudgets({ query: { account: account.name } })).budgets.map((b) => b.id).sort(), [acct.id, prj.id].sort());
  });

  test("bad requests are invalid, with their field, and make nothing", async () => {
    const before_ = (await hb.listBudgets(mine())).budgets;
    const ok = { scope: { kind: "account" }, period: "total", limit_usd: "1", action: "notify" };
    for (const [body, field] of [
      [{ ...ok, limit_usd: "0" }, "limit_usd"],
      [{ ...ok, period: "weekly" }, "period"],
      [{ ...ok, action: "explode" }, "action"],
      [{ ...ok, warn_at_percent: [100] }, "warn_at_percent[0]"],
      [{ ...ok, scope: { kind: "planet" } }, "scope.kind"],
      [{ ...ok, scope: { kind: "account", ref: "web" } }, "scope"],
      [{ ...ok, scope: { kind: "label" } }, "scope.labels"],
      [{ ...ok, scope: { kind: "project", ref: "no-such-project" } }, "scope.ref"],
      [{ ...ok, bogus: 1 }, "bogus"],
    ]) {
      await rejectsWith(hb.createBudget({ ...mine(), body: /** @type {any} */ (body) }), { status: 400, code: "invalid", field });
    }
    await rejectsWith(hb.createBudget({ query: { account: `no-such-account-${run}` }, body: /** @type {any} */ (ok) }), { status: 400, field: "account" });
    await rejectsWith(hb.getBudget("bgt_00000000000000000000000000"), { status: 404, code: "not_found" });
    assert.deepEqual((await hb.listBudgets(mine())).budgets, before_);
  });

  test("a deny_new budget with no room refuses a create with budget_exceeded (402) before anything boots", async () => {
    const tight = await hb.createBudget({ ...mine(), body: { name: "tight", scope: { kind: "account" }, period: "total", limit_usd: "0.000001", action: "deny_new" } });
    assert.deepEqual([tight.limit_usd, tight.spent_usd, tight.reserved_usd], ["0.000001", "0.00", "0.00"]);
    for (const fields of [{}, { project: project.name }]) {
      await assert.rejects(hb.create({ account_id: account.id, image: IMAGE, labels, ttl_seconds: 60, ...fields }), (e) => {
        assert.ok(e instanceof HareBoxError && !(e instanceof RateLimitedError), `want a HareBoxError, got ${e}`);
        assert.deepEqual([e.status, e.code], [402, "budget_exceeded"], String(e));
        assert.match(e.message, /budget tight/);
        return true;
      });
    }
    assert.deepEqual((await hb.listSandboxes(mine())).sandboxes, [], "a refused create left a sandbox");
    const after_ = await hb.getBudget(tight.id);
    assert.deepEqual([after_.spent_usd, after_.reserved_usd], ["0.00", "0.00"], "a refused create reserved nothing");
  });

  test("a key reads its own account's budgets and usage", async () => {
    const key = await hb.createKey({ body: { account_id: account.id, scope: { actions: ["budgets:read"] } } });
    try {
      const reader = new HareBox({ url: URL_, apiKey: key.secret });
      assert.deepEqual((await reader.listBudgets()).budgets, (await hb.listBudgets(mine())).budgets);
      assert.deepEqual(await reader.getUsage(), { usage: [] });
      await rejectsWith(reader.createBudget({ body: { scope: { kind: "account" }, period: "total", limit_usd: "1", action: "notify" } }), { status: 403, code: "forbidden" });
    } finally {
      await hb.revokeKey(key.id);
    }
  });

  test("usage: one row per group, an array", async () => {
    // Nothing ran in this account: every grouping is empty.
    for (const group_by of /** @type {const} */ (["account", "project", "fleet", "key", "sandbox", "label:team", undefined])) {
      const got = await hb.getUsage({ query: { account: account.id, group_by } });
      assert.deepEqual(got, { usage: [] }, String(group_by));
    }
    // Every account's, for the operator: whatever ran on this server.
    const { usage } = await hb.getUsage({ query: { group_by: "account", from: "2000-01-01T00:00:00Z", to: new Date(Date.now() + 60_000).toISOString() } });
    assert.ok(Array.isArray(usage));
    for (const g of usage) {
      assert.ok(typeof g.group === "string" && money.test(g.cost_usd), JSON.stringify(g));
      for (const n of [g.vcpu_seconds, g.memory_gib_seconds, g.paused_seconds]) assert.ok(Number.isInteger(n) && n >= 0, JSON.stringify(g));
    }
    assert.deepEqual(usage.map((g) => g.group), usage.map((g) => g.group).sort(), "sorted by group");
    await rejectsWith(hb.getUsage({ query: { group_by: /** @type {any} */ ("team") } }), { status: 400, code: "invalid", field: "group_by" });
    await rejectsWith(hb.getUsage({ query: { from: "yesterday" } }), { status: 400, field: "from" });
    await rejectsWith(hb.getUsage({ query: { from: "2026-02-01T00:00:00Z", to: "2026-01-01T00:00:00Z" } }), { status: 400, field: "to" });
  });
});

describe("events", { skip }, () => {
  // The operator's pages boot nothing. Then one account made for this run
  // gets a notify budget of "0.000001" on the whole account, and one
  // sandbox (the one boot) created and deleted in it reaches the budget:
  // its budgetReached event shows on a followed stream of the account's
  // events and in its pages. `after` deletes the budget, any sandbox left
  // and the account, even when a test failed. The tests need the root key.
  /** @type {HareBox} */
  let hb;
  const run = randomBytes(4).toString("hex");
  const labels = { "harebox.test/suite": "sdk-typescript-events", "harebox.test/run": run };
  /** @type {import("harebox").Account} */
  let account;
  const mine = () => ({ query: { account: account.id } });
  const principals = /^(budget:bgt_[0-9a-z]{26}|sandbox:sbx_[0-9a-z]{26}|engine)$/;

  before(async () => {
    hb = new HareBox();
    account = await hb.createAccount({ body: { name: `ts-sdk-events-${run}` } });
  });

  after(async () => {
    if (!account) return;
    try {
      for (const b of (await hb.listBudgets(mine())).budgets) await hb.deleteBudget(b.id).catch((e) => console.error(`deleting ${b.id}: ${e}`));
      const { sandboxes } = await hb.listSandboxes(mine());
      for (const s of sandboxes) if (s.state !== "deleted") await hb.deleteSandbox(s.id).catch((e) => console.error(`deleting ${s.id}: ${e}`));
    } finally {
      await hb.deleteAccount(account.id).catch((e) => console.error(`deleting ${account.id}: ${e}`));
    }
  });

  test("listEvents: the operator's page, its cursor, and a bad limit", async () => {
    const page = await hb.listEvents();
    assert.deepEqual(Object.keys(page).sort(), ["events", "next"]);
    assert.ok(Array.isArray(page.events));
    assert.match(page.next, /^\d+$/);
    for (const e of page.events) {
      assert.ok(Number.isInteger(e.seq) && e.seq > 0 && e.seq <= Number(page.next), JSON.stringify(e));
      assert.match(e.principal, principals, JSON.stringify(e));
      assert.ok(typeof e.action === "string" && typeof e.time === "string" && typeof e.hash === "string", JSON.stringify(e));
    }
    assert.deepEqual(page.events.map((e) => e.seq), page.events.map((e) => e.seq).sort((a, b) => a - b), "oldest first");
    // Past the cursor: nothing at or before it, and the cursor never goes back.
    const rest = await hb.listEvents({ query: { after: page.next } });
    assert.ok(rest.events.every((e) => e.seq > Number(page.next)), JSON.stringify(rest));
    assert.ok(Number(rest.next) >= Number(page.next), JSON.stringify(rest));
    assert.ok((await hb.listEvents({ query: { limit: 1 } })).events.length <= 1);
    // A fresh account has none; its cursor moves to the log's head (all
    // of it was looked at).
    const fresh = await hb.listEvents({ query: { account: account.id, after: 0 } });
    assert.deepEqual(fresh.events, []);
    assert.ok(Number(fresh.next) > 0, JSON.stringify(fresh));
    for (const limit of [0, 1001]) {
      await rejectsWith(hb.listEvents({ query: { limit } }), { status: 400, code: "invalid", field: "limit" });
    }
    await rejectsWith(hb.listEvents({ query: { after: -1 } }), { status: 400, code: "invalid", field: "after" });
    await rejectsWith(hb.listEvents({ query: { account: `no-such-account-${run}` } }), { status: 400, code: "invalid", field: "account" });
  });

  test("a notify budget reached by a sandbox shows on the followed stream and in the account's pages", async () => {
    const start = await hb.listEvents(mine());
    assert.deepEqual(start.events, []);
    const budget = await hb.createBudget({ ...mine(), body: { name: "tiny", scope: { kind: "account" }, period: "total", limit_usd: "0.000001", action: "notify" } });
    assert.deepEqual([budget.limit_usd, budget.action, budget.reached_at], ["0.000001", "notify", undefined]);

    // Follow the account's events from the cursor on, until budgetReached;
    // the signal ends the stream whatever happens (at the latest 20 s after
    // the delete).
    const ac = new AbortController();
    const got = [];
    const following = (async () => {
      for await (const e of hb.followEvents({ query: { account: account.id, after: start.next }, signal: ac.signal })) {
        got.push(e);
        if (e.action === "budgetReached") return e;
      }
    })();
    following.catch(() => {}); // awaited below
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let bound;
    try {
      // notify refuses nothing: the create goes on, and its spend (settled
      // at the latest by the delete) passes the limit.
      const box = await hb.create({ account_id: account.id, image: IMAGE, labels, ttl_seconds: 600 });
      assert.equal(box.account_id, account.id);
      assert.equal((await hb.deleteSandbox(box.id)).state, "deleted");
      bound = setTimeout(() => ac.abort(new Error(`no budgetReached event within 20 s of the delete; got ${JSON.stringify(got)}`)), 20_000);
      const reached = await following;
      assert.ok(reached, `the stream ended without budgetReached: ${JSON.stringify(got)}`);
      assert.deepEqual(
        [reached.principal, reached.action, reached.target, reached.account_id, reached.outcome],
        [`budget:${budget.id}`, "budgetReached", budget.id, account.id, "ok"],
      );
      for (const e of got) assert.equal(e.account_id, account.id, JSON.stringify(e));

      // The account's pages show it too, by ID or by name.
      const page = await hb.listEvents(mine());
      assert.deepEqual(page.events.filter((e) => e.action === "budgetReached"), [reached]);
      assert.ok(Number(page.next) >= reached.seq, JSON.stringify(page));
      assert.deepEqual(await hb.listEvents({ query: { account: account.name } }), page);
      assert.deepEqual(await hb.listEvents({ query: { account: account.id, after: page.next } }), { events: [], next: page.next });
      assert.ok((await hb.getBudget(budget.id)).reached_at, "the budget says it was reached");
    } finally {
      clearTimeout(bound);
      ac.abort();
    }
  });
});

describe("command history and retention", { skip }, () => {
  // One sandbox made for this run (monitoring on, as by default) runs a
  // command kept with its output; then the default account's retention is
  // lowered to { output_days: 0 } and the next command is kept without
  // it. `after` sets the retention back to {} (keep forever), even when a
  // test failed, since other tests share the server, and deletes the
  // sandbox. The tests run in order and need the root key.
  /** @type {HareBox} */
  let hb;
  /** @type {Sandbox} */
  let box;
  const run = randomBytes(4).toString("hex");
  const labels = { "harebox.test/suite": "sdk-typescript-history", "harebox.test/run": run };
  /** The one history entry of the sandbox with this command. */
  const entry = async (cmd) => {
    const found = (await hb.listCommands(box.id)).commands.filter((c) => c.cmd === cmd);
    assert.equal(found.length, 1, `entries for ${cmd}: ${JSON.stringify(found)}`);
    return found[0];
  };
  const reversed = (s) => [...s].reverse().join("");

  before(async () => {
    hb = new HareBox();
    await hb.updateAccount("default", { body: { retention: {} } }); // keep forever, whatever an earlier run left
    box = await hb.create({ image: IMAGE, labels, ttl_seconds: 1800, monitoring: true, snapshots: true });
  });

  after(async () => {
    try {
      await hb.updateAccount("default", { body: { retention: {} } });
    } finally {
      const { sandboxes } = await hb.listSandboxes({ query: { label: { "harebox.test/run": run } } });
      for (const s of sandboxes) if (s.state !== "deleted") await hb.deleteSandbox(s.id).catch((e) => console.error(`deleting ${s.id}: ${e}`));
    }
  });

  test("the sandbox reports monitoring and snapshots", async () => {
    assert.deepEqual([box.monitoring, box.snapshots], [true, true]);
    const got = await hb.getSandbox(box.id);
    assert.deepEqual([got.monitoring, got.snapshots], [true, true]);
    assert.equal(box.toJSON().monitoring, true);
  });

  test("an exec is kept with its output", async () => {
    const tag = randomBytes(16).toString("hex");
    const cmd = `echo ${tag} | rev`;
    const r = await box.run(cmd, { user: "root", cwd: "/tmp" });
    assert.deepEqual([r.exit_code, r.stdout], [0, `${reversed(tag)}\n`]);
    const e = await entry(cmd);
    assert.deepEqual([e.kind, e.sandbox_id, e.user, e.cwd, e.output_purged], ["exec", box.id, "root", "/tmp", false]);
    assert.ok(e.id && Date.parse(e.started_at) <= Date.parse(e.ended_at), JSON.stringify(e));
    assert.deepEqual([e.result?.exit_code, e.result?.stdout, e.result?.stdout_truncated], [0, `${reversed(tag)}\n`, false]);
    // Oldest first; limit keeps the newest.
    assert.deepEqual((await hb.listCommands(box.id, { query: { limit: 1 } })).commands, [e]);
    assert.deepEqual((await hb.listCommands(box.id)).commands.at(-1), e);
  });

  test("output_days 0 keeps entries without their output", async () => {
    const account = await hb.updateAccount("default", { body: { retention: { output_days: 0 } } });
    assert.deepEqual([account.name, account.retention], ["default", { output_days: 0 }]);
    assert.deepEqual((await hb.getAccount("default")).retention, { output_days: 0 });
    const tag = randomBytes(16).toString("hex");
    const cmd = `echo ${tag} | rev`;
    assert.equal((await box.run(cmd)).stdout, `${reversed(tag)}\n`, "the caller still gets the output");
    const e = await entry(cmd);
    assert.deepEqual([e.kind, e.output_purged], ["exec", true], JSON.stringify(e));
    assert.ok(!e.result?.stdout, JSON.stringify(e));
    const { commands } = await hb.listCommands(box.id);
    assert.ok(!JSON.stringify(commands).includes(reversed(tag)));
    // Lowered: the output kept before goes too.
    assert.ok(commands.every((c) => c.output_purged && !c.result?.stdout), JSON.stringify(commands));
  });

  test("bad requests are refused with their field", async () => {
    await rejectsWith(hb.updateAccount("default", { body: { retention: { history_days: -1 } } }), { status: 400, code: "invalid", field: "retention.history_days" });
    assert.deepEqual((await hb.getAccount("default")).retention, { output_days: 0 }, "unchanged");
    await rejectsWith(hb.listCommands(box.id, { query: { limit: 0 } }), { status: 400, field: "limit" });
    await rejectsWith(hb.listCommands("sbx_00000000000000000000000000"), { status: 404, code: "not_found" });
  });

  test("back to keep forever", async () => {
    assert.deepEqual((await hb.updateAccount("default", { body: { retention: {} } })).retention, {});
    assert.deepEqual((await hb.getAccount("default")).retention, {});
    await box.run("echo kept again");
    const e = await entry("echo kept again");
    assert.deepEqual([e.output_purged, e.result?.stdout], [false, "kept again\n"]);
  });
});

describe("monitoring metrics", { skip }, () => {
  // One sandbox made for this run with monitoring on (the one boot, started
  // early: monitoredBox) gets the server's samples (every 15 s, hareboxd
  // --metrics-interval); the server's Prometheus text is read with the root
  // key, and with keys of one account made for this run: only a key whose
  // actions name getServerMetrics or metrics:read may read it. `after`
  // deletes the sandbox and the account (its keys with it), even when a
  // test failed. The tests need the root key.
  /** @type {HareBox} */
  let hb;
  /** @type {Sandbox} */
  let box;
  /** @type {import("harebox").Account | undefined} */
  let account;
  const run = monitoringRun;
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  /** A client with a new key of this run's account, with these actions ([]: every action). */
  const keyWith = async (actions) => {
    account ??= await hb.createAccount({ body: { name: `ts-sdk-metrics-${run}` } });
    const key = await hb.createKey({ body: { account_id: account.id, description: "sdk-typescript metrics", scope: { actions } } });
    return new HareBox({ url: URL_, apiKey: key.secret });
  };
  /** A gauge's value in the Prometheus text (the sum of its series that match). */
  const gauge = (text, series) =>
    text
      .split("\n")
      .filter((l) => l.startsWith(series + " "))
      .reduce((sum, l) => sum + Number(l.slice(series.length + 1)), 0);

  before(async () => {
    hb = new HareBox();
    box = await monitoredBox();
  });

  after(async () => {
    try {
      const { sandboxes } = await hb.listSandboxes({ query: { label: { "harebox.test/run": run } } });
      for (const s of sandboxes) if (s.state !== "deleted") await hb.deleteSandbox(s.id).catch((e) => console.error(`deleting ${s.id}: ${e}`));
    } finally {
      if (account) await hb.deleteAccount(account.id).catch((e) => console.error(`deleting ${account?.id}: ${e}`));
    }
  });

  test("a monitored sandbox gets samples of its CPU, memory, disk and traffic", async () => {
    assert.equal(box.monitoring, true);
    // The server samples every 15 s: poll every 2 s, for at most 40 s.
    const deadline = Date.now() + 40_000;
    /** @type {import("harebox").MetricSample[]} */
    let samples = [];
    for (;;) {
      ({ samples } = await hb.getSandboxMetrics(box.id));
      if (samples.length > 0 || Date.now() > deadline) break;
      await sleep(2000);
    }
    assert.ok(samples.length > 0, "no sample within 40 s");
    const created = Date.parse(box.created_at);
    for (const s of samples) {
      assert.deepEqual(Object.keys(s).sort(), ["cpu_seconds", "disk_bytes", "memory_bytes", "net_received_bytes", "net_sent_bytes", "sandbox_id", "time"], JSON.stringify(s));
      assert.equal(s.sandbox_id, box.id);
      const t = Date.parse(s.time);
      assert.ok(t >= created - 1000 && t <= Date.now() + 1000, `sample time ${s.time}, created ${box.created_at}`);
      assert.ok(s.cpu_seconds > 0, `cpu_seconds ${s.cpu_seconds}`);
      assert.ok(s.memory_bytes > 0, `memory_bytes ${s.memory_bytes}`);
      for (const f of ["disk_bytes", "net_sent_bytes", "net_received_bytes"]) assert.ok(Number.isSafeInteger(s[f]) && s[f] >= 0, `${f} ${s[f]}`);
    }
    assert.deepEqual(samples.map((s) => s.time), samples.map((s) => s.time).sort((a, b) => Date.parse(a) - Date.parse(b)), "oldest first");

    // The query: limit, from and to; the Sandbox's convenience is the same call.
    const first = samples[0];
    assert.deepEqual((await hb.getSandboxMetrics(box.id, { query: { limit: 1 } })).samples.length, 1);
    assert.ok((await hb.getSandboxMetrics(box.id, { query: { from: first.time } })).samples.some((s) => s.time === first.time), "from is inclusive");
    assert.ok(!(await hb.getSandboxMetrics(box.id, { query: { to: first.time } })).samples.some((s) => s.time === first.time), "to is exclusive");
    assert.deepEqual(await hb.getSandboxMetrics(box.id, { query: { to: box.created_at } }), { samples: [] });
    assert.deepEqual(await hb.getSandboxMetrics(box.id, { query: { from: "2999-01-01T00:00:00Z" } }), { samples: [] });
    assert.deepEqual((await box.metrics({ to: first.time, limit: 10 })).samples, (await hb.getSandboxMetrics(box.id, { query: { to: first.time, limit: 10 } })).samples);
    assert.ok((await box.metrics()).samples.some((s) => s.time === first.time));
  });

  test("bad queries are refused with their field", async () => {
    for (const limit of [0, 10001]) {
      await rejectsWith(hb.getSandboxMetrics(box.id, { query: { limit } }), { status: 400, code: "invalid", field: "limit" });
    }
    await rejectsWith(box.metrics({ limit: 0 }), { status: 400, code: "invalid", field: "limit" });
    await rejectsWith(hb.getSandboxMetrics(box.id, { query: { from: "yesterday" } }), { status: 400, code: "invalid", field: "from" });
    await rejectsWith(hb.getSandboxMetrics(box.id, { query: { to: "2026-13-01" } }), { status: 400, code: "invalid", field: "to" });
    await rejectsWith(hb.getSandboxMetrics("sbx_00000000000000000000000000"), { status: 404, code: "not_found" });
  });

  test("getServerMetrics: the Prometheus text, for the root key", async () => {
    const text = await hb.getServerMetrics();
    assert.equal(typeof text, "string");
    assert.ok(text.includes("harebox_sandboxes{"), text.slice(0, 2000));
    assert.ok(text.includes("go_goroutines"), text.slice(0, 2000));
    assert.match(text, /^# HELP harebox_sandboxes /m);
    assert.match(text, /^# TYPE harebox_sandboxes gauge$/m);
    for (const state of ["creating", "running", "paused", "stopped"]) assert.match(text, new RegExp(`^harebox_sandboxes\\{state="${state}"\\} \\d+$`, "m"), state);
    for (const r of ["vcpus", "memory_mb", "disk_gb"]) assert.match(text, new RegExp(`^harebox_admission_limit\\{resource="${r}"\\} `, "m"), r);
    // This run's sandbox is running (or being sampled just then: busy).
    assert.ok(gauge(text, 'harebox_sandboxes{state="running"}') + gauge(text, "harebox_sandboxes_busy") >= 1, text.slice(0, 2000));
    assert.ok(gauge(text, 'harebox_reserved{resource="vcpus"}') >= 1);
  });

  test("getServerMetrics: a key needs getServerMetrics or metrics:read named in its actions", async () => {
    const reader = await keyWith(["sandboxes:read"]);
    await rejectsWith(reader.getServerMetrics(), { status: 403, code: "forbidden" });
    // A key of another account does not see this run's sandbox or its samples.
    await rejectsWith(reader.getSandboxMetrics(box.id), { status: 404, code: "not_found" });
    // A full key is still its account's: the host's numbers are not.
    for (const actions of [["*"], []]) {
      await rejectsWith((await keyWith(actions)).getServerMetrics(), { status: 403, code: "forbidden" });
    }
    for (const actions of [["metrics:read"], ["getServerMetrics"]]) {
      const text = await (await keyWith(actions)).getServerMetrics();
      assert.ok(text.includes("harebox_sandboxes{") && text.includes("go_goroutines"), String(actions));
    }
  });
});
