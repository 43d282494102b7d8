package hypervisortest

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/voldisk"
)

// testVolumes plugs a volume into a running machine, writable, then
// read-only: the guest mounts it, what it wrote is there again, a
// read-only one refuses writes, the file on the host holds nothing in
// plain text, a wrong key is refused, and a machine with a volume
// plugged in takes no snapshot. While the writer runs, its writes move
// to a new layer (LayerVolume, the guest's filesystem frozen meanwhile)
// and the file under it is plugged in again read-only: a reader of the
// volume as it was, beside the writer.
func testVolumes(t *testing.T, h Harness) {
	ctx := context.Background()
	hv := h.New(t)
	caps, err := hv.Capabilities(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !caps.Volumes {
		t.Skip("the backend does not report volumes")
	}
	base := baseDir(t)
	key := newKey()
	file := filepath.Join(base, "vol.qcow2")
	if err := (&voldisk.Maker{}).Create(ctx, file, 64<<20, key, layout.VolumeUUID("v1")); err != nil {
		t.Fatal(err)
	}
	spec := h.Spec(t)
	spec.ID = "vol-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	spec.StateDir = filepath.Join(base, "m")
	if caps.Encryption {
		spec.DataKey = newKey()
	}
	start := time.Now()
	m, err := hv.Launch(ctx, spec)
	if err != nil {
		t.Fatal("launch:", err)
	}
	v := &vm{m: m, spec: spec}
	defer forget(t, v)
	connect(t, h, v, start)

	vol := hypervisor.Volume{ID: "v1", Path: file, Key: key}
	// (A fake opens no file: it cannot tell a wrong key.)
	if !h.FakeGuest {
		if err := m.PlugVolume(ctx, hypervisor.Volume{ID: "v1", Path: file, Key: newKey()}); !errors.Is(err, hypervisor.ErrInvalid) {
			t.Fatalf("plug with a wrong key: %v, want ErrInvalid", err)
		}
	}
	if err := m.PlugVolume(ctx, hypervisor.Volume{ID: "Bad,ID", Path: file, Key: key}); !errors.Is(err, hypervisor.ErrInvalid) {
		t.Fatalf("plug with a bad ID: %v, want ErrInvalid", err)
	}
	if err := m.PlugVolume(ctx, vol); err != nil {
		t.Fatal("plug:", err)
	}
	if err := m.PlugVolume(ctx, vol); !errors.Is(err, hypervisor.ErrExists) {
		t.Fatalf("plug twice: %v, want ErrExists", err)
	}
	if err := v.agent.MountVolume(ctx, "v1", "/mnt/vol", false, "root"); err != nil {
		t.Fatal("mount:", err)
	}
	canary := []byte("volume-canary-" + strconv.FormatInt(time.Now().UnixNano(), 36))
	writeFile(t, v, "/mnt/vol/canary", canary)
	if !h.FakeGuest {
		run(t, v, "sync")
	}
	if err := m.Snapshot(ctx, filepath.Join(base, "snap"), spec.DataKey); !errors.Is(err, hypervisor.ErrState) {
		t.Errorf("snapshot with a volume plugged in: %v, want ErrState", err)
	}
	wantState(t, m, hypervisor.StateRunning)

	layer := filepath.Join(base, "vol.1.qcow2")
	if err := voldisk.Layer(ctx, voldisk.Tools{}, file, layer, key); err != nil {
		t.Fatal(err)
	}
	if err := m.LayerVolume(ctx, "v2", layer); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Fatalf("layer a volume not plugged: %v, want ErrNotFound", err)
	}
	if err := v.agent.FreezeVolume(ctx, "/mnt/vol", 10*time.Second); err != nil {
		t.Fatal("freeze:", err)
	}
	if err := m.LayerVolume(ctx, "v1", layer); err != nil {
		t.Fatal("layer:", err)
	}
	if err := m.LayerVolume(ctx, "v1", layer); err != nil {
		t.Fatal("layer again onto the same file:", err)
	}
	if err := v.agent.ThawVolume(ctx, "/mnt/vol"); err != nil {
		t.Fatal("thaw:", err)
	}
	after := []byte("written-after-the-layer")
	writeFile(t, v, "/mnt/vol/after", after)
	if !h.NoSerials {
		// The first file, which the writer no longer writes, plugged in again
		// read-only beside it.
		reader := hypervisor.Volume{ID: "v1r", Path: file, Key: key, ReadOnly: true}
		if err := m.PlugVolume(ctx, reader); err != nil {
			t.Fatal("plug the layer under a writer read-only:", err)
		}
		if err := v.agent.MountVolume(ctx, "v1r", "/mnt/was", true, ""); err != nil {
			t.Fatal("mount the layer under a writer:", err)
		}
		if err := m.LayerVolume(ctx, "v1r", filepath.Join(base, "nope.qcow2")); !errors.Is(err, hypervisor.ErrInvalid) {
			t.Fatalf("layer a read-only volume: %v, want ErrInvalid", err)
		}
		if !h.FakeGuest {
			if got := readFile(t, v, "/mnt/was/canary"); !bytes.Equal(got, canary) {
				t.Errorf("the reader beside the writer read %q, want %q", got, canary)
			}
			if r := run(t, v, "test -e /mnt/was/after"); r.ExitCode == 0 {
				t.Error("the reader beside the writer sees what the writer wrote after the layer")
			}
		}
		if err := v.agent.UnmountVolume(ctx, "/mnt/was"); err != nil {
			t.Fatal("unmount:", err)
		}
		if err := m.UnplugVolume(ctx, "v1r"); err != nil {
			t.Fatal("unplug:", err)
		}
	}

	if err := v.agent.UnmountVolume(ctx, "/mnt/vol"); err != nil {
		t.Fatal("unmount:", err)
	}
	if err := m.UnplugVolume(ctx, "v1"); err != nil {
		t.Fatal("unplug:", err)
	}
	if err := m.UnplugVolume(ctx, "v1"); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Fatalf("unplug twice: %v, want ErrNotFound", err)
	}
	if found := FilesContaining(t, base, canary); len(found) > 0 {
		t.Errorf("the canary is in plain text in %v", found)
	}
	if h.FakeGuest {
		return // the fake keeps no content across mounts
	}

	vol.ReadOnly, vol.Path, vol.Backing = true, layer, []string{file}
	if err := m.PlugVolume(ctx, vol); err != nil {
		t.Fatal("plug read-only:", err)
	}
	if err := v.agent.MountVolume(ctx, "v1", "/mnt/ro", true, ""); err != nil {
		t.Fatal("mount read-only:", err)
	}
	if got := readFile(t, v, "/mnt/ro/canary"); !bytes.Equal(got, canary) {
		t.Errorf("read back %q, want %q", got, canary)
	}
	if got := readFile(t, v, "/mnt/ro/after"); !bytes.Equal(got, after) {
		t.Errorf("read back %q from the layer, want %q", got, after)
	}
	if r := run(t, v, "echo x > /mnt/ro/new"); r.ExitCode == 0 || !strings.Contains(string(r.Stderr), "Read-only") {
		t.Errorf("a write to a read-only volume: exit %d, %q; want Read-only file system", r.ExitCode, r.Stderr)
	}
	if err := v.agent.UnmountVolume(ctx, "/mnt/ro"); err != nil {
		t.Fatal("unmount:", err)
	}
	if err := m.UnplugVolume(ctx, "v1"); err != nil {
		t.Fatal("unplug:", err)
	}
}
