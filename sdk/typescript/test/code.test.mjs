// The code interpreter through a real hareboxd: cells in a running sandbox
// made from the code-interpreter image, named by
// HAREBOX_TEST_CODE_SANDBOX. They read HAREBOX_URL, HAREBOX_API_KEY and
// HAREBOX_CA as the client does; without HAREBOX_URL or
// HAREBOX_TEST_CODE_SANDBOX they are skipped. They boot nothing: they run
// in contexts they make in that sandbox and delete, so its default
// contexts are left as they were.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Execution, HareBox, HareBoxError, Result } from "harebox";

const SANDBOX = process.env.HAREBOX_TEST_CODE_SANDBOX ?? "";
const skip = !process.env.HAREBOX_URL
  ? 'HAREBOX_URL is not set: these tests need a running hareboxd (eval "$(scripts/devserver.sh)" from the repository root)'
  : !SANDBOX
  ? "HAREBOX_TEST_CODE_SANDBOX is not set: these tests need a running sandbox made from the code-interpreter image"
  : false;

const PNG_SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];

describe("the code interpreter", { skip }, () => {
  /** @type {import("harebox").Sandbox} */
  let box;
  /** A python context of the tests' own, deleted at the end. */
  let ctx = "";

  before(async () => {
    const hb = new HareBox();
    box = await hb.getSandbox(SANDBOX);
    assert.equal(box.state, "running", `HAREBOX_TEST_CODE_SANDBOX ${SANDBOX} is ${box.state}, not running`);
    const made = await box.createCodeContext();
    assert.equal(made.language, "python");
    assert.ok(made.cwd);
    ctx = made.id;
  });

  after(async () => {
    if (ctx) await box.deleteCodeContext(ctx);
  });

  test("state lasts from one cell to the next", async () => {
    const first = await box.runCode("x = 41", { context: ctx });
    const second = await box.runCode("x + 1", { context: ctx });
    assert.ok(second instanceof Execution);
    assert.deepEqual([first.status, first.text, first.error], ["ok", undefined, undefined]);
    assert.deepEqual([second.status, second.text, second.context_id], ["ok", "42", ctx]);
    assert.equal(second.execution_count, first.execution_count + 1);
    assert.deepEqual(second.mainResult?.formats(), ["text"]);
  });

  test("a chart is a PNG", async () => {
    const x = await box.runCode(
      "import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(4, 3), dpi=100)\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()",
      { context: ctx },
    );
    assert.equal(x.status, "ok", JSON.stringify(x.error));
    const charts = x.results.filter((r) => r.png);
    assert.equal(charts.length, 1, JSON.stringify(x.results.map((r) => r.formats())));
    const chart = charts[0];
    assert.ok(chart instanceof Result && chart.png instanceof Uint8Array);
    assert.deepEqual([...chart.png.subarray(0, 8)], PNG_SIGNATURE);
    assert.ok(chart.width !== undefined && chart.width > 0 && chart.height !== undefined && chart.height > 0, `${chart.width}x${chart.height}`);
    // The size is the PNG's own (its IHDR chunk).
    const ihdr = new DataView(chart.png.buffer, chart.png.byteOffset + 16, 8);
    assert.deepEqual([ihdr.getUint32(0), ihdr.getUint32(4)], [chart.width, chart.height]);
    assert.ok(chart.formats().includes("png"));
  });

  test("a DataFrame is an HTML table", async () => {
    const x = await box.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})", { context: ctx });
    assert.equal(x.status, "ok", JSON.stringify(x.error));
    assert.match(x.mainResult?.html ?? "", /<table/);
    assert.match(x.text ?? "", /a\s+b/);
  });

  test("callbacks get the output as it comes", async () => {
    /** @type {[number, string][]} */
    const got = [];
    /** @type {Result[]} */
    const results = [];
    const x = await box.runCode("import time\nprint('a', flush=True)\ntime.sleep(2)\nprint('b')\n6 * 7", {
      context: ctx,
      onStdout: (text) => void got.push([Date.now(), text]),
      onResult: (r) => void results.push(r),
    });
    const ended = Date.now();
    assert.equal(got.map(([, t]) => t).join(""), "a\nb\n");
    assert.equal(x.stdout, "a\nb\n");
    assert.ok(got[0][1].startsWith("a"));
    // The first line came while the cell still slept, not with its end.
    assert.ok(ended - got[0][0] >= 1000, `stdout came ${ended - got[0][0]} ms before the end`);
    assert.deepEqual(results.map((r) => r.text), ["42"]);
    assert.equal(x.text, "42");
    assert.deepEqual(x.results, results);
  });

  test("an exception is the cell's error", async () => {
    const x = await box.runCode("def f():\n    return 1 / 0\nf()", { context: ctx });
    assert.equal(x.status, "error");
    assert.equal(x.error?.name, "ZeroDivisionError");
    assert.match(x.error?.traceback ?? "", /1 \/ 0/);
    // Streamed, onError gets the same error.
    const errors = [];
    const y = await box.runCode("f()", { context: ctx, onError: (e) => void errors.push(e) });
    assert.equal(y.status, "error");
    assert.equal(y.error?.name, "ZeroDivisionError");
    assert.deepEqual(errors, [y.error]);
  });

  test("contexts are kernels of their own", async () => {
    const shell = await box.createCodeContext({ language: "bash", cwd: "/tmp" });
    try {
      assert.deepEqual([shell.language, shell.cwd], ["bash", "/tmp"]);
      const listed = (await box.codeContexts()).map((c) => c.id);
      assert.ok(listed.includes(shell.id) && listed.includes(ctx), JSON.stringify(listed));
      await box.runCode("X=5", { context: shell });
      assert.equal((await box.runCode("echo $X $PWD", { context: shell })).stdout, "5 /tmp\n");
      const failed = await box.runCode("false", { context: shell });
      assert.deepEqual([failed.error?.name, failed.error?.value], ["ExitCode", "1"]);
      // A restart loses the state.
      assert.equal((await box.restartCodeContext(shell.id)).id, shell.id);
      assert.equal((await box.runCode("echo ${X:-unset}", { context: shell })).stdout, "unset\n");
    } finally {
      await box.deleteCodeContext(shell.id);
    }
    assert.ok(!(await box.codeContexts()).some((c) => c.id === shell.id));
    await assert.rejects(box.runCode("echo hi", { context: shell.id }), (e) => e instanceof HareBoxError);
  });
});
