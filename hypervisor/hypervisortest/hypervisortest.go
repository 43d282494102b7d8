// Package hypervisortest is the conformance suite every hypervisor backend
// runs, in-process and through the plugin boundary, in the style of
// gocloud.dev's drivertest: boot until the agent is healthy, exec and files,
// pause and resume, re-attach from a handle, snapshot and restore into a
// usable clone, shutdown and kill, and no leftovers afterwards. A backend
// that reports Encryption runs it all with a data key and an encrypted
// console: a canary on the disk, in memory and on the console must not be
// in any file in plain text, and wrong or missing keys are refused; one
// that does not must refuse a key. One that reports Volumes plugs one in
// and out, writable and read-only.
package hypervisortest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"filippo.io/age"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/consolelog"
	"github.com/harebox/harebox/internal/procs"
)

// Harness adapts a backend to the suite.
type Harness struct {
	// New returns the backend under test. It is called once per test, and
	// again to stand for a restarted engine (a fresh driver or plugin
	// process) that must re-adopt running machines.
	New func(t *testing.T) hypervisor.Hypervisor
	// Spec returns a bootable spec for an image that runs the HareBox agent:
	// kernel, initrd, cmdline and sizes. The suite sets ID and StateDir and
	// adds a scratch data disk.
	Spec func(t *testing.T) hypervisor.Spec
	// BootTimeout bounds launch-to-agent-healthy; default 90 s (TCG is slow).
	BootTimeout time.Duration
	// FakeGuest says the guest is a fake agent with no kernel, shell or
	// block devices (hypervisor/memhv). The suite then skips the one check
	// that needs them, the scratch disk's content through a snapshot (dd
	// on /dev/vd*), and runs every other one.
	FakeGuest bool
	// NoSerials says a volume's disk has no serial the guest sees (a
	// vhost-user disk: its storage daemon answers alike for all): the
	// guest finds a volume by its filesystem's UUID, so one guest cannot
	// tell two plugs of the same file apart, and the suite plugs the
	// file under a layered writer into no second disk of the same guest.
	NoSerials bool
}

// Run runs the conformance suite.
func Run(t *testing.T, h Harness) {
	if h.BootTimeout == 0 {
		h.BootTimeout = 90 * time.Second
	}
	t.Run("Capabilities", func(t *testing.T) { testCapabilities(t, h) })
	t.Run("InvalidInput", func(t *testing.T) { testInvalid(t, h) })
	t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, h) })
	t.Run("Volumes", func(t *testing.T) { testVolumes(t, h) })
}

func testCapabilities(t *testing.T, h Harness) {
	c, err := h.New(t).Capabilities(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c.Name == "" || c.Accelerator == "" || len(c.AgentTransports) == 0 {
		t.Fatalf("incomplete capabilities: %+v", c)
	}
	t.Logf("backend %s %s, accelerator %s %s", c.Name, c.Version, c.Accelerator, c.Notice)
}

func testInvalid(t *testing.T, h Harness) {
	ctx := context.Background()
	hv := h.New(t)
	base := baseDir(t)
	bad := []hypervisor.Spec{
		{},
		func() hypervisor.Spec { s := h.Spec(t); s.ID = "../x"; s.StateDir = filepath.Join(base, "a"); return s }(),
		func() hypervisor.Spec {
			s := h.Spec(t)
			s.ID = "x"
			s.StateDir = filepath.Join(base, "b")
			s.VCPUs = 0
			return s
		}(),
		func() hypervisor.Spec {
			s := h.Spec(t)
			s.ID = "x"
			s.StateDir = filepath.Join(base, "c")
			s.Kernel = filepath.Join(base, "no-such-kernel")
			return s
		}(),
	}
	for i, s := range bad {
		m, err := hv.Launch(ctx, s)
		if err == nil {
			m.Kill(ctx)
			m.Cleanup(ctx)
			t.Errorf("spec %d: launch succeeded", i)
			continue
		}
		if !errors.Is(err, hypervisor.ErrInvalid) {
			t.Errorf("spec %d: want ErrInvalid, got %v", i, err)
		}
	}
	if ents, _ := os.ReadDir(base); len(ents) != 0 {
		t.Errorf("failed launches left files behind: %v", ents)
	}
	if c, err := hv.Capabilities(ctx); err == nil && !c.Encryption {
		// A backend that cannot encrypt refuses a key rather than boot
		// plaintext.
		s := h.Spec(t)
		s.ID, s.StateDir, s.DataKey = "k", filepath.Join(base, "k"), newKey()
		if m, err := hv.Launch(ctx, s); err == nil {
			m.Kill(ctx)
			m.Cleanup(ctx)
			t.Error("a backend without encryption launched with a data key")
		} else if !errors.Is(err, hypervisor.ErrUnsupported) {
			t.Errorf("launch with a data key: want ErrUnsupported, got %v", err)
		}
	}
	_, err := hv.Attach(ctx, hypervisor.Handle{Backend: "nope", ID: "x", Data: []byte(`{}`)})
	if !errors.Is(err, hypervisor.ErrInvalid) && !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("attach bad handle: want ErrInvalid or ErrNotFound, got %v", err)
	}
	_, err = hv.Restore(ctx, filepath.Join(base, "no-snapshot"), hypervisor.Spec{ID: "y", StateDir: filepath.Join(base, "y")})
	if !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("restore missing snapshot: want ErrNotFound, got %v", err)
	}
}

// vm is a machine under test with its agent client.
type vm struct {
	// console reads an encrypted console log (nil: a plain one).
	console *age.X25519Identity
	m       hypervisor.Machine
	agent   *agentclient.Client
	spec    hypervisor.Spec
	booted  time.Duration
}

func testLifecycle(t *testing.T, h Harness) {
	ctx := context.Background()
	hv := h.New(t)
	base := baseDir(t)
	outer := t

	data := filepath.Join(base, "data.raw")
	if err := os.WriteFile(data, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := h.Spec(t)
	spec.ID = "conf-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	spec.StateDir = filepath.Join(base, "m1")
	spec.Disks = append(spec.Disks, hypervisor.Disk{Path: data, Format: "raw", Overlay: true})
	caps, err := hv.Capabilities(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var console *age.X25519Identity
	if caps.Encryption {
		// The whole lifecycle runs encrypted, as the engine runs it.
		spec.DataKey = newKey()
		console = newConsole(t)
		spec.ConsoleRecipient = console.Recipient().String()
	}

	start := time.Now()
	m, err := hv.Launch(ctx, spec)
	if err != nil {
		t.Fatal("launch:", err)
	}
	orig := &vm{m: m, spec: spec, console: console}
	defer forget(t, orig)
	var clone *vm
	defer func() {
		if clone != nil {
			forget(t, clone)
		}
	}()
	connect(t, h, orig, start)
	t.Logf("booted to a healthy agent in %v", orig.booted.Round(time.Millisecond))
	if spec.DataKey != nil {
		// The key reaches the VMM by no command line and no environment,
		// in no form (raw, hex, base64 as the LUKS passphrase).
		info, err := m.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"cmdline", "environ"} {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", info.PID, f))
			if errors.Is(err, os.ErrNotExist) {
				break // (no process: an in-memory backend)
			}
			if len(b) == 0 {
				t.Errorf("the VMM's %s cannot be read: %v", f, err)
			}
			for _, form := range []string{string(spec.DataKey), hex.EncodeToString(spec.DataKey), base64.StdEncoding.EncodeToString(spec.DataKey)} {
				if bytes.Contains(b, []byte(form)) {
					t.Errorf("the data key is in the VMM's %s", f)
				}
			}
		}
	}

	// The data disk must be pristine afterwards: writes go to the overlay.
	t.Run("Exec", func(t *testing.T) {
		r := run(t, orig, "echo hello; echo err >&2; exit 3")
		if string(r.Stdout) != "hello\n" || string(r.Stderr) != "err\n" || r.ExitCode != 3 {
			t.Fatalf("got %+v", r)
		}
	})
	t.Run("Files", func(t *testing.T) {
		payload := bytes.Repeat([]byte("harebox\x00\xff"), 100_000) // 1 MB
		writeFile(t, orig, "/tmp/roundtrip", payload)
		if got := readFile(t, orig, "/tmp/roundtrip"); !bytes.Equal(got, payload) {
			t.Fatalf("read back %d bytes, want %d equal bytes", len(got), len(payload))
		}
	})
	t.Run("PauseResume", func(t *testing.T) {
		if err := orig.m.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		wantState(t, orig.m, hypervisor.StatePaused)
		short, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		_, err := orig.agent.Health(short)
		cancel()
		if err == nil {
			t.Error("agent answered while the machine was paused")
		}
		if err := orig.m.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		wantState(t, orig.m, hypervisor.StateRunning)
		waitHealthy(t, orig, 30*time.Second)
	})
	t.Run("Reattach", func(t *testing.T) {
		// A restarted engine has only the serialised handle.
		b, err := json.Marshal(orig.m.Handle())
		if err != nil {
			t.Fatal(err)
		}
		var handle hypervisor.Handle
		if err := json.Unmarshal(b, &handle); err != nil {
			t.Fatal(err)
		}
		// The restarted backend outlives this subtest: later steps use it.
		m2, err := h.New(outer).Attach(ctx, handle)
		if err != nil {
			t.Fatal("attach:", err)
		}
		i1, _ := orig.m.Info(ctx)
		i2, err := m2.Info(ctx)
		if err != nil || i2.PID != i1.PID || i2.State != hypervisor.StateRunning {
			t.Fatalf("re-attached info %+v (%v), want pid %d running", i2, err, i1.PID)
		}
		if m2.AgentEndpoint() != orig.m.AgentEndpoint() {
			t.Fatalf("endpoint changed: %+v vs %+v", m2.AgentEndpoint(), orig.m.AgentEndpoint())
		}
		orig.m = m2
	})

	t.Run("SnapshotRestore", func(t *testing.T) {
		writeFile(t, orig, "/tmp/before-snapshot", []byte("memory state"))
		// A canary in guest memory and on the guest's disk: with a data
		// key, no file the backend writes may hold it in plain text.
		canary := hex.EncodeToString(newKey())
		writeFile(t, orig, "/tmp/canary", []byte(canary))
		if !h.FakeGuest {
			run(t, orig, diskWrite("A"))
			run(t, orig, lastDisk+`; printf `+canary+` | dd of=$dev bs=1 seek=8192 conv=fsync 2>/dev/null`)
			run(t, orig, `printf 'console:`+canary+`\n' > /dev/ttyS0`)
			if orig.console != nil {
				// The console reaches its log, readable with the identity.
				for deadline := time.Now().Add(10 * time.Second); !strings.Contains(consoleTail(orig), canary); time.Sleep(100 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("the canary did not reach the console log: %q", consoleTail(orig))
					}
				}
			}
		}
		snapDir := filepath.Join(base, "snap")
		// A snapshot has its own key: the machine's does not open it.
		var snapKey []byte
		if spec.DataKey != nil {
			snapKey = newKey()
		}
		if err := orig.m.Snapshot(ctx, snapDir, snapKey); err != nil {
			t.Fatal("snapshot:", err)
		}
		wantState(t, orig.m, hypervisor.StatePaused)
		if err := orig.m.Snapshot(ctx, snapDir, snapKey); !errors.Is(err, hypervisor.ErrExists) {
			t.Errorf("second snapshot into the same dir: want ErrExists, got %v", err)
		}
		if spec.DataKey != nil {
			if err := orig.m.Snapshot(ctx, filepath.Join(base, "nokey"), nil); err == nil {
				t.Error("an encrypted machine was snapshotted without its key")
			}
			if found := FilesContaining(t, base, []byte(canary)); len(found) > 0 {
				t.Errorf("the canary is in plain text in %v", found)
			}
		}
		if err := orig.m.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		waitHealthy(t, orig, 30*time.Second)

		// Restored as the engine restores its golden snapshots: a backend
		// may share the snapshot's memory (SharedMemory); nothing the
		// clone does may tell.
		cspec := hypervisor.Spec{ID: spec.ID + "-c", StateDir: filepath.Join(base, "m2"), SharedMemory: true}
		if spec.DataKey != nil {
			// A wrong snapshot key is refused, not used, and leaves nothing.
			bad := hypervisor.Spec{ID: spec.ID + "-w", StateDir: filepath.Join(base, "mw"), DataKey: newKey(), SnapshotKey: newKey()}
			if m, err := hv.Restore(ctx, snapDir, bad); err == nil {
				m.Kill(ctx)
				m.Cleanup(ctx)
				t.Error("restored under a wrong snapshot key")
			} else if !errors.Is(err, hypervisor.ErrInvalid) {
				t.Errorf("restore under a wrong key: want ErrInvalid, got %v", err)
			}
			if ents, _ := os.ReadDir(bad.StateDir); len(ents) > 0 {
				t.Errorf("a refused restore left %v", ents)
			}
			if _, err := hv.Restore(ctx, snapDir, hypervisor.Spec{ID: spec.ID + "-n", StateDir: filepath.Join(base, "mn"), DataKey: newKey()}); !errors.Is(err, hypervisor.ErrInvalid) {
				t.Errorf("restore without the snapshot key: want ErrInvalid, got %v", err)
			}
			// Nor does the source machine's key.
			mk := hypervisor.Spec{ID: spec.ID + "-k", StateDir: filepath.Join(base, "mk"), DataKey: newKey(), SnapshotKey: spec.DataKey}
			if m, err := hv.Restore(ctx, snapDir, mk); err == nil {
				m.Kill(ctx)
				m.Cleanup(ctx)
				t.Error("restored under the source machine's key, not the snapshot's")
			}
			os.RemoveAll(mk.StateDir)
			cspec.DataKey, cspec.SnapshotKey = newKey(), snapKey
			cspec.ConsoleRecipient = newConsole(t).Recipient().String()
		}
		start := time.Now()
		cm, err := hv.Restore(ctx, snapDir, cspec)
		if err != nil {
			t.Fatal("restore:", err)
		}
		clone = &vm{m: cm, spec: cspec}
		connect(t, h, clone, start)
		t.Logf("restored clone answered in %v", clone.booted.Round(time.Millisecond))
		if got := readFile(t, clone, "/tmp/before-snapshot"); string(got) != "memory state" {
			t.Fatalf("clone lost memory state: %q", got)
		}
		if !h.FakeGuest {
			if got := run(t, clone, diskRead()).Stdout; string(got) != "A" {
				t.Fatalf("clone disk: %q, want A", got)
			}
			// Clone and original now diverge, each on its own copy-on-write disk.
			run(t, clone, diskWrite("B"))
			run(t, orig, diskWrite("C"))
			if got := run(t, clone, diskRead()).Stdout; string(got) != "B" {
				t.Errorf("clone disk: %q, want B", got)
			}
			if got := run(t, orig, diskRead()).Stdout; string(got) != "C" {
				t.Errorf("original disk: %q, want C", got)
			}
		}
		// A fork gets its own machine ID and entropy.
		id := make([]byte, 16)
		rand.Read(id)
		entropy := make([]byte, 64)
		rand.Read(entropy)
		if err := clone.agent.Reseed(ctx, entropy, hex.EncodeToString(id), ""); err != nil {
			t.Fatal("reseed:", err)
		}
		if got := strings.TrimSpace(string(readFile(t, clone, "/etc/machine-id"))); got != hex.EncodeToString(id) {
			t.Errorf("clone machine-id %q, want %q", got, hex.EncodeToString(id))
		}
	})
	t.Run("SharedMemory", func(t *testing.T) {
		if clone == nil {
			t.Skip("no clone")
		}
		// A second clone restored sharing the snapshot's memory starts
		// from the snapshot's memory, and the two clones' memory then
		// diverges: what one writes, the other does not see.
		c2spec := clone.spec
		c2spec.ID, c2spec.StateDir, c2spec.SerialLog = spec.ID+"-s", filepath.Join(base, "m4"), ""
		if c2spec.DataKey != nil {
			c2spec.DataKey = newKey()
		}
		start := time.Now()
		m, err := hv.Restore(ctx, filepath.Join(base, "snap"), c2spec)
		if err != nil {
			t.Fatal("second shared restore:", err)
		}
		c2 := &vm{m: m, spec: c2spec}
		defer forget(t, c2)
		connect(t, h, c2, start)
		if got := readFile(t, c2, "/tmp/before-snapshot"); string(got) != "memory state" {
			t.Fatalf("second clone lost memory state: %q", got)
		}
		writeFile(t, clone, "/tmp/which", []byte("first clone"))
		writeFile(t, c2, "/tmp/which", []byte("second clone"))
		writeFile(t, c2, "/tmp/before-snapshot", []byte("changed in the second clone"))
		for _, c := range []struct {
			v          *vm
			path, want string
		}{
			{clone, "/tmp/which", "first clone"},
			{c2, "/tmp/which", "second clone"},
			{clone, "/tmp/before-snapshot", "memory state"},
		} {
			if got := readFile(t, c.v, c.path); string(got) != c.want {
				t.Errorf("%s of %s = %q, want %q", c.path, c.v.m.ID(), got, c.want)
			}
		}
	})
	t.Run("SnapshotOfClone", func(t *testing.T) {
		if clone == nil {
			t.Skip("no clone")
		}
		// A clone needs nothing of the snapshot it came from once Restore
		// has returned: with the snapshot gone, a snapshot of the clone
		// (under the clone's own key alone) restores, with the clone's
		// writes and what it inherited.
		if err := os.RemoveAll(filepath.Join(base, "snap")); err != nil {
			t.Fatal(err)
		}
		writeFile(t, clone, "/tmp/in-clone", []byte("clone state"))
		snap2 := filepath.Join(base, "snap2")
		var snap2Key []byte
		if clone.spec.DataKey != nil {
			snap2Key = newKey()
		}
		if err := clone.m.Snapshot(ctx, snap2, snap2Key); err != nil {
			t.Fatal("snapshot of the clone:", err)
		}
		if err := clone.m.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		gspec := hypervisor.Spec{ID: spec.ID + "-g", StateDir: filepath.Join(base, "m3")}
		if clone.spec.DataKey != nil {
			gspec.DataKey, gspec.SnapshotKey = newKey(), snap2Key
		}
		start := time.Now()
		gm, err := hv.Restore(ctx, snap2, gspec)
		if err != nil {
			t.Fatal("restore of the clone's snapshot:", err)
		}
		g := &vm{m: gm, spec: gspec}
		defer forget(t, g)
		connect(t, h, g, start)
		for path, want := range map[string]string{"/tmp/in-clone": "clone state", "/tmp/before-snapshot": "memory state"} {
			if got := readFile(t, g, path); string(got) != want {
				t.Errorf("grand-clone %s = %q, want %q", path, got, want)
			}
		}
		if !h.FakeGuest {
			if got := run(t, g, diskRead()).Stdout; string(got) != "B" {
				t.Errorf("grand-clone disk: %q, want B (the clone's)", got)
			}
		}
		os.RemoveAll(snap2)
		if !caps.Reuse || h.FakeGuest {
			return
		}
		// A clone is launched again on its own disks like any machine
		// (stop and start): under its own key, without the snapshot.
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if err := g.m.Shutdown(sctx); err != nil {
			t.Fatal("shutdown of the grand-clone:", err)
		}
		g.m.Wait(sctx)
		g.agent.Close()
		again := spec
		again.ID, again.StateDir, again.DataKey, again.Reuse = gspec.ID, gspec.StateDir, gspec.DataKey, true
		again.SerialLog, again.ConsoleRecipient = "", ""
		start = time.Now()
		m, err := hv.Launch(ctx, again)
		if err != nil {
			t.Fatal("launch the grand-clone again:", err)
		}
		g.m = m
		connect(t, h, g, start)
		if got := run(t, g, diskRead()).Stdout; string(got) != "B" {
			t.Errorf("the grand-clone's disk after a launch again: %q, want B", got)
		}
	})
	t.Run("Reuse", func(t *testing.T) {
		if !caps.Reuse {
			t.Skip("the backend cannot launch a machine again on its disks")
		}
		// A marker written to the data disk (its overlay) outlives a
		// shutdown: the machine launched again on its disks reads it.
		marker := []byte("harebox reuse marker " + strconv.FormatInt(time.Now().UnixNano(), 36))
		dev := "/dev/vd" + string(rune('a'+len(spec.Disks)-1))
		if h.FakeGuest {
			writeFile(t, orig, dev, marker)
		} else {
			// (The agent writes files by rename: a device gets a shell.)
			if r := run(t, orig, "printf '%s' '"+string(marker)+"' > "+dev+" && sync"); r.ExitCode != 0 {
				t.Fatalf("write the marker: %+v", r)
			}
		}
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if err := orig.m.Shutdown(sctx); err != nil {
			t.Fatalf("shutdown: %v\nconsole:\n%s", err, consoleTail(orig))
		}
		if err := orig.m.Wait(sctx); err != nil {
			t.Fatal("wait:", err)
		}
		orig.agent.Close()
		again := spec
		again.Reuse = true
		start := time.Now()
		m, err := hv.Launch(ctx, again)
		if err != nil {
			t.Fatal("launch again:", err)
		}
		orig.m = m
		connect(t, h, orig, start)
		// (The agent reads regular files only: the device through cat.)
		if got := run(t, orig, "cat "+dev).Stdout; !bytes.HasPrefix(got, marker) {
			t.Fatalf("the data disk after a launch again starts %q, want %q", got[:min(len(got), len(marker))], marker)
		}
		// A fresh launch on a directory without disks is refused.
		none := spec
		none.ID, none.StateDir, none.Reuse = spec.ID+"-none", filepath.Join(base, "none"), true
		if m, err := hv.Launch(ctx, none); !errors.Is(err, hypervisor.ErrNotFound) {
			if err == nil {
				m.Kill(ctx)
				m.Cleanup(ctx)
			}
			t.Errorf("launch again without disks: %v, want ErrNotFound", err)
		}
		os.RemoveAll(none.StateDir)
	})
	t.Run("Shutdown", func(t *testing.T) {
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if err := orig.m.Shutdown(sctx); err != nil {
			t.Fatal("shutdown:", err)
		}
		if err := orig.m.Wait(sctx); err != nil {
			t.Fatal("wait:", err)
		}
		wantState(t, orig.m, hypervisor.StateStopped)
	})
	t.Run("Kill", func(t *testing.T) {
		if clone == nil {
			t.Skip("no clone")
		}
		if err := clone.m.Kill(ctx); err != nil {
			t.Fatal("kill:", err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := clone.m.Wait(wctx); err != nil {
			t.Fatal("wait:", err)
		}
		wantState(t, clone.m, hypervisor.StateStopped)
	})
	t.Run("NoLeftovers", func(t *testing.T) {
		for _, v := range []*vm{orig, clone} {
			if v == nil {
				continue
			}
			v.agent.Close()
			if err := v.m.Cleanup(ctx); err != nil {
				t.Fatal("cleanup:", err)
			}
			if _, err := os.Stat(v.spec.StateDir); !os.IsNotExist(err) {
				t.Errorf("state dir %s still exists (%v)", v.spec.StateDir, err)
			}
			if p := procs.Naming(v.spec.StateDir); len(p) > 0 {
				t.Errorf("processes still use %s: %v", v.spec.StateDir, p)
			}
		}
		if b, _ := os.ReadFile(data); !bytes.Equal(b, make([]byte, 4<<20)) {
			t.Error("the base data disk was written to; writes must go to overlays")
		}
	})
}

// connect dials the agent and waits until it is healthy.
func connect(t *testing.T, h Harness, v *vm, start time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), h.BootTimeout)
	defer cancel()
	c, _, err := agentclient.DialReady(ctx, v.m.AgentEndpoint(), agentclient.Options{})
	if err != nil {
		t.Fatalf("agent of %s not healthy within %v: %v\nserial log:\n%s", v.m.ID(), h.BootTimeout, err, consoleTail(v))
	}
	v.agent = c
	v.booted = time.Since(start)
}

func waitHealthy(t *testing.T, v *vm, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if _, err := v.agent.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, v *vm, shell string) agentclient.ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := v.agent.Exec(ctx, agentclient.ExecRequest{Shell: shell, User: "root", Timeout: 50 * time.Second}, nil)
	if err != nil {
		t.Fatalf("exec %q: %v", shell, err)
	}
	if r.Error != "" {
		t.Fatalf("exec %q: %s", shell, r.Error)
	}
	return r
}

// The scratch disk is the last virtio disk; one byte at offset 4096 marks it.
const lastDisk = `dev=/dev/$(ls /sys/block | grep '^vd' | sort | tail -n 1)`

func newKey() []byte {
	k := make([]byte, hypervisor.KeySize)
	rand.Read(k)
	return k
}

// FilesContaining lists the regular files under dir that contain b (a
// canary that must not be stored in plain text).
func FilesContaining(t testing.TB, dir string, b []byte) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(p)
		if os.IsNotExist(err) {
			return nil // gone while walking (a temporary file)
		}
		if err != nil {
			return err
		}
		if bytes.Contains(data, b) {
			found = append(found, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

func diskWrite(s string) string {
	return lastDisk + `; printf ` + s + ` | dd of=$dev bs=1 seek=4096 conv=fsync 2>/dev/null`
}

func diskRead() string {
	return lastDisk + `; dd if=$dev bs=1 skip=4096 count=1 2>/dev/null`
}

func writeFile(t *testing.T, v *vm, path string, b []byte) {
	t.Helper()
	if _, err := v.agent.WriteFile(context.Background(), path, bytes.NewReader(b), agentclient.WriteOptions{Owner: "root"}); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

func readFile(t *testing.T, v *vm, path string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if _, err := v.agent.ReadFile(context.Background(), path, &buf, 0, 0); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return buf.Bytes()
}

func wantState(t *testing.T, m hypervisor.Machine, want hypervisor.State) {
	t.Helper()
	info, err := m.Info(context.Background())
	if err != nil {
		t.Fatal("info:", err)
	}
	if info.State != want {
		t.Fatalf("state %s, want %s", info.State, want)
	}
}

// forget kills and cleans up a machine if a test failed half way. The
// backend itself may be what failed, so as a last resort it kills every
// process that names the machine's state directory, and removes it.
func forget(t *testing.T, v *vm) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if v.agent != nil {
		v.agent.Close()
	}
	if info, err := v.m.Info(ctx); err == nil && info.State != hypervisor.StateStopped {
		v.m.Kill(ctx)
	}
	v.m.Cleanup(ctx)
	for _, p := range procs.Naming(v.spec.StateDir) {
		t.Errorf("killing leftover process %s", p)
		syscall.Kill(p.PID, syscall.SIGKILL)
	}
	os.RemoveAll(v.spec.StateDir)
}

// baseDir is a short temporary directory (Unix socket paths are limited to
// 107 bytes, too few for t.TempDir under deep test names).
func baseDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "hbt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func newConsole(t *testing.T) *age.X25519Identity {
	id, err := consolelog.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// consoleTail is the end of a machine's console log.
func consoleTail(v *vm) string {
	p := v.spec.SerialLog
	if p == "" {
		p = filepath.Join(v.spec.StateDir, "serial.log")
	}
	if v.console != nil {
		b, err := consolelog.Tail(p, v.console, 4000)
		if err != nil {
			return "(console log: " + err.Error() + ")"
		}
		return string(b)
	}
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > 4000 {
		f.Seek(fi.Size()-4000, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, 4000))
	return string(b)
}
