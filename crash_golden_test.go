package harebox_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/sandbox"

	_ "modernc.org/sqlite" // (the data directory's database, read by the checks)
)

// TestCrashGoldenPool kills an engine (a child process, SIGKILL) at each
// step of a golden boot and of a pool refill, on real VMs (QEMU, the
// minimal image). The VMMs outlive the killed engine, as a sandbox's must;
// the engine started again on the data directory stops every one of them
// (by pid, and no qemu process names the data directory), removes their
// pool files and a golden snapshot's cut short (one made keeps), has no
// key of theirs, and re-adopts a sandbox
// claimed from the pool before the kill (its VMM names the golden
// snapshot's disk, and lives on). After a clean Close nothing runs.
//
// It runs beside the other parallel tests, and its cases two at a time:
// each waits on its own child's VMs most of its time. Under make test
// the pool's cases restore from the run's golden snapshot of the
// minimal image (HAREBOX_TEST_GOLDEN_DIR), as the test servers do,
// instead of each booting one of its own first; the golden boot's cases
// boot their own.
func TestCrashGoldenPool(t *testing.T) {
	needQEMU(t)
	t.Parallel()
	cases := []struct {
		step string
		nth  int // which time the step is reached (0: the first)
		// hold: the child stops at the step, and is killed there; else it
		// goes on, and is killed as soon as the VMM the step starts runs
		// (or, for the snapshot, its memory is being written).
		hold bool
		// claim: a sandbox is claimed from the pool first.
		claim bool
	}{
		{step: "golden-launch"},
		{step: "golden-booting", hold: true},
		{step: "golden-settled", hold: true},
		{step: "golden-snapshot"},
		{step: "golden-written", hold: true},
		{step: "pool-restore"},
		{step: "pool-restored", hold: true},
		{step: "pool-warm", hold: true},
		{step: "pool-idle", hold: true},
		{step: "pool-restored", nth: 2, hold: true, claim: true},
	}
	for _, c := range cases {
		name := c.step
		if c.claim {
			name += "-after-a-claim"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			began := time.Now()
			var (
				v            *env
				claimed, dir string
				before, left []qproc
			)
			for attempt := 1; ; attempt++ {
				if strings.HasPrefix(c.step, "pool-") {
					v = restoredEnv(t)
				} else {
					v = newEnv(t)
				}
				ch := startCrashChild(t, v, c.step, max(c.nth, 1), c.hold, c.claim)
				claimed = ""
				if c.claim {
					claimed = ch.wait(t, "SANDBOX ")
				}
				dir = ch.waitStep(t, c.step, max(c.nth, 1))
				if !c.hold {
					// Killed while the VMM is being launched (or restored),
					// or while the snapshot's memory is being written.
					waitFor(t, "the step's VMM or snapshot", func() bool {
						return len(vmmsNaming(dir+"/")) > 0 || fileExists(filepath.Join(dir, "memory"))
					})
				}
				before = qemuNaming(v.dataDir + "/")
				ch.kill()
				if c.step == "golden-snapshot" {
					t.Logf("at the kill the snapshot's memory file had %d bytes, and the snapshot was complete: %v",
						fileSize(filepath.Join(dir, "memory")), fileExists(filepath.Join(dir, "snapshot.json")))
				}
				left = nil
				for _, p := range before {
					if p.runs() && !p.of(v.dataDir, claimed) {
						left = append(left, p)
					}
				}
				if len(left) > 0 {
					break
				}
				// A VMM killed in mid-restore can end by itself: its
				// incoming stream came from the plugin, which dies with
				// the engine. Then no VMM outlived the kill, and the sweep
				// is not tested: try again, a few times.
				if c.hold || attempt == 3 {
					t.Fatalf("no VMM of the killed engine ran after the kill (before it: %v; attempt %d): nothing was tested", before, attempt)
				}
				t.Logf("attempt %d: no VMM outlived the kill at %s (before it: %v); again", attempt, c.step, before)
			}
			t.Logf("killed at %s (%s): %d qemu processes outlive it", c.step, dir, len(left))

			eng := v.open(t)
			closed := false
			defer func() {
				if !closed {
					eng.Close()
				}
			}()
			noneLeft(t, "after the restart", v.dataDir, left, claimed)
			// A golden boot cut short leaves nothing; a golden snapshot
			// made before the kill (its manifest written) is kept.
			kept, _ := filepath.Glob(filepath.Join(v.dataDir, "golden", "*", "golden.json"))
			var all []string
			ents, _ := os.ReadDir(filepath.Join(v.dataDir, "golden"))
			for _, e := range ents {
				if e.IsDir() {
					all = append(all, e.Name())
				}
			}
			if strings.HasPrefix(c.step, "golden-") && len(all) > 0 || len(all) != len(kept) {
				t.Errorf("golden files after the restart: %v (of them kept with a manifest: %v)", all, kept)
			}
			var dirs []string
			ents, _ = os.ReadDir(filepath.Join(v.dataDir, "m"))
			for _, e := range ents {
				if e.Name() != claimed {
					dirs = append(dirs, e.Name())
				}
			}
			if len(dirs) > 0 {
				t.Errorf("machine directories of no sandbox after the restart: %v", dirs)
			}
			for _, s := range sealedScopes(t, v.dataDir) {
				if strings.HasPrefix(s, "sandbox/") && s != "sandbox/"+claimed {
					t.Errorf("a key of no sandbox is stored: %s", s)
				}
			}
			if claimed != "" {
				ctx := context.Background()
				if got, err := eng.Get(ctx, claimed); err != nil || got.State != sandbox.StateRunning {
					t.Fatalf("the claimed sandbox after the restart: %+v %v", got, err)
				}
				if r := run(t, eng, claimed, "echo alive"); r.Stdout != "alive\n" {
					t.Fatalf("the claimed sandbox: %+v", r)
				}
				if err := eng.Delete(ctx, claimed); err != nil {
					t.Fatal(err)
				}
			}
			closed = true
			if err := eng.Close(); err != nil {
				t.Error(err)
			}
			noneLeft(t, "after Close", v.dataDir, left, "")
			t.Logf("took %v", time.Since(began).Round(100*time.Millisecond))
		})
	}
}

// noneLeft fails if a qemu process of the killed engine (in left) still
// runs, or any qemu process names dataDir other than the sandbox kept's.
func noneLeft(t *testing.T, when, dataDir string, left []qproc, kept string) {
	t.Helper()
	for _, p := range left {
		if p.runs() {
			t.Errorf("%s: the killed engine's %s still runs", when, p)
		}
	}
	for _, p := range qemuNaming(dataDir + "/") {
		if !p.of(dataDir, kept) {
			t.Errorf("%s: qemu process %s names the data directory", when, p)
		}
	}
}

// crashChild is an engine in a child process (TestCrashGoldenPoolChild).
type crashChild struct {
	cmd   *exec.Cmd
	lines chan string
	// tail is the child's last lines (its steps and its engine's log),
	// for a failure to show.
	mu   sync.Mutex
	tail []string
}

// last returns the child's last lines, one string.
func (ch *crashChild) last() string {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return strings.Join(ch.tail, "\n")
}

func startCrashChild(t *testing.T, v *env, step string, nth int, hold, claim bool) *crashChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashGoldenPoolChild$", "-test.v")
	cmd.Env = append(os.Environ(), "HAREBOX_TEST_CRASH_AT="+step+"#"+strconv.Itoa(nth),
		"HAREBOX_TEST_DATADIR="+v.dataDir, "HAREBOX_TEST_PLUGIN="+v.plugin, "HAREBOX_TEST_IMAGE="+v.img.Dir,
		"HAREBOX_TEST_CRASH_GOLDEN="+v.goldenDir)
	if hold {
		cmd.Env = append(cmd.Env, "HAREBOX_TEST_CRASH_HOLD=1")
	}
	if claim {
		cmd.Env = append(cmd.Env, "HAREBOX_TEST_CRASH_CLAIM=1")
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := &crashChild{cmd: cmd, lines: make(chan string, 64)}
	go func() {
		defer close(ch.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ch.mu.Lock()
			ch.tail = append(ch.tail, sc.Text())
			if len(ch.tail) > 40 {
				ch.tail = ch.tail[1:]
			}
			ch.mu.Unlock()
			ch.lines <- sc.Text()
		}
	}()
	t.Cleanup(ch.kill)
	return ch
}

// crashStepTimeout bounds the wait for a step: a golden boot and a
// restore of the minimal image take seconds under TCG.
const crashStepTimeout = 3 * time.Minute

// wait returns the rest of the child's first line that starts with prefix.
func (ch *crashChild) wait(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(crashStepTimeout)
	for {
		select {
		case l, ok := <-ch.lines:
			if !ok {
				t.Fatalf("the child ended before printing %q; its last lines:\n%s", prefix, ch.last())
			}
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				return rest
			}
		case <-timeout:
			t.Fatalf("the child did not print %q within %v; its last lines:\n%s", prefix, crashStepTimeout, ch.last())
		}
	}
}

// waitStep waits until the child reaches step for the nth time, and
// returns the directory the step concerns.
func (ch *crashChild) waitStep(t *testing.T, step string, nth int) string {
	t.Helper()
	return ch.wait(t, fmt.Sprintf("STEP %s %d ", step, nth))
}

func (ch *crashChild) kill() {
	if ch.cmd.ProcessState == nil {
		ch.cmd.Process.Kill() // SIGKILL
		ch.cmd.Wait()
	}
}

// TestCrashGoldenPoolChild is the engine process TestCrashGoldenPool
// kills: it keeps a pool of one minimal sandbox (which starts a golden
// boot), prints each step it reaches, and holds at the one it is to be
// killed at.
func TestCrashGoldenPoolChild(t *testing.T) {
	at := os.Getenv("HAREBOX_TEST_CRASH_AT")
	if at == "" {
		t.Skip("helper process for TestCrashGoldenPool")
	}
	step, n, _ := strings.Cut(at, "#")
	nth, _ := strconv.Atoi(n)
	hold := os.Getenv("HAREBOX_TEST_CRASH_HOLD") == "1"
	var mu sync.Mutex
	seen := map[string]int{}
	harebox.SetStepHook(func(s, dir string) {
		mu.Lock()
		seen[s]++
		k := seen[s]
		mu.Unlock()
		fmt.Printf("STEP %s %d %s\n", s, k, dir)
		if s == step && k == nth && hold {
			select {} // until killed
		}
	})
	img, err := images.Load(os.Getenv("HAREBOX_TEST_IMAGE"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	opts := harebox.Options{
		DataDir: os.Getenv("HAREBOX_TEST_DATADIR"), PluginPath: os.Getenv("HAREBOX_TEST_PLUGIN"),
		Images:   map[string]images.Image{"minimal": img},
		Pool:     map[string]int{"minimal:small": 1},
		Capacity: harebox.Capacity{VCPUs: 3, MemoryMB: 4096, DiskGB: 100},
		// (The parent shows the last lines when a step does not come.)
		Logger: slog.New(slog.NewTextHandler(os.Stdout, nil)),
	}
	if dir := os.Getenv("HAREBOX_TEST_CRASH_GOLDEN"); dir != "" {
		// (The run's: the parent's engine after the kill uses it too.)
		opts.GoldenSnapshots, opts.GoldenDir, opts.GoldenKey = true, dir, filepath.Join(dir, "golden.key")
	}
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("HAREBOX_TEST_CRASH_CLAIM") == "1" {
		for {
			st, err := eng.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Pool > 0 {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		box, err := eng.Create(ctx, sandbox.CreateRequest{Image: "minimal", Size: sandbox.Size{Preset: "small"}})
		if err != nil {
			t.Fatal(err)
		}
		if box.Served != "pool" {
			t.Fatalf("served by %q, not the pool", box.Served)
		}
		fmt.Println("SANDBOX " + box.ID)
	}
	select {} // until killed
}

// TestGoldenStrayStopped, without a VM (memhv): at start the engine stops
// a VMM left running in a golden snapshot's machine directory, and the
// VMM of a pool member or sandbox directory without a record; it leaves
// alone a VMM that only names the golden snapshot (a sandbox restored from
// it names its disk) and a process there that is no VMM. A snapshot's
// staging tmpfs left mounted in those directories is unmounted (as root)
// and the directories are removed. The "VMMs" are
// shells under a VMM's name, so that the check is by name and command
// line, as for a real one.
func TestGoldenStrayStopped(t *testing.T) {
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	golden := filepath.Join(opts.DataDir, "golden", "golden-0123456789ab")
	member := filepath.Join(opts.DataDir, "m", sandbox.NewID())
	for _, d := range []string{filepath.Join(golden, "m"), filepath.Join(golden, "snap"), member} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// A backend's snapshot staging tmpfs a crash left mounted (Cloud
	// Hypervisor's, holding plain guest memory), in each machine directory.
	var stages []string
	if os.Geteuid() == 0 {
		stages = []string{filepath.Join(golden, "m", "snapshot-1"), filepath.Join(member, "restore")}
	}
	for _, d := range stages {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", d, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Unmount(d, syscall.MNT_DETACH) })
		if err := os.WriteFile(filepath.Join(d, "memory"), []byte("plain guest memory"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sh, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	fakeVMM := filepath.Join(t.TempDir(), "qemu-system-x86_64")
	if err := os.WriteFile(fakeVMM, sh, 0o755); err != nil {
		t.Fatal(err)
	}
	// The marker is $0; the open stdin keeps read (a builtin) waiting.
	spawn := func(bin, marker string) *exec.Cmd {
		t.Helper()
		cmd := exec.Command(bin, "-c", "read x", marker)
		if _, err := cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		// (Its command line reads empty for a moment after Start.)
		waitFor(t, "the process's command line", func() bool { return len(procs.Naming(marker)) > 0 })
		return cmd
	}
	goldenVMM := spawn(fakeVMM, filepath.Join(golden, "m", "qmp.sock"))
	memberVMM := spawn(fakeVMM, filepath.Join(member, "qmp.sock"))
	clone := spawn(fakeVMM, filepath.Join(golden, "snap", "disk0.qcow2"))
	tail := spawn("/bin/sh", filepath.Join(golden, "m", "serial.log"))

	eng, err := harebox.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	for name, cmd := range map[string]*exec.Cmd{"the golden machine's": goldenVMM, "the pool member's": memberVMM} {
		if !exited(cmd) {
			t.Errorf("%s VMM still runs after the start", name)
		}
	}
	for name, cmd := range map[string]*exec.Cmd{"a clone of the golden snapshot": clone, "a process that is no VMM": tail} {
		if exited(cmd) {
			t.Errorf("%s was killed", name)
		}
	}
	for _, d := range []string{golden, member} {
		if fileExists(d) {
			t.Errorf("%s is still there", d)
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range stages {
		if strings.Contains(string(mounts), " "+d+" ") {
			t.Errorf("%s is still mounted", d)
		}
	}
}

// exited reports whether cmd has exited (it was killed: it waits on its
// stdin otherwise).
func exited(cmd *exec.Cmd) bool {
	return syscall.Kill(cmd.Process.Pid, 0) != nil || isZombie(cmd.Process.Pid)
}

func isZombie(pid int) bool {
	st, err := procs.ReadStat(pid)
	return err != nil || st.State == 'Z'
}

// vmmsNaming lists the VMM processes whose command line contains s.
func vmmsNaming(s string) []procs.Proc {
	var out []procs.Proc
	for _, p := range procs.Naming(s) {
		if p.IsVMM() {
			out = append(out, p)
		}
	}
	return out
}

// qproc is a process with its start time, which tells it from a later
// process that got its pid.
type qproc struct {
	procs.Proc
	start uint64
}

// qemuNaming lists the qemu processes of any kind (VMMs, storage
// daemons, qemu-img) whose command line contains s.
func qemuNaming(s string) []qproc {
	var out []qproc
	for _, p := range procs.Naming(s) {
		if strings.HasPrefix(filepath.Base(p.Exe), "qemu") {
			if st, ok := startTime(p.PID); ok {
				out = append(out, qproc{p, st})
			}
		}
	}
	return out
}

func (p qproc) String() string {
	const max = 200
	if s := p.Proc.String(); len(s) > max {
		return s[:max] + "..."
	}
	return p.Proc.String()
}

// runs reports whether p still runs: its pid has the same start time and
// is not a zombie.
func (p qproc) runs() bool {
	st, ok := startTime(p.PID)
	return ok && st == p.start && !isZombie(p.PID)
}

// of reports whether p is the sandbox id's (in dataDir; never for "").
func (p qproc) of(dataDir, id string) bool {
	return id != "" && strings.Contains(p.Cmdline, filepath.Join(dataDir, "m", id)+"/")
}

// startTime is when process pid started (procs.Stat).
func startTime(pid int) (uint64, bool) {
	st, err := procs.ReadStat(pid)
	return st.StartTime, err == nil
}

// sealedScopes lists the scopes of the sealed secrets in the data
// directory's database ("sandbox/ID" holds a sandbox's data key).
func sealedScopes(t *testing.T, dataDir string) []string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dataDir, "harebox.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT scope FROM secrets`)
	if err != nil {
		t.Fatalf("secrets: %v", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return -1
	}
	return fi.Size()
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(crashStepTimeout); !ok(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, crashStepTimeout)
		}
	}
}
