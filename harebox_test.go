package harebox_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"filippo.io/age"

	"github.com/harebox/harebox"
	envs "github.com/harebox/harebox/env"
	"github.com/harebox/harebox/events"
	"github.com/harebox/harebox/hypervisor/consolelog"
	"github.com/harebox/harebox/hypervisor/hypervisortest"
	"github.com/harebox/harebox/hypervisor/plugin"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/monitor"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// The engine tests boot real VMs (QEMU, TCG here) from the minimal image,
// through the QEMU plugin binary, as a deployed engine would.

func needQEMU(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps installs it)")
	}
}

type env struct {
	dataDir string
	plugin  string
	img     images.Image
	// goldenDir, if set, holds the golden snapshots its engines share
	// with the test run's other engines and servers (restoredEnv).
	goldenDir string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	needQEMU(t)
	dir, err := os.MkdirTemp("", "hbe")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the engine's data directory: %s", dir) // (its VMs name it: their cost by test)
	e := &env{dataDir: dir, plugin: testimage.Binary(t, "harebox-plugin-qemu"), img: testimage.Image(t, "minimal")}
	t.Cleanup(func() {
		// Whatever happened, no VM of this test outlives it.
		if n := strayVMs(dir); n > 0 {
			t.Errorf("%d VM processes were left running", n)
		}
		os.RemoveAll(dir)
	})
	return e
}

// restoredEnv is newEnv for a test that is not about booting: under make
// test (HAREBOX_TEST_GOLDEN_DIR) its creates restore from the run's
// golden snapshot of the minimal image once there is one, as the test
// servers' do; they boot until then.
func restoredEnv(t *testing.T) *env {
	v := newEnv(t)
	v.goldenDir = os.Getenv("HAREBOX_TEST_GOLDEN_DIR")
	return v
}

func (v *env) options() harebox.Options {
	o := harebox.Options{
		DataDir:      v.dataDir,
		PluginPath:   v.plugin,
		Images:       map[string]images.Image{"minimal": v.img},
		Site:         sandbox.Site{Name: "fr-par-1", Country: "FR"},
		MaxFileBytes: 4 << 20,
		Capacity:     harebox.Capacity{VCPUs: 3, MemoryMB: 4096, DiskGB: 100},
	}
	if v.goldenDir != "" {
		o.GoldenSnapshots, o.GoldenDir, o.GoldenKey = true, v.goldenDir, filepath.Join(v.goldenDir, "golden.key")
	}
	return o
}

func (v *env) open(t testing.TB) *harebox.Engine {
	t.Helper()
	eng, err := harebox.New(context.Background(), v.options())
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

// enginePlugin is the pid of the hypervisor plugin of the engine on dir.
func enginePlugin(t *testing.T, dir string) int {
	t.Helper()
	for _, p := range procs.WithEnv(plugin.OwnerEnv + "=" + dir) {
		if p.IsPlugin() {
			return p.PID
		}
	}
	t.Fatal("no hypervisor plugin runs for", dir)
	return 0
}

// strayVMs kills and counts VMM processes that still use dir.
func strayVMs(dir string) int {
	n := 0
	for _, p := range procs.Naming(dir + "/") {
		if p.IsVMM() {
			syscall.Kill(p.PID, syscall.SIGKILL)
			n++
		}
	}
	return n
}

func create(t *testing.T, eng *harebox.Engine, req sandbox.CreateRequest) *sandbox.Sandbox {
	t.Helper()
	if req.Image == "" {
		req.Image = "minimal"
	}
	start := time.Now()
	box, err := eng.Create(context.Background(), req)
	if err != nil {
		t.Fatal("create:", err)
	}
	t.Logf("created %s in %v", box.ID, time.Since(start).Round(time.Millisecond))
	return box
}

func run(t *testing.T, eng *harebox.Engine, id, cmd string) *sandbox.ExecResult {
	t.Helper()
	r, err := eng.Exec(context.Background(), id, sandbox.ExecRequest{Cmd: cmd})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return r
}

func wantKind(t *testing.T, what string, err, kind error) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Errorf("%s: want %v, got %v", what, kind, err)
	}
}

func TestEngineLifecycle(t *testing.T) {
	v := newEnv(t)
	eng := v.open(t)
	defer eng.Close()
	ctx := context.Background()

	box := create(t, eng, sandbox.CreateRequest{Name: "lifecycle", Labels: map[string]string{"team": "a"}, Env: map[string]string{"GREETING": "hi"}})
	if box.State != sandbox.StateRunning || box.Site.Name != "fr-par-1" || box.Site.Country != "FR" || box.Size != sandbox.Presets["small"] {
		t.Fatalf("created sandbox: %+v", box)
	}
	defer eng.Delete(ctx, box.ID)

	t.Run("GetList", func(t *testing.T) {
		got, err := eng.Get(ctx, box.ID)
		if err != nil || got.ID != box.ID || got.Name != "lifecycle" {
			t.Fatalf("get: %+v %v", got, err)
		}
		for _, f := range []sandbox.ListFilter{{}, {State: sandbox.StateRunning}, {Labels: map[string]string{"team": "a"}}} {
			l, err := eng.List(ctx, f)
			if err != nil || len(l) != 1 || l[0].ID != box.ID {
				t.Errorf("list %+v: %v %v", f, l, err)
			}
		}
		if l, _ := eng.List(ctx, sandbox.ListFilter{Labels: map[string]string{"team": "b"}}); len(l) != 0 {
			t.Errorf("label filter matched %v", l)
		}
		if l, _ := eng.List(ctx, sandbox.ListFilter{State: sandbox.StatePaused}); len(l) != 0 {
			t.Errorf("state filter matched %v", l)
		}
	})
	t.Run("Exec", func(t *testing.T) {
		r := run(t, eng, box.ID, `echo "$GREETING from $(id -un) in $(pwd)"; echo oops >&2; exit 7`)
		if r.Stdout != "hi from user in /home/user\n" || r.Stderr != "oops\n" || r.ExitCode != 7 || r.TimedOut {
			t.Fatalf("got %+v", r)
		}
		r, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("piped"), User: "root", Cwd: "/tmp", Env: map[string]string{"GREETING": "x"}})
		if err != nil || r.Stdout != "piped" {
			t.Fatalf("argv+stdin: %+v %v", r, err)
		}
		r, err = eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "id -u", User: "root"})
		if err != nil || r.Stdout != "0\n" {
			t.Fatalf("root: %+v %v", r, err)
		}
		r, err = eng.Exec(ctx, box.ID, sandbox.ExecRequest{Argv: []string{"/no/such/program"}})
		if err != nil || r.Error == "" {
			t.Fatalf("missing program: %+v %v", r, err)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		start := time.Now()
		r, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "echo started; sleep 100 & sleep 100", TimeoutSeconds: 1})
		if err != nil || !r.TimedOut || r.Stdout != "started\n" {
			t.Fatalf("got %+v %v", r, err)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Fatalf("timeout took %v", d)
		}
		// The whole process group died, background child included.
		if r := run(t, eng, box.ID, "pgrep -x sleep || echo none"); strings.TrimSpace(r.Stdout) != "none" {
			t.Fatalf("sleep processes left: %q", r.Stdout)
		}
	})
	t.Run("Streaming", func(t *testing.T) {
		w := &stampWriter{}
		r, err := eng.ExecStream(ctx, box.ID, sandbox.ExecRequest{Cmd: "echo first; sleep 2; echo second"}, nil, w, nil)
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("got %+v %v", r, err)
		}
		if len(w.chunks) < 2 || w.chunks[0].data != "first\n" {
			t.Fatalf("chunks %+v", w.chunks)
		}
		if gap := w.chunks[len(w.chunks)-1].at.Sub(w.chunks[0].at); gap < time.Second {
			t.Fatalf("output was not streamed: first and last chunk %v apart", gap)
		}
	})
	t.Run("Background", func(t *testing.T) {
		p, err := eng.Processes().Start(ctx, box.ID, sandbox.ExecRequest{Cmd: "echo up; sleep 300"})
		if err != nil || !p.Running || p.PID <= 0 {
			t.Fatalf("start: %+v %v", p, err)
		}
		q, err := eng.Processes().Start(ctx, box.ID, sandbox.ExecRequest{Cmd: "sleep 1; echo done"})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		qd, err := eng.Processes().Wait(wctx, box.ID, q.ID)
		if err != nil || qd.Running || qd.Result == nil || qd.Result.Stdout != "done\n" {
			t.Fatalf("wait: %+v %v", qd, err)
		}
		if err := eng.Processes().Kill(ctx, box.ID, p.ID, 0); err != nil {
			t.Fatal("kill:", err)
		}
		pd, err := eng.Processes().Wait(wctx, box.ID, p.ID)
		if err != nil || pd.Result == nil || pd.Result.Signal != 9 || pd.Result.Stdout != "up\n" {
			t.Fatalf("killed: %+v %v", pd.Result, err)
		}
		if l, _ := eng.Processes().List(ctx, box.ID); len(l) != 2 {
			t.Fatalf("list: %v", l)
		}
		wantKind(t, "wait unknown process", func() error { _, err := eng.Processes().Wait(ctx, box.ID, "proc_nope"); return err }(), sandbox.ErrNotFound)
	})
	t.Run("Concurrent", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				r, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: fmt.Sprintf("sleep 0.5; echo %d", i)})
				if err == nil && r.Stdout != fmt.Sprintf("%d\n", i) {
					err = fmt.Errorf("exec %d: stdout %q", i, r.Stdout)
				}
				errs <- err
			}(i)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
	})
	t.Run("Files", func(t *testing.T) {
		payload := bytes.Repeat([]byte{0, 1, 2, 0xff}, 256<<10) // 1 MiB
		fi, err := eng.WriteFile(ctx, box.ID, "/home/user/dir/data.bin", bytes.NewReader(payload), sandbox.WriteOptions{Mode: 0o600, MakeParents: true})
		if err != nil || fi.Size != int64(len(payload)) || fi.Mode != 0o600 || fi.UID != 1000 {
			t.Fatalf("write: %+v %v", fi, err)
		}
		var buf bytes.Buffer
		if n, err := eng.ReadFile(ctx, box.ID, "/home/user/dir/data.bin", &buf); err != nil || n != int64(len(payload)) || !bytes.Equal(buf.Bytes(), payload) {
			t.Fatalf("read back %d bytes: %v", n, err)
		}
		if fi, err := eng.Mkdir(ctx, box.ID, "/home/user/a/b", 0o755, ""); err != nil || fi.UID != 1000 {
			t.Fatalf("mkdir: %+v %v", fi, err)
		}
		if fi, err := eng.Mkdir(ctx, box.ID, "/tmp/rootdir", 0, "root"); err != nil || fi.UID != 0 {
			t.Fatalf("mkdir as root: %+v %v", fi, err)
		}
		list, _, err := eng.ListFiles(ctx, box.ID, "/home/user", 0)
		names := map[string]string{}
		for _, f := range list {
			names[f.Name] = f.Type
		}
		if err != nil || names["dir"] != "dir" || names["a"] != "dir" || names["b"] != "" {
			t.Fatalf("list: %v %v", list, err)
		}
		if list, _, err := eng.ListFiles(ctx, box.ID, "/home/user/a", 2); err != nil || len(list) != 1 || list[0].Path != "/home/user/a/b" {
			t.Fatalf("list a depth of 2: %v %v", list, err)
		}
		_, _, err = eng.ListFiles(ctx, box.ID, "/home/user", sandbox.MaxListDepth+1)
		wantKind(t, "list too deep", err, sandbox.ErrInvalid)
		if fi, err := eng.MoveFile(ctx, box.ID, "/home/user/a/b", "/home/user/moved"); err != nil || fi.Path != "/home/user/moved" || fi.Type != "dir" {
			t.Fatalf("move: %+v %v", fi, err)
		}
		_, err = eng.StatFile(ctx, box.ID, "/home/user/a/b")
		wantKind(t, "stat moved away", err, sandbox.ErrNotFound)
		_, err = eng.MoveFile(ctx, box.ID, "/home/user/missing", "/home/user/x")
		wantKind(t, "move a missing file", err, sandbox.ErrNotFound)
		w, err := eng.WatchDir(ctx, box.ID, "/home/user", false)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := eng.WriteFile(ctx, box.ID, "/home/user/watched", strings.NewReader("x"), sandbox.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
		for {
			ev, err := w.Next()
			if err != nil {
				t.Fatalf("watch: %v", err)
			}
			// (The agent writes a temporary file and renames it.)
			if ev.Path == "/home/user/watched" && ev.Op == "create" {
				break
			}
		}
		w.Close()
		if _, err := w.Next(); err == nil {
			t.Error("a closed watch goes on")
		}
		_, err = eng.WatchDir(ctx, box.ID, "/home/user/missing", false)
		wantKind(t, "watch a missing directory", err, sandbox.ErrNotFound)
		if st, err := eng.StatFile(ctx, box.ID, "/home/user/dir/data.bin"); err != nil || st.Type != "file" {
			t.Fatalf("stat: %+v %v", st, err)
		}
		if err := eng.RemoveFile(ctx, box.ID, "/home/user/dir", true); err != nil {
			t.Fatal(err)
		}
		_, err = eng.StatFile(ctx, box.ID, "/home/user/dir")
		wantKind(t, "stat removed", err, sandbox.ErrNotFound)

		// Oversized: refused, and nothing is left behind.
		_, err = eng.WriteFile(ctx, box.ID, "/home/user/big", bytes.NewReader(make([]byte, 5<<20)), sandbox.WriteOptions{})
		wantKind(t, "oversized write", err, sandbox.ErrTooLarge)
		_, err = eng.StatFile(ctx, box.ID, "/home/user/big")
		wantKind(t, "oversized file after refusal", err, sandbox.ErrNotFound)
		run(t, eng, box.ID, "head -c 5000000 /dev/zero > /tmp/big")
		_, err = eng.ReadFile(ctx, box.ID, "/tmp/big", &buf)
		wantKind(t, "oversized read", err, sandbox.ErrTooLarge)
		_, err = eng.ReadFile(ctx, box.ID, "relative/path", &buf)
		wantKind(t, "relative path", err, sandbox.ErrInvalid)
	})
	t.Run("SerialLogBounded", func(t *testing.T) {
		// Root in the guest floods the console; the host's copy stays bounded.
		start := time.Now()
		r, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "head -c 9000000 /dev/zero > /dev/ttyS0", User: "root", TimeoutSeconds: 240})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("flood: %+v %v", r, err)
		}
		log := filepath.Join(v.dataDir, "m", box.ID, "serial.log")
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			fi, err := os.Stat(log)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Size() <= harebox.MaxSerialLogBytes {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("serial log is %d bytes, over the %d bound", fi.Size(), harebox.MaxSerialLogBytes)
			}
		}
		t.Logf("9 MB through the emulated UART took %v", time.Since(start).Round(time.Millisecond))
	})
	t.Run("OutputFloodBounded", func(t *testing.T) {
		// A command floods its output far past every bound, three ways: a
		// synchronous exec (collected up to MaxOutputBytes), a streaming
		// exec whose client stops reading, and a background process no one
		// attaches to. The host's memory (this process, which holds the
		// engine, and the VMM) must not follow the flood.
		// What each may grow by: the engine keeps 8 MiB per stream, with its
		// copies and the GC's slack; the VMM's resident size also grows as
		// the guest first touches its memory, which is not buffering.
		const engineBound, vmmBound = 80 << 20, 128 << 20
		// Left alone, Go's collector lets garbage pile up to the size of
		// the live heap before it runs (GOGC=100): in this process, which
		// holds about 100 MiB, that slack alone neared the bound (137 MiB
		// once in CI). A soft limit a little above what the runtime holds
		// now takes the slack away; what the engine keeps cannot be
		// collected, goes past the limit and shows in the peak.
		defer debug.SetMemoryLimit(debug.SetMemoryLimit(goRuntimeBytes() + engineBound/2))
		bounds := map[int]int64{os.Getpid(): engineBound}
		before := map[int]int64{os.Getpid(): resetPeakRSS(t, os.Getpid())}
		for _, p := range procs.Naming(v.dataDir + "/") {
			if p.IsVMM() { // (the agent's channel is the VMM's socket; the plugin is not on the path)
				before[p.PID], bounds[p.PID] = resetPeakRSS(t, p.PID), vmmBound
			}
		}
		if len(before) != 2 {
			t.Fatalf("want this process and one VMM, have %v", before)
		}
		flooded := int64(0)

		start := time.Now()
		r, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "dd if=/dev/zero bs=65536 count=1536; echo end >&2", TimeoutSeconds: 120})
		if err != nil || r.ExitCode != 0 || !r.StdoutTruncated || int64(len(r.Stdout)) > 8<<20 || !strings.HasSuffix(r.Stderr, "end\n") {
			t.Fatalf("sync flood: exit %d truncated %v, %d bytes kept, stderr %q, %v", r.ExitCode, r.StdoutTruncated, len(r.Stdout), r.Stderr, err)
		}
		flooded += 1536 * 65536
		t.Logf("synchronous: %v", time.Since(start).Round(time.Millisecond))
		start = time.Now()

		// A client that stops reading: its writer blocks for 4 s while the
		// command goes on writing, then drains.
		release := make(chan struct{})
		time.AfterFunc(4*time.Second, func() { close(release) })
		sw := &stallWriter{release: release}
		r, err = eng.ExecStream(ctx, box.ID, sandbox.ExecRequest{Cmd: "timeout 7 cat /dev/zero; true", TimeoutSeconds: 120}, nil, sw, io.Discard)
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("streaming flood: %+v %v", r, err)
		}
		flooded += sw.n.Load()
		t.Logf("streaming: %v", time.Since(start).Round(time.Millisecond))
		start = time.Now()

		// A background process no one attaches to: its output is kept in
		// the guest's ring; the engine keeps only its first MaxOutputBytes.
		p, err := eng.Processes().Start(ctx, box.ID, sandbox.ExecRequest{Cmd: "dd if=/dev/zero bs=65536 count=2048 2>/dev/null"})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		pd, err := eng.Processes().Wait(wctx, box.ID, p.ID)
		if err != nil || pd.Result == nil || pd.Result.ExitCode != 0 || len(pd.Result.Stdout) > 8<<20 {
			t.Fatalf("background flood: %+v %v", pd, err)
		}
		flooded += 2048 * 65536
		t.Logf("background: %v", time.Since(start).Round(time.Millisecond))

		for pid, rss := range before {
			peak := peakRSS(t, pid)
			t.Logf("pid %d: resident %d MiB before, peak %d MiB during %d MiB of output", pid, rss>>20, peak>>20, flooded>>20)
			if peak-rss > bounds[pid] {
				t.Errorf("pid %d grew by %d MiB while %d MiB of output went by", pid, (peak-rss)>>20, flooded>>20)
			}
		}
		if flooded < 2*engineBound {
			t.Errorf("only %d MiB flooded; the check needs far more than its bound", flooded>>20)
		}
	})
	t.Run("Metrics", func(t *testing.T) {
		// Measured on the host: the VMM's CPU time grows by what a busy
		// loop in the guest burns; its memory and the disk files are there.
		// A round skips a box another call holds and the background
		// round may add samples of its own: take the last sample before
		// the loop and the first after it.
		sampleSince := func(from time.Time) []*store.MetricSample {
			for range 20 {
				eng.Monitor().Sample(ctx)
				l, err := eng.Monitor().Metrics(ctx, box.ID, monitor.Query{From: from})
				if err != nil {
					t.Fatal(err)
				}
				if len(l) > 0 {
					return l
				}
			}
			t.Fatal("no sample taken in 20 rounds")
			return nil
		}
		l := sampleSince(time.Now())
		first := l[len(l)-1]
		// The guest burns CPU until the host has seen a second of it (or
		// a minute passes): how fast that comes depends on what else the
		// 2 cores run, so the loop is not timed. An idle guest under TCG
		// burns about 1% of a core: well under a second in that minute.
		burning := make(chan error, 1)
		go func() {
			_, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "rm -f /tmp/stop; timeout 90 sh -c 'while [ ! -e /tmp/stop ]; do :; done'; true"})
			burning <- err
		}()
		var last *store.MetricSample
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
			last = sampleSince(time.Now())[0]
			if last.CPUSeconds-first.CPUSeconds >= 1 || time.Now().After(deadline) {
				break
			}
		}
		run(t, eng, box.ID, "touch /tmp/stop")
		if err := <-burning; err != nil {
			t.Fatalf("the busy loop: %v", err)
		}
		t.Logf("cpu %.2f s -> %.2f s, memory %d MiB, disk %d MiB", first.CPUSeconds, last.CPUSeconds, last.MemoryBytes>>20, last.DiskBytes>>20)
		if last.CPUSeconds-first.CPUSeconds < 1 || last.MemoryBytes < 64<<20 || last.DiskBytes <= 0 || !last.Time.After(first.Time) {
			t.Errorf("samples: %+v then %+v", first, last)
		}
	})
	t.Run("Admission", func(t *testing.T) {
		// 1 of 3 vCPUs is taken: 3 more do not fit.
		_, err := eng.Create(ctx, sandbox.CreateRequest{Image: "minimal", Size: sandbox.Size{VCPUs: 3, MemoryMB: 256}})
		wantKind(t, "over capacity", err, sandbox.ErrCapacity)
		_, err = eng.Create(ctx, sandbox.CreateRequest{Image: "minimal", Name: "lifecycle"})
		wantKind(t, "duplicate name", err, sandbox.ErrExists)
		// 5 of 100 GB of disk are taken: 96 more do not fit.
		_, err = eng.Create(ctx, sandbox.CreateRequest{Image: "minimal", Size: sandbox.Size{VCPUs: 1, MemoryMB: 256, DiskGB: 96}})
		wantKind(t, "over disk capacity", err, sandbox.ErrCapacity)
		if sandbox.FieldOf(err) != "size.disk_gb" {
			t.Errorf("disk capacity error names %q", sandbox.FieldOf(err))
		}
	})
	t.Run("DeleteDuringCreate", func(t *testing.T) {
		done := make(chan error, 1)
		var second *sandbox.Sandbox
		go func() {
			var err error
			second, err = eng.Create(ctx, sandbox.CreateRequest{Image: "minimal", Labels: map[string]string{"race": "1"}})
			done <- err
		}()
		// Find it while it boots, and try to delete it.
		var id string
		for deadline := time.Now().Add(30 * time.Second); id == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if l, _ := eng.List(ctx, sandbox.ListFilter{State: sandbox.StateCreating}); len(l) == 1 {
				id = l[0].ID
			}
		}
		if id == "" {
			t.Fatal("never saw the sandbox in state creating")
		}
		wantKind(t, "delete while creating", eng.Delete(ctx, id), sandbox.ErrState)
		if err := <-done; err != nil {
			t.Fatal("create:", err)
		}
		if second.ID != id || second.State != sandbox.StateRunning {
			t.Fatalf("create returned %+v", second)
		}
		if r := run(t, eng, id, "echo ok"); r.Stdout != "ok\n" {
			t.Fatalf("the raced sandbox does not work: %+v", r)
		}
		if err := eng.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("PauseResume", func(t *testing.T) {
		_, err := eng.Resume(ctx, box.ID)
		wantKind(t, "resume running", err, sandbox.ErrState)
		p, err := eng.Pause(ctx, box.ID)
		if err != nil || p.State != sandbox.StatePaused {
			t.Fatalf("pause: %+v %v", p, err)
		}
		_, err = eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "true"})
		wantKind(t, "exec while paused", err, sandbox.ErrState)
		_, err = eng.Pause(ctx, box.ID)
		wantKind(t, "pause paused", err, sandbox.ErrState)
		if r, err := eng.Resume(ctx, box.ID); err != nil || r.State != sandbox.StateRunning {
			t.Fatalf("resume: %+v %v", r, err)
		}
		if r := run(t, eng, box.ID, "echo back"); r.Stdout != "back\n" {
			t.Fatalf("after resume: %+v", r)
		}
	})
	t.Run("AgentRestart", func(t *testing.T) {
		// Root in the guest kills the agent service (its parent; PID 1, the
		// init, restarts it): the exec that did it fails at once, and the
		// next ones reach the new agent within seconds.
		start := time.Now()
		_, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{User: "root", TimeoutSeconds: 60, Cmd: `kill -9 $PPID; sleep 50`})
		if !errors.Is(err, sandbox.ErrUnavailable) {
			t.Fatalf("the exec that killed the agent: %v, want ErrUnavailable", err)
		}
		failed := time.Since(start)
		var r *sandbox.ExecResult
		for {
			r, err = eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "echo alive", TimeoutSeconds: 10})
			if err == nil || time.Since(start) > 30*time.Second {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil || r.Stdout != "alive\n" {
			t.Fatalf("exec after the agent restarted: %+v %v", r, err)
		}
		if got, _ := eng.Get(ctx, box.ID); got.State != sandbox.StateRunning {
			t.Fatalf("state after the restart: %s", got.State)
		}
		t.Logf("the in-flight exec failed after %v; an exec answered %v after the kill", failed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	})
	t.Run("PluginCrash", func(t *testing.T) {
		// The plugin is killed; the VM outlives it (exec needs no plugin),
		// and the next hypervisor call starts the plugin again, which
		// re-attaches the machine from its handle.
		old := enginePlugin(t, v.dataDir)
		syscall.Kill(old, syscall.SIGKILL)
		if r := run(t, eng, box.ID, "echo still"); r.Stdout != "still\n" {
			t.Fatalf("exec after the plugin died: %+v", r)
		}
		var err error
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err = eng.Pause(ctx, box.ID); err == nil || time.Now().After(deadline) {
				break
			}
			if !errors.Is(err, sandbox.ErrUnavailable) {
				t.Fatalf("pause after the plugin died: %v, want ErrUnavailable or success", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("pause never worked after the plugin died: %v", err)
		}
		if _, err := eng.Resume(ctx, box.ID); err != nil {
			t.Fatal(err)
		}
		if got, _ := eng.Get(ctx, box.ID); got.State != sandbox.StateRunning {
			t.Fatalf("state: %s", got.State)
		}
		if now := enginePlugin(t, v.dataDir); now == old {
			t.Fatalf("the plugin was not started again (pid %d)", now)
		}
	})
	t.Run("Delete", func(t *testing.T) {
		if err := eng.Delete(ctx, box.ID); err != nil {
			t.Fatal(err)
		}
		got, err := eng.Get(ctx, box.ID)
		if err != nil || got.State != sandbox.StateDeleted {
			t.Fatalf("after delete: %+v %v", got, err)
		}
		_, err = eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "true"})
		wantKind(t, "exec on deleted", err, sandbox.ErrState)
		wantKind(t, "delete twice", eng.Delete(ctx, box.ID), sandbox.ErrState)
		if l, _ := eng.List(ctx, sandbox.ListFilter{}); len(l) != 0 {
			t.Fatalf("deleted sandbox still listed: %v", l)
		}
		if ents, _ := os.ReadDir(filepath.Join(v.dataDir, "m")); len(ents) != 0 {
			t.Fatalf("machine files left: %v", ents)
		}
		if n := strayVMs(v.dataDir); n != 0 {
			t.Fatalf("%d VMs left after delete", n)
		}
	})
}

type chunk struct {
	at   time.Time
	data string
}

// stallWriter blocks its first write until release is closed (a client
// that stops reading), then counts and drops what it is given.
type stallWriter struct {
	release chan struct{}
	n       atomic.Int64
}

func (w *stallWriter) Write(b []byte) (int, error) {
	<-w.release
	w.n.Add(int64(len(b)))
	return len(b), nil
}

// resetPeakRSS resets pid's peak resident size (clear_refs 5) and returns
// its resident size now.
func resetPeakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
	return procStatusBytes(t, pid, "VmRSS:")
}

// goRuntimeBytes returns what the Go runtime holds from the OS after a
// collection, as its memory limit counts it.
func goRuntimeBytes() int64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64() - s[1].Value.Uint64())
}

// peakRSS returns pid's peak resident size since the last reset.
func peakRSS(t *testing.T, pid int) int64 { return procStatusBytes(t, pid, "VmHWM:") }

func procStatusBytes(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), &kb)
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

type stampWriter struct {
	mu     sync.Mutex
	chunks []chunk
}

func (w *stampWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.chunks = append(w.chunks, chunk{time.Now(), string(b)})
	return len(b), nil
}

func TestEngineBadInput(t *testing.T) {
	v := restoredEnv(t)
	eng := v.open(t)
	defer eng.Close()
	ctx := context.Background()
	missing := sandbox.NewID()
	cases := []struct {
		name  string
		err   error
		kind  error
		field string
	}{
		{"bad size", errOf(eng.Create(ctx, sandbox.CreateRequest{Image: "minimal", Size: sandbox.Size{Preset: "huge"}})), sandbox.ErrInvalid, "size.preset"},
		{"unknown image", errOf(eng.Create(ctx, sandbox.CreateRequest{Image: "nope"})), sandbox.ErrInvalid, "image"},
		{"negative ttl", errOf(eng.Create(ctx, sandbox.CreateRequest{Image: "minimal", TTLSeconds: -5})), sandbox.ErrInvalid, "ttl_seconds"},
		{"get missing", errOf(eng.Get(ctx, missing)), sandbox.ErrNotFound, ""},
		{"get malformed id", errOf(eng.Get(ctx, "../../etc")), sandbox.ErrNotFound, ""},
		{"delete missing", eng.Delete(ctx, missing), sandbox.ErrNotFound, ""},
		{"exec missing", errOf(eng.Exec(ctx, missing, sandbox.ExecRequest{Cmd: "true"})), sandbox.ErrNotFound, ""},
		{"exec without command", errOf(eng.Exec(ctx, missing, sandbox.ExecRequest{})), sandbox.ErrInvalid, "cmd"},
		{"exec negative timeout", errOf(eng.Exec(ctx, missing, sandbox.ExecRequest{Cmd: "x", TimeoutSeconds: -1})), sandbox.ErrInvalid, "timeout_seconds"},
		{"pause missing", errOf(eng.Pause(ctx, missing)), sandbox.ErrNotFound, ""},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.kind) || sandbox.FieldOf(c.err) != c.field {
			t.Errorf("%s: got %v (field %q), want %v on %q", c.name, c.err, sandbox.FieldOf(c.err), c.kind, c.field)
		}
	}
	// Nothing was created by any of it.
	if l, _ := eng.List(ctx, sandbox.ListFilter{State: sandbox.StateDeleted}); len(l) != 0 {
		t.Errorf("bad requests left records: %v", l)
	}
	if ents, _ := os.ReadDir(filepath.Join(v.dataDir, "m")); len(ents) != 0 {
		t.Errorf("bad requests left machine files: %v", ents)
	}
}

func errOf[T any](_ T, err error) error { return err }

func TestEngineTTL(t *testing.T) {
	v := restoredEnv(t)
	eng := v.open(t)
	box := create(t, eng, sandbox.CreateRequest{TTLSeconds: 1})
	if box.ExpiresAt == nil {
		t.Fatal("no expiry")
	}
	// The TTL expires while the engine is down: the next start deletes it.
	eng.Close()
	time.Sleep(1500 * time.Millisecond)
	eng = v.open(t)
	defer eng.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := eng.Get(context.Background(), box.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == sandbox.StateDeleted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox still %s after its TTL", got.State)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := strayVMs(v.dataDir); n != 0 {
		t.Fatalf("%d VMs left after TTL expiry", n)
	}
}

func TestEngineRestart(t *testing.T) {
	v := restoredEnv(t)
	ctx := context.Background()
	eng := v.open(t)
	box := create(t, eng, sandbox.CreateRequest{})
	run(t, eng, box.ID, "echo kept > /tmp/state")
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	// A closed engine leaves the VM running; a new one re-adopts it.
	eng = v.open(t)
	defer eng.Close()
	got, err := eng.Get(ctx, box.ID)
	if err != nil || got.State != sandbox.StateRunning {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	if r := run(t, eng, box.ID, "cat /tmp/state"); r.Stdout != "kept\n" {
		t.Fatalf("state lost across restart: %+v", r)
	}
	if err := eng.Delete(ctx, box.ID); err != nil {
		t.Fatal(err)
	}
}

// TestEngineDataDirFull is TestDataDirFull on a real VM (QEMU, the minimal
// image): the data directory is a 256 MiB tmpfs, filled while a sandbox
// runs. Creates fail with a clear capacity error and launch nothing, the
// running sandbox keeps answering, no half-made sandbox is left, and once
// space is freed a create works again.
func TestEngineDataDirFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	v := newEnv(t)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", v.dataDir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	// (Runs before newEnv's cleanup, which checks for VMs and removes
	// the directory.)
	t.Cleanup(func() { exec.Command("umount", "-l", v.dataDir).Run() })
	ctx := context.Background()
	eng := v.open(t)
	defer eng.Close()
	running := create(t, eng, sandbox.CreateRequest{})
	defer eng.Delete(ctx, running.ID)

	filler, err := os.Create(filepath.Join(v.dataDir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := filler.Write(make([]byte, 1<<20)); err != nil {
			break
		}
	}
	filler.Close()
	vms := liveVMs(v.dataDir)
	for range 2 {
		_, err := eng.Create(ctx, sandbox.CreateRequest{Image: "minimal"})
		if !errors.Is(err, sandbox.ErrCapacity) || !strings.Contains(err.Error(), "disk is full") {
			t.Fatalf("create on a full disk: %v, want a clear ErrCapacity", err)
		}
	}
	if n := liveVMs(v.dataDir); n != vms || n != 1 {
		t.Errorf("%d VMs after creates on a full disk, want the running one (%d before)", n, vms)
	}
	if r := run(t, eng, running.ID, "echo still"); r.Stdout != "still\n" {
		t.Fatalf("the running sandbox on a full disk: %+v", r)
	}
	if err := os.Remove(filepath.Join(v.dataDir, "filler")); err != nil {
		t.Fatal(err)
	}
	after := create(t, eng, sandbox.CreateRequest{})
	if l, err := eng.List(ctx, sandbox.ListFilter{}); err != nil || len(l) != 2 {
		t.Errorf("sandboxes after the full disk: %v %v, want the 2 that were created", l, err)
	}
	for _, id := range []string{running.ID, after.ID} {
		if err := eng.Delete(ctx, id); err != nil {
			t.Error(err)
		}
	}
}

// liveVMs counts the VMM processes that use dir (strayVMs, which kills
// them, is for the end).
func liveVMs(dir string) int {
	n := 0
	for _, p := range procs.Naming(dir + "/") {
		if p.IsVMM() {
			n++
		}
	}
	return n
}

// TestEngineKill9 runs an engine in a child process, kills it with -9 once
// a sandbox runs and again while another is being created, and checks that
// a new engine re-adopts the first, cleans up the second, and leaks nothing.
func TestEngineKill9(t *testing.T) {
	v := newEnv(t)
	ctx := context.Background()

	child := func(mode string) (*exec.Cmd, *bufio.Scanner) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestEngineChild$", "-test.v")
		cmd.Env = append(os.Environ(), "HAREBOX_TEST_CHILD="+mode, "HAREBOX_TEST_DATADIR="+v.dataDir,
			"HAREBOX_TEST_PLUGIN="+v.plugin, "HAREBOX_TEST_IMAGE="+v.img.Dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, bufio.NewScanner(out)
	}
	waitLine := func(sc *bufio.Scanner, prefix string) string {
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), prefix); ok {
				return rest
			}
		}
		t.Fatalf("child ended before printing %q", prefix)
		return ""
	}

	cmd, sc := child("create")
	id := waitLine(sc, "SANDBOX ")
	cmd.Process.Kill() // SIGKILL
	cmd.Wait()

	cmd, sc = child("interrupted")
	waitLine(sc, "CREATING")
	time.Sleep(1500 * time.Millisecond) // the VM is launched and booting
	cmd.Process.Kill()
	cmd.Wait()

	eng := v.open(t)
	defer eng.Close()
	got, err := eng.Get(ctx, id)
	if err != nil || got.State != sandbox.StateRunning {
		t.Fatalf("after kill -9: %+v %v", got, err)
	}
	if r := run(t, eng, id, "cat /tmp/marker"); r.Stdout != "before kill\n" {
		t.Fatalf("state lost across kill -9: %+v", r)
	}
	all, _ := eng.List(ctx, sandbox.ListFilter{State: sandbox.StateDeleted})
	if len(all) != 1 || !strings.Contains(all[0].Error, "being created") {
		t.Fatalf("the interrupted create was not cleaned up: %+v", all)
	}
	if ents, _ := os.ReadDir(filepath.Join(v.dataDir, "m")); len(ents) != 1 || ents[0].Name() != id {
		t.Fatalf("machine dirs after restart: %v", ents)
	}
	if err := eng.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// TestEngineChild is the engine process that TestEngineKill9 kills.
func TestEngineChild(t *testing.T) {
	mode := os.Getenv("HAREBOX_TEST_CHILD")
	if mode == "" {
		t.Skip("helper process for TestEngineKill9")
	}
	img, err := images.Load(os.Getenv("HAREBOX_TEST_IMAGE"))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := harebox.New(context.Background(), harebox.Options{
		DataDir: os.Getenv("HAREBOX_TEST_DATADIR"), PluginPath: os.Getenv("HAREBOX_TEST_PLUGIN"),
		Images: map[string]images.Image{"minimal": img},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if mode == "interrupted" {
		fmt.Println("CREATING")
		eng.Create(ctx, sandbox.CreateRequest{Image: "minimal"})
		select {}
	}
	box, err := eng.Create(ctx, sandbox.CreateRequest{Image: "minimal"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "echo before kill > /tmp/marker"}); err != nil {
		t.Fatal(err)
	}
	fmt.Println("SANDBOX " + box.ID)
	select {} // until killed
}

// TestEngineDefaultImage boots the Debian image (systemd, the agent as a
// service, python3, sudo) through the engine. Building the image runs
// debootstrap once (cached), so it runs where HAREBOX_TEST_DEFAULT_IMAGE=1
// (make test sets it).
func TestEngineDefaultImage(t *testing.T) {
	if os.Getenv("HAREBOX_TEST_DEFAULT_IMAGE") != "1" {
		t.Skip("default image: set HAREBOX_TEST_DEFAULT_IMAGE=1 (make test does) to build it with debootstrap and boot it")
	}
	// Beside TestCrashGoldenPool: its guest's work and the other's waits
	// share the cores.
	t.Parallel()
	v := newEnv(t)
	def := testimage.Image(t, "default")
	baseBefore, err := os.Stat(def.RootDisk)
	if err != nil {
		t.Fatal(err)
	}
	opts := v.options()
	opts.Images["default"] = def
	eng, err := harebox.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	ctx := context.Background()
	// A canary the sandbox holds in its env, on its disk, in a process's
	// memory and in its command history: none of it may reach the host's
	// files in plain text, and delete takes its key away.
	canaryBytes := make([]byte, 32)
	rand.Read(canaryBytes)
	canary := hex.EncodeToString(canaryBytes)
	// An environment with a credential rule: the sandbox gets its own CA.
	if _, err := eng.Environments().Create(ctx, "", envs.CreateRequest{Name: "api",
		Variables:   map[string]envs.Var{"API_KEY": {Value: "sk-default-image-test", Secret: true}},
		Credentials: []store.CredentialRule{{Secret: "API_KEY", Hosts: []string{"api.example.test"}}},
	}); err != nil {
		t.Fatal(err)
	}
	// (A 2 GB disk, more than the image's: DiskFull fills it, and frees
	// it for what follows.)
	box := create(t, eng, sandbox.CreateRequest{Image: "default", Size: sandbox.Size{VCPUs: 1, MemoryMB: 512, DiskGB: 2}, Environment: "api", TTLSeconds: 900, Env: map[string]string{"HB_CANARY": canary}})
	defer eng.Delete(ctx, box.ID)
	job := "import os, sys\nprint('job', os.getuid(), sys.version_info[0])\n"
	if _, err := eng.WriteFile(ctx, box.ID, "/home/user/job.py", strings.NewReader(job), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	r, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "python3 /home/user/job.py", TimeoutSeconds: 300})
	if err != nil || r.ExitCode != 0 || r.Stdout != "job 1000 3\n" {
		t.Fatalf("python3 job: %+v %v", r, err)
	}
	// A cold boot's agent answers before systemd has finished the boot:
	// until the system bus listens, a user's systemctl cannot ask it
	// anything. Root's asks systemd directly, and waits.
	t.Logf("systemd's boot: %s", strings.TrimSpace(run(t, eng, box.ID, "sudo -n systemctl is-system-running --wait").Stdout))
	checks := map[string]string{
		"systemctl is-system-running":       "",
		"systemctl is-active harebox-agent": "active\n",
		"sudo -n id -u":                     "0\n",
		"findmnt -no FSTYPE /":              "ext4\n",
	}
	for cmd, want := range checks {
		r := run(t, eng, box.ID, cmd)
		if want != "" && r.Stdout != want {
			t.Errorf("%s: got %q (stderr %q), want %q", cmd, r.Stdout, r.Stderr, want)
		}
		if want == "" {
			t.Logf("%s: %s", cmd, strings.TrimSpace(r.Stdout))
		}
	}
	// A login shell (as E2B's SDK runs every command) gets each user's
	// PATH from /etc/profile, which asks bash's EUID (the image's edit).
	r = run(t, eng, box.ID, `bash -lc 'echo "$PATH"'; sudo bash -lc 'echo "$PATH"'`)
	if paths := strings.Split(strings.TrimSpace(r.Stdout), "\n"); len(paths) != 2 ||
		!strings.HasSuffix(paths[0], "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games") ||
		!strings.HasSuffix(paths[1], "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin") {
		t.Errorf("login shells' PATH (the user's, then root's): %q", r.Stdout)
	}
	// Under TCG the guest's processes load at fixed addresses (the QEMU
	// backend's norandmaps), so TCG reuses their translated code; under
	// KVM they keep full randomization.
	caps, err := eng.Capabilities(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantASLR := map[string]string{"tcg": "0\n", "kvm": "2\n"}[caps.Accelerator]
	if r := run(t, eng, box.ID, "cat /proc/sys/kernel/randomize_va_space"); r.Stdout != wantASLR {
		t.Errorf("randomize_va_space under %s: %q, want %q", caps.Accelerator, r.Stdout, wantASLR)
	}
	// The guest keeps time by the TSC, which lets an idle guest go
	// without timer ticks (under TCG the kernel would otherwise judge the
	// TSC by late emulated ticks and fall back to counting them).
	wantClock := map[string]string{"tcg": "tsc\n", "kvm": "kvm-clock\n"}[caps.Accelerator]
	if r := run(t, eng, box.ID, "cat /sys/devices/system/clocksource/clocksource0/current_clocksource"); r.Stdout != wantClock {
		t.Errorf("clocksource under %s: %q, want %q", caps.Accelerator, r.Stdout, wantClock)
	}
	// The root filesystem has the size's disk (2 GB), not the image's.
	r = run(t, eng, box.ID, "df -k --output=size / | tail -n 1")
	var kb int64
	fmt.Sscan(strings.TrimSpace(r.Stdout), &kb)
	if kb < 1800<<10 {
		t.Errorf("root filesystem is %d KiB, want about %d GiB", kb, box.Size.DiskGB)
	}
	// The root disk is this sandbox's own overlay: the base image is untouched.
	r = run(t, eng, box.ID, "sudo sh -c 'echo mine > /etc/harebox-test && sync' && cat /etc/harebox-test")
	if r.Stdout != "mine\n" {
		t.Fatalf("write to the root disk: %+v", r)
	}
	if after, err := os.Stat(def.RootDisk); err != nil || !after.ModTime().Equal(baseBefore.ModTime()) {
		t.Fatalf("the base root disk changed: %v", err)
	}

	t.Run("Tools", func(t *testing.T) {
		// What the code run in a sandbox expects of the image, used as
		// the unprivileged user: a C toolchain and make, git, curl, pip, venv.
		// (pip and venv installing from an index: linuxnet's TestVMDebian/PipInstall.)
		r := run(t, eng, box.ID, `set -e; mkdir -p /tmp/tools && cd /tmp/tools
printf '#include <stdio.h>\nint main(void){puts("built here");return 0;}\n' > hello.c
printf 'hello: hello.c\n\tcc -O2 -o $@ $<\n' > Makefile
make -s && ./hello
git init -q && git add . && git -c user.name=u -c user.email=u@x commit -qm one && git log --format=%s
curl --version | head -n 1 | cut -d' ' -f1
python3 -m pip --version | cut -d' ' -f1
python3 -m venv --without-pip v && v/bin/python -c 'import sys; print("venv", sys.prefix != sys.base_prefix)'`)
		if r.ExitCode != 0 || r.Stdout != "built here\none\ncurl\npip\nvenv True\n" {
			t.Fatalf("tools: %+v", r)
		}
	})

	t.Run("TrustStore", func(t *testing.T) {
		// The sandbox's CA is in the image's own trust store, beside
		// Debian's CAs, for programs that read no variable.
		r := run(t, eng, box.ID, `env -u SSL_CERT_FILE -u REQUESTS_CA_BUNDLE python3 -c '
import ssl
certs = ssl.create_default_context().get_ca_certs(binary_form=True)
print(len(certs) > 100, ssl.PEM_cert_to_DER_cert(open("/etc/harebox/ca.pem").read()) in certs)'`)
		if r.ExitCode != 0 || r.Stdout != "True True\n" {
			t.Fatalf("trust store: %+v", r)
		}
	})

	t.Run("DiskFull", func(t *testing.T) {
		// The guest fills its own (2 GB) disk: its writes fail with ENOSPC
		// inside, its agent answers, the host's copy stays within the
		// disk's size; freed, the disk takes writes again. (fallocate
		// takes all but the last 64 MiB, which dd writes: writing the
		// whole disk through the emulated CPU and the overlay's
		// encryption took 90 s of the suite.)
		r, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "fallocate -l $(( $(df -k --output=avail /home/user | tail -n 1) - 65536 ))k /home/user/fill0 && " +
			"dd if=/dev/zero of=/home/user/fill bs=1M; rc=$?; sync; exit $rc", TimeoutSeconds: 240})
		if err != nil {
			t.Fatal("fill:", err)
		}
		if r.ExitCode == 0 || !strings.Contains(r.Stderr, "No space left") {
			t.Fatalf("filling the disk: %+v", r)
		}
		if r := run(t, eng, box.ID, "echo alive"); r.Stdout != "alive\n" {
			t.Fatalf("after the disk filled: %+v", r)
		}
		var overlay int64
		filepath.WalkDir(filepath.Join(v.dataDir, "m", box.ID), func(p string, d os.DirEntry, err error) error {
			if err == nil && strings.HasSuffix(p, ".qcow2") {
				if fi, err := d.Info(); err == nil {
					overlay += fi.Size()
				}
			}
			return nil
		})
		t.Logf("the full guest's overlay takes %d MiB on the host", overlay>>20)
		if overlay > 2<<30+128<<20 {
			t.Errorf("the overlay of a 2 GB disk takes %d MiB on the host", overlay>>20)
		}
		if r := run(t, eng, box.ID, "rm /home/user/fill /home/user/fill0 && sync && echo ok > /home/user/after && cat /home/user/after"); r.Stdout != "ok\n" {
			t.Fatalf("after freeing the disk: %+v", r)
		}
	})
	t.Run("MemoryExhausted", func(t *testing.T) {
		// A job that eats the guest's memory meets the guest's OOM killer;
		// the agent stays, and so does the sandbox.
		// The agent's pages are locked in RAM: reclaim would otherwise
		// take its code first and stall it past the host's keepalives.
		var lockedKB int
		fmt.Sscanf(run(t, eng, box.ID, "grep VmLck /proc/$(pidof harebox-agent)/status").Stdout, "VmLck: %d kB", &lockedKB)
		if lockedKB < 1024 {
			t.Errorf("the agent has %d KiB locked in memory", lockedKB)
		}
		hog := "python3 -c 'a = []\nwhile True: a.append(bytearray(16 << 20))'"
		r, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: hog, TimeoutSeconds: 180})
		if err != nil {
			t.Fatal("the hog's exec:", err)
		}
		if r.ExitCode == 0 || r.TimedOut {
			t.Fatalf("the memory hog was not stopped by the OOM killer: %+v", r)
		}
		t.Logf("the hog ended with exit code %d", r.ExitCode)
		if r := run(t, eng, box.ID, "echo alive"); r.Stdout != "alive\n" {
			t.Fatalf("after the OOM: %+v", r)
		}
		if got, _ := eng.Get(ctx, box.ID); got.State != sandbox.StateRunning {
			t.Fatalf("state after the OOM: %s", got.State)
		}
	})
	t.Run("StopStart", func(t *testing.T) {
		// Stop keeps the disk: a file written before is there after Start;
		// a process that ran is not (the guest booted again).
		run(t, eng, box.ID, "echo kept > /home/user/kept && sync")
		run(t, eng, box.ID, "nohup sleep 3600 >/dev/null 2>&1 &")
		start := time.Now()
		if s, err := eng.Stop(ctx, box.ID); err != nil || s.State != sandbox.StateStopped {
			t.Fatalf("stop: %+v %v", s, err)
		}
		t.Logf("stopped in %v", time.Since(start).Round(time.Millisecond))
		if strayVMs(v.dataDir) != 0 {
			t.Fatal("a VMM still runs after stop")
		}
		start = time.Now()
		if s, err := eng.Start(ctx, box.ID); err != nil || s.State != sandbox.StateRunning {
			t.Fatalf("start: %+v %v", s, err)
		}
		t.Logf("started in %v", time.Since(start).Round(time.Millisecond))
		if r := run(t, eng, box.ID, "cat /home/user/kept; pgrep -x sleep || echo no-sleep"); r.Stdout != "kept\nno-sleep\n" {
			t.Fatalf("after stop and start: %+v", r)
		}
	})
	t.Run("CryptoErase", func(t *testing.T) {
		// (sudo drops the environment: the file gets the value itself.)
		r := run(t, eng, box.ID, `echo "$HB_CANARY" | sudo tee /root/canary && sudo sync && sudo cat /root/canary`)
		if r.Stdout != canary+"\n"+canary+"\n" {
			t.Fatalf("canary: %+v", r)
		}
		run(t, eng, box.ID, `nohup sh -c "x=$HB_CANARY; exec sleep 600" >/dev/null 2>&1 &`)
		run(t, eng, box.ID, `echo "console:$HB_CANARY" | sudo tee /dev/ttyS0 >/dev/null`)
		db, err := store.OpenSQLite(ctx, filepath.Join(v.dataDir, "harebox.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		// The console reaches its log, which the identity sealed under the
		// sandbox's data key reads.
		console := consoleIdentity(t, db, v.dataDir, box.ID)
		logPath := filepath.Join(v.dataDir, "m", box.ID, "serial.log")
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			tail, err := consolelog.Tail(logPath, console, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(tail, []byte("console:"+canary)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the canary did not reach the console log; its end: %q", tail[max(0, len(tail)-500):])
			}
		}
		// A snapshot's files (memory, disk writes) are under the data dir
		// too, and under a key.
		snap, err := eng.Snapshots().Take(ctx, box.ID, sandbox.SnapshotRequest{Name: "canary"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := eng.Pause(ctx, box.ID); err != nil {
			t.Fatal(err)
		}
		if found := hypervisortest.FilesContaining(t, v.dataDir, []byte(canary)); len(found) > 0 {
			t.Errorf("the canary is in plain text in %v", found)
		}
		if _, err := eng.Resume(ctx, box.ID); err != nil {
			t.Fatal(err)
		}
		wrapped, err := db.GetSecret(ctx, "sandbox/"+box.ID, secrets.DataKeyName)
		if err != nil {
			t.Fatal("the sandbox has no data key:", err)
		}
		if err := eng.Delete(ctx, box.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.GetSecret(ctx, "sandbox/"+box.ID, secrets.DataKeyName); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("the data key outlived its sandbox: %v", err)
		}
		if found := hypervisortest.FilesContaining(t, v.dataDir, wrapped); len(found) > 0 {
			t.Errorf("the erased key's sealed bytes are still in %v", found)
		}
		if _, err := os.Stat(filepath.Join(v.dataDir, "m", box.ID)); !os.IsNotExist(err) {
			t.Errorf("the sandbox's state directory is still there: %v", err)
		}
		// The snapshot outlived it, under its own key copy; its delete
		// erases that too.
		snapWrapped, err := db.GetSecret(ctx, "snapshot/"+snap.ID, secrets.DataKeyName)
		if err != nil {
			t.Fatal("the snapshot has no key:", err)
		}
		if err := eng.Snapshots().Delete(ctx, snap.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.GetSecret(ctx, "snapshot/"+snap.ID, secrets.DataKeyName); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("the snapshot's key outlived it: %v", err)
		}
		if found := hypervisortest.FilesContaining(t, v.dataDir, snapWrapped); len(found) > 0 {
			t.Errorf("the snapshot's erased key's sealed bytes are still in %v", found)
		}
		if ents, _ := os.ReadDir(filepath.Join(v.dataDir, "snapshots")); len(ents) != 0 {
			t.Errorf("snapshot files are still there: %v", ents)
		}
	})
}

// consoleIdentity reads a sandbox's console identity as only a holder of
// the master key and the sandbox's data key can.
func consoleIdentity(t *testing.T, db store.Store, dataDir, id string) *age.X25519Identity {
	t.Helper()
	ctx := context.Background()
	master, err := secrets.NewSealed(db, filepath.Join(dataDir, "master.key"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := secrets.DataKey(ctx, master, "sandbox/"+id)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := master.Get(ctx, "sandbox/"+id, "console-key")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := secrets.Open(key, "console-key", sealed)
	if err != nil {
		t.Fatal(err)
	}
	ident, err := age.ParseX25519Identity(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	return ident
}

// TestEngineVMExit: a VM that stops on its own (here root in the guest
// powers it off) is noticed: its sandbox becomes stopped with a reason, its
// reservation is released and nothing is left on the host.
func TestEngineVMExit(t *testing.T) {
	v := restoredEnv(t)
	eng := v.open(t)
	defer eng.Close()
	ctx := context.Background()
	box := create(t, eng, sandbox.CreateRequest{Size: sandbox.Size{VCPUs: 3, MemoryMB: 512}})
	// Fire and forget: the exec's stream dies with the VM.
	eng.Processes().Start(ctx, box.ID, sandbox.ExecRequest{Cmd: "sync; poweroff -f", User: "root"})
	if got := waitStopped(t, eng, box.ID, "the guest powered off"); got.Error == "" {
		t.Error("stopped without a reason")
	}
	// It is an event, by the engine.
	evs, _, err := eng.Events().List(ctx, events.Query{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(evs); n != 1 || evs[0].Action != "vmExited" || evs[0].Target != box.ID || evs[0].Principal != "engine" {
		t.Errorf("events after the VM exited: %+v", evs)
	}
	_, err = eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "true"})
	wantKind(t, "exec on a stopped sandbox", err, sandbox.ErrState)
	// All 3 vCPUs were released: the same size fits again.
	again := create(t, eng, sandbox.CreateRequest{Size: sandbox.Size{VCPUs: 3, MemoryMB: 512}})
	if err := eng.Delete(ctx, again.ID); err != nil {
		t.Fatal(err)
	}
	if err := eng.Delete(ctx, box.ID); err != nil {
		t.Fatal("delete the stopped sandbox:", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(v.dataDir, "m")); len(ents) != 0 {
		t.Fatalf("machine files left: %v", ents)
	}
}

// A secret of an environment never enters the guest: root there finds its
// placeholder in the environment of every exec, in /proc and in the
// templated file, and the value nowhere.
func TestEnvironmentInGuest(t *testing.T) {
	v := restoredEnv(t)
	eng := v.open(t)
	defer eng.Close()
	ctx := context.Background()
	const secret = "sk-live-guest-canary-5f3a9c"
	_, err := eng.Environments().Create(ctx, "", envs.CreateRequest{
		Name: "prod",
		Variables: map[string]envs.Var{
			"MODE":  {Value: "prod"},
			"TOKEN": {Value: secret, Secret: true},
		},
		Files: []store.EnvFile{{Path: "/etc/app/app.conf", Template: true, Content: "token={{TOKEN}}\n", Mode: 0o600, Owner: "user"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	box := create(t, eng, sandbox.CreateRequest{Environment: "prod", Env: map[string]string{"OWN": "mine"}})
	defer eng.Delete(ctx, box.ID)
	r, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{User: "root", TimeoutSeconds: 60, Cmd: `
echo "env=$MODE $TOKEN $OWN"
cat /etc/app/app.conf
sleep 30 & pid=$!
# (Its environ reads empty while it is in execve: wait until it is sleep.)
i=0; while [ "$(cat /proc/$pid/comm)" != sleep ] && [ $i -lt 10000 ]; do i=$((i+1)); done
cat /proc/$pid/environ | tr '\0' '\n' | grep ^TOKEN=; kill $pid
grep -rl "` + secret + `" /etc /root /home /tmp /var 2>/dev/null | head -3
echo done`})
	if err != nil {
		t.Fatal(err)
	}
	out := r.Stdout
	t.Logf("in the guest:\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "env=prod hbph_") || !strings.HasSuffix(lines[0], " mine") {
		t.Fatalf("what the guest sees: %q", out)
	}
	ph := strings.Fields(lines[0])[1]
	if lines[1] != "token="+ph || lines[2] != "TOKEN="+ph || lines[3] != "done" || strings.Contains(out, secret) {
		t.Fatalf("the guest saw the secret, or not its placeholder everywhere: %q", out)
	}
}

// waitStopped waits up to a minute for a sandbox to be stopped after what
// (a guest's own doing) and returns it.
func waitStopped(t *testing.T, eng *harebox.Engine, id, what string) *sandbox.Sandbox {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got, err := eng.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == sandbox.StateStopped {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox still %s after %s", got.State, what)
		}
	}
}

// TestEngineKernelPanic: root in the guest crashes its kernel. The VM
// stops, and the reason the sandbox gives is the panic's own last line,
// read back from the encrypted console log (QEMU waits, stopped, until
// the backend has drained the console's last lines).
func TestEngineKernelPanic(t *testing.T) {
	v := newEnv(t)
	eng := v.open(t)
	defer eng.Close()
	ctx := context.Background()
	box := create(t, eng, sandbox.CreateRequest{})
	defer eng.Delete(ctx, box.ID)
	eng.Processes().Start(ctx, box.ID, sandbox.ExecRequest{Cmd: "echo c > /proc/sysrq-trigger", User: "root"})
	got := waitStopped(t, eng, box.ID, "a kernel panic")
	if !strings.Contains(got.Error, "Kernel panic") {
		t.Errorf("stopped with %q, want the kernel's panic line", got.Error)
	}
	t.Logf("reason: %s", got.Error)
	if n := strayVMs(v.dataDir); n > 0 {
		t.Errorf("%d VMMs still run after the panic", n)
	}
}

// vmmCPU is the CPU time, in seconds, of the VMM whose command line
// names dir.
func vmmCPU(t *testing.T, dir string) float64 {
	t.Helper()
	for _, p := range procs.Naming(dir) {
		if !p.IsVMM() {
			continue
		}
		st, err := procs.ReadStat(p.PID)
		if err != nil {
			t.Fatal(err)
		}
		return st.CPU.Seconds()
	}
	t.Fatalf("no VMM names %s", dir)
	return 0
}

// TestGuestForkBomb: root in one sandbox runs a fork bomb. Its neighbour
// keeps answering, the host keeps working, and delete still takes the
// bombed sandbox down at once with nothing left behind.
func TestGuestForkBomb(t *testing.T) {
	v := restoredEnv(t)
	eng := v.open(t)
	defer eng.Close()
	ctx := context.Background()
	bomb := create(t, eng, sandbox.CreateRequest{})
	defer eng.Delete(ctx, bomb.ID) // if the test stops early
	calm := create(t, eng, sandbox.CreateRequest{})
	defer eng.Delete(ctx, calm.ID)
	if _, err := eng.Processes().Start(ctx, bomb.ID, sandbox.ExecRequest{Cmd: `b(){ b|b& }; b`, User: "root"}); err != nil {
		t.Fatal(err)
	}
	// The bomb is really running: its guest's vCPU is busy, seen from the
	// host (the VMM's CPU time over a second). An exec in the bombed guest
	// would say so too, but only after 15 to 45 s of the bomb's CPU here.
	dir := filepath.Join(v.dataDir, "m", bomb.ID) + "/"
	for deadline, seen := time.Now().Add(20*time.Second), 0; seen < 3; {
		before := vmmCPU(t, dir)
		time.Sleep(time.Second)
		busy := vmmCPU(t, dir) - before
		if busy >= 0.5 {
			seen++ // (three busy seconds in a row: the bomb took the guest over)
			t.Logf("the bombed guest keeps its vCPU busy: %.2f s of CPU in a second", busy)
			continue
		}
		seen = 0
		if time.Now().After(deadline) {
			t.Fatalf("the fork bomb is not running: its VMM used %.2f s of CPU in a second", busy)
		}
	}
	for i := range 3 {
		start := time.Now()
		r, err := eng.Exec(ctx, calm.ID, sandbox.ExecRequest{Cmd: "echo calm", TimeoutSeconds: 30})
		if err != nil || r.Stdout != "calm\n" {
			t.Fatalf("the neighbour, exec %d: %+v %v", i, r, err)
		}
		t.Logf("neighbour exec %d answered in %v", i, time.Since(start).Round(time.Millisecond))
	}
	got, err := eng.Get(ctx, bomb.ID)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the bombed sandbox: state %s, agent %q", got.State, got.Agent)
	start := time.Now()
	if err := eng.Delete(ctx, bomb.ID); err != nil {
		t.Fatal("delete the bombed sandbox:", err)
	}
	t.Logf("deleted the bombed sandbox in %v", time.Since(start).Round(time.Millisecond))
	if _, err := os.Stat(filepath.Join(v.dataDir, "m", bomb.ID)); !os.IsNotExist(err) {
		t.Errorf("the bombed sandbox's files are still there: %v", err)
	}
	for _, p := range procs.Naming(filepath.Join(v.dataDir, "m", bomb.ID) + "/") {
		if p.IsVMM() {
			t.Errorf("the bombed sandbox's VMM %d still runs", p.PID)
		}
	}
}
