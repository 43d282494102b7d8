package cloudhypervisor

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/hypervisor/consolelog"
	"github.com/harebox/harebox/hypervisor/hvsock"
	"github.com/harebox/harebox/hypervisor/vhostblk"
	"github.com/harebox/harebox/hypervisor/voldisk"

	"github.com/harebox/harebox/hypervisor"
)

// stubBackend returns a backend whose "cloud-hypervisor" is this test
// binary running stubProcessMain.
func stubBackend(t *testing.T) *Backend {
	t.Helper()
	t.Setenv(stubEnv, "1")
	spec, err := filepath.Abs(specFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(stubSpecEnv, spec)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{Binary: exe, StartTimeout: 10 * time.Second})
}

type testFiles struct {
	dir, kernel, base, data string
}

func newTestFiles(t *testing.T) testFiles {
	dir := shortTempDir(t)
	f := testFiles{
		dir:    dir,
		kernel: filepath.Join(dir, "vmlinux"),
		base:   filepath.Join(dir, "base.raw"),
		data:   filepath.Join(dir, "data.raw"),
	}
	for _, p := range []string{f.kernel, f.base, f.data} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f testFiles) spec(id string, overlay bool) hypervisor.Spec {
	s := hypervisor.Spec{
		ID:       id,
		VCPUs:    1,
		MemoryMB: 128,
		Kernel:   f.kernel,
		StateDir: filepath.Join(f.dir, id),
		Disks:    []hypervisor.Disk{{Path: f.data, ReadOnly: true}},
		Network:  &hypervisor.Network{Tap: "hbx-" + id, MAC: "52:54:00:00:00:01"},
	}
	if overlay {
		s.Disks = append([]hypervisor.Disk{{Path: f.base, Format: "raw", Overlay: true}}, s.Disks...)
	}
	return s
}

// reap makes sure a machine's VMM is gone when the test ends.
func reap(t *testing.T, m hypervisor.Machine) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		m.Kill(ctx)
		m.Cleanup(ctx)
	})
}

func echoThrough(t *testing.T, ep hypervisor.AgentEndpoint) {
	t.Helper()
	if ep.Transport != hypervisor.TransportHybridVsock || ep.Port != hypervisor.AgentPort {
		t.Fatalf("agent endpoint = %+v", ep)
	}
	conn, err := hvsock.DialHybridVsock(testCtx(t), ep.Path, ep.Port)
	if err != nil {
		t.Fatalf("dial agent: %v", err)
	}
	defer conn.Close()
	conn.Write([]byte("hi"))
	buf := make([]byte, 2)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "hi" {
		t.Fatalf("agent echo = %q, %v", buf, err)
	}
}

func wantState(t *testing.T, m hypervisor.Machine, want hypervisor.State) hypervisor.Info {
	t.Helper()
	info, err := m.Info(testCtx(t))
	if err != nil || info.State != want {
		t.Fatalf("Info = %+v, %v; want %s", info, err, want)
	}
	return info
}

func TestBackendLifecycle(t *testing.T) {
	b := stubBackend(t)
	ctx := testCtx(t)
	files := newTestFiles(t)
	_, err := exec.LookPath("qemu-img")
	overlay := err == nil
	if !overlay {
		t.Log("qemu-img not on PATH: launching without an overlay disk")
	}
	spec := files.spec("vm1", overlay)

	m, err := b.Launch(ctx, spec)
	if err != nil {
		t.Fatalf("Launch: %v", err)
	}
	reap(t, m)
	info := wantState(t, m, hypervisor.StateRunning)
	if info.ID != "vm1" || info.PID <= 0 || info.Started.IsZero() {
		t.Fatalf("Info = %+v", info)
	}
	echoThrough(t, m.AgentEndpoint())
	if overlay {
		out, err := exec.Command("qemu-img", "info", "-U", "--output=json", filepath.Join(spec.StateDir, "disk-0.qcow2")).Output()
		if err != nil || !strings.Contains(string(out), files.base) {
			t.Fatalf("overlay: %s, %v", out, err)
		}
	}

	// The handle carries what Attach needs, and Attach re-adopts.
	h := m.Handle()
	var d map[string]any
	if err := json.Unmarshal(h.Data, &d); err != nil || h.Backend != Name || h.ID != "vm1" {
		t.Fatalf("handle = %+v, %v", h, err)
	}
	for _, k := range []string{"pid", "api_socket", "state_dir", "started"} {
		if _, ok := d[k]; !ok {
			t.Fatalf("handle data lacks %q: %s", k, h.Data)
		}
	}
	m2, err := New(b.cfg).Attach(ctx, h)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	wantState(t, m2, hypervisor.StateRunning)

	if err := m2.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	wantState(t, m, hypervisor.StatePaused)
	if err := m.Resume(ctx); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	wantState(t, m, hypervisor.StateRunning)

	// Snapshot: the machine ends up paused, the dir holds the VMM's files,
	// the writable disk copy and the metadata.
	snap := filepath.Join(files.dir, "snap1")
	if err := m.Snapshot(ctx, snap, nil); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	wantState(t, m, hypervisor.StatePaused)
	want := []string{"config.json", "state.json", "memory-ranges", snapshotMetaName}
	if overlay {
		want = append(want, "disk-0.qcow2")
	}
	for _, f := range want {
		if _, err := os.Stat(filepath.Join(snap, f)); err != nil {
			t.Errorf("snapshot lacks %s", f)
		}
	}
	if err := m.Snapshot(ctx, snap, nil); !errors.Is(err, hypervisor.ErrExists) {
		t.Errorf("Snapshot into an existing dir: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(spec.StateDir, "snapshot-*")); len(left) > 0 {
		t.Errorf("staging left behind: %v", left)
	}

	// Restore a clone while the source still runs: its sockets and disk
	// copies must be its own (the stub refuses a vsock socket in use).
	cspec := hypervisor.Spec{ID: "vm2", StateDir: filepath.Join(files.dir, "vm2"),
		Network: &hypervisor.Network{Tap: "hbx-vm2", MAC: "52:54:00:00:00:02"}}
	clone, err := b.Restore(ctx, snap, cspec)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	reap(t, clone)
	wantState(t, clone, hypervisor.StateRunning)
	echoThrough(t, clone.AgentEndpoint())
	if clone.AgentEndpoint().Path == m.AgentEndpoint().Path {
		t.Fatal("clone shares the source's vsock socket")
	}
	cinfo, err := clone.(*machine).api.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cinfo.Config.Net[0].Tap != "hbx-vm2" || cinfo.Config.Memory.Size != 128<<20 ||
		cinfo.Config.Serial.File != filepath.Join(cspec.StateDir, serialLogName) {
		t.Fatalf("clone config = %+v", cinfo.Config)
	}
	if overlay && cinfo.Config.Disks[0].Path != filepath.Join(cspec.StateDir, "disk-0.qcow2") {
		t.Fatalf("clone disk = %s", cinfo.Config.Disks[0].Path)
	}
	if _, err := os.Stat(filepath.Join(cspec.StateDir, restoreDirName)); !os.IsNotExist(err) {
		t.Errorf("restore staging left behind: %v", err)
	}

	// Shutdown goes through the API and the VMM exits.
	if err := m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Cleanup(ctx); !errors.Is(err, hypervisor.ErrState) {
		t.Fatalf("Cleanup while running: %v", err)
	}
	if err := m.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := m.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	wantState(t, m, hypervisor.StateStopped)
	if err := m2.Wait(ctx); err != nil {
		t.Fatalf("Wait on the attached machine: %v", err)
	}
	if _, err := b.Attach(ctx, h); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Fatalf("Attach after shutdown: %v", err)
	}
	if err := m.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if _, err := os.Stat(spec.StateDir); !os.IsNotExist(err) {
		t.Fatalf("state dir still there: %v", err)
	}

	if err := clone.Kill(ctx); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	wantState(t, clone, hypervisor.StateStopped)
	if err := clone.Cleanup(ctx); err != nil {
		t.Fatalf("Cleanup clone: %v", err)
	}
}

func TestShutdownFallsBackToKill(t *testing.T) {
	b := stubBackend(t)
	t.Setenv(stubStubborn, "1")
	files := newTestFiles(t)
	m, err := b.Launch(testCtx(t), files.spec("stubborn", false))
	if err != nil {
		t.Fatal(err)
	}
	reap(t, m)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := m.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("Shutdown took %v", d)
	}
	wantState(t, m, hypervisor.StateStopped)
}

func TestAttachRejects(t *testing.T) {
	b := stubBackend(t)
	ctx := testCtx(t)
	dir := shortTempDir(t)
	data := func(pid int) []byte {
		b, _ := json.Marshal(handleData{PID: pid, APISocket: filepath.Join(dir, "api.sock"), StateDir: dir, VsockSocket: filepath.Join(dir, "v.sock")})
		return b
	}
	// A live pid that is not our VMM (this test process) must not be trusted.
	if _, err := b.Attach(ctx, hypervisor.Handle{Backend: Name, ID: "x", Data: data(os.Getpid())}); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Fatalf("Attach to a foreign pid: %v", err)
	}
	if _, err := b.Attach(ctx, hypervisor.Handle{Backend: Name, ID: "x", Data: data(1 << 30)}); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Fatalf("Attach to a missing pid: %v", err)
	}
	if _, err := b.Attach(ctx, hypervisor.Handle{Backend: "qemu", ID: "x", Data: data(1)}); !errors.Is(err, hypervisor.ErrInvalid) {
		t.Fatalf("Attach with another backend's handle: %v", err)
	}
}

func TestLaunchFailures(t *testing.T) {
	b := stubBackend(t)
	ctx := testCtx(t)
	files := newTestFiles(t)

	t.Run("exists", func(t *testing.T) {
		spec := files.spec("dup", false)
		m, err := b.Launch(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		reap(t, m)
		if _, err := b.Launch(ctx, spec); !errors.Is(err, hypervisor.ErrExists) {
			t.Fatalf("second Launch in the same state dir: %v", err)
		}
		wantState(t, m, hypervisor.StateRunning)
	})
	t.Run("vmm exits", func(t *testing.T) {
		t.Setenv(stubFailEnv, "1")
		spec := files.spec("fails", false)
		_, err := b.Launch(ctx, spec)
		if !errors.Is(err, hypervisor.ErrUnavailable) || !strings.Contains(err.Error(), "Failed to open hypervisor interface") {
			t.Fatalf("Launch with a failing VMM: %v", err)
		}
		if _, err := os.Stat(spec.StateDir); !os.IsNotExist(err) {
			t.Fatalf("failed Launch left its state dir: %v", err)
		}
	})
	t.Run("too old", func(t *testing.T) {
		t.Setenv(stubVersionEnv, "v50.0")
		if _, err := New(b.cfg).Launch(ctx, files.spec("old", false)); !errors.Is(err, hypervisor.ErrUnavailable) || !strings.Contains(err.Error(), "older than") {
			t.Fatalf("Launch with v50: %v", err)
		}
	})
	t.Run("invalid spec", func(t *testing.T) {
		spec := files.spec("bad", false)
		spec.Kernel = "vmlinux"
		if _, err := b.Launch(ctx, spec); !errors.Is(err, hypervisor.ErrInvalid) {
			t.Fatalf("Launch with a relative kernel: %v", err)
		}
		spec = files.spec("long", false)
		spec.StateDir = "/" + strings.Repeat("d", 120)
		if _, err := b.Launch(ctx, spec); !errors.Is(err, hypervisor.ErrInvalid) {
			t.Fatalf("Launch with a long state dir: %v", err)
		}
	})
	t.Run("restore without metadata", func(t *testing.T) {
		if _, err := b.Restore(ctx, files.dir, hypervisor.Spec{ID: "r", StateDir: filepath.Join(files.dir, "r")}); !errors.Is(err, hypervisor.ErrNotFound) {
			t.Fatalf("Restore from a non-snapshot: %v", err)
		}
	})
}

func TestCapabilities(t *testing.T) {
	b := stubBackend(t)
	dir := shortTempDir(t)
	kvm := filepath.Join(dir, "kvm")
	os.WriteFile(kvm, nil, 0o600)
	os.MkdirAll(filepath.Join(dir, "module", "kvm_intel"), 0o700)
	b.hp = hostPaths{devKVM: kvm, sysModule: filepath.Join(dir, "module"), procModules: "/nonexistent", lsm: "/nonexistent"}
	caps, err := b.Capabilities(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if caps.Name != "cloud-hypervisor" || caps.Accelerator != "kvm" || !caps.Snapshot || !caps.Pause || !caps.Reuse ||
		len(caps.AgentTransports) != 1 || caps.AgentTransports[0] != hypervisor.TransportHybridVsock || caps.Version != "v53.0.0" {
		t.Fatalf("caps = %+v", caps)
	}
	_, errImg := exec.LookPath("qemu-img")
	_, errDaemon := exec.LookPath("qemu-storage-daemon")
	if want := errImg == nil && errDaemon == nil; caps.Encryption != want || caps.Volumes != want || !caps.VolumesNeedDataKey {
		t.Errorf("caps.Encryption = %v, caps.Volumes = %v with qemu-img and qemu-storage-daemon found: %v", caps.Encryption, caps.Volumes, want)
	}
	nb := New(Config{Binary: b.cfg.Binary, StorageDaemon: "/nonexistent/qemu-storage-daemon"})
	nb.hp = b.hp
	if caps, err := nb.Capabilities(testCtx(t)); err != nil || caps.Encryption || caps.Volumes {
		t.Errorf("caps without the storage daemon = %+v, %v", caps, err)
	}
	os.RemoveAll(filepath.Join(dir, "module", "kvm_intel"))
	os.MkdirAll(filepath.Join(dir, "module", "kvm_pvm"), 0o700)
	caps, err = b.Capabilities(testCtx(t))
	if !errors.Is(err, hypervisor.ErrUnavailable) || !strings.Contains(caps.Notice, "PVM-only") {
		t.Fatalf("caps on PVM = %+v, %v", caps, err)
	}
}

// TestEncryptedDisks: with a data key, a machine's overlay is a LUKS
// qcow2 served to the VMM by qemu-storage-daemon as a vhost-user-blk
// socket (the VMM cannot open it itself), with guest memory shared; the
// daemon goes when the machine is killed, and with it every file; what
// is not built yet (encrypted snapshots, a writable disk without an
// overlay) is refused, not served in plain text.
func TestEncryptedDisks(t *testing.T) {
	for _, bin := range []string{"qemu-img", "qemu-storage-daemon"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	b := stubBackend(t)
	ctx := testCtx(t)
	files := newTestFiles(t)
	key := make([]byte, hypervisor.KeySize)
	rand.Read(key)
	// launch starts a machine with an overlay under key.
	launch := func(id string) (hypervisor.Machine, hypervisor.Spec) {
		t.Helper()
		spec := files.spec(id, true)
		spec.DataKey = key
		m, err := b.Launch(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		reap(t, m)
		return m, spec
	}
	m, spec := launch("enc")
	vi, err := m.(*machine).api.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(vi.Config.Disks) != 2 || !vi.Config.Disks[0].VhostUser || vi.Config.Disks[0].Path != "" || vi.Config.Disks[1].VhostUser || !vi.Config.Memory.Shared {
		t.Fatalf("the VMM's config: %+v memory %+v", vi.Config.Disks, vi.Config.Memory)
	}
	srv, err := vhostblk.Find(filepath.Join(spec.StateDir, blockDirName))
	if err != nil || len(srv.Sockets) != 1 || srv.Sockets[0] != vi.Config.Disks[0].VhostSocket {
		t.Fatalf("the storage daemon: %+v %v", srv, err)
	}
	out, err := exec.Command("qemu-img", "info", "-U", "--output=json", filepath.Join(spec.StateDir, "disk-0.qcow2")).Output()
	var info struct {
		Encrypted bool `json:"encrypted"`
	}
	if err != nil || json.Unmarshal(out, &info) != nil || !info.Encrypted {
		t.Errorf("the overlay is not encrypted: %v %s", err, out)
	}
	// Re-attached (a restarted plugin), it still stops its daemon.
	again, err := b.Attach(ctx, m.Handle())
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := vhostblk.Find(srv.Dir); !errors.Is(err, vhostblk.ErrNotRunning) {
		t.Errorf("the daemon outlived its VMM: %v", err)
	}
	if err := again.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(spec.StateDir); !os.IsNotExist(err) {
		t.Errorf("state dir after Cleanup: %v", err)
	}

	// A VMM that dies while no plugin watches: the Attach that finds it
	// gone stops its daemon. A Shutdown stops it too.
	for _, kill := range []bool{true, false} {
		m, s := launch("dies")
		dir := filepath.Join(s.StateDir, blockDirName)
		if kill {
			info, _ := m.Info(ctx)
			syscall.Kill(info.PID, syscall.SIGKILL)
			m.Wait(ctx)
			if _, err := New(b.cfg).Attach(ctx, m.Handle()); !errors.Is(err, hypervisor.ErrNotFound) {
				t.Errorf("attach of a dead VMM: %v", err)
			}
		} else if err := m.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := vhostblk.Find(dir); !errors.Is(err, vhostblk.ErrNotRunning) {
			t.Errorf("the daemon outlived its VMM (killed %v): %v", kill, err)
		}
		if err := m.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
	}

	s := files.spec("refused", true)
	s.DataKey, s.SnapshotKey = key, key
	if m, err := b.Launch(ctx, s); !errors.Is(err, hypervisor.ErrInvalid) {
		if m != nil {
			reap(t, m)
		}
		t.Errorf("a snapshot key given to Launch: %v", err)
	}
	s = files.spec("writable", false)
	s.Disks[0].ReadOnly = false
	s.DataKey = key
	if _, err := b.Launch(ctx, s); !errors.Is(err, hypervisor.ErrInvalid) {
		t.Errorf("a writable disk without an overlay: %v", err)
	}
	// A daemon that cannot start (no such binary) fails the launch and
	// leaves nothing.
	nb := New(Config{Binary: b.cfg.Binary, StartTimeout: b.cfg.StartTimeout, StorageDaemon: "/nonexistent/qemu-storage-daemon"})
	s = files.spec("nodaemon", true)
	s.DataKey = key
	if _, err := nb.Launch(ctx, s); !errors.Is(err, hypervisor.ErrUnavailable) {
		t.Errorf("without the daemon: %v", err)
	}
	if _, err := os.Stat(s.StateDir); !os.IsNotExist(err) {
		t.Errorf("a failed launch left %s: %v", s.StateDir, err)
	}
}

// TestVolumes: a volume is served by the machine's storage daemon (real)
// and hot-plugged into the VM (the stub, checked against the API spec,
// connects to its socket as the VMM does); plugged twice is ErrExists; a
// machine with a volume takes no snapshot; the volume moves onto a new
// layer; unplugged, the daemon serves it no more; twice is ErrNotFound.
// A machine without a storage daemon takes none. (The guest's side, on
// a host with Cloud Hypervisor only: hypervisortest's Volumes.)
func TestVolumes(t *testing.T) {
	for _, bin := range []string{"qemu-img", "qemu-storage-daemon", "mkfs.ext4"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	b := stubBackend(t)
	ctx := testCtx(t)
	files := newTestFiles(t)
	key, volKey := make([]byte, hypervisor.KeySize), make([]byte, hypervisor.KeySize)
	rand.Read(key)
	rand.Read(volKey)
	spec := files.spec("vol", true)
	spec.DataKey = key
	m, err := b.Launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	reap(t, m)
	file := filepath.Join(t.TempDir(), "v.qcow2")
	if err := (&voldisk.Maker{}).Create(ctx, file, 32<<20, volKey, ""); err != nil {
		t.Fatal(err)
	}
	vol := hypervisor.Volume{ID: "v1", Path: file, Key: volKey}
	if err := m.PlugVolume(ctx, vol); err != nil {
		t.Fatal("plug:", err)
	}
	if err := m.PlugVolume(ctx, vol); !errors.Is(err, hypervisor.ErrExists) {
		t.Errorf("plug twice: %v, want ErrExists", err)
	}
	srv, err := vhostblk.Find(filepath.Join(spec.StateDir, blockDirName))
	if err != nil {
		t.Fatal(err)
	}
	if ids, err := srv.Volumes(ctx); err != nil || len(ids) != 1 || ids[0] != "v1" {
		t.Errorf("the daemon serves %v, %v", ids, err)
	}
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Snapshot(ctx, filepath.Join(t.TempDir(), "snap"), key); !errors.Is(err, hypervisor.ErrState) {
		t.Errorf("snapshot with a volume plugged: %v, want ErrState", err)
	}
	if err := m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(filepath.Dir(file), "v.1.qcow2")
	if err := voldisk.Layer(ctx, voldisk.Tools{}, file, layer, volKey); err != nil {
		t.Fatal(err)
	}
	if err := m.LayerVolume(ctx, "v1", layer); err != nil {
		t.Fatal("layer:", err)
	}
	// An export a plug left without the VMM taking it (a host that died
	// between the two) goes, and the volume is plugged in afresh.
	v2 := hypervisor.Volume{ID: "v2", Path: file, Key: volKey, ReadOnly: true}
	if _, err := srv.AddVolume(ctx, v2); err != nil {
		t.Fatal(err)
	}
	if err := m.PlugVolume(ctx, v2); err != nil {
		t.Fatal("plug over an export left behind:", err)
	}
	if err := m.PlugVolume(ctx, v2); !errors.Is(err, hypervisor.ErrExists) {
		t.Errorf("plug it twice: %v, want ErrExists", err)
	}
	if err := m.UnplugVolume(ctx, "v2"); err != nil {
		t.Fatal("unplug:", err)
	}
	if err := m.UnplugVolume(ctx, "v1"); err != nil {
		t.Fatal("unplug:", err)
	}
	if err := m.UnplugVolume(ctx, "v1"); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("unplug twice: %v, want ErrNotFound", err)
	}
	if ids, err := srv.Volumes(ctx); err != nil || len(ids) != 0 {
		t.Errorf("the daemon serves %v after the unplug (%v)", ids, err)
	}
	// Without a data key there is no storage daemon: no volume.
	plain := files.spec("plain", false)
	pm, err := b.Launch(ctx, plain)
	if err != nil {
		t.Fatal(err)
	}
	reap(t, pm)
	if err := pm.PlugVolume(ctx, vol); !errors.Is(err, hypervisor.ErrUnsupported) {
		t.Errorf("plug into a machine without a storage daemon: %v, want ErrUnsupported", err)
	}
}

// TestEncryptedConsole: with a console recipient the VMM serves the serial
// port on a socket and the backend drains it into the encrypted log: the
// guest's line is in the log, readable with the identity, and not in any
// file in plain text; a re-attached machine (a restarted plugin) is
// drained again; snapshots and restores of such machines are refused.
func TestEncryptedConsole(t *testing.T) {
	b := stubBackend(t)
	ctx := testCtx(t)
	files := newTestFiles(t)
	id, err := consolelog.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	spec := files.spec("con", false)
	spec.ConsoleRecipient = id.Recipient().String()
	spec.SerialLog = filepath.Join(files.dir, "con.log")
	m, err := b.Launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	reap(t, m)
	line := strings.TrimSpace(stubSerialLine)
	var waitLog func(log string, n int)
	waitLines := func(n int) {
		t.Helper()
		waitLog(spec.SerialLog, n)
	}
	waitLog = func(log string, n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			got, err := consolelog.Tail(log, id, 1<<16)
			if err == nil && strings.Count(string(got), line) >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the console log holds %q (%v), want %d of %q", got, err, n, line)
			}
		}
	}
	waitLines(1)
	filepath.Walk(files.dir, func(path string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if b, _ := os.ReadFile(path); bytes.Contains(b, []byte("console canary")) {
				t.Errorf("%s holds the console in plain text", path)
			}
		}
		return nil
	})
	// A restarted plugin: this process's drain stops, another's starts.
	m.(*machine).endDrain()
	again, err := New(b.cfg).Attach(ctx, m.Handle())
	if err != nil {
		t.Fatal(err)
	}
	waitLines(2)
	// A clone's console is its own, whatever its source's was: encrypted
	// to its recipient and drained from its own socket, or a plain file.
	// (Golden snapshots are taken with a plain console and restored into
	// encrypted ones.)
	restore := func(snap, id string, recipient string) *VmConfig {
		t.Helper()
		cspec := hypervisor.Spec{ID: id, StateDir: filepath.Join(files.dir, id), ConsoleRecipient: recipient,
			Network: &hypervisor.Network{Tap: "hbx-" + id, MAC: "52:54:00:00:00:02"}}
		clone, err := b.Restore(ctx, snap, cspec)
		if err != nil {
			t.Fatal(err)
		}
		reap(t, clone)
		info, err := clone.(*machine).api.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return &info.Config
	}
	snap := filepath.Join(files.dir, "snap")
	if err := again.Snapshot(ctx, snap, nil); err != nil {
		t.Fatal(err)
	}
	if c := restore(snap, "c1", spec.ConsoleRecipient); c.Serial.Mode != ConsoleModeSocket || c.Serial.File != "" {
		t.Errorf("an encrypted clone's serial: %+v", c.Serial)
	}
	waitLog(filepath.Join(files.dir, "c1", serialLogName), 1)
	if c := restore(snap, "c2", ""); c.Serial.Mode != ConsoleModeFile || c.Serial.File != filepath.Join(files.dir, "c2", serialLogName) || c.Serial.Socket != "" {
		t.Errorf("a plain clone's serial: %+v", c.Serial)
	}
	plain, err := b.Launch(ctx, files.spec("plaincon", false))
	if err != nil {
		t.Fatal(err)
	}
	reap(t, plain)
	psnap := filepath.Join(files.dir, "psnap")
	if err := plain.Snapshot(ctx, psnap, nil); err != nil {
		t.Fatal(err)
	}
	if c := restore(psnap, "c3", spec.ConsoleRecipient); c.Serial.Mode != ConsoleModeSocket {
		t.Errorf("an encrypted clone of a plain console's snapshot: %+v", c.Serial)
	}
	waitLog(filepath.Join(files.dir, "c3", serialLogName), 1)
	if err := again.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { again.Cleanup(ctx); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Cleanup hangs on the console drain")
	}
}
