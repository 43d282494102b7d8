package clone

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
)

func masterKey(t *testing.T) cipher.AEAD {
	t.Helper()
	k := make([]byte, 32)
	rand.Read(k)
	b, err := aes.NewCipher(k)
	if err != nil {
		t.Fatal(err)
	}
	a, err := cipher.NewGCM(b)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// goldens lists the golden snapshot directories in dir.
func goldens(t *testing.T, dir string) []string {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestGoldenKept, over memhv: with Seal, a golden snapshot outlives its
// engine and the next start restores from it at once with the same key;
// an engine on the same directory does not make one another engine is
// making, and finds it once it is made; a start drops what it cannot use
// (an image build gone, what a crash cut short) and nothing else, and
// with golden snapshots off only what a crash cut short; one of a
// superseded build is neither used nor removed, nor one of another golden
// key or backend until unused for a week (any unused for a week goes); a
// golden snapshot that did not
// restore, or whose image is deleted (its boot stopped), is removed.
func TestGoldenKept(t *testing.T) {
	t.Parallel() // (it waits on the golden boot's timers)
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	dir, err := os.MkdirTemp("", "hbg") // short: socket paths live under it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	img := memhv.Image(dir)
	small, medium := sandbox.Presets["small"], sandbox.Presets["medium"]
	gdir := filepath.Join(dir, "golden")
	seal := masterKey(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type engine struct {
		*Service
		built atomic.Int32 // golden machines it launched
		// While holding, its golden boots wait on a release sent on hold.
		holding atomic.Bool
		hold    chan chan struct{}
	}
	open := func(seal cipher.AEAD, backend string, cat catalog) *engine {
		e := &engine{hold: make(chan chan struct{})}
		e.Service = New(ctx, Options{Hypervisor: hv, Network: network.None{}, Images: cat, Host: &host{dir: dir, limit: 8},
			Dir: gdir, Seal: seal, Backend: backend, Golden: true, Encrypt: true, BootTimeout: 10 * time.Second,
			Step: func(step, _ string) {
				if step == "golden-launch" {
					e.built.Add(1)
				}
				if step == "golden-booting" && e.holding.Load() {
					release := make(chan struct{})
					e.hold <- release
					<-release
				}
			}})
		e.Open()
		return e
	}
	ready := func(e *engine, res sandbox.Resources) []byte {
		t.Helper()
		var key []byte
		waitFor(t, "a golden snapshot", func() bool {
			snap, k := e.Golden("memhv", img, res)
			key = k
			return snap != nil
		})
		return key
	}
	cat := catalog{"memhv": img}

	a := open(seal, "memhv 1", cat)
	key := ready(a, small)
	a.Close()
	if g := goldens(t, gdir); len(g) != 1 {
		t.Fatalf("kept after Close: %v", g)
	}

	// The next start has it at once, under the same key, and it restores.
	b := open(seal, "memhv 1", cat)
	snap, k := b.Golden("memhv", img, small)
	if snap == nil || string(k) != string(key) || b.built.Load() != 0 {
		t.Fatalf("after a restart: %+v, same key %v, %d golden boots", snap, string(k) == string(key), b.built.Load())
	}
	data := make([]byte, hypervisor.KeySize)
	rand.Read(data)
	m, err := hv.Restore(ctx, snap.Dir, hypervisor.Spec{ID: "clone", StateDir: filepath.Join(dir, "m", "clone"), SnapshotKey: k, DataKey: data})
	if err != nil {
		t.Fatalf("restore from the kept golden snapshot: %v", err)
	}
	m.Kill(ctx)
	m.Cleanup(ctx)

	// Another engine on the directory waits for the one making it.
	b.holding.Store(true)
	c := open(seal, "memhv 1", cat)
	b.Golden("memhv", img, medium)
	release := <-b.hold
	for range 3 {
		if snap, _ := c.Golden("memhv", img, medium); snap != nil {
			t.Fatal("a golden snapshot while another engine makes it")
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(release)
	ready(c, medium)
	b.wg.Wait() // (its machine stopped, its lock let go)
	if c.built.Load() != 0 || b.built.Load() != 1 {
		t.Fatalf("golden boots: %d by the engine that found it, %d by the one that made it", c.built.Load(), b.built.Load())
	}
	b.holding.Store(false)

	// One that did not restore is removed, and made again.
	failed, _ := c.Golden("memhv", img, medium)
	c.Failed(img, medium, failed, errors.New("test"))
	c.Failed(img, medium, failed, errors.New("test")) // (a second create's: nothing more)
	if g := goldens(t, gdir); len(g) != 1 {
		t.Fatalf("after a failed restore: %v", g)
	}
	ready(c, medium)
	if c.built.Load() != 1 {
		t.Fatalf("%d golden boots after a failed restore", c.built.Load())
	}

	// An image's delete stops a golden boot of it and removes its files.
	c.holding.Store(true)
	large := sandbox.Presets["large"]
	c.Golden("memhv", img, large)
	release = <-c.hold
	dropped := make(chan struct{})
	go func() { defer close(dropped); c.DropImage(img.Dir) }()
	close(release)
	<-dropped
	c.holding.Store(false)
	if g := goldens(t, gdir); len(g) != 0 {
		t.Fatalf("after the image's delete: %v", g)
	}
	ready(c, small)
	ready(c, medium)
	ready(c, large)
	b.Close()
	c.Close()
	if g := goldens(t, gdir); len(g) != 3 {
		t.Fatalf("kept: %v", g)
	}

	// A file that is no golden snapshot's (the golden key) stays; what a
	// crash cut short (no manifest) goes at the next start; so
	// does everything under another master key, another backend, or an
	// image build that is no longer the image's.
	if err := os.MkdirAll(filepath.Join(gdir, "g-000000000000000000000000", goldenMachine), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(gdir, "golden.key"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	d := open(seal, "memhv 1", cat)
	if g := goldens(t, gdir); len(g) != 3 {
		t.Fatalf("after a start over a cut-short build: %v", g)
	}
	if _, err := os.Stat(filepath.Join(gdir, "golden.key")); err != nil {
		t.Fatalf("a start removed another file: %v", err)
	}
	d.DropImage(img.Dir)
	if g := goldens(t, gdir); len(g) != 0 {
		t.Fatalf("after the image's delete: %v", g)
	}
	// Its image build gone, it goes at the next start.
	ready(d, small)
	d.Close()
	if err := os.Rename(img.Dir, img.Dir+".gone"); err != nil {
		t.Fatal(err)
	}
	open(seal, "memhv 1", cat).Close()
	if err := os.Rename(img.Dir+".gone", img.Dir); err != nil {
		t.Fatal(err)
	}
	if g := goldens(t, gdir); len(g) != 0 {
		t.Fatalf("kept at a start after its image build went: %v", g)
	}
	d = open(seal, "memhv 1", cat)
	// An engine with golden snapshots off leaves kept ones alone (another
	// engine's on Dir, or its own for later); so does one whose image's
	// name finds a newer build (until the old one is gone), without
	// using or holding it.
	ready(d, small)
	d.Close()
	open(nil, "memhv 1", cat).Close()
	newer := open(seal, "memhv 1", catalog{"memhv": images.Image{Name: "memhv", Dir: filepath.Join(dir, "newer")}})
	if held, _ := newer.Held(); len(held) != 0 || newer.Ready(img.Dir) {
		t.Fatalf("a golden snapshot of a superseded build is held: %v", held)
	}
	newer.Close()
	if g := goldens(t, gdir); len(g) != 1 {
		t.Fatalf("after a start with golden snapshots off, and one with a newer build: %v", g)
	}

	// Another kind of engine's (another golden key, backend or network)
	// is left to it, unless unused for a week; a start that finds one
	// marks it used.
	open(masterKey(t), "memhv 1", cat).Close()
	if g := goldens(t, gdir); len(g) != 1 {
		t.Fatalf("a start under another golden key removed one: %v", g)
	}
	manifests := func() []string {
		m, _ := filepath.Glob(filepath.Join(gdir, "*", goldenManifest))
		return m
	}
	age := func(d time.Duration) {
		for _, m := range manifests() {
			os.Chtimes(m, time.Now().Add(-d), time.Now().Add(-d))
		}
	}
	age(6 * 24 * time.Hour)
	open(seal, "memhv 2", cat).Close()
	if g := goldens(t, gdir); len(g) != 1 {
		t.Fatalf("another backend's start removed one used 6 days ago: %v", g)
	}
	open(seal, "memhv 1", cat).Close()
	for _, m := range manifests() {
		if fi, err := os.Stat(m); err != nil || time.Since(fi.ModTime()) > time.Minute {
			t.Fatalf("a start of its own kind did not mark it used: %v %v", fi.ModTime(), err)
		}
	}
	age(8 * 24 * time.Hour)
	open(seal, "memhv 2", cat).Close()
	if g := goldens(t, gdir); len(g) != 0 {
		t.Fatalf("another backend's start kept one unused for 8 days: %v", g)
	}
	// Its own kind's start removes one unused for 8 days too.
	d = open(seal, "memhv 1", cat)
	ready(d, small)
	d.Close()
	age(8 * 24 * time.Hour)
	open(seal, "memhv 1", cat).Close()
	if g := goldens(t, gdir); len(g) != 0 {
		t.Fatalf("a start kept one unused for 8 days: %v", g)
	}
	os.Remove(filepath.Join(gdir, "golden.key"))
	if ents, _ := os.ReadDir(gdir); len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("left in the golden directory: %v", names)
	}
}
