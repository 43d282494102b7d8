package harebox_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/hypervisor/voldisk"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/volume"
)

func needVolumeTools(t *testing.T) {
	t.Helper()
	if err := (voldisk.Tools{}).Check(); err != nil {
		t.Skip(err)
	}
}

func wantSaying(t *testing.T, what string, err, kind error, say string) {
	t.Helper()
	if !errors.Is(err, kind) || !strings.Contains(err.Error(), say) {
		t.Errorf("%s: %v; want %v saying %q", what, err, kind, say)
	}
}

// layerOf is the layer sandbox id has of volume v (-1: none).
func layerOf(v *volume.View, id string) int {
	for _, a := range v.Attachments {
		if a.SandboxID == id {
			return a.Layer
		}
	}
	return -1
}

// TestVolumeAttachments, on the in-memory hypervisor: one writer and
// many readers, claimed at create and given back at delete; a reader
// beside a running or stopped writer takes the layer it wrote, and the
// writer a new one (readers that come at once share it), a paused one
// takes none; a volume in use is neither deleted nor resized; an
// unknown one is not found.
func TestVolumeAttachments(t *testing.T) {
	t.Parallel()
	needVolumeTools(t)
	eng, _ := memhvEngine(t, nil)
	ctx := context.Background()
	v, err := eng.Volumes().Create(ctx, "", volume.CreateRequest{Name: "data", SizeGB: 1})
	if err != nil {
		t.Fatal(err)
	}
	rw := []sandbox.VolumeMount{{Name: "data", Path: "/mnt/data"}}
	ro := []sandbox.VolumeMount{{Name: "data", Path: "/mnt/data", ReadOnly: true}}
	w, err := eng.Create(ctx, sandbox.CreateRequest{Volumes: rw})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Volumes) != 1 {
		t.Errorf("the writer's volumes: %+v", w.Volumes)
	}
	_, err = eng.Create(ctx, sandbox.CreateRequest{Volumes: rw})
	wantSaying(t, "a second writer", err, sandbox.ErrState, w.ID)
	r0, err := eng.Create(ctx, sandbox.CreateRequest{Volumes: ro})
	if err != nil {
		t.Fatal("a reader beside a running writer:", err)
	}
	if got, _ := eng.Volumes().Get(ctx, "", "", "data"); got.Layers != 1 || got.Busy != "" || layerOf(got, w.ID) != 1 || layerOf(got, r0.ID) != 0 {
		t.Errorf("a reader beside a running writer: %+v", got.Volume)
	}
	// Readers at once: each gets a layer the writer left.
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := eng.Create(ctx, sandbox.CreateRequest{Volumes: ro})
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Error("readers at once beside a writer:", err)
		}
	}
	got, err := eng.Volumes().Get(ctx, "", "", "data")
	if err != nil || got.Busy != "" || len(got.Attachments) != 5 || layerOf(got, w.ID) != got.Layers || got.Layers < 2 || got.Layers > 4 {
		t.Fatalf("readers at once beside a writer: %+v, %v", got, err)
	}
	for _, a := range got.Attachments {
		if a.ReadOnly && a.Layer >= got.Layers {
			t.Errorf("a reader on the writer's layer: %+v", got.Attachments)
		}
	}
	if _, err := eng.Pause(ctx, w.ID); err != nil {
		t.Fatal(err)
	}
	_, err = eng.Create(ctx, sandbox.CreateRequest{Volumes: ro})
	wantSaying(t, "a reader beside a paused writer", err, sandbox.ErrState, "paused")
	if _, err := eng.Resume(ctx, w.ID); err != nil {
		t.Fatal(err)
	}
	for _, a := range got.Attachments {
		if a.ReadOnly {
			if err := eng.Delete(ctx, a.SandboxID); err != nil {
				t.Fatal(err)
			}
		}
	}
	wantSaying(t, "delete in use", eng.Volumes().Delete(ctx, "", "", "data"), sandbox.ErrState, "attached")
	_, err = eng.Volumes().Resize(ctx, "", "", "data", 2)
	wantSaying(t, "resize in use", err, sandbox.ErrState, "attached")
	_, err = eng.Create(ctx, sandbox.CreateRequest{Volumes: []sandbox.VolumeMount{{Name: "nope", Path: "/mnt/x"}}})
	wantSaying(t, "an unknown volume", err, sandbox.ErrNotFound, "no volume")
	_, err = eng.Create(ctx, sandbox.CreateRequest{Volumes: []sandbox.VolumeMount{{Name: "data", Path: "/mnt/a", ReadOnly: true}, {Name: "data", Path: "/mnt/b", ReadOnly: true}}})
	wantSaying(t, "the same volume twice", err, sandbox.ErrInvalid, "twice")
	for _, p := range []string{"/etc", "/usr/local/data", "/", "/mnt/../etc"} {
		_, err = eng.Create(ctx, sandbox.CreateRequest{Volumes: []sandbox.VolumeMount{{Name: "data", Path: p, ReadOnly: true}}})
		wantSaying(t, "a volume at "+p, err, sandbox.ErrInvalid, "system's own trees")
	}
	if err := eng.Delete(ctx, w.ID); err != nil {
		t.Fatal(err)
	}
	var readers []string
	for range 3 {
		r, err := eng.Create(ctx, sandbox.CreateRequest{Volumes: ro})
		if err != nil {
			t.Fatal("a reader:", err)
		}
		readers = append(readers, r.ID)
	}
	got, err = eng.Volumes().Get(ctx, "", "", v.ID)
	if err != nil || len(got.Attachments) != 3 || got.Layers != 0 {
		t.Fatalf("attachments of three readers: %+v, %v", got, err)
	}
	// A writer beside the readers writes to a layer of its own.
	w2, err := eng.Create(ctx, sandbox.CreateRequest{Volumes: rw})
	if err != nil {
		t.Fatal("a writer beside readers:", err)
	}
	if got, _ := eng.Volumes().Get(ctx, "", "", "data"); got.Layers != 1 || got.Attachments[3].Layer != 1 || got.Attachments[0].Layer != 0 {
		t.Errorf("layers with a writer beside readers: %+v", got.Volume)
	}
	// A reader beside a stopped writer: the writer opens its new layer
	// when it starts.
	if _, err := eng.Stop(ctx, w2.ID); err != nil {
		t.Fatal(err)
	}
	r3, err := eng.Create(ctx, sandbox.CreateRequest{Volumes: ro})
	if err != nil {
		t.Fatal("a reader beside a stopped writer:", err)
	}
	if got, _ := eng.Volumes().Get(ctx, "", "", "data"); got.Layers != 2 || layerOf(got, w2.ID) != 2 || layerOf(got, r3.ID) != 1 {
		t.Errorf("a reader beside a stopped writer: %+v", got.Volume)
	}
	if _, err := eng.Start(ctx, w2.ID); err != nil {
		t.Fatal("the writer starts on its new layer:", err)
	}
	if err := eng.Delete(ctx, w2.ID); err != nil {
		t.Fatal(err)
	}
	// A reader after it sees what it wrote (its layer).
	r4, err := eng.Create(ctx, sandbox.CreateRequest{Volumes: ro})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := eng.Volumes().Get(ctx, "", "", "data"); layerOf(got, r4.ID) != 2 {
		t.Errorf("a reader after the writer: %+v", got.Attachments)
	}
	for _, id := range append(readers, r3.ID, r4.ID) {
		if err := eng.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	// Nothing holds it: its layers are folded into its first file.
	if got, _ := eng.Volumes().Get(ctx, "", "", "data"); len(got.Attachments) != 0 || got.Layers != 0 || got.Busy != "" {
		t.Errorf("after the deletes: %+v", got.Volume)
	}
	if err := eng.Volumes().Delete(ctx, "", "", "data"); err != nil {
		t.Fatal(err)
	}
}

// TestVolumeLayeringCut, on the in-memory hypervisor: the engine dies
// while a reader's create moves a running writer onto a new layer,
// before the move and after it. After a restart the volume is not busy,
// the cut reader holds nothing (its record named its volumes from its
// admission on: it did not before, and a create cut short anywhere
// before its box was made kept its volumes attached), the writer runs with its record a layer
// ahead of its machine or on it (an empty layer: either is the same
// volume), and the next reader beside it attaches and moves it again.
func TestVolumeLayeringCut(t *testing.T) {
	needVolumeTools(t)
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	ctx := context.Background()
	defer harebox.SetStepHook(nil)
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	v, err := eng.Volumes().Create(ctx, "", volume.CreateRequest{Name: "data", SizeGB: 1})
	if err != nil {
		t.Fatal(err)
	}
	w, err := eng.Create(ctx, sandbox.CreateRequest{Volumes: []sandbox.VolumeMount{{Name: "data", Path: "/mnt/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	ro := []sandbox.VolumeMount{{Name: "data", Path: "/mnt/data", ReadOnly: true}}
	top := func() string {
		t.Helper()
		hvv, ok := hv.Volume(w.ID, volume.Serial(v.ID))
		if !ok {
			t.Fatal("the writer has no volume plugged in")
		}
		return filepath.Base(hvv.Path)
	}
	for i, step := range []string{"layers-claimed", "layers-moved"} {
		before := top()
		harebox.SetStepHook(func(s, id string) {
			if s == step && id == w.ID {
				runtime.Goexit() // (the engine dies here)
			}
		})
		done := make(chan struct{})
		go func() { defer close(done); eng.Create(ctx, sandbox.CreateRequest{Volumes: ro}) }()
		<-done
		harebox.SetStepHook(nil)
		eng.Close()
		if eng, err = harebox.New(ctx, opts); err != nil {
			t.Fatal(err)
		}
		got, err := eng.Volumes().Get(ctx, "", "", "data")
		if err != nil {
			t.Fatal(err)
		}
		if got.Busy != "" || len(got.Attachments) != 1 || layerOf(got, w.ID) != 2*i+1 {
			t.Errorf("%s: after the restart: %+v", step, got.Volume)
		}
		if moved := top() != before; moved != (step == "layers-moved") {
			t.Errorf("%s: the writer's machine writes %s (before: %s)", step, top(), before)
		}
		if st := state(t, eng, w.ID); st != sandbox.StateRunning {
			t.Errorf("%s: the writer is %s", step, st)
		}
		r, err := eng.Create(ctx, sandbox.CreateRequest{Volumes: ro})
		if err != nil {
			t.Fatalf("%s: a reader after the restart: %v", step, err)
		}
		got, _ = eng.Volumes().Get(ctx, "", "", "data")
		if want := fmt.Sprintf("%s.%d.qcow2", v.ID, got.Layers); top() != want || layerOf(got, r.ID) != got.Layers-1 {
			t.Errorf("%s: the next reader: writer on %s, want %s; %+v", step, top(), want, got.Volume)
		}
		if err := eng.Delete(ctx, r.ID); err != nil {
			t.Fatal(err)
		}
	}
	eng.Close()
}

// volumesCaps is memhv reporting other volume capabilities: none (as
// Cloud Hypervisor without its storage daemon), or only into machines
// with a data key (as Cloud Hypervisor).
type volumesCaps struct {
	*memhv.Hypervisor
	none, needKey bool
}

func (v volumesCaps) Capabilities(ctx context.Context) (hypervisor.Capabilities, error) {
	c, err := v.Hypervisor.Capabilities(ctx)
	c.Volumes, c.VolumesNeedDataKey = !v.none, v.needKey
	return c, err
}

// TestVolumesNotTaken: on a host whose hypervisor takes no volumes, or
// takes them only into machines with a data key while the host runs
// without (PlaintextDisks), a create that attaches one is refused,
// saying so, before a machine is made; one without volumes runs.
func TestVolumesNotTaken(t *testing.T) {
	t.Parallel()
	needVolumeTools(t)
	ctx := context.Background()
	// engine is an engine on caps, with a volume "data".
	engine := func(caps volumesCaps, plaintext bool) (*harebox.Engine, *memhv.Hypervisor) {
		t.Helper()
		hv := memhv.New(memhv.Options{})
		t.Cleanup(func() { hv.Close() })
		opts := memhvOptions(t, hv)
		caps.Hypervisor = hv
		opts.Hypervisor, opts.PlaintextDisks = caps, plaintext
		eng, err := harebox.New(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { eng.Close() })
		if _, err := eng.Volumes().Create(ctx, "", volume.CreateRequest{Name: "data", SizeGB: 1}); err != nil {
			t.Fatal(err)
		}
		return eng, hv
	}
	withVolume := sandbox.CreateRequest{Volumes: []sandbox.VolumeMount{{Name: "data", Path: "/mnt/data"}}}
	for _, c := range []struct {
		caps      volumesCaps
		plaintext bool
		say       string
	}{
		{volumesCaps{none: true}, false, "does not take volumes"},
		{volumesCaps{needKey: true}, true, "only into sandboxes with encrypted disks"},
	} {
		eng, hv := engine(c.caps, c.plaintext)
		_, err := eng.Create(ctx, withVolume)
		wantSaying(t, "a create with a volume", err, sandbox.ErrInvalid, c.say)
		if n := hv.Launched(); n != 0 {
			t.Errorf("%s: %d machines launched for a refused create", c.say, n)
		}
		if got, _ := eng.Volumes().Get(ctx, "", "", "data"); len(got.Attachments) != 0 {
			t.Errorf("%s: the refused create holds the volume: %+v", c.say, got.Attachments)
		}
		if _, err := eng.Create(ctx, sandbox.CreateRequest{}); err != nil {
			t.Errorf("%s: a create without volumes: %v", c.say, err)
		}
	}
	// The same capabilities with data keys take volumes.
	eng, _ := engine(volumesCaps{needKey: true}, false)
	if _, err := eng.Create(ctx, withVolume); err != nil {
		t.Error("volumes into machines with data keys:", err)
	}
}

// TestVolumeLimits: a volume's size is bounded, a project's volumes
// together by its quota, the host's disk admission counts them as it
// counts sandboxes' disks (also after a restart), and a budget with no
// room refuses a new one.
func TestVolumeLimits(t *testing.T) {
	t.Parallel()
	needVolumeTools(t)
	ctx := context.Background()
	eng, _ := memhvEngine(t, func(o *harebox.Options) {
		o.MaxVolumeGB, o.ProjectVolumeGB = 4, 6
		o.Capacity.DiskGB = 9
	})
	vols := eng.Volumes()
	if _, err := vols.Create(ctx, "", volume.CreateRequest{Name: "big", SizeGB: 5}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("5 GB past the 4 GB bound: %v, want ErrInvalid", err)
	}
	if _, err := vols.Create(ctx, "", volume.CreateRequest{Name: "a", SizeGB: 4}); err != nil {
		t.Fatal(err)
	}
	_, err := vols.Create(ctx, "", volume.CreateRequest{Name: "b", SizeGB: 3})
	wantSaying(t, "past the project's quota", err, sandbox.ErrCapacity, "quota of 6 GB")
	if _, err := vols.Resize(ctx, "", "", "a", 3); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("shrink: %v, want ErrInvalid", err)
	}
	// The host's disk: 9 GB, 4 of them the volume's.
	_, err = eng.Create(ctx, sandbox.CreateRequest{Size: sandbox.Size{VCPUs: 1, MemoryMB: 256, DiskGB: 6}})
	wantSaying(t, "a sandbox disk past what the volume left", err, sandbox.ErrCapacity, "disk")
	if _, err := vols.Create(ctx, "", volume.CreateRequest{Name: "b", SizeGB: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := vols.Resize(ctx, "", "", "b", 3); err == nil {
		t.Error("a resize past the quota passed")
	}
	if err := vols.Delete(ctx, "", "", "a"); err != nil {
		t.Fatal(err)
	}
	box, err := eng.Create(ctx, sandbox.CreateRequest{Size: sandbox.Size{VCPUs: 1, MemoryMB: 256, DiskGB: 6}})
	if err != nil {
		t.Fatal("a sandbox disk in the room a deleted volume left:", err)
	}
	eng.Delete(ctx, box.ID)
}

// TestVolumeBudget: volumes are charged disk GB-hours, and a budget
// without room refuses a new one.
func TestVolumeBudget(t *testing.T) {
	t.Parallel()
	needVolumeTools(t)
	eng, clk, _ := budgetEngine(t, budget.Prices{DiskGBHour: dollar})
	ctx := context.Background()
	b := newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeAccount}, Limit: 3 * dollar, Action: budget.DenyNew})
	v, err := eng.Volumes().Create(ctx, "", volume.CreateRequest{Name: "one", SizeGB: 2})
	if err != nil {
		t.Fatal(err)
	}
	_, err = eng.Volumes().Create(ctx, "", volume.CreateRequest{Name: "two", SizeGB: 2})
	wantSaying(t, "a second volume past the budget", err, sandbox.ErrBudget, "")
	clk.advance(30 * time.Minute)
	if err := eng.Volumes().Delete(ctx, "", "", v.ID); err != nil {
		t.Fatal(err)
	}
	got, err := eng.Budgets().Get(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Spent != dollar {
		t.Errorf("spent %v for 2 GB for half an hour at $1 a GB-hour, want $1", got.Spent)
	}
}

// TestVolumeDropHost: the volumes of a host removed from the deployment
// lose their keys and records (the engine's part of cluster.Remove).
func TestVolumeDropHost(t *testing.T) {
	t.Parallel()
	needVolumeTools(t)
	eng, _ := memhvEngine(t, nil)
	ctx := context.Background()
	v, err := eng.Volumes().Create(ctx, "", volume.CreateRequest{Name: "data", SizeGB: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Secrets().Get(ctx, "volume/"+v.ID, "data-key"); err != nil {
		t.Fatal("the volume's key:", err)
	}
	if err := eng.Volumes().DropHost(ctx, "another-host"); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Volumes().Get(ctx, "", "", "data"); err != nil {
		t.Fatal("another host's removal dropped this host's volume:", err)
	}
	if err := eng.Volumes().DropHost(ctx, eng.Cluster().Name()); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Volumes().Get(ctx, "", "", "data"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("the volume after its host's removal: %v", err)
	}
	if _, err := eng.Secrets().Get(ctx, "volume/"+v.ID, "data-key"); err == nil {
		t.Error("the volume's key is still in the secret store")
	}
}

// TestVolumeSnapshots: a snapshot records its source's volumes (detached
// while it is written, attached again after); a fork attaches read-only
// ones again and refuses a read-write one its source holds unless the
// request names others; a create from the snapshot, once the source is
// gone, attaches them all; hibernate and wake keep them.
func TestVolumeSnapshots(t *testing.T) {
	t.Parallel()
	needVolumeTools(t)
	eng, hv := memhvEngine(t, nil)
	ctx := context.Background()
	for _, n := range []string{"ro", "rw", "other"} {
		if _, err := eng.Volumes().Create(ctx, "", volume.CreateRequest{Name: n, SizeGB: 1}); err != nil {
			t.Fatal(err)
		}
	}
	both := []sandbox.VolumeMount{{Name: "ro", Path: "/mnt/ro", ReadOnly: true}, {Name: "rw", Path: "/mnt/rw"}}
	src, err := eng.Create(ctx, sandbox.CreateRequest{Volumes: both})
	if err != nil {
		t.Fatal(err)
	}
	_, err = eng.Snapshots().Fork(ctx, src.ID, sandbox.ForkRequest{})
	wantSaying(t, "a fork that takes the source's read-write volume", err, sandbox.ErrState, src.ID)
	clones, err := eng.Snapshots().Fork(ctx, src.ID, sandbox.ForkRequest{Count: 2, Volumes: []sandbox.VolumeMount{{Name: "ro", Path: "/mnt/ro", ReadOnly: true}}})
	if err != nil {
		t.Fatal("a fork with the read-only volume only:", err)
	}
	for _, c := range clones {
		if len(c.Volumes) != 1 || c.Volumes[0].Name != "ro" {
			t.Errorf("clone %s's volumes: %+v", c.ID, c.Volumes)
		}
		eng.Delete(ctx, c.ID)
	}
	none, err := eng.Snapshots().Fork(ctx, src.ID, sandbox.ForkRequest{Volumes: []sandbox.VolumeMount{}})
	if err != nil || len(none) != 1 || len(none[0].Volumes) != 0 {
		t.Fatalf("a fork with no volumes: %+v %v", none, err)
	}
	eng.Delete(ctx, none[0].ID)
	// The source's machine has them plugged in again.
	if got, _ := eng.Get(ctx, src.ID); len(got.Volumes) != 2 {
		t.Errorf("the source's volumes after the forks: %+v", got.Volumes)
	}
	if n := hv.Plugged(src.ID); n != 2 {
		t.Errorf("the source's machine has %d volumes plugged after the forks, want 2", n)
	}
	// Paused, its guest cannot unmount them: a snapshot is refused.
	if _, err := eng.Pause(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	_, err = eng.Snapshots().Take(ctx, src.ID, sandbox.SnapshotRequest{Name: "paused"})
	wantSaying(t, "a snapshot of a paused sandbox with volumes", err, sandbox.ErrState, "resume it first")
	if _, err := eng.Resume(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	snap, err := eng.Snapshots().Take(ctx, src.ID, sandbox.SnapshotRequest{Name: "with-volumes"})
	if err != nil {
		t.Fatal(err)
	}
	// Hibernated and woken, it has them again.
	if _, err := eng.Hibernate(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Resume(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	if n := hv.Plugged(src.ID); n != 2 {
		t.Errorf("the woken source has %d volumes plugged, want 2", n)
	}
	if err := eng.Delete(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	restored, err := eng.Create(ctx, sandbox.CreateRequest{Snapshot: snap.ID})
	if err != nil {
		t.Fatal("a create from the snapshot, its source gone:", err)
	}
	if len(restored.Volumes) != 2 {
		t.Errorf("restored with volumes %+v, want the source's two", restored.Volumes)
	}
	eng.Delete(ctx, restored.ID)
}
