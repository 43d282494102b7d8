package voldisk_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/overlay"
	"github.com/harebox/harebox/hypervisor/voldisk"
)

// TestCreateGrow: a volume file is an encrypted qcow2 of the size asked,
// with no scratch left beside it and no ext4 magic in plain text; it
// grows, and a short key or a tiny size is refused.
func TestCreateGrow(t *testing.T) {
	if err := (voldisk.Tools{}).Check(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "v.qcow2")
	m := &voldisk.Maker{}
	key := make([]byte, hypervisor.KeySize)
	rand.Read(key)
	if err := m.Create(ctx, path, 64<<20, key[:16], ""); !errors.Is(err, hypervisor.ErrInvalid) {
		t.Fatalf("short key: %v, want ErrInvalid", err)
	}
	if err := m.Create(ctx, path, 1<<20, key, ""); !errors.Is(err, hypervisor.ErrInvalid) {
		t.Fatalf("1 MiB: %v, want ErrInvalid", err)
	}
	if err := m.Create(ctx, path, 64<<20, key, ""); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("files left: %v, want only the volume", ents)
	}
	// A second one is another file under another key.
	path2 := filepath.Join(dir, "v2.qcow2")
	key2 := make([]byte, hypervisor.KeySize)
	rand.Read(key2)
	if err := m.Create(ctx, path2, 32<<20, key2, ""); err != nil {
		t.Fatal(err)
	}
	if err := voldisk.Grow(ctx, voldisk.Tools{}, path2, 48<<20, key); err == nil {
		t.Error("the second volume opened with the first's key")
	}
	out, err := exec.Command("qemu-img", "info", path).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("encrypted: yes")) {
		t.Errorf("qemu-img info: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(path)
	// ext4's superblock magic with the label "volume" next to it.
	if bytes.Contains(b, []byte("volume\x00\x00")) {
		t.Error("the filesystem's label is in the file in plain text")
	}
	if size, err := overlay.VirtualSize(ctx, "qemu-img", path, "qcow2"); err != nil || size != 64<<20 {
		t.Errorf("size %d (%v), want 64 MiB", size, err)
	}
	if err := voldisk.Grow(ctx, voldisk.Tools{}, path, 96<<20, key); err != nil {
		t.Fatal(err)
	}
	if size, err := overlay.VirtualSize(ctx, "qemu-img", path, "qcow2"); err != nil || size != 96<<20 {
		t.Errorf("size %d (%v) after grow, want 96 MiB", size, err)
	}
	other := make([]byte, hypervisor.KeySize)
	if err := voldisk.Grow(ctx, voldisk.Tools{}, path, 128<<20, other); err == nil {
		t.Error("grow with a wrong key succeeded")
	}
}

// TestLayerFold: a layer over a volume file is a chain that opens with
// the one key; folded, the first file stands alone again and the layer
// is gone.
func TestLayerFold(t *testing.T) {
	if err := (voldisk.Tools{}).Check(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	key := make([]byte, hypervisor.KeySize)
	rand.Read(key)
	base, l1, l2 := filepath.Join(dir, "v.qcow2"), filepath.Join(dir, "v.1.qcow2"), filepath.Join(dir, "v.2.qcow2")
	if err := (&voldisk.Maker{}).Create(ctx, base, 32<<20, key, ""); err != nil {
		t.Fatal(err)
	}
	if err := voldisk.Layer(ctx, voldisk.Tools{}, base, l1, key); err != nil {
		t.Fatal(err)
	}
	if err := voldisk.Layer(ctx, voldisk.Tools{}, l1, l2, key); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("qemu-img", "info", "--backing-chain", l2).CombinedOutput(); err != nil || !bytes.Contains(out, []byte(base)) {
		t.Fatalf("the chain: %v\n%s", err, out)
	}
	if err := voldisk.Fold(ctx, voldisk.Tools{}, []string{l2, l1, base}, key); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{l1, l2} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("layer %s after the fold: %v", p, err)
		}
	}
	if out, err := exec.Command("qemu-img", "info", base).CombinedOutput(); err != nil || bytes.Contains(out, []byte("backing file")) {
		t.Errorf("the first file after the fold: %v\n%s", err, out)
	}
	if err := voldisk.Grow(ctx, voldisk.Tools{}, base, 48<<20, key); err != nil {
		t.Errorf("the first file does not open with its key after the fold: %v", err)
	}
}
