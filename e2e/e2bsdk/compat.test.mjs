// The unmodified E2B SDK against hareboxd's E2B listener, through its
// public API only. e2e/clients/e2b_test.go runs it once per pinned version
// (E2B_SDK names the package: e2b-2.50 creates with POST /sandboxes,
// e2b-2.51 with POST /v2/sandboxes), with E2B_API_URL and E2B_SANDBOX_URL
// pointed at the listener and E2B_API_KEY a HareBox key in E2B's form.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'

const { Sandbox, Volume, NotFoundError, CommandExitError, TimeoutError } = await import(process.env.E2B_SDK)
const suite = `${process.env.E2B_SDK}-${process.pid}`
const made = []

// 'base' is HareBox's minimal image here (fast to restore); 'full' its
// Debian image, which has the /bin/bash the SDK's commands and terminals
// run under.
// create makes a sandbox that goes when test t ends (the host holds 8 at
// once), or at the end of the suite if t's end is cut short.
async function create(t, opts = {}, template = 'base') {
  const sbx = await Sandbox.create(template, { timeoutMs: 300_000, metadata: { suite }, ...opts })
  made.push(sbx)
  t.after(() => sbx.kill().catch(() => {}))
  return sbx
}

after(async () => {
  for (const s of made) await s.kill().catch(() => {})
})

async function listed(query, opts = {}) {
  const p = Sandbox.list({ query, ...opts })
  const out = []
  while (p.hasNext) out.push(...(await p.nextItems()))
  return out
}

test('create, info, list by metadata and state, connect, kill', async (t) => {
  const sbx = await create(t, { metadata: { suite, role: 'main' } })
  assert.match(sbx.sandboxId, /^[0-9a-z]{26}$/)
  assert.equal(await sbx.isRunning(), true)

  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.templateId, 'base')
  assert.deepEqual(info.metadata, { suite, role: 'main' })
  assert.equal(info.state, 'running')
  assert.ok(info.endAt > info.startedAt)

  const other = await create(t, { metadata: { suite, role: 'other' } })
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

test('files: text, bytes and streams both ways, the home by default', async (t) => {
  const sbx = await create(t)
  await sbx.files.write('hello.txt', 'hello from the SDK\n')
  assert.equal(await sbx.files.read('/home/user/hello.txt'), 'hello from the SDK\n')
  const bytes = new Uint8Array(256 * 1024).map((_, i) => (i * 7) & 0xff)
  await sbx.files.write('/tmp/blob.bin', bytes)
  const back = await sbx.files.read('/tmp/blob.bin', { format: 'bytes' })
  assert.equal(Buffer.compare(Buffer.from(back), Buffer.from(bytes)), 0)
  // Streams both ways: written from a ReadableStream in chunks, read as one.
  const chunks = [bytes.subarray(0, 100_000), bytes.subarray(100_000)]
  await sbx.files.write('/tmp/streamed.bin', new ReadableStream({
    pull(c) { chunks.length ? c.enqueue(chunks.shift()) : c.close() },
  }))
  const parts = []
  for await (const part of await sbx.files.read('/tmp/streamed.bin', { format: 'stream' })) parts.push(part)
  assert.equal(Buffer.compare(Buffer.concat(parts), Buffer.from(bytes)), 0)
  await assert.rejects(sbx.files.read('/tmp/no-such-file'), NotFoundError)
})

test('files: an oversized upload, a download left unread', async (t) => {
  const sbx = await create(t)
  // The server's limit is 32 MiB a file (e2e/clients/e2b_test.go): an upload
  // over it is refused and leaves no file.
  await assert.rejects(sbx.files.write('/tmp/too-big', new Uint8Array((32 << 20) + 1)), (e) => {
    assert.match(String(e.message), /413.*33554432-byte limit/)
    return true
  })
  assert.equal(await sbx.files.exists('/tmp/too-big'), false)
  // A download far larger than the sockets hold, left unread: the
  // sandbox goes on answering, and the stream can still be dropped.
  await sbx.files.write('/tmp/big', new Uint8Array(24 << 20))
  const stream = await sbx.files.read('/tmp/big', { format: 'stream' })
  await sbx.files.write('/tmp/after', 'still here')
  assert.equal(await sbx.files.read('/tmp/after'), 'still here')
  assert.equal((await sbx.files.getInfo('/tmp/big')).size, 24 << 20)
  await stream.cancel()
})

test('a timeout set after create really ends the sandbox', async (t) => {
  const sbx = await create(t)
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

test('bad input: an unknown template, an unknown or killed sandbox', async (t) => {
  await assert.rejects(Sandbox.create('no-such-template', { timeoutMs: 60_000 }), (e) => {
    assert.match(String(e.message), /template/i)
    return true
  })
  await assert.rejects(Sandbox.connect('0'.repeat(26)), NotFoundError)
  const sbx = await create(t)
  await sbx.kill()
  assert.equal(await sbx.isRunning(), false)
  await assert.rejects(sbx.files.write('/tmp/after-kill', 'x'))
  await assert.rejects(Sandbox.connect(sbx.sandboxId), NotFoundError)
})

test('files: list with depth, exists, info, makeDir, rename, remove, watch', async (t) => {
  const sbx = await create(t)
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

test('commands: output, exit codes, env, cwd, user, timeouts, background, stdin, connect, kill', async (t) => {
  const sbx = await create(t, {}, 'full')
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

test('pty: input, resize, kill', async (t) => {
  const sbx = await create(t, {}, 'full')
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

test('network rules hold on the host: root in the guest cannot lift them', async (t) => {
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
  const sbx = await create(t, { network: rules }, 'full')
  assert.equal((await sbx.commands.run(probe)).stdout.trim(), '200')

  // Closed from outside (what an update leaves out is cleared): root in
  // the guest drops every rule it has, and the host's still hold.
  await sbx.updateNetwork({ allowInternetAccess: false })
  assert.match((await sbx.commands.run(probe)).stdout, /^blocked/)
  await sbx.commands.run('nft flush ruleset 2>/dev/null; iptables -F 2>/dev/null; true', { user: 'root' })
  assert.match((await sbx.commands.run(probe, { user: 'root' })).stdout, /^blocked/)
  await sbx.updateNetwork(rules)
  assert.equal((await sbx.commands.run(probe)).stdout.trim(), '200')

  const closed = await create(t, { allowInternetAccess: false }, 'full')
  assert.match((await closed.commands.run(probe)).stdout, /^blocked/)
})

// get fetches / through the listener with Host: host, as a browser that
// resolves *.DOMAIN to it would.
function get(host, headers = {}) {
  const u = new URL(process.env.E2B_SANDBOX_URL)
  return new Promise((resolve, reject) => {
    const req = http.request({ host: u.hostname, port: u.port, path: '/', headers: { host, ...headers } }, (res) => {
      let body = ''
      res.on('data', (d) => { body += d })
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

test('getHost: a web server in the guest, public or behind the traffic token', async (t) => {
  const serve = async (sbx, text) => {
    await sbx.files.write('/tmp/www/index.html', text)
    await sbx.commands.run('cd /tmp/www && exec python3 -m http.server 8000', { background: true, timeoutMs: 0 })
  }
  const pub = await create(t, {}, 'full')
  await serve(pub, 'hello from the guest')
  const host = pub.getHost(8000)
  assert.equal(host, `8000-${pub.sandboxId}.${process.env.E2B_TEST_DOMAIN}`)
  let r
  const deadline = Date.now() + 30_000
  do {
    r = await get(host)
    if (r.status === 200) break
    await new Promise((res) => setTimeout(res, 250))
  } while (Date.now() < deadline)
  assert.equal(r.status, 200)
  assert.equal(r.body, 'hello from the guest')

  const priv = await create(t, { network: { allowPublicTraffic: false } }, 'full')
  assert.ok(priv.trafficAccessToken)
  await serve(priv, 'private')
  const ph = priv.getHost(8000)
  const d2 = Date.now() + 30_000
  do {
    r = await get(ph, { 'e2b-traffic-access-token': priv.trafficAccessToken })
    if (r.status === 200) break
    await new Promise((res) => setTimeout(res, 250))
  } while (Date.now() < d2)
  assert.equal(r.body, 'private')
  assert.equal((await get(ph)).status, 403)
  assert.equal((await get(ph, { 'e2b-traffic-access-token': pub.trafficAccessToken ?? 'x' })).status, 403)
})

test('a scoped key sees only what it may through this door too', async (t) => {
  const scoped = { apiKey: process.env.E2B_SCOPED_KEY }
  const mine = await create(t)
  const theirs = await Sandbox.create('base', { ...scoped, timeoutMs: 300_000, metadata: { suite } })
  made.push(theirs)
  t.after(() => theirs.kill().catch(() => {}))
  assert.equal((await theirs.getInfo()).metadata.team, 'a') // the key's label, forced
  assert.deepEqual((await listed({ metadata: { suite } }, scoped)).map((s) => s.sandboxId), [theirs.sandboxId])
  await assert.rejects(Sandbox.connect(mine.sandboxId, scoped), NotFoundError)
  await assert.rejects(Sandbox.getInfo(mine.sandboxId, scoped), NotFoundError)
  assert.equal(await Sandbox.kill(mine.sandboxId, scoped), false)
  assert.equal(await mine.isRunning(), true)
  await theirs.files.write('/tmp/ok', 'yes')
  assert.equal(await theirs.files.read('/tmp/ok'), 'yes')
})

test('volumes: made, mounted, what one sandbox wrote read by the next, destroyed', async (t) => {
  const name = `vol-${process.pid}`
  const vol = await Volume.create(name)
  t.after(() => Volume.destroy(vol.volumeId).catch(() => {}))
  assert.equal(vol.name, name)
  assert.ok((await Volume.list()).some((v) => v.volumeId === vol.volumeId))
  assert.equal((await Volume.getInfo(vol.volumeId)).name, name)

  const a = await create(t, { volumeMounts: { '/mnt/data': vol } })
  assert.deepEqual((await a.getInfo()).volumeMounts, [{ name, path: '/mnt/data' }])
  await a.files.write('/mnt/data/hello.txt', 'from a')
  await a.kill() // (the host has the guest sync and unmount it first)

  const b = await create(t, { volumeMounts: { '/srv/data': name } })
  assert.equal(await b.files.read('/srv/data/hello.txt'), 'from a')
  await assert.rejects(Volume.destroy(vol.volumeId)) // (mounted)
  await b.kill()
  assert.equal(await Volume.destroy(vol.volumeId), true)
  await assert.rejects(Volume.getInfo(vol.volumeId), { name: 'VolumeNotFoundError' })
})
