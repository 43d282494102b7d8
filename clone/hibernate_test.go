package clone

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// TestHibernation, over memhv and the real store: a machine's files are
// written under its key, are the origin of its wake (none without them),
// and go; at start, a hibernated record's VMM is stopped (its files
// stay) and files of a sandbox that is not hibernated are pruned.
func TestHibernation(t *testing.T) {
	ctx := context.Background()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	dir, err := os.MkdirTemp("", "hbh") // short: socket paths live under it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	db, err := store.OpenSQLite(ctx, filepath.Join(dir, "harebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	h := NewHibernation(HibernationOptions{Hypervisor: hv, Network: network.None{}, Store: db, Dir: filepath.Join(dir, "hibernated")})
	img := memhv.Image(dir)
	key := make([]byte, hypervisor.KeySize)
	launch := func() (string, hypervisor.Machine) {
		t.Helper()
		id := sandbox.NewID()
		m, err := hv.Launch(ctx, hypervisor.Spec{ID: id, VCPUs: 1, MemoryMB: 512, Kernel: img.Kernel, Initrd: img.Initrd,
			StateDir: filepath.Join(dir, "m", id), DataKey: key})
		if err != nil {
			t.Fatal(err)
		}
		return id, m
	}

	id, m := launch()
	if _, err := h.Origin(id, key); !errors.Is(err, sandbox.ErrState) {
		t.Errorf("the origin of a sandbox without files: %v", err)
	}
	if err := h.Prepare(id); err != nil {
		t.Fatal(err)
	}
	size, err := h.Write(ctx, m, id, key)
	if err != nil || size <= 0 || size != h.Bytes(id) {
		t.Fatalf("written: %d bytes (%d on disk), %v", size, h.Bytes(id), err)
	}
	o, err := h.Origin(id, key)
	if err != nil || !o.Wake || string(o.Key) != string(key) {
		t.Fatalf("origin: %+v %v", o, err)
	}
	// (Under another ID: the machine it was written of still runs here.)
	wid := sandbox.NewID()
	woken, err := hv.Restore(ctx, o.Snap.Dir, hypervisor.Spec{ID: wid, StateDir: filepath.Join(dir, "m", wid), DataKey: key, SnapshotKey: key})
	if err != nil {
		t.Fatalf("a wake from the files: %v", err)
	}
	woken.Kill(ctx)
	woken.Cleanup(ctx)
	if err := h.Remove(id); err != nil || h.Bytes(id) != 0 {
		t.Errorf("removed: %d bytes left, %v", h.Bytes(id), err)
	}
	if err := h.Prepare(id); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Write(ctx, m, id, nil); err == nil {
		t.Error("a keyed machine written without its key")
	} else if _, err := os.Stat(filepath.Join(dir, "hibernated", id)); !os.IsNotExist(err) {
		t.Errorf("files after a failed write: %v", err)
	}

	// At start: a hibernated record whose VMM still runs (the engine died
	// before it stopped it), and files of a sandbox not hibernated.
	if err := h.Prepare(id); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Write(ctx, m, id, key); err != nil {
		t.Fatal(err)
	}
	hd := m.Handle()
	rec := &store.Sandbox{Sandbox: sandbox.Sandbox{ID: id, State: sandbox.StateHibernated}, StateDir: filepath.Join(dir, "m", id), Handle: &hd, Kept: true}
	if err := db.PutSandbox(ctx, rec); err != nil {
		t.Fatal(err)
	}
	h.Finish(ctx, rec)
	if _, ok := hv.Machine(id); ok {
		t.Error("the VMM a hibernate left still runs")
	}
	if got, err := db.GetSandbox(ctx, id); err != nil || got.Handle != nil {
		t.Errorf("the record after Finish: %+v %v", got, err)
	}
	if _, err := os.Stat(rec.StateDir); !os.IsNotExist(err) {
		t.Errorf("the machine directory after Finish: %v", err)
	}
	other, om := launch()
	if err := h.Prepare(other); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Write(ctx, om, other, key); err != nil {
		t.Fatal(err)
	}
	om.Kill(ctx)
	om.Cleanup(ctx)
	if err := h.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if h.Bytes(other) != 0 || h.Bytes(id) == 0 {
		t.Errorf("pruned: %d bytes of a sandbox without a record left, %d of the hibernated one", h.Bytes(other), h.Bytes(id))
	}
}
