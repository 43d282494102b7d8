package vhostblk_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/overlay"
	"github.com/harebox/harebox/hypervisor/vhostblk"
	"github.com/harebox/harebox/hypervisor/voldisk"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/internal/testimage"
)

func need(t *testing.T, bins ...string) {
	t.Helper()
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s is not installed (make deps installs it)", b)
		}
	}
}

func newKey() []byte {
	k := make([]byte, hypervisor.KeySize)
	rand.Read(k)
	return k
}

// plainBytes reads the disk at path (an encrypted qcow2 over its base)
// as the guest sees it, through qemu-img with key.
func plainBytes(t *testing.T, path string, key []byte) []byte {
	t.Helper()
	b, err := readPlain(t, path, key)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func readPlain(t *testing.T, path string, key []byte) ([]byte, error) {
	t.Helper()
	var sec overlay.Secrets
	defer sec.Close()
	if err := sec.Add("k", key); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "plain.raw")
	args := append([]string{"convert"}, sec.Args()...)
	// (-U: the daemon may hold the image open.)
	args = append(args, "-U", "--image-opts", "driver=qcow2,file.filename="+path+",encrypt.key-secret=k", "-O", "raw", out)
	cmd := exec.Command("qemu-img", args...)
	sec.Apply(cmd)
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("qemu-img convert: %v %s", err, b)
	}
	return os.ReadFile(out)
}

// frontend boots the minimal image under QEMU (TCG) with the sockets as
// vhost-user-blk disks, the way a VMM that cannot open the overlay uses
// them (guest memory shared with the daemon), and returns its agent.
func frontend(t *testing.T, dir string, sockets []string) *agentclient.Client {
	t.Helper()
	img := testimage.Image(t, "minimal")
	agentSock := filepath.Join(dir, "agent.sock")
	pidFile := filepath.Join(dir, "qemu.pid")
	args := []string{
		"-M", "microvm,isa-serial=on,rtc=on,pcie=on,memory-backend=mem", "-accel", "tcg", "-cpu", "max", "-smp", "1", "-m", "512",
		"-object", "memory-backend-memfd,id=mem,size=512M,share=on",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", img.Kernel, "-initrd", img.Initrd, "-append", img.Cmdline + tscHint(t),
		"-serial", "file:" + filepath.Join(dir, "serial.log"),
		"-pidfile", pidFile, "-daemonize",
		// (The agent's first random bytes wait for the guest's CRNG.)
		"-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-device,rng=rng0",
		"-device", "virtio-serial-device,max_ports=2",
		"-chardev", "socket,id=agent,path=" + agentSock + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=" + hypervisor.AgentSerialName,
	}
	for i, s := range sockets {
		id := "vb" + string(rune('0'+i))
		// (PCI, as Cloud Hypervisor's disks are: QEMU's virtio-mmio
		// kicks a vhost-user device only under KVM.)
		args = append(args, "-chardev", "socket,id="+id+",path="+s, "-device", "vhost-user-blk-pci,chardev="+id)
	}
	if out, err := exec.Command("qemu-system-x86_64", args...).CombinedOutput(); err != nil {
		t.Fatalf("qemu: %v %s", err, out)
	}
	t.Cleanup(func() {
		for _, p := range procs.Naming(pidFile) {
			syscall.Kill(p.PID, syscall.SIGKILL)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, _, err := agentclient.DialReady(ctx, hypervisor.AgentEndpoint{Transport: hypervisor.TransportSerial, Path: agentSock}, agentclient.Options{})
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "serial.log"))
		t.Fatalf("agent: %v\n%s", err, log)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// tscHint gives a TCG guest the host's TSC rate, which its own
// calibration cannot measure on microvm (the QEMU backend measures it;
// the host's cpuinfo is close enough for a test).
func tscHint(t *testing.T) string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			if mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && mhz > 0 {
				return " tsc_early_khz=" + strconv.Itoa(int(mhz*1000))
			}
		}
	}
	t.Skip("no cpu MHz in /proc/cpuinfo")
	return ""
}

func guest(t *testing.T, c *agentclient.Client, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := c.Exec(ctx, agentclient.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, User: "root", Timeout: 50 * time.Second}, nil)
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("%q: %v %d %s %s", script, err, r.ExitCode, r.Stdout, r.Stderr)
	}
	return string(r.Stdout)
}

// TestServeEncryptedOverlay: a guest writes through a vhost-user-blk
// socket served from a LUKS overlay; on the host the overlay holds only
// ciphertext and the base is untouched; the key reads the guest's bytes
// back; another key opens nothing; the daemon is found again by its
// directory and copies the disk's writes under a snapshot's key; Stop
// leaves no process and no socket.
func TestServeEncryptedOverlay(t *testing.T) {
	need(t, "qemu-storage-daemon", "qemu-img", "qemu-system-x86_64")
	dir, err := os.MkdirTemp("", "hbv")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	base := filepath.Join(dir, "base.raw")
	baseData := bytes.Repeat([]byte("base-block"), (8<<20)/10+1)
	if err := os.WriteFile(base, baseData[:8<<20], 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := newKey()
	ov := filepath.Join(dir, "ov.qcow2")
	if err := overlay.CreateEncrypted(ctx, "qemu-img", base, "raw", ov, 16<<20, key); err != nil {
		t.Fatal(err)
	}
	disk := vhostblk.Disk{Path: ov, Format: "qcow2", Encrypted: true, Backing: base, BackingFormat: "raw"}

	// Another key: the daemon cannot open the overlay and nothing runs.
	if _, err := vhostblk.Start(ctx, vhostblk.Options{Dir: filepath.Join(dir, "wrong"), Disks: []vhostblk.Disk{disk}, DataKey: newKey()}); err == nil || !strings.Contains(err.Error(), "Invalid password") {
		t.Errorf("another key: %v", err)
	}
	if _, err := vhostblk.Find(filepath.Join(dir, "wrong")); !errors.Is(err, vhostblk.ErrNotRunning) {
		t.Errorf("a daemon runs after a failed start: %v", err)
	}
	if socks, _ := filepath.Glob(filepath.Join(dir, "wrong", "*.sock")); len(socks) != 0 {
		t.Errorf("a failed start left sockets: %v", socks)
	}

	srv, err := vhostblk.Start(ctx, vhostblk.Options{Dir: filepath.Join(dir, "d"), Disks: []vhostblk.Disk{disk}, DataKey: key})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(ctx)
	if again, err := vhostblk.Start(ctx, vhostblk.Options{Dir: filepath.Join(dir, "d"), Disks: []vhostblk.Disk{disk}, DataKey: key}); !errors.Is(err, hypervisor.ErrExists) {
		t.Errorf("a second daemon on the directory: %+v %v", again, err)
	}
	if cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(srv.PID) + "/cmdline"); bytes.Contains(cmdline, []byte(overlay.Passphrase(key))) {
		t.Error("the key is on the daemon's command line")
	}

	c := frontend(t, dir, srv.Sockets)
	const marker = "harebox-vhost-user-marker"
	got := guest(t, c, `printf `+marker+` | dd of=/dev/vda bs=512 seek=2048 conv=fsync 2>/dev/null && dd if=/dev/vda bs=512 skip=2048 count=1 2>/dev/null | head -c 25; echo; dd if=/dev/vda bs=10 count=1 2>/dev/null`)
	if got != marker+"\nbase-block" {
		t.Fatalf("the guest reads %q", got)
	}

	found, err := vhostblk.Find(srv.Dir)
	if err != nil || found.PID != srv.PID || len(found.Sockets) != 1 || found.Sockets[0] != srv.Sockets[0] {
		t.Fatalf("found %+v %v, started %+v", found, err, srv)
	}

	// A snapshot's copy of the disk, by the daemon found again (as after
	// a restart), under a key of its own: ciphertext only; the snapshot's
	// key reads the guest's bytes over the base, the disk's key opens
	// nothing, and the disk itself is as it was.
	// A copy that fails (no target file) cleans up after itself, and so
	// does one that works: the copies after each work too (the key's
	// secret, the target and the job have the same names every time).
	snapKey := newKey()
	if err := found.Backup(ctx, 0, filepath.Join(dir, "missing.qcow2"), snapKey); err == nil || strings.Contains(err.Error(), "clean up") {
		t.Errorf("a copy into a file that is not there: %v", err)
	}
	var snap string
	for _, name := range []string{"snap1.qcow2", "snap.qcow2"} {
		snap = filepath.Join(dir, name)
		if err := overlay.CreateEncrypted(ctx, "qemu-img", base, "raw", snap, 16<<20, snapKey); err != nil {
			t.Fatal(err)
		}
		if err := found.Backup(ctx, 0, snap, snapKey); err != nil {
			t.Fatal(err)
		}
	}
	if err := found.Backup(ctx, 1, snap, snapKey); !errors.Is(err, hypervisor.ErrInvalid) {
		t.Errorf("a backup of a disk it does not serve: %v", err)
	}
	if raw, _ := os.ReadFile(snap); len(raw) == 0 || bytes.Contains(raw, []byte(marker)) {
		t.Errorf("the copy holds the guest's bytes in plain text (or nothing: %d bytes)", len(raw))
	}
	if plain := plainBytes(t, snap, snapKey); !bytes.HasPrefix(plain[2048*512:], []byte(marker)) || !bytes.HasPrefix(plain, []byte("base-block")) {
		t.Errorf("the snapshot key reads back %q at the marker", plain[2048*512:2048*512+32])
	}
	if _, err := readPlain(t, snap, key); err == nil || !strings.Contains(err.Error(), "Invalid password") {
		t.Errorf("the disk's key opens the copy: %v", err)
	}
	if got := guest(t, c, `dd if=/dev/vda bs=512 skip=2048 count=1 2>/dev/null | head -c 25`); got != marker {
		t.Errorf("after the copy the guest reads %q", got)
	}

	// A clone of the snapshot: its own overlay over the plain base, under
	// its own key, served over the snapshot's copy until Detach streams
	// that copy in; then the clone needs neither the copy nor its key.
	cloneKey := newKey()
	clone := filepath.Join(dir, "clone.qcow2")
	if err := overlay.CreateEncrypted(ctx, "qemu-img", base, "raw", clone, 16<<20, cloneKey); err != nil {
		t.Fatal(err)
	}
	csrv, err := vhostblk.Start(ctx, vhostblk.Options{Dir: filepath.Join(dir, "c"), DataKey: cloneKey, BackingKey: snapKey,
		Disks: []vhostblk.Disk{{Path: clone, Format: "qcow2", Encrypted: true, Backing: snap, BackingFormat: "qcow2", BackingEncrypted: true,
			BackingBase: base, BackingBaseFormat: "raw"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer csrv.Stop(ctx)
	if plain := plainBytes(t, clone, cloneKey); bytes.HasPrefix(plain[2048*512:], []byte(marker)) {
		t.Fatal("the clone's overlay holds the guest's bytes before Detach")
	}
	if err := csrv.Detach(ctx, map[int]string{1: base}); !errors.Is(err, hypervisor.ErrInvalid) {
		t.Errorf("detach of a disk it does not serve: %v", err)
	}
	if err := csrv.Detach(ctx, map[int]string{0: base}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(snap); err != nil {
		t.Fatal(err)
	}
	// (Stopped first: the daemon flushes the overlay's metadata then.)
	if err := csrv.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if plain := plainBytes(t, clone, cloneKey); !bytes.HasPrefix(plain[2048*512:], []byte(marker)) || !bytes.HasPrefix(plain, []byte("base-block")) {
		t.Errorf("after Detach the clone's key reads %q at the marker", plain[2048*512:2048*512+32])
	}
	if raw, _ := os.ReadFile(clone); bytes.Contains(raw, []byte(marker)) {
		t.Error("the clone's overlay holds the guest's bytes in plain text")
	}
	if _, err := readPlain(t, clone, snapKey); err == nil {
		t.Error("the snapshot's key opens the clone's overlay")
	}
	if err := found.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := vhostblk.Find(srv.Dir); !errors.Is(err, vhostblk.ErrNotRunning) {
		t.Errorf("after Stop: %v", err)
	}
	for _, sock := range []string{srv.Sockets[0], filepath.Join(srv.Dir, "qmp.sock")} {
		if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the socket %s is left: %v", sock, err)
		}
	}

	raw, err := os.ReadFile(ov)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(marker)) {
		t.Error("the guest's bytes are in the overlay in plain text")
	}
	if b, _ := os.ReadFile(base); !bytes.Equal(b, baseData[:8<<20]) {
		t.Error("the base changed")
	}
	plain := plainBytes(t, ov, key)
	if !bytes.HasPrefix(plain[2048*512:], []byte(marker)) || !bytes.HasPrefix(plain, []byte("base-block")) {
		t.Errorf("the key reads back %q at the marker", plain[2048*512:2048*512+32])
	}
}

// TestServeVolumes: a running daemon serves a volume added over its
// monitor (the key never on a command line; a wrong key refused); a
// guest writes to it; the volume moves onto a new layer while the guest
// runs, and the file under it is served again read-only beside it, to
// another guest that reads what the first wrote before the layer and
// not after, and cannot write; both are removed, their sockets go, and
// neither file holds the guest's bytes in plain text.
func TestServeVolumes(t *testing.T) {
	need(t, "qemu-storage-daemon", "qemu-img", "qemu-system-x86_64")
	dir, err := os.MkdirTemp("", "hbvv")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	raw := filepath.Join(dir, "root.raw")
	if err := os.WriteFile(raw, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := vhostblk.Start(ctx, vhostblk.Options{Dir: filepath.Join(dir, "d"), Disks: []vhostblk.Disk{{Path: raw, Format: "raw"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(ctx)
	key := newKey()
	vol, layer := filepath.Join(dir, "vol.qcow2"), filepath.Join(dir, "vol.1.qcow2")
	if err := overlay.CreateEncrypted(ctx, "qemu-img", "", "", vol, 16<<20, key); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.AddVolume(ctx, hypervisor.Volume{ID: "v1", Path: vol, Key: newKey()}); !errors.Is(err, hypervisor.ErrInvalid) {
		t.Fatalf("a volume under a wrong key: %v, want ErrInvalid", err)
	}
	sock, err := srv.AddVolume(ctx, hypervisor.Volume{ID: "v1", Path: vol, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.AddVolume(ctx, hypervisor.Volume{ID: "v1", Path: vol, Key: key}); !errors.Is(err, hypervisor.ErrExists) {
		t.Fatalf("the same volume twice: %v, want ErrExists", err)
	}
	if cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(srv.PID) + "/cmdline"); bytes.Contains(cmdline, []byte(overlay.Passphrase(key))) {
		t.Error("the volume's key is on the daemon's command line")
	}
	const before, after = "written-before-the-layer", "written-after-the-layer"
	for _, d := range []string{"w", "r"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	w := frontend(t, filepath.Join(dir, "w"), []string{srv.Sockets[0], sock})
	guest(t, w, `printf `+before+` | dd of=/dev/vdb bs=512 seek=2048 conv=fsync 2>/dev/null`)

	if err := overlay.CreateEncrypted(ctx, "qemu-img", vol, "qcow2", layer, 0, key); err != nil {
		t.Fatal(err)
	}
	if err := srv.LayerVolume(ctx, "v2", layer); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("layer a volume not served: %v, want ErrNotFound", err)
	}
	for range 2 { // (the second time: no change)
		if err := srv.LayerVolume(ctx, "v1", layer); err != nil {
			t.Fatal("layer:", err)
		}
	}
	guest(t, w, `printf `+after+` | dd of=/dev/vdb bs=512 seek=4096 conv=fsync 2>/dev/null`)
	if got := guest(t, w, `dd if=/dev/vdb bs=512 skip=2048 count=1 2>/dev/null | head -c 24; echo; dd if=/dev/vdb bs=512 skip=4096 count=1 2>/dev/null | head -c 23`); got != before+"\n"+after {
		t.Errorf("the writer reads %q", got)
	}

	rsock, err := srv.AddVolume(ctx, hypervisor.Volume{ID: "v1r", Path: vol, Key: key, ReadOnly: true})
	if err != nil {
		t.Fatal("serve the file under the writer read-only:", err)
	}
	if err := srv.LayerVolume(ctx, "v1r", filepath.Join(dir, "nope.qcow2")); !errors.Is(err, hypervisor.ErrInvalid) {
		t.Errorf("layer a read-only volume: %v, want ErrInvalid", err)
	}
	// (A socket serves one VMM: the reader has the volume alone, vda.)
	r := frontend(t, filepath.Join(dir, "r"), []string{rsock})
	if got := guest(t, r, `dd if=/dev/vda bs=512 skip=2048 count=1 2>/dev/null | head -c 24; echo; dd if=/dev/vda bs=512 skip=4096 count=1 2>/dev/null | head -c 23 | od -c | head -n 1`); !strings.HasPrefix(got, before+"\n0000000  \\0") {
		t.Errorf("the reader beside the writer reads %q, want what was written before the layer only", got)
	}
	if got := guest(t, r, `printf x | dd of=/dev/vda bs=512 seek=8192 conv=fsync 2>&1; echo "exit $?"`); !strings.Contains(got, "exit 1") {
		t.Errorf("the reader writes: %q", got)
	}

	for _, id := range []string{"v1r", "v1"} {
		if err := srv.RemoveVolume(ctx, id); err != nil {
			t.Fatalf("remove %s: %v", id, err)
		}
	}
	if err := srv.RemoveVolume(ctx, "v1"); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("remove twice: %v, want ErrNotFound", err)
	}
	for _, s := range []string{sock, rsock} {
		if _, err := os.Stat(s); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the socket %s is left: %v", s, err)
		}
	}
	for _, f := range []string{vol, layer} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(before)) || bytes.Contains(b, []byte(after)) {
			t.Errorf("%s holds the guest's bytes in plain text", f)
		}
	}
	// The first file holds what was written before the layer (the key
	// reads it back), and the daemon serves the volume again from it.
	if plain := plainBytes(t, vol, key); !bytes.HasPrefix(plain[2048*512:], []byte(before)) || bytes.Contains(plain, []byte(after)) {
		t.Errorf("the first file reads %q at the first mark", plain[2048*512:2048*512+24])
	}
	if _, err := srv.AddVolume(ctx, hypervisor.Volume{ID: "v1", Path: layer, Backing: []string{vol}, Key: key}); err != nil {
		t.Fatal("serve the volume again, layer over first file:", err)
	}
	if err := srv.RemoveVolume(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
}

// TestVolumeFoundWithoutSerial: a volume served over vhost-user, whose
// disk has no serial of its own (the daemon answers every disk's alike),
// is found and mounted by the guest agent by its filesystem's UUID (the
// host made it from the volume's ID), written and read back; a volume
// made before (another UUID) is not taken for it.
func TestVolumeFoundWithoutSerial(t *testing.T) {
	need(t, "qemu-storage-daemon", "qemu-img", "qemu-system-x86_64", "mkfs.ext4")
	dir, err := os.MkdirTemp("", "hbvu")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	key := newKey()
	vol, other := filepath.Join(dir, "vol.qcow2"), filepath.Join(dir, "other.qcow2")
	if err := (&voldisk.Maker{}).Create(ctx, vol, 32<<20, key, layout.VolumeUUID("v1")); err != nil {
		t.Fatal(err)
	}
	if err := (&voldisk.Maker{}).Create(ctx, other, 32<<20, key, ""); err != nil {
		t.Fatal(err)
	}
	srv, err := vhostblk.Start(ctx, vhostblk.Options{Dir: filepath.Join(dir, "d"), Disks: []vhostblk.Disk{{Path: other, Format: "qcow2", Encrypted: true}}, DataKey: key})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(ctx)
	sock, err := srv.AddVolume(ctx, hypervisor.Volume{ID: "v1", Path: vol, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "g"), 0o700); err != nil {
		t.Fatal(err)
	}
	// (The other volume first: vda, tried first and passed over.)
	g := frontend(t, filepath.Join(dir, "g"), []string{srv.Sockets[0], sock})
	if err := g.MountVolume(ctx, "v1", "/mnt/v", false, "root"); err != nil {
		t.Fatal("mount by the filesystem's UUID:", err)
	}
	if got := guest(t, g, `echo found > /mnt/v/f && sync && cat /mnt/v/f && grep -c ' /mnt/v ' /proc/mounts && readlink -f /sys/block/vdb/device >/dev/null && grep '^/dev/vdb ' /proc/mounts | cut -d' ' -f2`); got != "found\n1\n/mnt/v\n" {
		t.Errorf("in the guest: %q, want the volume (vdb) mounted at /mnt/v", got)
	}
	if err := g.UnmountVolume(ctx, "/mnt/v"); err != nil {
		t.Fatal(err)
	}
	if err := srv.RemoveVolume(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
}

// TestStartRefuses: what cannot be served is refused before a daemon
// starts, with the reason.
func TestStartRefuses(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	qcow := vhostblk.Disk{Path: "/x.qcow2", Format: "qcow2", Encrypted: true}
	for name, o := range map[string]vhostblk.Options{
		"no disks":                {Dir: dir},
		"no data key":             {Dir: dir, Disks: []vhostblk.Disk{qcow}},
		"short data key":          {Dir: dir, Disks: []vhostblk.Disk{qcow}, DataKey: []byte("short")},
		"no backing key":          {Dir: dir, Disks: []vhostblk.Disk{{Path: "/x", Format: "qcow2", Backing: "/b", BackingFormat: "qcow2", BackingEncrypted: true}}},
		"encrypted raw":           {Dir: dir, Disks: []vhostblk.Disk{{Path: "/x", Format: "raw", Encrypted: true}}, DataKey: newKey()},
		"unknown format":          {Dir: dir, Disks: []vhostblk.Disk{{Path: "/x", Format: "vmdk"}}},
		"raw with a backing file": {Dir: dir, Disks: []vhostblk.Disk{{Path: "/x", Format: "raw", Backing: "/b"}}},
		"encrypted raw backing":   {Dir: dir, Disks: []vhostblk.Disk{{Path: "/x", Format: "qcow2", Backing: "/b", BackingFormat: "raw", BackingEncrypted: true}}, BackingKey: newKey()},
		"socket path too long":    {Dir: filepath.Join(dir, strings.Repeat("d", 100)), Disks: []vhostblk.Disk{{Path: "/x", Format: "raw"}}},
	} {
		if s, err := vhostblk.Start(ctx, o); !errors.Is(err, hypervisor.ErrInvalid) {
			t.Errorf("%s: %+v %v", name, s, err)
		}
	}
}
