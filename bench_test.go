package harebox_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox"
	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/backends/qemu"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/sandbox"
)

// The benchmarks measure the engine against the bare parts it is built
// on, in the same run, and report the ratio (make bench).

func benchEnv(b *testing.B) (*env, func()) {
	b.Helper()
	if _, err := os.Stat("/usr/bin/qemu-system-x86_64"); err != nil {
		b.Skip("qemu-system-x86_64 is not installed")
	}
	dir, err := os.MkdirTemp("", "hbb")
	if err != nil {
		b.Fatal(err)
	}
	v := &env{dataDir: dir, plugin: testimage.Binary(b, "harebox-plugin-qemu"), img: testimage.Image(b, "minimal")}
	return v, func() { strayVMs(dir); os.RemoveAll(dir) }
}

// bareBoot launches the image with the backend alone and waits for the agent.
// With disks, it runs with a data key.
func bareBoot(b *testing.B, hv hypervisor.Hypervisor, img images.Image, dir string, i int, disks ...hypervisor.Disk) (hypervisor.Machine, *agentclient.Client) {
	spec := hypervisor.Spec{
		ID: "bare" + strconv.Itoa(i), VCPUs: 1, MemoryMB: 512, StateDir: filepath.Join(dir, "bare"+strconv.Itoa(i)),
		Kernel: img.Kernel, Initrd: img.Initrd, Cmdline: img.Cmdline, Disks: disks,
	}
	if len(disks) > 0 {
		spec.DataKey = make([]byte, hypervisor.KeySize)
		rand.Read(spec.DataKey)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	m, err := hv.Launch(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	c, _, err := agentclient.DialReady(ctx, m.AgentEndpoint(), agentclient.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return m, c
}

func bareStop(m hypervisor.Machine, c *agentclient.Client) {
	c.Close()
	m.Kill(context.Background())
	m.Cleanup(context.Background())
}

// BenchmarkCreateToReady: engine Create (admission, records, plugin,
// network, boot, agent ready, time sync) next to a bare backend launch of
// the same image until its agent answers.
func BenchmarkCreateToReady(b *testing.B) {
	v, done := benchEnv(b)
	defer done()
	eng := v.open(b)
	defer eng.Close()
	hv, err := qemu.New(qemu.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var engine, bare time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		box, err := eng.Create(ctx, sandbox.CreateRequest{Image: "minimal"})
		if err != nil {
			b.Fatal(err)
		}
		engine += time.Since(start)
		eng.Delete(ctx, box.ID)

		start = time.Now()
		m, c := bareBoot(b, hv, v.img, v.dataDir, i)
		bare += time.Since(start)
		bareStop(m, c)
	}
	b.ReportMetric(engine.Seconds()/float64(b.N), "engine-s/op")
	b.ReportMetric(bare.Seconds()/float64(b.N), "bare-s/op")
	b.ReportMetric(float64(engine)/float64(bare), "engine/bare")
}

// BenchmarkExecRoundTrip: one short command through the engine next to
// the same command through the agent client directly.
func BenchmarkExecRoundTrip(b *testing.B) {
	v, done := benchEnv(b)
	defer done()
	eng := v.open(b)
	defer eng.Close()
	ctx := context.Background()
	box, err := eng.Create(ctx, sandbox.CreateRequest{Image: "minimal"})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Delete(ctx, box.ID)
	hv, err := qemu.New(qemu.Options{})
	if err != nil {
		b.Fatal(err)
	}
	m, c := bareBoot(b, hv, v.img, v.dataDir, 0)
	defer bareStop(m, c)

	var engine, direct time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		engine += time.Since(start)
		start = time.Now()
		if _, err := c.Exec(ctx, agentclient.ExecRequest{Argv: []string{"true"}}, nil); err != nil {
			b.Fatal(err)
		}
		direct += time.Since(start)
	}
	b.ReportMetric(float64(engine.Microseconds())/float64(b.N), "engine-us/op")
	b.ReportMetric(float64(direct.Microseconds())/float64(b.N), "direct-us/op")
	b.ReportMetric(float64(engine)/float64(direct), "engine/direct")
}

// BenchmarkReattach: reading a finished background process's output
// again (its whole output, kept in the guest, and its exit) next to one
// exec round trip, in one run: re-attach/exec.
func BenchmarkReattach(b *testing.B) {
	v, done := benchEnv(b)
	defer done()
	eng := v.open(b)
	defer eng.Close()
	ctx := context.Background()
	box, err := eng.Create(ctx, sandbox.CreateRequest{Image: "minimal"})
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Delete(ctx, box.ID)
	p, err := eng.Processes().Start(ctx, box.ID, sandbox.ExecRequest{Cmd: "seq 1 1000"})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := eng.Processes().Wait(ctx, box.ID, p.ID); err != nil {
		b.Fatal(err)
	}
	var exec, attach time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Argv: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		exec += time.Since(start)
		start = time.Now()
		n := 0
		res, err := eng.Processes().Output(ctx, box.ID, p.ID, [2]uint64{}, true, func(_ bool, _ uint64, d []byte) error { n += len(d); return nil })
		if err != nil || res == nil || n != 3893 {
			b.Fatalf("re-attach: %v %v, %d bytes", res, err, n)
		}
		attach += time.Since(start)
	}
	b.ReportMetric(float64(exec.Microseconds())/float64(b.N), "exec-us/op")
	b.ReportMetric(float64(attach.Microseconds())/float64(b.N), "reattach-us/op")
	b.ReportMetric(float64(attach)/float64(exec), "reattach/exec")
}

// BenchmarkDiskEncryption: the cost of crypto-erase, in one run. The same
// image with a 1 GiB scratch disk is launched with the backend alone, with
// a data key (a LUKS overlay) and without (a plain overlay): launch to a
// ready agent, then 512 MiB written by dd in the guest with conv=fsync.
// Reported as encrypted/plain ratios (the goal is at most 1.15 on both).
func BenchmarkDiskEncryption(b *testing.B) {
	v, done := benchEnv(b)
	defer done()
	hv, err := qemu.New(qemu.Options{})
	if err != nil {
		b.Fatal(err)
	}
	scratch := filepath.Join(v.dataDir, "scratch.raw")
	if err := os.WriteFile(scratch, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	if err := os.Truncate(scratch, 1<<30); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	// The first boot of the base reads it from disk into the page cache:
	// reported apart.
	first := time.Now()
	m, c := bareBoot(b, hv, v.img, v.dataDir, -1, hypervisor.Disk{Path: scratch, Format: "raw", Overlay: true})
	firstBoot := time.Since(first)
	bareStop(m, c)
	var boot, write [2]time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for enc := range 2 {
			spec := hypervisor.Spec{
				ID: "enc" + strconv.Itoa(enc) + "-" + strconv.Itoa(i), VCPUs: 1, MemoryMB: 512,
				Kernel: v.img.Kernel, Initrd: v.img.Initrd, Cmdline: v.img.Cmdline,
				Disks: []hypervisor.Disk{{Path: scratch, Format: "raw", Overlay: true}},
			}
			spec.StateDir = filepath.Join(v.dataDir, spec.ID)
			if enc == 1 {
				spec.DataKey = make([]byte, hypervisor.KeySize)
				rand.Read(spec.DataKey)
			}
			start := time.Now()
			lctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
			m, err := hv.Launch(lctx, spec)
			if err != nil {
				cancel()
				b.Fatal(err)
			}
			c, _, err := agentclient.DialReady(lctx, m.AgentEndpoint(), agentclient.Options{})
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			boot[enc] += time.Since(start)
			start = time.Now()
			r, err := c.Exec(ctx, agentclient.ExecRequest{Argv: []string{"sh", "-c", "dd if=/dev/zero of=$(ls /dev/vd* | tail -n 1) bs=1M count=512 conv=fsync 2>&1"}, User: "root", Timeout: 5 * time.Minute}, nil)
			if err != nil || r.ExitCode != 0 {
				b.Fatalf("dd: %+v %v", r, err)
			}
			write[enc] += time.Since(start)
			bareStop(m, c)
		}
	}
	b.ReportMetric(firstBoot.Seconds(), "first-enc-boot-s")
	b.ReportMetric(boot[1].Seconds()/float64(b.N), "enc-boot-s/op")
	b.ReportMetric(boot[0].Seconds()/float64(b.N), "plain-boot-s/op")
	b.ReportMetric(float64(boot[1])/float64(boot[0]), "boot-enc/plain")
	b.ReportMetric(512/(write[1].Seconds()/float64(b.N)), "enc-write-MiB/s")
	b.ReportMetric(512/(write[0].Seconds()/float64(b.N)), "plain-write-MiB/s")
	b.ReportMetric(float64(write[1])/float64(write[0]), "write-enc/plain")
}

// BenchmarkFork: a fork of a running Debian sandbox to the first exec in
// its clone, next to a cold create of the same image to its first exec;
// and the host memory (the VMM's resident set) an idle clone adds.
func BenchmarkFork(b *testing.B) {
	v, done := benchEnv(b)
	defer done()
	opts := v.options()
	opts.Images["default"] = testimage.Image(b, "default")
	eng, err := harebox.New(context.Background(), opts)
	if err != nil {
		b.Fatal(err)
	}
	defer eng.Close()
	ctx := context.Background()
	firstExec := func(id string) {
		if _, err := eng.Exec(ctx, id, sandbox.ExecRequest{Cmd: "true"}); err != nil {
			b.Fatal(err)
		}
	}
	var cold, fork time.Duration
	var rss int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		src, err := eng.Create(ctx, sandbox.CreateRequest{})
		if err != nil {
			b.Fatal(err)
		}
		firstExec(src.ID)
		cold += time.Since(start)
		// Forked once its boot is done: a source still booting (a cold
		// create answers before systemd has settled) hands the rest of
		// its boot to the clone, and both share the cores.
		if _, err := eng.Exec(ctx, src.ID, sandbox.ExecRequest{Cmd: "systemctl is-system-running --wait >/dev/null; true"}); err != nil {
			b.Fatal(err)
		}

		start = time.Now()
		clones, err := eng.Snapshots().Fork(ctx, src.ID, sandbox.ForkRequest{})
		if err != nil {
			b.Fatal(err)
		}
		firstExec(clones[0].ID)
		fork += time.Since(start)
		time.Sleep(2 * time.Second) // idle
		rss += vmmRSS(filepath.Join(v.dataDir, "m", clones[0].ID) + "/")
		eng.Delete(ctx, clones[0].ID)
		eng.Delete(ctx, src.ID)
	}
	b.ReportMetric(cold.Seconds()/float64(b.N), "cold-s/op")
	b.ReportMetric(fork.Seconds()/float64(b.N), "fork-s/op")
	b.ReportMetric(float64(fork)/float64(cold), "fork/cold")
	b.ReportMetric(float64(rss)/float64(b.N)/(1<<20), "clone-rss-MiB")
}

// vmmRSS is the resident set of the VMM whose command line names dir.
func vmmRSS(dir string) int64 {
	for _, p := range procs.Naming(dir) {
		if !p.IsVMM() {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// BenchmarkGoldenCreate: creates of the Debian image to their first
// exec, in one run: cold boots on an engine without golden snapshots
// (nothing else runs beside them), then restores from the golden
// snapshot on one with them.
func BenchmarkGoldenCreate(b *testing.B) {
	const colds = 5
	v, done := benchEnv(b)
	defer done()
	ctx := context.Background()
	open := func(golden bool) *harebox.Engine {
		opts := v.options()
		opts.Images["default"] = testimage.Image(b, "default")
		opts.GoldenSnapshots = golden
		eng, err := harebox.New(ctx, opts)
		if err != nil {
			b.Fatal(err)
		}
		return eng
	}
	createExec := func(eng *harebox.Engine) (*sandbox.Sandbox, time.Duration) {
		start := time.Now()
		s, err := eng.Create(ctx, sandbox.CreateRequest{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := eng.Exec(ctx, s.ID, sandbox.ExecRequest{Cmd: "true"}); err != nil {
			b.Fatal(err)
		}
		return s, time.Since(start)
	}
	eng := open(false)
	var cold []time.Duration
	for range colds {
		s, d := createExec(eng)
		eng.Delete(ctx, s.ID)
		if s.Served != "boot" {
			b.Fatalf("served by %s", s.Served)
		}
		cold = append(cold, d)
	}
	eng.Close()
	eng = open(true)
	defer eng.Close()
	// Until the golden snapshot (started by the first create) is ready.
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(time.Second) {
		s, _ := createExec(eng)
		eng.Delete(ctx, s.ID)
		if s.Served == "snapshot" {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("no golden snapshot after 5 minutes")
		}
	}
	var warm time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s, d := createExec(eng)
		if s.Served != "snapshot" {
			b.Fatalf("served by %s", s.Served)
		}
		warm += d
		eng.Delete(ctx, s.ID)
	}
	slices.Sort(cold)
	var sum time.Duration
	for _, d := range cold {
		sum += d
	}
	mean := sum / colds
	b.ReportMetric(mean.Seconds(), "cold-s/op")
	b.ReportMetric(cold[colds/2].Seconds(), "cold-p50-s")
	b.ReportMetric(cold[colds-1].Seconds(), "cold-max-s")
	b.ReportMetric(warm.Seconds()/float64(b.N), "golden-s/op")
	b.ReportMetric(float64(warm)/float64(b.N)/float64(mean), "golden/cold")
}

// BenchmarkCreatePaths: create to first exec, p50 and p99 over 20 creates
// each, of the minimal image: a cold boot, a restore from the golden
// snapshot and a claim from the warm pool; against one exec round trip
// measured in the same run. Also an idle pool member's resident memory
// and the time from a claim until the pool is full again. (b.N is
// ignored: one pass takes minutes.)
func BenchmarkCreatePaths(b *testing.B) {
	const n = 20
	v, done := benchEnv(b)
	defer done()
	ctx := context.Background()
	open := func(mod func(*harebox.Options)) *harebox.Engine {
		opts := v.options()
		mod(&opts)
		eng, err := harebox.New(ctx, opts)
		if err != nil {
			b.Fatal(err)
		}
		return eng
	}
	createExec := func(eng *harebox.Engine) (*sandbox.Sandbox, time.Duration) {
		start := time.Now()
		s, err := eng.Create(ctx, sandbox.CreateRequest{Image: "minimal"})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := eng.Exec(ctx, s.ID, sandbox.ExecRequest{Cmd: "true"}); err != nil {
			b.Fatal(err)
		}
		return s, time.Since(start)
	}
	pct := func(d []time.Duration, p float64) float64 {
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[min(len(s)-1, int(p*float64(len(s))))].Seconds() * 1000
	}
	b.ResetTimer()
	// Cold boots, and exec round trips on them.
	eng := open(func(o *harebox.Options) {})
	var cold, golden, rtt []time.Duration
	for len(cold) < n {
		s, d := createExec(eng)
		cold = append(cold, d)
		for range 3 {
			start := time.Now()
			eng.Exec(ctx, s.ID, sandbox.ExecRequest{Cmd: "true"})
			rtt = append(rtt, time.Since(start))
		}
		eng.Delete(ctx, s.ID)
	}
	eng.Close()
	// Golden restores, once the first create made the golden snapshot.
	eng = open(func(o *harebox.Options) { o.GoldenSnapshots = true })
	for deadline := time.Now().Add(10 * time.Minute); len(golden) < n; {
		s, d := createExec(eng)
		eng.Delete(ctx, s.ID)
		if s.Served == "snapshot" {
			golden = append(golden, d)
		} else if time.Now().After(deadline) {
			b.Fatal("no golden snapshot")
		} else {
			time.Sleep(time.Second) // (the golden snapshot is being made)
		}
	}
	eng.Close()
	// Pool claims: each claim waits for the refill before the next.
	eng = open(func(o *harebox.Options) { o.Pool = map[string]int{"minimal:small": 1} })
	defer eng.Close()
	poolIdle := func() int {
		st, _ := eng.Stats(ctx)
		return st.Pool
	}
	var pool, refill []time.Duration
	var rss int64
	for len(pool) < n {
		for deadline := time.Now().Add(3 * time.Minute); poolIdle() == 0; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatal("the pool did not fill")
			}
		}
		if rss == 0 {
			rss = vmmRSS(v.dataDir + "/m/") // (the idle member's: the only VM)
		}
		claimed := time.Now()
		s, d := createExec(eng)
		if s.Served != "pool" {
			b.Fatalf("served by %s", s.Served)
		}
		pool = append(pool, d)
		eng.Delete(ctx, s.ID)
		for poolIdle() == 0 && time.Since(claimed) < 3*time.Minute {
			time.Sleep(20 * time.Millisecond)
		}
		refill = append(refill, time.Since(claimed))
	}
	b.ReportMetric(pct(cold, 0.5), "cold-p50-ms")
	b.ReportMetric(pct(cold, 0.99), "cold-p99-ms")
	b.ReportMetric(pct(golden, 0.5), "snapshot-p50-ms")
	b.ReportMetric(pct(golden, 0.99), "snapshot-p99-ms")
	b.ReportMetric(pct(pool, 0.5), "pool-p50-ms")
	b.ReportMetric(pct(pool, 0.99), "pool-p99-ms")
	b.ReportMetric(pct(rtt, 0.5), "exec-rtt-p50-ms")
	b.ReportMetric(pct(golden, 0.5)/pct(cold, 0.5), "snapshot/cold")
	b.ReportMetric(pct(pool, 0.5)/pct(rtt, 0.5), "pool/exec-rtt")
	b.ReportMetric(float64(rss)/(1<<20), "pool-member-rss-MiB")
	b.ReportMetric(pct(refill, 0.5), "claim-to-refilled-p50-ms")
}
