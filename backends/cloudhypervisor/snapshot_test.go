package cloudhypervisor

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/overlay"
	"github.com/harebox/harebox/hypervisor/qmp"
	"github.com/harebox/harebox/hypervisor/vhostblk"
)

// TestEncryptedSnapshot: an encrypted machine's snapshot is sealed. The
// stub guest's memory canary is in no file under the test's directory
// (a plain snapshot shows it, which proves the search), and the disk copy
// is an overlay under the snapshot's key that the disk's key does not
// open. A restore with a wrong key, or without keys, is refused before
// anything starts. With the right keys the clone's VMM gets the memory
// back byte for byte (the stub compares), and its disk is its own overlay
// under its own key over the plain base, served by its own daemon, which
// no longer opens the snapshot's copy: the snapshot can be deleted, and
// the clone is snapshotted and restored in turn. No tmpfs stays mounted.
func TestEncryptedSnapshot(t *testing.T) {
	for _, bin := range []string{"qemu-img", "qemu-io", "qemu-storage-daemon"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	b := stubBackend(t)
	// (Many steps, each with real qemu-img and daemons: more than
	// testCtx's 20 s on a busy host.)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	files := newTestFiles(t)
	newKey := func() []byte {
		k := make([]byte, hypervisor.KeySize)
		rand.Read(k)
		return k
	}
	canary := []byte(strings.TrimSpace(stubMemoryLine))
	// plainCanaries lists the files under the test's directory that hold
	// the stub guest's memory in plain text.
	plainCanaries := func() []string {
		var found []string
		filepath.Walk(files.dir, func(path string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				if b, _ := os.ReadFile(path); bytes.Contains(b, canary) {
					found = append(found, path)
				}
			}
			return nil
		})
		return found
	}

	// A plain machine's snapshot holds the canary: the search works.
	plain, err := b.Launch(ctx, files.spec("plain", true))
	if err != nil {
		t.Fatal(err)
	}
	reap(t, plain)
	if err := plain.Snapshot(ctx, filepath.Join(files.dir, "plainsnap"), newKey()); !errors.Is(err, hypervisor.ErrInvalid) {
		t.Errorf("a plain machine snapshotted under a key: %v", err)
	}
	if err := plain.Snapshot(ctx, filepath.Join(files.dir, "plainsnap"), nil); err != nil {
		t.Fatal(err)
	}
	if found := plainCanaries(); len(found) != 1 || filepath.Base(found[0]) != "memory-ranges" {
		t.Fatalf("the plain snapshot's memory canary is found in %v", found)
	}
	if err := os.RemoveAll(filepath.Join(files.dir, "plainsnap")); err != nil {
		t.Fatal(err)
	}

	key, snapKey := newKey(), newKey()
	spec := files.spec("enc", true)
	spec.DataKey = key
	first, err := b.Launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	// The guest's writes, stood in for by a pattern written into the
	// overlay while the machine is down; the machine then runs on it
	// again (Reuse).
	if err := first.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := qemuIO(filepath.Join(spec.StateDir, "disk-0.qcow2"), key, "write -P 0x5a 64k 4k"); err != nil {
		t.Fatal(err)
	}
	spec.Reuse = true
	m, err := b.Launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	reap(t, m)
	snap := filepath.Join(files.dir, "snap")
	if err := m.Snapshot(ctx, snap, nil); !errors.Is(err, hypervisor.ErrInvalid) {
		t.Errorf("an encrypted machine snapshotted without a key: %v", err)
	}
	if err := m.Snapshot(ctx, snap, snapKey); err != nil {
		t.Fatal(err)
	}
	wantState(t, m, hypervisor.StatePaused)
	if found := plainCanaries(); len(found) != 0 {
		t.Errorf("the encrypted machine's memory is in plain text in %v", found)
	}
	for _, name := range []string{"memory-ranges", "state.json", "config.json"} {
		if _, err := os.Stat(filepath.Join(snap, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the snapshot holds %s unsealed: %v", name, err)
		}
		if _, err := os.Stat(filepath.Join(snap, name+sealedExt)); err != nil {
			t.Errorf("the snapshot lacks %s sealed: %v", name, err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(spec.StateDir, stagePrefix+"*")); len(left) > 0 {
		t.Errorf("staging left behind: %v", left)
	}
	snapDisk := filepath.Join(snap, "disk-0.qcow2")
	if info := imageInfo(t, snapDisk); !info.Encrypted || info.Backing != files.base {
		t.Errorf("the snapshot's disk copy: %+v", info)
	}
	if err := opensWith(snapDisk, snapKey); err != nil {
		t.Errorf("the snapshot's key does not open its disk copy: %v", err)
	}
	if err := opensWith(snapDisk, key); err == nil {
		t.Error("the machine's key opens the snapshot's disk copy")
	}
	if err := qemuIO(snapDisk, snapKey, "read -P 0x5a 64k 4k"); err != nil {
		t.Errorf("the snapshot's disk copy lacks the guest's writes: %v", err)
	}
	// The plain metadata names no file; the sealed one is believed, and a
	// sealed one that was altered is refused.
	if plainMeta, _ := os.ReadFile(filepath.Join(snap, snapshotMetaName)); len(plainMeta) == 0 || bytes.Contains(plainMeta, []byte(files.dir)) {
		t.Errorf("the plain metadata of an encrypted snapshot: %s", plainMeta)
	}
	if err := m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	sealedMeta := filepath.Join(snap, snapshotMetaName+sealedExt)
	good, err := os.ReadFile(sealedMeta)
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(good)
	bad[len(bad)-5] ^= 1
	os.WriteFile(sealedMeta, bad, 0o600)
	tspec := hypervisor.Spec{ID: "tampered", StateDir: filepath.Join(files.dir, "tampered"), DataKey: newKey(), SnapshotKey: snapKey,
		Network: &hypervisor.Network{Tap: "hbx-tampered", MAC: "52:54:00:00:00:05"}}
	if c, err := b.Restore(ctx, snap, tspec); !errors.Is(err, hypervisor.ErrInvalid) {
		if c != nil {
			reap(t, c)
		}
		t.Errorf("restore with altered metadata: %v", err)
	}
	os.WriteFile(sealedMeta, good, 0o600)

	// Refused before anything starts: no state dir is made.
	cspec := hypervisor.Spec{ID: "clone", StateDir: filepath.Join(files.dir, "clone"),
		Network: &hypervisor.Network{Tap: "hbx-clone", MAC: "52:54:00:00:00:02"}}
	for name, keys := range map[string][2][]byte{
		"a wrong key":     {newKey(), newKey()},
		"no snapshot key": {newKey(), nil},
		"no data key":     {nil, snapKey},
	} {
		s := cspec
		s.DataKey, s.SnapshotKey = keys[0], keys[1]
		if c, err := b.Restore(ctx, snap, s); !errors.Is(err, hypervisor.ErrInvalid) {
			if c != nil {
				reap(t, c)
			}
			t.Errorf("restore with %s: %v", name, err)
		}
		if _, err := os.Stat(cspec.StateDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("restore with %s left %s: %v", name, cspec.StateDir, err)
		}
	}

	cloneKey := newKey()
	cspec.DataKey, cspec.SnapshotKey = cloneKey, snapKey
	clone, err := b.Restore(ctx, snap, cspec)
	if err != nil {
		t.Fatal(err)
	}
	reap(t, clone)
	wantState(t, clone, hypervisor.StateRunning)
	echoThrough(t, clone.AgentEndpoint())
	cinfo, err := clone.(*machine).api.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	csrv, err := vhostblk.Find(filepath.Join(cspec.StateDir, blockDirName))
	if err != nil {
		t.Fatal(err)
	}
	if d := cinfo.Config.Disks[0]; !d.VhostUser || d.VhostSocket != csrv.Sockets[0] {
		t.Fatalf("the clone's disk: %+v, its daemon %+v", d, csrv)
	}
	nodes, err := qmp.Run(ctx, filepath.Join(csrv.Dir, "qmp.sock"), "query-named-block-nodes", nil)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(nodes, []byte(snap)) {
		t.Errorf("the clone's daemon still opens the snapshot: %s", nodes)
	}
	cdisk := filepath.Join(cspec.StateDir, "disk-0.qcow2")
	if info := imageInfo(t, cdisk); !info.Encrypted || info.Backing != files.base {
		t.Errorf("the clone's disk: %+v", info)
	}
	if err := opensWith(cdisk, cloneKey); err != nil {
		t.Errorf("the clone's key does not open its disk: %v", err)
	}
	if err := os.RemoveAll(snap); err != nil {
		t.Fatal(err)
	}
	if found := plainCanaries(); len(found) != 0 {
		t.Errorf("after the restore the memory is in plain text in %v", found)
	}

	// The clone, on its own now, is snapshotted and restored in turn.
	snap2, snapKey2 := filepath.Join(files.dir, "snap2"), newKey()
	if err := clone.Snapshot(ctx, snap2, snapKey2); err != nil {
		t.Fatal(err)
	}
	c2spec := hypervisor.Spec{ID: "clone2", StateDir: filepath.Join(files.dir, "clone2"), DataKey: newKey(), SnapshotKey: snapKey2,
		Network: &hypervisor.Network{Tap: "hbx-clone2", MAC: "52:54:00:00:00:03"}}
	clone2, err := b.Restore(ctx, snap2, c2spec)
	if err != nil {
		t.Fatal(err)
	}
	reap(t, clone2)
	wantState(t, clone2, hypervisor.StateRunning)

	// A snapshot that fails half-way (the source's daemon is gone) leaves
	// no snapshot dir, no staging and no mount.
	srv, err := vhostblk.Find(filepath.Join(spec.StateDir, blockDirName))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	failed := filepath.Join(files.dir, "failed")
	if err := m.Snapshot(ctx, failed, newKey()); err == nil {
		t.Error("a snapshot without the storage daemon worked")
	}
	if _, err := os.Stat(failed); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed snapshot left its dir: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(spec.StateDir, stagePrefix+"*")); len(left) > 0 {
		t.Errorf("a failed snapshot left staging: %v", left)
	}

	// Each clone's own overlay, under its own key alone, holds the
	// guest's writes (streamed in from the snapshot, which is gone).
	for _, c := range []struct {
		m   hypervisor.Machine
		key []byte
	}{{m, nil}, {clone, cloneKey}, {clone2, c2spec.DataKey}} {
		if err := c.m.Kill(ctx); err != nil {
			t.Fatal(err)
		}
		if c.key != nil {
			ov := filepath.Join(c.m.(*machine).data.StateDir, "disk-0.qcow2")
			if err := qemuIO(ov, c.key, "read -P 0x5a 64k 4k"); err != nil {
				t.Errorf("%s's disk lacks the guest's writes: %v", c.m.ID(), err)
			}
		}
		if err := c.m.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// A machine with a key but no disk to serve (an image whose root is
	// in memory): its snapshot is sealed all the same, and restores.
	nspec := files.spec("nodisk", false)
	nspec.DataKey = newKey()
	nd, err := b.Launch(ctx, nspec)
	if err != nil {
		t.Fatal(err)
	}
	reap(t, nd)
	nsnap, nkey := filepath.Join(files.dir, "nsnap"), newKey()
	if err := nd.Snapshot(ctx, nsnap, nil); !errors.Is(err, hypervisor.ErrInvalid) {
		t.Errorf("a diskless encrypted machine snapshotted without a key: %v", err)
	}
	if err := nd.Snapshot(ctx, nsnap, nkey); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(nsnap, "memory-ranges"+sealedExt)); err != nil {
		t.Errorf("the diskless machine's memory is not sealed: %v", err)
	}
	nc, err := b.Restore(ctx, nsnap, hypervisor.Spec{ID: "nclone", StateDir: filepath.Join(files.dir, "nclone"), DataKey: newKey(), SnapshotKey: nkey,
		Network: &hypervisor.Network{Tap: "hbx-nclone", MAC: "52:54:00:00:00:04"}})
	if err != nil {
		t.Fatal(err)
	}
	reap(t, nc)
	wantState(t, nc, hypervisor.StateRunning)
	if found := plainCanaries(); len(found) != 0 {
		t.Errorf("the memory is in plain text in %v", found)
	}
	for _, c := range []hypervisor.Machine{nd, nc} {
		c.Kill(ctx)
		if err := c.Cleanup(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); bytes.Contains(mounts, []byte(files.dir)) {
		t.Errorf("mounts left under %s:\n%s", files.dir, mounts)
	}
}

type diskInfo struct {
	Encrypted bool   `json:"encrypted"`
	Backing   string `json:"backing-filename"`
}

func imageInfo(t *testing.T, path string) diskInfo {
	t.Helper()
	out, err := exec.Command("qemu-img", "info", "-U", "--output=json", path).Output()
	var info diskInfo
	if err != nil || json.Unmarshal(out, &info) != nil {
		t.Fatalf("qemu-img info %s: %v %s", path, err, out)
	}
	return info
}

// opensWith reads the encrypted qcow2 at path (over its plain backing
// file) with key.
func opensWith(path string, key []byte) error {
	var sec overlay.Secrets
	defer sec.Close()
	if err := sec.Add("k", key); err != nil {
		return err
	}
	out := path + ".read"
	defer os.Remove(out)
	args := append([]string{"convert"}, sec.Args()...)
	args = append(args, "-U", "--image-opts", "driver=qcow2,file.filename="+path+",encrypt.key-secret=k", "-O", "raw", out)
	cmd := exec.Command("qemu-img", args...)
	sec.Apply(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		return errors.New(strings.TrimSpace(string(out)))
	}
	return nil
}

// TestReuse: a machine launched again with Reuse (stop and start) runs on
// the overlay its last launch left, as it was (a pattern written into it
// while the machine was down is still there), encrypted ones served by a
// new daemon under the same key. Without an overlay it is ErrNotFound; a
// wrong key fails; neither failure removes the disk it came for.
func TestReuse(t *testing.T) {
	for _, bin := range []string{"qemu-img", "qemu-io", "qemu-storage-daemon"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s is not installed", bin)
		}
	}
	b := stubBackend(t)
	ctx := testCtx(t)
	files := newTestFiles(t)
	key := make([]byte, hypervisor.KeySize)
	rand.Read(key)
	for _, k := range [][]byte{nil, key} {
		name := map[bool]string{false: "plain", true: "encrypted"}[k != nil]
		t.Run(name, func(t *testing.T) {
			spec := files.spec(name, true)
			spec.DataKey = k
			m, err := b.Launch(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			ov := filepath.Join(spec.StateDir, "disk-0.qcow2")
			if err := qemuIO(ov, k, "write -P 0x5a 0 4k"); err != nil {
				t.Fatal(err)
			}
			if k != nil {
				bad := spec
				bad.Reuse, bad.DataKey = true, make([]byte, hypervisor.KeySize)
				if m, err := b.Launch(ctx, bad); err == nil {
					reap(t, m)
					t.Fatal("a launch again under another key worked")
				}
			}
			spec.Reuse = true
			again, err := b.Launch(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			reap(t, again)
			wantState(t, again, hypervisor.StateRunning)
			info, err := again.(*machine).api.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if d := info.Config.Disks[0]; d.VhostUser != (k != nil) || (k == nil && d.Path != ov) {
				t.Errorf("the disk launched again: %+v", d)
			}
			if err := again.Kill(ctx); err != nil {
				t.Fatal(err)
			}
			if err := qemuIO(ov, k, "read -P 0x5a 0 4k"); err != nil {
				t.Errorf("the overlay was not the one left: %v", err)
			}
			if err := again.Cleanup(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Launch(ctx, spec); !errors.Is(err, hypervisor.ErrNotFound) {
				t.Errorf("a launch again without its overlay: %v", err)
			}
		})
	}
}

// qemuIO runs one qemu-io command on the qcow2 at path (over its plain
// backing file), opened with key if it is encrypted.
func qemuIO(path string, key []byte, cmd string) error {
	var sec overlay.Secrets
	defer sec.Close()
	args := []string{"-c", cmd}
	opts := "driver=qcow2,file.filename=" + path
	if key != nil {
		if err := sec.Add("k", key); err != nil {
			return err
		}
		args = append(args, sec.Args()...)
		opts += ",encrypt.key-secret=k"
	}
	c := exec.Command("qemu-io", append(args, "--image-opts", opts)...)
	sec.Apply(c)
	out, err := c.CombinedOutput()
	if err != nil || bytes.Contains(out, []byte("fail")) || bytes.Contains(out, []byte("rror")) {
		return fmt.Errorf("qemu-io %q: %v %s", cmd, err, out)
	}
	return nil
}

// TestStaleStageRemoved: a snapshot's tmpfs that a killed process left
// mounted (plain guest memory) is removed when the machine is attached
// again, and when the state dir is launched in again.
func TestStaleStageRemoved(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	b := stubBackend(t)
	ctx := testCtx(t)
	files := newTestFiles(t)
	spec := files.spec("stage", false)
	m, err := b.Launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	reap(t, m)
	leave := func() string {
		t.Helper()
		stage, err := os.MkdirTemp(spec.StateDir, stagePrefix)
		if err != nil {
			t.Fatal(err)
		}
		if err := mountStage(stage, 1<<20); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(stage, "memory-ranges"), []byte(stubMemoryLine), 0o600); err != nil {
			t.Fatal(err)
		}
		return stage
	}
	mounted := func(dir string) bool {
		b, _ := os.ReadFile("/proc/self/mountinfo")
		return bytes.Contains(b, []byte(" "+dir+" "))
	}
	stage := leave()
	again, err := New(b.cfg).Attach(ctx, m.Handle())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stage); !errors.Is(err, os.ErrNotExist) || mounted(stage) {
		t.Errorf("after Attach the stale stage is there (%v) or mounted (%v)", err, mounted(stage))
	}
	if err := again.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	stage = leave()
	spec.Reuse = true
	relaunched, err := b.Launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	reap(t, relaunched)
	if _, err := os.Stat(stage); !errors.Is(err, os.ErrNotExist) || mounted(stage) {
		t.Errorf("after a launch again the stale stage is there (%v) or mounted (%v)", err, mounted(stage))
	}
	// A VMM that died with its stage mounted: the Attach that finds it
	// gone removes the stage.
	stage = leave()
	if err := relaunched.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := New(b.cfg).Attach(ctx, relaunched.Handle()); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("attach of a dead VMM: %v", err)
	}
	if _, err := os.Stat(stage); !errors.Is(err, os.ErrNotExist) || mounted(stage) {
		t.Errorf("after the Attach of a dead VMM the stale stage is there (%v) or mounted (%v)", err, mounted(stage))
	}
}
