// The unmodified E2B SDK against hareboxd's E2B listener, through its
// public API only. e2e/e2b_test.go runs it once per pinned version
// (E2B_SDK names the package: e2b-2.50 creates with POST /sandboxes,
// e2b-2.51 with POST /v2/sandboxes), with E2B_API_URL and E2B_SANDBOX_URL
// pointed at the listener and E2B_API_KEY a HareBox key in E2B's form.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'

const { Sandbox, NotFoundError, CommandExitError, TimeoutError } = await import(process.env.E2B_SDK)
const suite = `${process.env.E2B_SDK}-${process.pid}`
const made = []

// 'base' is HareBox's minimal image here (fast to restore); 'full' its
// Debian image, which has the /bin/bash the SDK's commands and terminals
// run under.
async function create(opts = {}, template = 'base') {
  const sbx = await Sandbox.create(template, { timeoutMs: 300_000, metadata: { suite }, ...opts })
  made.push(sbx)
  return sbx
}

after(async () => {
  for (const s of made) await s.kill().catch(() => {})
})

async function listed(query) {
  const p = Sandbox.list({ query })
  const out = []
  while (p.hasNext) out.push(...(await p.nextItems()))
  return out
}

test('create, info, list by metadata and state, connect, kill', async () => {
  const sbx = await create({ metadata: { suite, role: 'main' } })
  assert.match(sbx.sandboxId, /^[0-9a-z]{26}$/)
  assert.equal(await sbx.isRunning(), true)

  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.templateId, 'base')
  assert.deepEqual(info.metadata, { suite, role: 'main' })
  assert.equal(info.state, 'running')
  assert.ok(info.endAt > info.startedAt)

  const other = await create({ metadata: { suite, role: 'other' } })
  const mains = await listed({ metadata: { suite, role: 'main' } })
  assert.deepEqual(mains.map((s) => s.sandboxId), [sbx.sandboxId])
  const running = await listed({ metadata: { suite }, state: ['running'] })
  assert.deepEqual(running.map((s) => s.sandboxId).sort(), [sbx.sandboxId, other.sandboxId].sort())
  assert.deepEqual(await listed({ metadata: { suite }, state: ['paused'] }), [])

  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal(again.sandboxId, sbx.sandboxId)
  await again.files.write('/tmp/through-connect', 'connected')
  assert.equal(await sbx.files.read('/tmp/through-connect'), 'connected')

  assert.equal(await Sandbox.kill(other.sandboxId), true)
  assert.equal(await Sandbox.kill(other.sandboxId), false)
  assert.deepEqual((await listed({ metadata: { suite, role: 'other' } })).map((s) => s.sandboxId), [])
  await assert.rejects(Sandbox.connect(other.sandboxId), NotFoundError)
  await assert.rejects(Sandbox.getInfo(other.sandboxId), NotFoundError)
})

test('files: text and bytes both ways, the home by default', async () => {
  const sbx = await create()
  await sbx.files.write('hello.txt', 'hello from the SDK\n')
  assert.equal(await sbx.files.read('/home/user/hello.txt'), 'hello from the SDK\n')
  const bytes = new Uint8Array(256 * 1024).map((_, i) => (i * 7) & 0xff)
  await sbx.files.write('/tmp/blob.bin', bytes)
  const back = await sbx.files.read('/tmp/blob.bin', { format: 'bytes' })
  assert.equal(Buffer.compare(Buffer.from(back), Buffer.from(bytes)), 0)
  await assert.rejects(sbx.files.read('/tmp/no-such-file'), NotFoundError)
})

test('a timeout set after create really ends the sandbox', async () => {
  const sbx = await create()
  await sbx.setTimeout(3_000)
  const info = await sbx.getInfo()
  assert.ok(info.endAt.getTime() - Date.now() < 10_000, `endAt ${info.endAt.toISOString()}`)
  const deadline = Date.now() + 90_000
  while (Date.now() < deadline) {
    if ((await listed({ metadata: { suite } })).every((s) => s.sandboxId !== sbx.sandboxId)) break
    await new Promise((r) => setTimeout(r, 1_000))
  }
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), NotFoundError)
})

test('bad input: an unknown template, an unknown or killed sandbox', async () => {
  await assert.rejects(Sandbox.create('no-such-template', { timeoutMs: 60_000 }), (e) => {
    assert.match(String(e.message), /template/i)
    return true
  })
  await assert.rejects(Sandbox.connect('0'.repeat(26)), NotFoundError)
  const sbx = await create()
  await sbx.kill()
  assert.equal(await sbx.isRunning(), false)
  await assert.rejects(sbx.files.write('/tmp/after-kill', 'x'))
  await assert.rejects(Sandbox.connect(sbx.sandboxId), NotFoundError)
})

test('files: list with depth, exists, info, makeDir, rename, remove, watch', async () => {
  const sbx = await create()
  assert.equal(await sbx.files.makeDir('/tmp/tree/a/b'), true)
  assert.equal(await sbx.files.makeDir('/tmp/tree/a/b'), false)
  await sbx.files.write('/tmp/tree/a/one.txt', 'one')
  await sbx.files.write('/tmp/tree/a/b/two.txt', 'two!')

  const top = await sbx.files.list('/tmp/tree')
  assert.deepEqual(top.map((e) => [e.name, e.type]), [['a', 'dir']])
  const deep = await sbx.files.list('/tmp/tree', { depth: 3 })
  assert.deepEqual(deep.map((e) => e.path).sort(), ['/tmp/tree/a', '/tmp/tree/a/b', '/tmp/tree/a/b/two.txt', '/tmp/tree/a/one.txt'])

  assert.equal(await sbx.files.exists('/tmp/tree/a/one.txt'), true)
  assert.equal(await sbx.files.exists('/tmp/tree/nope'), false)
  const info = await sbx.files.getInfo('/tmp/tree/a/b/two.txt')
  assert.equal(info.name, 'two.txt')
  assert.equal(info.type, 'file')
  assert.equal(info.size, 4)
  assert.equal(info.path, '/tmp/tree/a/b/two.txt')
  assert.ok(info.modifiedTime instanceof Date)

  const moved = await sbx.files.rename('/tmp/tree/a/one.txt', '/tmp/tree/uno.txt')
  assert.equal(moved.path, '/tmp/tree/uno.txt')
  assert.equal(await sbx.files.read('/tmp/tree/uno.txt'), 'one')
  assert.equal(await sbx.files.exists('/tmp/tree/a/one.txt'), false)

  await sbx.files.remove('/tmp/tree/a')
  assert.equal(await sbx.files.exists('/tmp/tree/a/b/two.txt'), false)
  await assert.rejects(sbx.files.getInfo('/tmp/tree/a'), NotFoundError)

  // A watch sees what the guest does after it starts.
  const events = []
  const handle = await sbx.files.watchDir('/tmp/tree', (e) => events.push(e))
  await sbx.files.write('/tmp/tree/seen.txt', 'x')
  const deadline = Date.now() + 20_000
  while (!events.some((e) => e.name === 'seen.txt') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200))
  await handle.stop()
  assert.ok(events.some((e) => e.name === 'seen.txt'), `events: ${JSON.stringify(events)}`)
})

const until = async (what, ok, ms = 20_000) => {
  const deadline = Date.now() + ms
  while (!ok()) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

test('commands: output, exit codes, env, cwd, user, timeouts, background, stdin, connect, kill', async () => {
  const sbx = await create({}, 'full')
  const seen = []
  const r = await sbx.commands.run('echo hello; echo oops >&2', { onStdout: (d) => seen.push(d) })
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello\n')
  assert.equal(r.stderr, 'oops\n')
  assert.equal(seen.join(''), 'hello\n')

  await assert.rejects(sbx.commands.run('exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)
  const who = await sbx.commands.run('echo $FOO; pwd; whoami', { envs: { FOO: 'bar' }, cwd: '/tmp', user: 'root' })
  assert.equal(who.stdout, 'bar\n/tmp\nroot\n')
  assert.equal((await sbx.commands.run('whoami; pwd')).stdout, 'user\n/home/user\n')
  await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 2_000 }), TimeoutError)

  // Background, listed, killed.
  const bg = await sbx.commands.run('sleep 120', { background: true, timeoutMs: 0 })
  assert.ok(bg.pid > 0)
  assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid))
  assert.equal(await sbx.commands.kill(bg.pid), true)
  await assert.rejects(bg.wait())
  assert.equal(await sbx.commands.kill(bg.pid), false)

  // Stdin: sent, then closed.
  const cat = await sbx.commands.run('cat', { background: true, stdin: true, timeoutMs: 0 })
  await sbx.commands.sendStdin(cat.pid, 'ping\n')
  await sbx.commands.closeStdin(cat.pid)
  const catted = await cat.wait()
  assert.equal(catted.stdout, 'ping\n')

  // Connect to a running command from elsewhere, and read on to its end.
  const slow = await sbx.commands.run('for i in 1 2 3; do echo $i; sleep 1; done; exit 4', { background: true })
  const again = await sbx.commands.connect(slow.pid)
  await assert.rejects(again.wait(), (e) => e instanceof CommandExitError && e.exitCode === 4)
})

test('pty: input, resize, kill', async () => {
  const sbx = await create({}, 'full')
  let out = ''
  const dec = new TextDecoder()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) }, timeoutMs: 60_000 })
  const enc = new TextEncoder()
  await sbx.pty.sendInput(term.pid, enc.encode('echo $((6*7))\n'))
  await until('the terminal to answer 42', () => out.includes('42'))
  await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(term.pid, enc.encode('stty size\n'))
  await until('the new size', () => out.includes('30 100'))
  assert.equal(await sbx.pty.kill(term.pid), true)
  await assert.rejects(term.wait())
})

test('network rules hold on the host: root in the guest cannot lift them', async () => {
  // api.harebox.internal is the HareBox API, reached through the host's
  // egress proxy only when the sandbox's rules name it.
  const probe = `python3 -c "
import urllib.request
try:
    print(urllib.request.urlopen('http://api.harebox.internal/health', timeout=10).status)
except Exception as e:
    print('blocked', type(e).__name__)
"`
  const rules = { allowOut: ['api.harebox.internal'], denyOut: ['0.0.0.0/0'] }
  const sbx = await create({ network: rules }, 'full')
  assert.equal((await sbx.commands.run(probe)).stdout.trim(), '200')

  // Closed from outside (what an update leaves out is cleared): root in
  // the guest drops every rule it has, and the host's still hold.
  await sbx.updateNetwork({ allowInternetAccess: false })
  assert.match((await sbx.commands.run(probe)).stdout, /^blocked/)
  await sbx.commands.run('nft flush ruleset 2>/dev/null; iptables -F 2>/dev/null; true', { user: 'root' })
  assert.match((await sbx.commands.run(probe, { user: 'root' })).stdout, /^blocked/)
  await sbx.updateNetwork(rules)
  assert.equal((await sbx.commands.run(probe)).stdout.trim(), '200')

  const closed = await create({ allowInternetAccess: false }, 'full')
  assert.match((await closed.commands.run(probe)).stdout, /^blocked/)
})
