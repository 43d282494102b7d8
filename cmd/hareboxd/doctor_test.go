package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/images"
)

// TestDoctorImageCache: doctor reports each image name's builds and disk
// use, and which builds harebox-image gc would remove.
func TestDoctorImageCache(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-72 * time.Hour)
	build := func(name, hash string, built time.Time) string {
		d := filepath.Join(dir, name+"-"+hash[:12])
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{images.KernelFile, images.InitrdFile} {
			if err := os.WriteFile(filepath.Join(d, f), bytes.Repeat([]byte{1}, 3<<20), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		b, _ := json.Marshal(images.Image{Name: name, Kernel: images.KernelFile, Initrd: images.InitrdFile, InputHash: hash, BuiltAt: built})
		if err := os.WriteFile(filepath.Join(d, images.ManifestFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(d, built, built); err != nil {
			t.Fatal(err)
		}
		return d
	}
	unused := build("default", "aaaaaaaaaaaaaaaa", old)
	build("default", "bbbbbbbbbbbbbbbb", old.Add(time.Hour))
	build("minimal", "cccccccccccccccc", old)
	var out bytes.Buffer
	imageCache(context.Background(), &out, dir)
	for _, want := range []string{
		"image-cache: default: builds 2, 12 MiB; unused 1, 6 MiB reclaimable\n",
		"image-cache: minimal: builds 1, 6 MiB; unused 0, 0 MiB reclaimable\n",
		"image-cache: ok: builds 3, 18 MiB in " + dir + "; unused 1, 6 MiB reclaimable: harebox-image gc --out " + dir + " --no-engine",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("doctor lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := os.Stat(unused); err != nil {
		t.Errorf("doctor removed a build: %v", err)
	}
	// An engine's references: the build it uses is not reclaimable.
	if err := images.WriteRefs(dir, t.TempDir(), []string{unused}, time.Now()); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	imageCache(context.Background(), &out, dir)
	if want := "image-cache: ok: builds 3, 18 MiB in " + dir + "; unused 0, 0 MiB reclaimable\n"; !strings.Contains(out.String(), want) {
		t.Errorf("doctor lacks %q:\n%s", want, out.String())
	}
}
