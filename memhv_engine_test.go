package harebox_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/hypervisor/plugin"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
)

// The engine end to end over the in-memory hypervisor: no VM, no QEMU, so
// it runs in milliseconds.

func memhvOptions(t testing.TB, hv *memhv.Hypervisor) harebox.Options {
	t.Helper()
	dir, err := os.MkdirTemp("", "hbm") // short: socket paths live under it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return harebox.Options{
		DataDir:    dir,
		Hypervisor: hv,
		Images:     map[string]images.Image{sandbox.DefaultImage: memhv.Image(dir)},
		Capacity:   harebox.Capacity{VCPUs: 8, MemoryMB: 8192, DiskGB: 100},
	}
}

// memhvEngine is an engine on a new in-memory hypervisor with
// memhvOptions, changed by opts if given; both close with the test.
func memhvEngine(t testing.TB, opts func(*harebox.Options)) (*harebox.Engine, *memhv.Hypervisor) {
	t.Helper()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	o := memhvOptions(t, hv)
	if opts != nil {
		opts(&o)
	}
	eng, err := harebox.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng, hv
}

func TestMemHVEngine(t *testing.T) {
	start := time.Now()
	ctx := context.Background()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { eng.Close() }()

	if _, err := eng.Create(ctx, sandbox.CreateRequest{Image: "no-such-image"}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("create with an unknown image: %v", err)
	}
	if n := hv.Launched(); n != 0 {
		t.Fatalf("a refused create launched %d machines", n)
	}

	box, err := eng.Create(ctx, sandbox.CreateRequest{Name: "smoke"})
	if err != nil {
		t.Fatal(err)
	}
	if box.State != sandbox.StateRunning {
		t.Fatalf("created sandbox is %s", box.State)
	}
	res, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "echo hi"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "hi\n" || res.ExitCode != 0 {
		t.Fatalf("echo hi: %+v", res)
	}

	payload := "hello from memhv\n"
	if _, err := eng.WriteFile(ctx, box.ID, "/tmp/greeting", strings.NewReader(payload), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := eng.ReadFile(ctx, box.ID, "/tmp/greeting", &buf); err != nil {
		t.Fatal(err)
	}
	if buf.String() != payload {
		t.Fatalf("read back %q, want %q", buf.String(), payload)
	}

	if s, err := eng.Pause(ctx, box.ID); err != nil || s.State != sandbox.StatePaused {
		t.Fatalf("pause: %+v, %v", s, err)
	}
	if _, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "true"}); !errors.Is(err, sandbox.ErrState) {
		t.Fatalf("exec in a paused sandbox: %v, want ErrState", err)
	}
	if s, err := eng.Resume(ctx, box.ID); err != nil || s.State != sandbox.StateRunning {
		t.Fatalf("resume: %+v, %v", s, err)
	}

	// A restarted engine, given the same hypervisor, re-adopts the VM.
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	eng, err = harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := eng.Get(ctx, box.ID); err != nil || s.State != sandbox.StateRunning {
		t.Fatalf("after a restart: %+v, %v", s, err)
	}
	buf.Reset()
	if _, err := eng.ReadFile(ctx, box.ID, "/tmp/greeting", &buf); err != nil || buf.String() != payload {
		t.Fatalf("read after a restart: %q, %v", buf.String(), err)
	}

	if err := eng.Delete(ctx, box.ID); err != nil {
		t.Fatal(err)
	}
	if s, err := eng.Get(ctx, box.ID); err != nil || s.State != sandbox.StateDeleted {
		t.Fatalf("after delete: %+v, %v", s, err)
	}
	if _, ok := hv.Machine(box.ID); ok {
		t.Error("the deleted sandbox's machine still runs")
	}
	if n := hv.Launched(); n != 1 {
		t.Errorf("Launched() = %d, want 1", n)
	}
	t.Logf("took %v", time.Since(start).Round(time.Millisecond))
}

// A plugin of this data directory that outlived its engine is killed when
// a new engine starts on it.
func TestStalePluginKilled(t *testing.T) {
	bin := testimage.Package(t, "./hypervisor/plugin/testdata/memplugin", "harebox-plugin-memtest")
	dir, err := os.MkdirTemp("", "hbs")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// (Started here, not by an engine: their sockets go to go-plugin's
	// default, a file in the temporary directory, which a killed plugin
	// leaves: the test's own.)
	env := append(os.Environ(), "TMPDIR="+t.TempDir(), plugin.Handshake.MagicCookieKey+"="+plugin.Handshake.MagicCookieValue)
	stale := exec.Command(bin)
	stale.Env = append(slices.Clip(env), plugin.OwnerEnv+"="+dir)
	if err := stale.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { stale.Wait(); close(exited) }()
	defer stale.Process.Kill()
	// Another data directory's plugin is left alone.
	other := exec.Command(bin)
	other.Env = append(slices.Clip(env), plugin.OwnerEnv+"="+dir+"-other")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	time.Sleep(200 * time.Millisecond)

	eng, err := harebox.New(context.Background(), harebox.Options{
		DataDir: dir, PluginPath: bin,
		Images:   map[string]images.Image{sandbox.DefaultImage: memhv.Image(dir)},
		Capacity: harebox.Capacity{VCPUs: 8, MemoryMB: 8192, DiskGB: 100},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the stale plugin still runs")
	}
	if err := other.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("another data directory's plugin was killed: %v", err)
	}
	// The engine's own plugin works.
	box, err := eng.Create(context.Background(), sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Delete(context.Background(), box.ID); err != nil {
		t.Fatal(err)
	}
}

// A sandbox whose agent stops answering is reported so, and recovers.
func TestAgentHealth(t *testing.T) {
	ctx := context.Background()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	opts.HealthInterval = 100 * time.Millisecond
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	box, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	waitAgent := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, err := eng.Get(ctx, box.ID)
			if err == nil && got.Agent == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("agent %q, want %q (%v)", got.Agent, want, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitAgent("ok")
	// The guest freezes behind the engine's back: its agent stops
	// answering, and Get stays quick while it does.
	m, _ := hv.Machine(box.ID)
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	waitAgent("unresponsive")
	start := time.Now()
	if got, err := eng.Get(ctx, box.ID); err != nil || got.State != sandbox.StateRunning || time.Since(start) > time.Second {
		t.Fatalf("get while the agent is silent: %+v %v after %v", got, err, time.Since(start))
	}
	if err := m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	waitAgent("ok")
}

// A full data directory: creates fail at once with a clear capacity
// error, running sandboxes keep running, nothing half-made is left, and
// once space is freed everything works again.
func TestDataDirFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "hbf")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	defer exec.Command("umount", "-l", dir).Run()
	hv := memhv.New(memhv.Options{})
	defer hv.Close()
	eng, err := harebox.New(ctx, harebox.Options{
		DataDir: dir, Hypervisor: hv,
		Images:   map[string]images.Image{sandbox.DefaultImage: memhv.Image(dir)},
		Capacity: harebox.Capacity{VCPUs: 8, MemoryMB: 8192, DiskGB: 100},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	running, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Fill the disk.
	filler, _ := os.Create(dir + "/filler")
	for {
		if _, err := filler.Write(make([]byte, 64<<10)); err != nil {
			break
		}
	}
	filler.Close()
	launched := hv.Launched()
	for range 3 {
		_, err := eng.Create(ctx, sandbox.CreateRequest{Env: map[string]string{"A": strings.Repeat("x", 4096)}})
		if !errors.Is(err, sandbox.ErrCapacity) || !strings.Contains(err.Error(), "disk is full") {
			t.Fatalf("create on a full disk: %v, want a clear ErrCapacity", err)
		}
	}
	if hv.Launched() != launched {
		t.Error("a create on a full disk launched a machine")
	}
	if r, err := eng.Exec(ctx, running.ID, sandbox.ExecRequest{Cmd: "echo still"}); err != nil || r.Stdout != "still\n" {
		t.Fatalf("the running sandbox on a full disk: %+v %v", r, err)
	}
	os.Remove(dir + "/filler")
	after, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatalf("create once space is back: %v", err)
	}
	all, err := eng.List(ctx, sandbox.ListFilter{State: sandbox.StateDeleted})
	if err != nil || len(all) != 0 {
		t.Errorf("half-made records after the full disk: %v %v", all, err)
	}
	live, _ := eng.List(ctx, sandbox.ListFilter{})
	if len(live) != 2 {
		t.Errorf("sandboxes after the full disk: %d, want 2", len(live))
	}
	for _, id := range []string{running.ID, after.ID} {
		if err := eng.Delete(ctx, id); err != nil {
			t.Error(err)
		}
	}
}

// TestProcessTimeoutBackstop: a background process whose agent does not
// enforce its timeout (memhv's "stubborn") is killed by the host once it
// outlives the timeout by the grace.
func TestProcessTimeoutBackstop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eng, _ := memhvEngine(t, nil)
	box, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p, err := eng.Processes().Start(ctx, box.ID, sandbox.ExecRequest{Cmd: "stubborn 600", TimeoutSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	done, err := eng.Processes().Wait(wctx, box.ID, p.ID)
	if err != nil || done.Result == nil || done.Result.Signal != 9 {
		t.Fatalf("after %v: %+v %v", time.Since(start), done, err)
	}
	if d := time.Since(start); d < 10*time.Second {
		t.Fatalf("killed after %v, before the grace", d)
	}
}

// auditFails is a store whose audit appends fail while fail is set, in a
// transaction or not.
type auditFails struct {
	store.Store
	fail atomic.Bool
}

func (s *auditFails) Update(ctx context.Context, fn func(tx store.Tx) error) error {
	return s.Store.Update(ctx, func(tx store.Tx) error { return fn(auditFailsTx{tx, s}) })
}

func (s *auditFails) AppendAudit(ctx context.Context, e *store.AuditEntry) error {
	return auditFailsTx{s.Store, s}.AppendAudit(ctx, e)
}

type auditFailsTx struct {
	store.Tx
	s *auditFails
}

func (t auditFailsTx) AppendAudit(ctx context.Context, e *store.AuditEntry) error {
	if t.s.fail.Load() {
		return errors.New("the audit log's disk is gone")
	}
	return t.Tx.AppendAudit(ctx, e)
}

// A create's record, its budgets' reservation and its audit entry commit
// together or not at all; one that fails after that has a second entry
// that says so.
func TestCreateCommitsWithItsAuditEntry(t *testing.T) {
	ctx := context.Background()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	db, err := store.OpenSQLite(ctx, filepath.Join(opts.DataDir, "harebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st := &auditFails{Store: db}
	opts.Store = st
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	entries := func() []*audit.Entry {
		l, err := eng.Audit().List(ctx, store.AuditFilter{Action: "createSandbox", Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	st.fail.Store(true)
	if _, err := eng.Create(ctx, sandbox.CreateRequest{Name: "unaudited"}); err == nil {
		t.Fatal("a create whose audit entry cannot be written was made")
	}
	st.fail.Store(false)
	if recs, _ := db.ListSandboxes(ctx); len(recs) != 0 {
		t.Fatalf("records of a create that did not commit: %+v", recs)
	}
	if rs, _ := db.ListReservations(ctx); len(rs) != 0 {
		t.Fatalf("reservations of a create that did not commit: %+v", rs)
	}
	if n := hv.Launched(); n != 0 {
		t.Fatalf("a create that did not commit launched %d machines", n)
	}

	box, err := eng.Create(ctx, sandbox.CreateRequest{Name: "audited"})
	if err != nil {
		t.Fatal(err)
	}
	if l := entries(); len(l) != 1 || l[0].Target != box.ID || l[0].Outcome != audit.OK {
		t.Fatalf("entries of a create: %+v", l)
	}
	hv.FailNextLaunch(errors.New("no room on the hypervisor"))
	if _, err := eng.Create(ctx, sandbox.CreateRequest{Name: "fails"}); err == nil {
		t.Fatal("the launch failure was not reported")
	}
	l := entries()
	if len(l) != 3 || l[1].Outcome != audit.OK || l[2].Outcome != audit.Failed || l[1].Target == "" || l[2].Target != l[1].Target {
		t.Fatalf("entries of a create that failed after its admission: %+v", l)
	}
}

// TestCallCutByDelete: a command in flight when its sandbox is deleted or
// stopped fails as a conflict that says so (409), not as an agent failure
// (503).
func TestCallCutByDelete(t *testing.T) {
	ctx := context.Background()
	eng, _ := memhvEngine(t, nil)
	for _, c := range []struct {
		name, want string
		cut        func(id string) error
	}{
		{"delete", "was deleted during the call", func(id string) error { return eng.Delete(ctx, id) }},
		{"stop", "is being stopped", func(id string) error { _, err := eng.Stop(ctx, id); return err }},
	} {
		box, err := eng.Create(ctx, sandbox.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "sleep 20"})
			done <- err
		}()
		time.Sleep(300 * time.Millisecond) // the command runs
		if err := c.cut(box.ID); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			// (The first kind on the chain is the one the API answers with.)
			var se *sandbox.Error
			if !errors.As(err, &se) || se.Kind != sandbox.ErrState || !strings.Contains(err.Error(), c.want) {
				t.Errorf("the exec cut short by the %s: %v", c.name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the exec outlived its sandbox's %s", c.name)
		}
	}
}

// TestPluginKilledInFlight: the hypervisor plugin killed while a create
// and while a delete are in flight. The create fails at once with a
// retryable error and leaves no sandbox; the delete ends with the sandbox
// deleted and its files gone; the relaunched plugin serves the next
// create.
func TestPluginKilledInFlight(t *testing.T) {
	bin := testimage.Package(t, "./hypervisor/plugin/testdata/memplugin", "harebox-plugin-memtest")
	t.Setenv("MEMPLUGIN_LAUNCH_DELAY", "3s")
	dir, err := os.MkdirTemp("", "hbk")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	eng, err := harebox.New(ctx, harebox.Options{
		DataDir: dir, PluginPath: bin,
		Images:   map[string]images.Image{sandbox.DefaultImage: memhv.Image(dir)},
		Capacity: harebox.Capacity{VCPUs: 8, MemoryMB: 8192, DiskGB: 100},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	killPlugin := func() {
		t.Helper()
		n := 0
		for _, p := range procs.WithEnv(plugin.OwnerEnv + "=" + dir) {
			if p.IsPlugin() {
				syscall.Kill(p.PID, syscall.SIGKILL)
				n++
			}
		}
		if n != 1 {
			t.Fatalf("killed %d plugins, want 1", n)
		}
	}

	done := make(chan error, 1)
	go func() {
		_, err := eng.Create(ctx, sandbox.CreateRequest{Name: "cut"})
		done <- err
	}()
	time.Sleep(time.Second) // the launch is in the plugin
	killPlugin()
	select {
	case err := <-done:
		var se *sandbox.Error
		if !errors.As(err, &se) || se.Kind != sandbox.ErrUnavailable {
			t.Errorf("the create the plugin died in: %v, want a retryable (unavailable) error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the create hangs after its plugin died")
	}
	if l, _ := eng.List(ctx, sandbox.ListFilter{}); len(l) != 0 {
		t.Errorf("the failed create left %+v", l)
	}

	box, err := eng.Create(ctx, sandbox.CreateRequest{Name: "next"})
	if err != nil {
		t.Fatalf("a create on the relaunched plugin: %v", err)
	}
	// (Killed first: the delete's calls reach a plugin that is dead or
	// being relaunched.)
	killPlugin()
	go func() { done <- eng.Delete(ctx, box.ID) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the delete the plugin died in: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the delete hangs after its plugin died")
	}
	if s, err := eng.Get(ctx, box.ID); err != nil || s.State != sandbox.StateDeleted {
		t.Errorf("after the delete: %+v %v", s, err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "m")); len(ents) != 0 {
		t.Errorf("machine directories left: %v", ents)
	}
}

// unattachable is a host network that cannot set a sandbox up (its
// address pool is used up, say).
type unattachable struct{ network.None }

func (unattachable) Attach(context.Context, string, *firewall.Policy) (*network.Attachment, error) {
	return nil, errors.New("linuxnet: no address left in 10.0.0.0/30")
}

// refusing is a host network that refuses a sandbox's policy (one that
// passed the engine's own validation).
type refusing struct{ network.None }

func (refusing) Attach(context.Context, string, *firewall.Policy) (*network.Attachment, error) {
	return nil, &firewall.Error{Field: "outbound[0].hosts", Msg: "too many names for this host's resolver"}
}

// TestBootFailuresHaveKinds: a create whose network, hypervisor or agent
// fails gets an error of a kind (503; 400 for a policy the network
// refuses), never a server fault, and its message names the step, not
// host paths.
func TestBootFailuresHaveKinds(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		set  func(*harebox.Options, *memhv.Hypervisor)
		kind error
		msg  string
	}{
		{"network", func(o *harebox.Options, _ *memhv.Hypervisor) { o.Network = unattachable{} }, sandbox.ErrUnavailable, "the sandbox's network could not be set up"},
		{"policy", func(o *harebox.Options, _ *memhv.Hypervisor) { o.Network = refusing{} }, sandbox.ErrInvalid, "too many names for this host's resolver"},
		{"launch", func(_ *harebox.Options, hv *memhv.Hypervisor) {
			hv.FailNextLaunch(errors.New("qemu: /var/lib/x: boom"))
		}, sandbox.ErrUnavailable, "the hypervisor failed"},
		{"agent", func(o *harebox.Options, _ *memhv.Hypervisor) { o.BootTimeout = time.Nanosecond }, sandbox.ErrUnavailable, "the sandbox's agent does not answer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			hv := memhv.New(memhv.Options{})
			t.Cleanup(func() { hv.Close() })
			opts := memhvOptions(t, hv)
			c.set(&opts, hv)
			eng, err := harebox.New(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer eng.Close()
			_, err = eng.Create(ctx, sandbox.CreateRequest{})
			var se *sandbox.Error
			if !errors.Is(err, c.kind) || !errors.As(err, &se) || se.Msg != c.msg {
				t.Fatalf("create: %v (kind %s), want %q of kind %v", err, model.Code(err), c.msg, c.kind)
			}
			if l, _ := eng.List(ctx, sandbox.ListFilter{}); len(l) != 0 {
				t.Fatalf("the failed create left %+v", l)
			}
			// An agent that does not answer: the log says what its VMM
			// did meanwhile (a guest hung idle or spinning).
			if c.name == "agent" && !regexp.MustCompile(`\(the VMM is running( and used [0-9.]+ CPU-s in the [0-9]+ s since it started)?; serial log: `).MatchString(err.Error()) {
				t.Fatalf("create: %v, want the VMM's state before the serial log", err)
			}
		})
	}
}

// TestMeshNeedsANetwork: on a server whose sandboxes have no network,
// a create on the mesh (asked for, or by its project) is refused, clearly
// and with nothing left; one kept off the mesh is made.
func TestMeshNeedsANetwork(t *testing.T) {
	ctx := context.Background()
	eng, hv := memhvEngine(t, nil)
	on := true
	if _, err := eng.Create(ctx, sandbox.CreateRequest{Mesh: &on}); !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "no mesh") {
		t.Fatalf("mesh: true without a network: %v", err)
	}
	if _, err := eng.Tenants().UpdateProject(ctx, "", "default", tenant.ProjectUpdate{Mesh: &on}); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Create(ctx, sandbox.CreateRequest{}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("a mesh project without a network: %v", err)
	}
	if l, _ := eng.List(ctx, sandbox.ListFilter{}); len(l) != 0 || hv.Launched() != 0 {
		t.Fatalf("refused creates left %d sandboxes, %d machines", len(l), hv.Launched())
	}
	off := false
	if b, err := eng.Create(ctx, sandbox.CreateRequest{Mesh: &off}); err != nil || b.MeshAddress != "" {
		t.Fatalf("mesh: false in a mesh project: %+v %v", b, err)
	}
}

// TestCreateWhere: a create that asks for a site or a country this host
// is not in is refused, naming where, with nothing made; one that asks
// for this host's site or country is made here and reports it; a country
// that is not an upper-case ISO code is a bad request.
func TestCreateWhere(t *testing.T) {
	ctx := context.Background()
	site := sandbox.Site{Name: "fr-par-1", Country: "FR"}
	eng, hv := memhvEngine(t, func(o *harebox.Options) { o.Site = site })
	for _, c := range []struct {
		req  sandbox.CreateRequest
		says string
	}{
		{sandbox.CreateRequest{Site: "nl-ams-1"}, "no host of site nl-ams-1"},
		{sandbox.CreateRequest{Country: "NL"}, "no host of country NL"},
		{sandbox.CreateRequest{Site: "fr-par-1", Country: "NL"}, "no host of site fr-par-1 in NL"},
	} {
		if _, err := eng.Create(ctx, c.req); !errors.Is(err, sandbox.ErrCapacity) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("create %+v: %v, want ErrCapacity saying %q", c.req, err, c.says)
		}
	}
	if _, err := eng.Create(ctx, sandbox.CreateRequest{Country: "fr"}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("a lower-case country: %v", err)
	}
	if l, _ := eng.List(ctx, sandbox.ListFilter{}); len(l) != 0 || hv.Launched() != 0 {
		t.Fatalf("refused creates left %d sandboxes, %d machines", len(l), hv.Launched())
	}
	for _, req := range []sandbox.CreateRequest{{Site: "fr-par-1"}, {Country: "FR"}, {Site: "fr-par-1", Country: "FR"}} {
		b, err := eng.Create(ctx, req)
		if err != nil || b.Site != site {
			t.Errorf("create %+v: %+v %v", req, b, err)
		}
	}
}

// TestPausedForSnapshotResumed: an engine that dies while it holds a
// running sandbox paused for a snapshot or a hibernate (its machine
// paused, the mark in its directory) leaves it paused; the next engine
// resumes it. One its user paused stays paused.
func TestPausedForSnapshotResumed(t *testing.T) {
	ctx := context.Background()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { eng.Close() }()
	cut, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	paused, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Pause(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}
	eng.Close()
	// What the dead engine left: cut's machine paused, with the mark.
	m, ok := hv.Machine(cut.ID)
	if !ok {
		t.Fatal("no machine")
	}
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(opts.DataDir, "m", cut.ID, "paused-for-snapshot"), nil, 0o600)
	if eng, err = harebox.New(ctx, opts); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]sandbox.State{cut.ID: sandbox.StateRunning, paused.ID: sandbox.StatePaused} {
		if s, err := eng.Get(ctx, id); err != nil || s.State != want {
			t.Errorf("after the restart: %+v %v, want %s", s, err, want)
		}
	}
	if info, err := m.Info(ctx); err != nil || info.State != hypervisor.StateRunning {
		t.Errorf("the machine left paused for a snapshot: %+v %v", info, err)
	}
	if _, err := os.Stat(filepath.Join(opts.DataDir, "m", cut.ID, "paused-for-snapshot")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the mark stays: %v", err)
	}
	if _, err := eng.Exec(ctx, cut.ID, sandbox.ExecRequest{Cmd: "true"}); err != nil {
		t.Errorf("exec after the resume: %v", err)
	}
}

// A delete the engine died in, after its first step (the data key
// erased: the point of no return), is finished at the next start: the
// sandbox is deleted, its VM and its console identity gone. One whose
// keys are intact runs on. (TestCrashLoop caught such a sandbox, re-adopted
// as running without its key, when hareboxd was killed mid-delete.)
func TestAdoptFinishesDelete(t *testing.T) {
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	ctx := context.Background()
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	cut, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{secrets.DataKeyName, sandboxkeys.ConsoleKeyName} {
		if _, err := eng.Secrets().Get(ctx, sandboxkeys.Scope(cut.ID), name); err != nil {
			t.Fatalf("the sandbox has no %s: %v", name, err)
		}
	}
	if err := sandboxkeys.Erase(ctx, eng.Secrets(), cut.ID); err != nil {
		t.Fatal(err)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	if eng, err = harebox.New(ctx, opts); err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	if st := state(t, eng, cut.ID); st != sandbox.StateDeleted {
		t.Errorf("the sandbox whose delete was cut short is %s", st)
	}
	if _, err := eng.Secrets().Get(ctx, sandboxkeys.Scope(cut.ID), sandboxkeys.ConsoleKeyName); !errors.Is(err, secrets.ErrNotFound) {
		t.Errorf("its console identity: %v", err)
	}
	if _, ok := hv.Machine(cut.ID); ok {
		t.Error("its VM is still there")
	}
	if st := state(t, eng, kept.ID); st != sandbox.StateRunning {
		t.Errorf("the other sandbox is %s", st)
	}
	if _, err := eng.Exec(ctx, kept.ID, sandbox.ExecRequest{Cmd: "true"}); err != nil {
		t.Errorf("the other sandbox: %v", err)
	}
}

// TestDeleteCutAnywhere: an engine that dies in a delete, before it
// destroyed anything or after it destroyed everything but the record,
// finishes the delete when it starts again (the record said so first).
func TestDeleteCutAnywhere(t *testing.T) {
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	ctx := context.Background()
	defer harebox.SetStepHook(nil)
	for _, step := range []string{"delete-marked", "delete-destroyed"} {
		eng, err := harebox.New(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		box, err := eng.Create(ctx, sandbox.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		harebox.SetStepHook(func(s, id string) {
			if s == step && id == box.ID {
				runtime.Goexit() // (the engine dies here: nothing of the delete runs after)
			}
		})
		done := make(chan struct{})
		go func() { defer close(done); eng.Delete(ctx, box.ID) }()
		<-done
		harebox.SetStepHook(nil)
		eng.Close()
		if eng, err = harebox.New(ctx, opts); err != nil {
			t.Fatal(err)
		}
		if st := state(t, eng, box.ID); st != sandbox.StateDeleted {
			t.Errorf("%s: the sandbox whose delete was cut short is %s", step, st)
		}
		for _, name := range []string{secrets.DataKeyName, sandboxkeys.ConsoleKeyName} {
			if _, err := eng.Secrets().Get(ctx, sandboxkeys.Scope(box.ID), name); !errors.Is(err, secrets.ErrNotFound) {
				t.Errorf("%s: its %s: %v", step, name, err)
			}
		}
		if _, ok := hv.Machine(box.ID); ok {
			t.Errorf("%s: its VM is still there", step)
		}
		eng.Close()
	}
}
