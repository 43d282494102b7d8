// HareBox code interpreter kernel: the state of one JavaScript (or
// TypeScript) context.
//
// The server (server.py) starts one per JavaScript context, as `node
// --expose-internals --experimental-vm-modules interpreter_kernel.js REQ
// EVENTS LANGUAGE` (the first for Node's REPL rewrite of a top-level
// await, the second for import() in a cell), and speaks
// to it as to the Python kernel (interpreter_kernel.py says the protocol):
// requests come on the socket REQ, one at a time, and events go on the
// socket EVENTS, tagged with their request's cell.
//
// Cells run in this process's own global scope, as in Node's REPL: a
// top-level `let`, `const` or `class` becomes a global, so a later cell
// sees it and may declare it again; `await` works at top level (Node's
// REPL rewrite). A cell's value is its last
// expression, shown as util.inspect shows it, or as the MIME bundle its
// [Symbol.for("Jupyter.display")]() returns (Deno's convention). What the
// cell writes through process.stdout and process.stderr (console.*) is its
// output; a child process's inherited descriptors lead nowhere. SIGINT
// interrupts a running cell (a loop, or an await) and is ignored between
// cells. Math.random draws from the kernel's /dev/urandom, so forks of a
// sandbox do not share it. A TypeScript context's cells are transpiled
// first (TypeScript's transpileModule: types erased, not checked).
//
// Events are written synchronously, each with one write if it can be:
// a cell that loops without yielding still has its output sent (and is
// held back when the server reads slowly), and one broken by SIGINT
// mid-event leaves the rest of it to be written before the next one, so
// no line is ever cut. (Hence two sockets: Node makes the one it reads
// requests from non-blocking.)
'use strict';

const fs = require('fs');
const net = require('net');
const path = require('path');
const util = require('util');
const vm = require('vm');
const { createRequire } = require('module');
const { pathToFileURL } = require('url');
const acorn = require('internal/deps/acorn/acorn/dist/acorn');
const { processTopLevelAwait } = require('internal/repl/await');

const CHUNK = 64 << 10; // most characters in one stdout/stderr event
const FLUSH_AFTER = 50; // ms printed text may wait before it is sent
const DISPLAY = Symbol.for('Jupyter.display');

const requests = new net.Socket({ fd: Number(process.argv[2]), readable: true, writable: false });
const events = Number(process.argv[3]);
const typescript = process.argv[4] === 'typescript' ? loadTypeScript() : null;

// loadTypeScript finds the compiler: as Node resolves it, else where
// Debian's node-typescript puts it.
function loadTypeScript() {
  for (const name of ['typescript', '/usr/share/nodejs/typescript']) {
    try {
      return require(name);
    } catch {}
  }
  throw new Error('TypeScript is not installed');
}

// transpile turns a TypeScript cell into JavaScript, or throws its first
// syntax error.
function transpile(code) {
  const out = typescript.transpileModule(code, {
    compilerOptions: { target: typescript.ScriptTarget.ES2022, module: typescript.ModuleKind.ESNext },
    reportDiagnostics: true,
  });
  const d = out.diagnostics?.[0];
  if (d) {
    let where = '';
    if (d.file && d.start !== undefined) {
      const { line, character } = d.file.getLineAndCharacterOfPosition(d.start);
      where = ` (${line + 1}:${character + 1})`;
    }
    throw new SyntaxError(typescript.flattenDiagnosticMessageText(d.messageText, '\n') + where);
  }
  return out.outputText;
}
let cell = 0; // the request being answered
let count = 0; // cells run that the user sees
let running = null; // the running cell's interrupt, if it awaits

// outbox holds what is still to be written: an event cut short by SIGINT
// is finished before the next.
let outbox = Buffer.alloc(0);
function send(ev) {
  ev.cell = cell;
  outbox = Buffer.concat([outbox, Buffer.from(JSON.stringify(ev) + '\n')]);
  while (outbox.length > 0) {
    let n;
    try {
      n = fs.writeSync(events, outbox);
    } catch (err) {
      if (err.code === 'EAGAIN' || err.code === 'EINTR') continue;
      process.exit(0); // the server is gone
    }
    outbox = outbox.subarray(n);
  }
}

// Output: kept until FLUSH_AFTER has passed, CHUNK characters, the end of
// the tick, or a result, then sent.
const pending = { stdout: '', stderr: '' };
let since = 0; // when the oldest pending text was written
let flushing = false;
function flush() {
  flushing = false;
  for (const name of ['stdout', 'stderr']) {
    const text = pending[name];
    pending[name] = '';
    for (let i = 0; i < text.length; i += CHUNK) send({ type: name, text: text.slice(i, i + CHUNK) });
  }
}
function capture(stream, name) {
  const decoder = new (require('string_decoder').StringDecoder)('utf8');
  stream.write = (chunk, encoding, cb) => {
    if (typeof encoding === 'function') [cb, encoding] = [encoding, undefined];
    const now = Date.now();
    if (!pending.stdout && !pending.stderr) since = now;
    pending[name] += typeof chunk === 'string' ? chunk : decoder.write(Buffer.from(chunk, encoding));
    // (A cell that loops never lets setImmediate run: it is flushed here.)
    if (pending[name].length >= CHUNK || now - since >= FLUSH_AFTER) flush();
    else if (!flushing) {
      flushing = true;
      setImmediate(flush);
    }
    if (cb) process.nextTick(cb);
    return true;
  };
}
capture(process.stdout, 'stdout');
capture(process.stderr, 'stderr');

// Node's warnings as the cell's output, but for the experimental flag's
// own (import() in a cell uses it: not the user's doing).
process.removeAllListeners('warning');
process.on('warning', (w) => {
  if (w.name === 'ExperimentalWarning' && /VM Modules|vm\.USE_MAIN_CONTEXT/.test(w.message)) return;
  process.stderr.write(`(node) ${w.name}: ${w.message}\n`);
});

// What a cell left running reports where the cell would have.
process.on('uncaughtException', (err) => process.stderr.write(`Uncaught ${inspectError(err)}\n`));
process.on('unhandledRejection', (err) => process.stderr.write(`Uncaught (in promise) ${inspectError(err)}\n`));
process.on('SIGINT', () => {
  if (running) running(); // (a synchronous cell is broken by vm's breakOnSigint)
});

// Math.random from the kernel's generator, a page at a time; a fork's
// machine gets new pages (reseed, below).
const urandom = fs.openSync('/dev/urandom', 'r');
const pool = Buffer.alloc(4096);
let at = pool.length;
Math.random = function random() {
  if (at + 8 > pool.length) {
    fs.readSync(urandom, pool, 0, pool.length, null);
    at = 0;
  }
  const hi = pool.readUInt32BE(at) >>> 5; // 27 bits
  const lo = pool.readUInt32BE(at + 4) >>> 6; // 26 bits
  at += 8;
  return (hi * 67108864 + lo) / 9007199254740992;
};
globalThis[Symbol.for('harebox.reseed')] = () => {
  at = pool.length;
};

// Modules resolve from the context's working directory, as a script there
// would: require, and import() (a package only require finds, else as
// Node resolves it from this file).
globalThis.require = createRequire(path.join(process.cwd(), '<cell>'));
function importer(specifier) {
  let target = specifier;
  if (/^\.{0,2}\//.test(specifier)) target = pathToFileURL(path.resolve(process.cwd(), specifier)).href;
  else {
    try {
      const found = globalThis.require.resolve(specifier);
      target = path.isAbsolute(found) ? pathToFileURL(found).href : found;
    } catch {}
  }
  return import(target);
}

function inspectError(err) {
  try {
    if (err instanceof Error) return err.stack || `${err.name}: ${err.message}`;
    return util.inspect(err);
  } catch {
    return 'a value that cannot be shown';
  }
}

// A thrown value as the protocol's error: its frames in the cell only.
// (Anything may be thrown, an object whose getters throw too.)
function errorEvent(err) {
  try {
    return describe(err);
  } catch {
    return { type: 'error', name: 'Error', value: 'a value that cannot be shown was thrown', traceback: [] };
  }
}

function describe(err) {
  const isError = err instanceof Error;
  const name = isError ? err.name : 'Error';
  const value = isError ? err.message : util.inspect(err);
  let traceback = [];
  if (isError && typeof err.stack === 'string') {
    traceback = err.stack.split('\n');
    const cut = traceback.findIndex((l) => /\(?node:(vm|internal)|interpreter_kernel\.js/.test(l));
    if (cut > 0) traceback = traceback.slice(0, cut);
  }
  return { type: 'error', name, value, traceback };
}

// Top-level declarations as globals: `let`/`const` become `var`, `class
// C {}` becomes `var C = class C {}`. Code that does not parse is left as
// it is, for vm to say why.
function globalize(code) {
  let ast;
  try {
    ast = acorn.parse(code, { ecmaVersion: 'latest', sourceType: 'script', allowAwaitOutsideFunction: true });
  } catch {
    return code;
  }
  const edits = [];
  for (const node of ast.body) {
    if (node.type === 'VariableDeclaration' && node.kind !== 'var') {
      edits.push([node.start, node.start + node.kind.length, 'var']);
    } else if (node.type === 'ClassDeclaration') {
      edits.push([node.start, node.start, `var ${node.id.name} = `], [node.end, node.end, ';']);
    }
  }
  for (const [from, to, text] of edits.reverse()) code = code.slice(0, from) + text + code.slice(to);
  return code;
}

// objectLiteral reads a cell that starts with "{" as an object, not a
// block, as the REPL does, when it compiles as one (check throws if not).
function objectLiteral(code, check) {
  if (!/^\s*{/.test(code) || /;\s*$/.test(code)) return code;
  try {
    check(`(${code})`);
    return `(${code})`;
  } catch {
    return code;
  }
}

// run evaluates code and gives its value; one that awaits is awaited,
// until SIGINT.
async function run(code, file) {
  if (typescript) code = transpile(objectLiteral(code, transpile));
  else code = objectLiteral(code, (c) => new vm.Script(c));
  code = globalize(code);
  let wrapped = null;
  if (code.includes('await')) {
    try {
      wrapped = processTopLevelAwait(code);
    } catch {
      wrapped = null; // vm says what is wrong with it
    }
  }
  const script = new vm.Script(wrapped ?? code, { filename: file, importModuleDynamically: importer });
  const value = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
  if (wrapped === null) return value;
  const interrupted = new Promise((_, reject) => {
    running = () => reject(Object.assign(new Error('Script execution was interrupted by `SIGINT`'), { name: 'KeyboardInterrupt' }));
  });
  try {
    const result = await Promise.race([value, interrupted]);
    return result?.value;
  } finally {
    running = null;
  }
}

function show(value) {
  if (value !== null && (typeof value === 'object' || typeof value === 'function') && typeof value[DISPLAY] === 'function') {
    try {
      const bundle = value[DISPLAY]();
      if (bundle && typeof bundle === 'object') {
        const data = {};
        for (const [k, v] of Object.entries(bundle)) {
          if (typeof v === 'string' || k === 'application/json') data[k] = v;
        }
        if (!('text/plain' in data)) data['text/plain'] = util.inspect(value);
        return data;
      }
    } catch (err) {
      process.stderr.write(`display: ${inspectError(err)}\n`);
    }
  }
  return { 'text/plain': util.inspect(value) };
}

async function answer(req) {
  cell = req.cell;
  const silent = Boolean(req.silent);
  send({ type: 'start' });
  if (!silent) send({ type: 'count', count: ++count });
  let ok = true;
  // (A turn of the event loop after the cell: what it queued for the
  // next tick, a warning Node emits for one, is its output too.)
  const settle = () => new Promise((resolve) => setImmediate(resolve));
  try {
    const value = await run(String(req.code), `<cell ${silent ? 'internal' : count}>`);
    await settle();
    flush();
    if (!silent && value !== undefined) send({ type: 'result', main: true, data: show(value), metadata: {} });
  } catch (err) {
    ok = false;
    await settle();
    flush();
    send(errorEvent(err));
  }
  flush();
  send({ type: 'done', status: ok ? 'ok' : 'error' });
}

// Requests, one a line, answered one at a time.
let buf = '';
let queue = Promise.resolve();
requests.setEncoding('utf8');
requests.on('data', (data) => {
  buf += data;
  let i;
  while ((i = buf.indexOf('\n')) >= 0) {
    const line = buf.slice(0, i);
    buf = buf.slice(i + 1);
    let req;
    try {
      req = JSON.parse(line);
    } catch {
      continue;
    }
    // (A request that failed in the kernel's own code still ends, and
    // the next one is still answered.)
    queue = queue.then(() => answer(req)).catch((err) => {
      send({ type: 'error', name: 'InternalError', value: String(err?.message ?? 'the kernel failed'), traceback: [] });
      send({ type: 'done', status: 'error' });
    });
  }
});
requests.on('end', () => process.exit(0)); // the server is gone
send({ type: 'ready' });
