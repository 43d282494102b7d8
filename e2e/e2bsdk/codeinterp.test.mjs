// The unmodified @e2b/code-interpreter package (npm) against hareboxd's
// E2B listener: cells in the code-interpreter sandbox E2B_TEST_SANDBOX
// names (e2e's TestCodeInterpreter made it; the SDK connects to it).
import assert from "node:assert/strict";
import { test } from "node:test";

import { Sandbox } from "@e2b/code-interpreter";

const PNG = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

test("runCode, charts, errors, streaming and contexts", async () => {
  const sbx = await Sandbox.connect(process.env.E2B_TEST_SANDBOX);
  await sbx.runCode("e2b_x = 1");
  const two = await sbx.runCode("e2b_x + 1");
  assert.equal(two.text, "2");
  assert.ok(two.executionCount > 0);

  const plot = await sbx.runCode("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()");
  const chart = plot.results.find((r) => r.png);
  assert.ok(chart, JSON.stringify(plot.results.map((r) => r.formats())));
  assert.ok(Buffer.from(chart.png, "base64").subarray(0, 8).equals(PNG));
  assert.ok(chart.formats().includes("png"));
  // The figure as data: result.chart.
  assert.equal(chart.chart.type, "line");
  assert.deepEqual(chart.chart.elements[0].points, [[1, 1], [2, 4], [3, 9]]);

  const frame = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})");
  assert.match(frame.results[0].html, /<table/);

  // Output as it comes, outside ASCII included.
  const lines = [];
  const said = await sbx.runCode("print('café 😀')", { onStdout: (m) => lines.push(m.line) });
  assert.deepEqual(said.logs.stdout, ["café 😀\n"]);
  assert.deepEqual(lines, ["café 😀\n"]);

  const failed = await sbx.runCode("1 / 0");
  assert.equal(failed.error?.name, "ZeroDivisionError");
  assert.match(failed.error?.traceback ?? "", /ZeroDivisionError/);

  // A context of its own shares nothing but the filesystem.
  const ctx = await sbx.createCodeContext();
  assert.ok(ctx.id);
  const isolated = await sbx.runCode("e2b_x", { context: ctx });
  assert.equal(isolated.error?.name, "NameError");
  assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id));
  await sbx.restartCodeContext(ctx);
  await sbx.removeCodeContext(ctx);
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id));

  // Bash, by language.
  const sh = await sbx.runCode("echo $((6 * 7))", { language: "bash" });
  assert.deepEqual(sh.logs.stdout, ["42\n"]);

  // JavaScript, by language, and in a context of its own.
  await sbx.runCode("const jsx = 40", { language: "javascript" });
  const js = await sbx.runCode("console.log('js'); jsx + (await Promise.resolve(2))", { language: "javascript" });
  assert.equal(js.text, "42");
  assert.deepEqual(js.logs.stdout, ["js\n"]);
  const jsctx = await sbx.createCodeContext({ language: "javascript" });
  assert.equal(jsctx.language, "javascript");
  const jsFailed = await sbx.runCode("jsx", { context: jsctx });
  assert.equal(jsFailed.error?.name, "ReferenceError");
  await sbx.removeCodeContext(jsctx);
  const ts = await sbx.runCode("const tsx: number = 6 * 7; tsx", { language: "typescript" });
  assert.equal(ts.text, "42");
});
