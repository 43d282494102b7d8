package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/harebox/harebox/images"
)

// fakeBuild writes a complete build of name as images.Build lays it out.
func fakeBuild(t *testing.T, out, name, hash string, built time.Time) string {
	t.Helper()
	dir := filepath.Join(out, name+"-"+hash[:12])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{images.KernelFile, images.InitrdFile} {
		if err := os.WriteFile(filepath.Join(dir, f), bytes.Repeat([]byte{1}, 64<<10), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.Marshal(images.Image{Name: name, Kernel: images.KernelFile, Initrd: images.InitrdFile, InputHash: hash, BuiltAt: built})
	if err := os.WriteFile(filepath.Join(dir, images.ManifestFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(dir, built, built); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestGCCommand(t *testing.T) {
	out := t.TempDir()
	old := time.Now().Add(-72 * time.Hour)
	a := fakeBuild(t, out, "default", "aaaaaaaaaaaaaaaa", old)
	kept := fakeBuild(t, out, "default", "bbbbbbbbbbbbbbbb", old.Add(time.Hour))
	newest := fakeBuild(t, out, "default", "cccccccccccccccc", old.Add(2*time.Hour))
	run := func(args ...string) images.GCReport {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if err := gc(context.Background(), args, &stdout, &stderr); err != nil {
			t.Fatalf("gc %v: %v\n%s", args, err, stderr.String())
		}
		var r images.GCReport
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Fatalf("gc %v printed %q: %v", args, stdout.String(), err)
		}
		return r
	}
	r := run("--out", out, "--dry-run", "--in-use", kept)
	if !r.DryRun || len(r.Removed) != 1 || r.Removed[0].Dir != a || r.FreedBytes < 128<<10 || len(r.Kept) != 2 {
		t.Fatalf("dry run: %+v", r)
	}
	if _, err := os.Stat(a); err != nil {
		t.Fatalf("the dry run removed %s", a)
	}
	// No engine wrote its references there: removes nothing unless told
	// that none uses the cache.
	if err := gc(context.Background(), []string{"--out", out}, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Fatal("gc removed builds from a cache no engine wrote its references to")
	}
	r = run("--out", out, "--in-use", kept, "--no-engine")
	if len(r.Removed) != 1 || r.Removed[0].Dir != a {
		t.Fatalf("gc: %+v", r)
	}
	for d, want := range map[string]bool{a: false, kept: true, newest: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s: present %v, want %v", d, err == nil, want)
		}
	}
	var stderr bytes.Buffer
	if err := gc(context.Background(), []string{"--dry-run"}, &bytes.Buffer{}, &stderr); err == nil {
		t.Error("gc without --out ran")
	}
}
