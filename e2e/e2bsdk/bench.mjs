// The E2B SDK next to HareBox's own TypeScript SDK against one hareboxd,
// interleaved in one run: create to a first command's end, and one
// command's round trip. e2e's BenchmarkE2BSDK runs it and reports the
// ratios of the medians; it prints one JSON object of milliseconds.
// Both run the same command on the same image (E2B's through /bin/bash
// -l -c, as its SDK always does; HareBox's through /bin/sh -c, and again
// through /bin/bash -l -c, to tell the shell's cost from the protocol's).
import { Sandbox } from 'e2b-2.51'
import { HareBox } from '../../sdk/typescript/dist/index.js'

const n = Number(process.env.BENCH_N || 5)
const trips = Number(process.env.BENCH_TRIPS || 20)
const hb = new HareBox()
const out = { e2bCreateRun: [], hbCreateRun: [], e2bRun: [], hbRun: [], hbBashRun: [] }
const ms = (t0) => Number(process.hrtime.bigint() - t0) / 1e6

for (let i = 0; i < n; i++) {
  let t0 = process.hrtime.bigint()
  const sbx = await Sandbox.create('base', { timeoutMs: 300_000 })
  await sbx.commands.run('true')
  out.e2bCreateRun.push(ms(t0))

  t0 = process.hrtime.bigint()
  const box = await hb.create({ image: 'default', ttl_seconds: 300 })
  await box.run('true')
  out.hbCreateRun.push(ms(t0))

  for (let j = 0; j < trips / n; j++) {
    t0 = process.hrtime.bigint()
    await sbx.commands.run('true')
    out.e2bRun.push(ms(t0))
    t0 = process.hrtime.bigint()
    await box.run('true')
    out.hbRun.push(ms(t0))
    // (The shell E2B's SDK runs every command under, through HareBox's.)
    t0 = process.hrtime.bigint()
    await box.run('/bin/bash -l -c true')
    out.hbBashRun.push(ms(t0))
  }
  await sbx.kill()
  await hb.deleteSandbox(box.id)
}
console.log(JSON.stringify(out))
