package overlay

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func TestCreate(t *testing.T) {
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("qemu-img is not installed (make deps installs qemu-utils)")
	}
	ctx := context.Background()
	dir := t.TempDir()
	base := filepath.Join(dir, "base.raw")
	if err := os.WriteFile(base, make([]byte, 8<<20), 0o444); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		size int64
		want int64
	}{
		{"base size", 0, 8 << 20},
		{"grown", 64 << 20, 64 << 20},
		{"never smaller than the base", 1 << 20, 8 << 20},
	} {
		p := filepath.Join(dir, c.name+".qcow2")
		if err := Create(ctx, qemuImg, base, "raw", p, c.size); err != nil {
			t.Fatal(err)
		}
		got, err := VirtualSize(ctx, qemuImg, p, "qcow2")
		if err != nil || got != c.want {
			t.Errorf("%s: virtual size %d (%v), want %d", c.name, got, err, c.want)
		}
	}
	if err := Create(ctx, qemuImg, filepath.Join(dir, "missing"), "raw", filepath.Join(dir, "x.qcow2"), 0); err == nil {
		t.Error("an overlay of a missing base was created")
	}
}
