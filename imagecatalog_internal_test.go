package harebox

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/sandbox"
)

// fakeImageBuild writes a complete build of name into cache dir as
// images.Build lays it out, built (and last used) at built.
func fakeImageBuild(t *testing.T, dir, name, hash string, built time.Time) string {
	t.Helper()
	d := filepath.Join(dir, name+"-"+hash[:12])
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{images.KernelFile, images.InitrdFile} {
		if err := os.WriteFile(filepath.Join(d, f), []byte("memhv placeholder: never booted\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.Marshal(images.Image{Name: name, Kernel: images.KernelFile, Initrd: images.InitrdFile,
		Cmdline: images.BaseCmdline, KernelVersion: memhv.Name, InputHash: hash, BuiltAt: built})
	if err := os.WriteFile(filepath.Join(d, images.ManifestFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(d, built, built); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestImageGCInUse: a GC of the image cache on its own (as harebox-image
// gc runs it) keeps a build superseded long ago while a sandbox, a
// snapshot or a golden snapshot of the engine uses it, as the engine's
// reference file says, and removes it once none does.
func TestImageGCInUse(t *testing.T) {
	ctx := context.Background()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	data, err := os.MkdirTemp("", "hbi") // short: socket paths live under it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(data) })
	cache := filepath.Join(data, "images")
	now := time.Now()
	a := fakeImageBuild(t, cache, sandbox.DefaultImage, "aaaaaaaaaaaaaaaaaaaa", now.Add(-72*time.Hour))
	opts := Options{DataDir: data, Hypervisor: hv, GoldenSnapshots: true,
		Capacity: Capacity{VCPUs: 8, MemoryMB: 8192, DiskGB: 100}}
	eng, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { eng.Close() }()
	restart := func() {
		t.Helper()
		eng.Close()
		if eng, err = New(ctx, opts); err != nil {
			t.Fatal(err)
		}
	}
	// gc writes the engine's references and runs GC; the builds in want
	// must be there after it, those in gone not.
	gc := func(step string, want, gone []string) {
		t.Helper()
		if err := eng.catalog.WriteRefs(ctx); err != nil {
			t.Fatal(err)
		}
		r, err := images.GC(ctx, cache, images.GCOptions{})
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		for _, d := range want {
			if _, err := os.Stat(d); err != nil {
				t.Fatalf("%s: %s removed: %+v", step, filepath.Base(d), r)
			}
		}
		for _, d := range gone {
			if _, err := os.Stat(d); err == nil {
				t.Fatalf("%s: %s kept: %+v", step, filepath.Base(d), r)
			}
		}
	}
	waitGolden := func(dir string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if eng.clones.Ready(dir) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no golden snapshot of %s", dir)
			}
		}
	}
	create := func(req sandbox.CreateRequest) *sandbox.Sandbox {
		t.Helper()
		box, err := eng.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return box
	}
	snapshot := func(id string) *sandbox.Snapshot {
		t.Helper()
		s, err := eng.Snapshots().Take(ctx, id, sandbox.SnapshotRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	del := func(id string) {
		t.Helper()
		if err := eng.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	delSnap := func(id string) {
		t.Helper()
		if err := eng.Snapshots().Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	// a under a sandbox and its golden snapshot; then b supersedes it
	// (two days ago: for longer than the grace).
	box := create(sandbox.CreateRequest{})
	waitGolden(a)
	b := fakeImageBuild(t, cache, sandbox.DefaultImage, "bbbbbbbbbbbbbbbbbbbb", now.Add(-48*time.Hour))
	gc("a: sandbox, golden", []string{a, b}, nil)
	del(box.ID)
	gc("a: golden", []string{a, b}, nil)
	// A golden snapshot of a build no longer current goes at the next start.
	restart()
	gc("a: nothing", []string{b}, []string{a})

	// b under a sandbox, then a snapshot of it, then a sandbox made from
	// that; c supersedes it.
	box = create(sandbox.CreateRequest{})
	snap := snapshot(box.ID)
	c := fakeImageBuild(t, cache, sandbox.DefaultImage, "cccccccccccccccccccc", now.Add(-24*time.Hour))
	del(box.ID)
	restart() // (its golden snapshot goes)
	gc("b: snapshot", []string{b, c}, nil)
	clone := create(sandbox.CreateRequest{Snapshot: snap.ID})
	delSnap(snap.ID)
	gc("b: sandbox from the snapshot", []string{b, c}, nil)
	del(clone.ID)
	gc("b: nothing", []string{c}, []string{b})
}
