package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/internal/testserver"
	"github.com/harebox/harebox/sandbox"
)

// The jobs both run: a CPU-bound Python loop, and a syscall-heavy one
// (create, stat and remove 2,000 files in the working directory, /tmp in
// the sandboxes). Each prints its own time in ms.
const (
	cpuJob   = "import time\nt=time.monotonic()\nsum(i*i for i in range(2000000))\nprint((time.monotonic()-t)*1000)"
	filesJob = "import os,time\nt=time.monotonic()\nfor i in range(2000):\n    p='f%d'%i\n    open(p,'w').close(); os.stat(p); os.remove(p)\nprint((time.monotonic()-t)*1000)"
)

// idleBoxes is how many idle sandboxes of each the memory figure is the
// mean of.
const idleBoxes = 20

// BenchmarkSideBySide: HareBox against gVisor (runsc from Debian, its
// ptrace platform: the one that runs without hardware virtualization;
// HAREBOX_BENCH_RUNSC_PLATFORM=kvm on a host with hardware KVM), in one
// run, on the same jobs, with the jobs run directly on the host for
// scale. HareBox: a hareboxd with golden snapshots,
// the Debian image at the small size, through its Go client, with
// --golden-shared-memory (sharedFlag); gVisor: the
// host's root file system read-only, /tmp a tmpfs, no network, through
// its CLI. Printed as a table and reported as metrics (each the median
// of b.N):
//
//   - create to first command: HareBox's create, then `true`; gVisor's
//     `runsc do /bin/true` (which also tears its sandbox down);
//   - one command's round trip (`true`) in a running sandbox: HareBox's
//     exec, gVisor's `runsc exec`;
//   - the CPU-bound and the syscall-heavy job, timed inside each;
//   - idle memory per sandbox: the proportional set size (shared pages
//     counted once) of the processes that make up each of 20 idle
//     sandboxes (HareBox's VMMs; gVisor's sentry and gofer), divided by
//     20. HareBox's count the golden snapshot's memory they share (a
//     memfd that hareboxd's plugin keeps) once, whole, whether mapped or
//     not (vmmMemory).
func BenchmarkSideBySide(b *testing.B) {
	runsc, err := exec.LookPath("runsc")
	if err != nil {
		b.Skip("runsc is not installed (make deps installs Debian's)")
	}
	s := testserver.Prepare(b)
	// (20 small sandboxes need more vCPUs than a 2-core host admits by
	// default.)
	srv := testserver.StartTemp(b, s, "hbsbs", "--golden-snapshots", "--cpu-overcommit", "16", sharedFlag())
	dataDir := srv.DataDir
	c, err := apiclient.Open(apiclient.Options{URL: srv.URL, Key: srv.Key})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	gv := newGVisor(b, runsc)

	hb := map[string][]float64{}
	g := map[string][]float64{}
	host := map[string][]float64{} // the jobs run directly, for scale
	req := sandbox.CreateRequest{Image: "default", Size: sandbox.Size{Preset: "small"}, NoEnv: true}
	exec1 := func(id, cmd string) *sandbox.ExecResult {
		r, err := c.Exec(ctx, id, sandbox.ExecRequest{Cmd: cmd, TimeoutSeconds: 120})
		if err != nil || r.ExitCode != 0 {
			b.Fatalf("exec %q: %+v %v", cmd, r, err)
		}
		return r
	}
	// The first create boots and makes the golden snapshot in the
	// background: not measured, nor any create until one restores it.
	for tries, served := 0, ""; served != "snapshot"; tries++ {
		if tries == 30 {
			b.Fatalf("no create restored the golden snapshot in %d tries:\n%s", tries, testserver.Tail(srv.Log.String()))
		}
		box, err := c.Create(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		exec1(box.ID, "true")
		if err := c.Delete(ctx, box.ID); err != nil {
			b.Fatal(err)
		}
		if served = box.Served; served != "snapshot" {
			time.Sleep(5 * time.Second)
		}
	}
	gv.run("first", "do", "/bin/true")

	b.ResetTimer()
	for range b.N {
		start := time.Now()
		box, err := c.Create(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		exec1(box.ID, "true")
		hb["create"] = append(hb["create"], ms(time.Since(start)))
		start = time.Now()
		gv.run("do", "do", "/bin/true")
		g["create"] = append(g["create"], ms(time.Since(start)))

		name := "c" + strconv.Itoa(len(g["create"]))
		gv.start(name)
		for range 4 {
			start = time.Now()
			exec1(box.ID, "true")
			hb["exec"] = append(hb["exec"], ms(time.Since(start)))
			start = time.Now()
			gv.run("exec", "exec", name, "true")
			g["exec"] = append(g["exec"], ms(time.Since(start)))
		}
		for job, code := range map[string]string{"cpu": cpuJob, "files": filesJob} {
			hb[job] = append(hb[job], parseMS(b, exec1(box.ID, "cd /tmp && python3 -c \""+code+"\"").Stdout))
			g[job] = append(g[job], parseMS(b, gv.run(job, "exec", "--cwd", "/tmp", name, "python3", "-c", code)))
			cmd := exec.Command("python3", "-c", code)
			cmd.Dir = b.TempDir()
			out, err := cmd.Output()
			if err != nil {
				b.Fatalf("%s on the host: %v", job, err)
			}
			host[job] = append(host[job], parseMS(b, string(out)))
		}
		gv.stop(name)
		if err := c.Delete(ctx, box.ID); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()

	// Idle memory: idleBoxes of each, left alone for a while.
	var ids []string
	for range idleBoxes {
		box, err := c.Create(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, box.ID)
		gv.start("idle" + strconv.Itoa(len(ids)))
	}
	time.Sleep(10 * time.Second)
	var gvPSS int64
	accel := "TCG"
	var vmms []int
	for _, p := range procs.Naming(dataDir + "/") {
		if p.IsVMM() {
			vmms = append(vmms, p.PID)
			if strings.Contains(p.Cmdline, "-accel kvm") {
				accel = "KVM"
			}
		}
	}
	hbPSS, bases := vmmMemory(b, vmms)
	b.Logf("%d VMMs: %.1f MiB together, of which %.1f MiB their golden snapshots' shared memory", len(vmms), float64(hbPSS)/(1<<20), float64(bases)/(1<<20))
	for _, p := range procs.Naming("--root=" + gv.root + "\x00") { // (its sentry and gofer)
		gvPSS += pss(b, p.PID)
	}
	for i, id := range ids {
		c.Delete(ctx, id)
		gv.stop("idle" + strconv.Itoa(i+1))
	}
	if hbPSS == 0 || gvPSS == 0 {
		b.Fatalf("idle memory: %d bytes for HareBox's VMMs, %d for gVisor's sandboxes: a side found no process", hbPSS, gvPSS)
	}
	hb["idle"] = []float64{float64(hbPSS) / idleBoxes / (1 << 20)}
	g["idle"] = []float64{float64(gvPSS) / idleBoxes / (1 << 20)}

	rows := []struct{ key, what, unit string }{
		{"create", "create to first command", "ms"},
		{"exec", "one command's round trip", "ms"},
		{"cpu", "CPU-bound Python loop", "ms"},
		{"files", "2,000 files created, stat'ed, removed", "ms"},
		{"idle", "idle memory per sandbox (PSS)", "MiB"},
	}
	var table strings.Builder
	fmt.Fprintf(&table, "\n| | HareBox (%s) | gVisor (%s) | on the host | HareBox / gVisor |\n|---|---|---|---|---|\n", accel, gv.platform)
	for _, r := range rows {
		h, v := median(hb[r.key]), median(g[r.key])
		direct := "-"
		if len(host[r.key]) > 0 {
			direct = fmt.Sprintf("%.1f %s", median(host[r.key]), r.unit)
		}
		fmt.Fprintf(&table, "| %s | %.1f %s | %.1f %s | %s | %.2f× |\n", r.what, h, r.unit, v, r.unit, direct, h/v)
		b.ReportMetric(h, "harebox-"+r.key+"-"+r.unit)
		b.ReportMetric(v, "gvisor-"+r.key+"-"+r.unit)
		b.ReportMetric(h/v, "harebox/gvisor-"+r.key)
	}
	b.Log(table.String())
}

// sharedFlag is HareBox's setting of golden snapshots' shared memory:
// on (--golden-shared-memory), unless HAREBOX_BENCH_GOLDEN_SHARED=0
// measures it off (hareboxd's default).
func sharedFlag() string {
	if os.Getenv("HAREBOX_BENCH_GOLDEN_SHARED") == "0" {
		return "--golden-shared-memory=false"
	}
	return "--golden-shared-memory"
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func median(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

func parseMS(b *testing.B, out string) float64 {
	f, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
	if err != nil {
		b.Fatalf("a job printed %q, not its time", out)
	}
	return f
}

// vmmMemory is what the VMMs pids hold together, in bytes, each page
// counted once: their proportional set sizes, less their share of the
// golden snapshots' memory they map copy-on-write (a memfd's pages, each
// counted in part in each mapper's), plus each such memfd's whole size
// (bases). Their private copies of pages of it count in full.
func vmmMemory(b *testing.B, pids []int) (total, bases int64) {
	seen := map[string]bool{}
	for _, pid := range pids {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
		if err != nil {
			continue // (gone)
		}
		inBase := false
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) == 0:
			case !strings.HasSuffix(f[0], ":"): // a mapping's first line
				inBase = strings.Contains(line, "/memfd:harebox-golden-memory")
				if inBase && len(f) >= 5 && !seen[f[4]] {
					seen[f[4]] = true
					var st syscall.Stat_t
					if err := syscall.Stat(fmt.Sprintf("/proc/%d/map_files/%s", pid, f[0]), &st); err != nil {
						b.Fatalf("a base's size: %v", err)
					}
					bases += st.Blocks * 512
				}
			case len(f) == 3 && f[2] == "kB":
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				switch {
				case f[0] == "Pss:" && !inBase, f[0] == "Anonymous:" && inBase:
					total += kb << 10
				}
			}
		}
	}
	return total + bases, bases
}

// pss returns pid's proportional set size in bytes (0 if it is gone).
func pss(b *testing.B, pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "Pss:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	b.Fatalf("no Pss in /proc/%d/smaps_rollup", pid)
	return 0
}

// gvisor runs containers with runsc under a state directory of its own;
// they are all killed and deleted when the benchmark ends.
type gvisor struct {
	b            *testing.B
	runsc, root  string
	platform     string
	bundle       string
	started      []string
	stoppedNames map[string]bool
}

func newGVisor(b *testing.B, runsc string) *gvisor {
	dir := b.TempDir()
	g := &gvisor{b: b, runsc: runsc, root: filepath.Join(dir, "state"), bundle: filepath.Join(dir, "bundle"), stoppedNames: map[string]bool{},
		platform: cmp.Or(os.Getenv("HAREBOX_BENCH_RUNSC_PLATFORM"), "ptrace")}
	// The host's root, read-only; /tmp a tmpfs of the sandbox's own; no
	// network. (OCI runtime spec 1.0, the fields runsc reads.)
	spec := map[string]any{
		"ociVersion": "1.0.0",
		"process": map[string]any{"terminal": false, "user": map[string]any{"uid": 0, "gid": 0},
			"args": []string{"sleep", "infinity"}, "env": []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, "cwd": "/"},
		"root":     map[string]any{"path": "/", "readonly": true},
		"hostname": "gvisor",
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
			{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"nosuid", "noexec", "nodev", "ro"}},
			{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
		},
		"linux": map[string]any{"namespaces": []map[string]any{{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}}},
	}
	data, _ := json.Marshal(spec)
	if err := os.MkdirAll(g.bundle, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(g.bundle, "config.json"), data, 0o644); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		for _, name := range g.started {
			if !g.stoppedNames[name] {
				g.stop(name)
			}
		}
		// A sandbox whose kill or delete failed (seen under load) would
		// outlive the run, and its name the next run's.
		for _, p := range procs.Naming("--root=" + g.root + "\x00") {
			b.Logf("killing a gVisor process left: %s", p)
			syscall.Kill(p.PID, syscall.SIGKILL)
		}
	})
	return g
}

// run runs runsc with args and returns its stdout.
func (g *gvisor) run(what string, args ...string) string {
	cmd := exec.Command(g.runsc, append([]string{"--root=" + g.root, "--platform=" + g.platform, "--network=none"}, args...)...)
	cmd.Dir = g.bundle
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		g.b.Fatalf("runsc %s (%s): %v\n%s", what, strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}

// start starts a container that sleeps, for commands to run in. (Its
// output goes to /dev/null and its errors to a file: the sandbox it
// leaves running would hold a pipe open.)
func (g *gvisor) start(name string) {
	g.started = append(g.started, name)
	errf, err := os.CreateTemp(g.b.TempDir(), "stderr")
	if err != nil {
		g.b.Fatal(err)
	}
	defer errf.Close()
	cmd := exec.Command(g.runsc, "--root="+g.root, "--platform="+g.platform, "--network=none", "run", "--detach", "--bundle", g.bundle, name)
	cmd.Stderr = errf
	if err := cmd.Run(); err != nil {
		msg, _ := os.ReadFile(errf.Name())
		g.b.Fatalf("runsc run %s: %v\n%s", name, err, msg)
	}
}

func (g *gvisor) stop(name string) {
	g.stoppedNames[name] = true
	exec.Command(g.runsc, "--root="+g.root, "kill", name, "KILL").Run()
	exec.Command(g.runsc, "--root="+g.root, "delete", "--force", name).Run()
}
