package overlay

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
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

// qemuIO runs qemu-io on an overlay opened with its key (and its backing's
// key, if any), the way the VMM opens it.
func qemuIO(t *testing.T, path string, key, backingKey []byte, cmd string) ([]byte, error) {
	t.Helper()
	var sec Secrets
	defer sec.Close()
	if err := sec.Add("k", key); err != nil {
		t.Fatal(err)
	}
	opts := "driver=qcow2,file.filename=" + path + ",encrypt.key-secret=k"
	if backingKey != nil {
		if err := sec.Add("b", backingKey); err != nil {
			t.Fatal(err)
		}
		opts += ",backing.encrypt.key-secret=b"
	}
	c := exec.Command("qemu-io", append(sec.Args(), "--image-opts", opts, "-c", cmd)...)
	sec.Apply(c)
	return c.CombinedOutput()
}

func TestCreateEncrypted(t *testing.T) {
	qemuImg := needQEMUIO(t)
	ctx := context.Background()
	dir := t.TempDir()
	base := filepath.Join(dir, "base.raw")
	if err := os.WriteFile(base, make([]byte, 8<<20), 0o444); err != nil {
		t.Fatal(err)
	}
	key, other := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	ov := filepath.Join(dir, "ov.qcow2")
	if err := CreateEncrypted(ctx, qemuImg, base, "raw", ov, 16<<20, key, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := VirtualSize(ctx, qemuImg, ov, "qcow2"); err != nil || got != 16<<20 {
		t.Fatalf("virtual size %d (%v)", got, err)
	}
	// 0x43 is 'C': a page of it would be a run of Cs in a plain overlay.
	if out, err := qemuIO(t, ov, key, nil, "write -P 0x43 0 1M"); err != nil {
		t.Fatalf("write with the key: %v: %s", err, out)
	}
	raw, _ := os.ReadFile(ov)
	if bytes.Contains(raw, bytes.Repeat([]byte("C"), 64)) {
		t.Fatal("the overlay holds the guest's data in plain text")
	}
	if out, err := qemuIO(t, ov, key, nil, "read -P 0x43 0 1M"); err != nil {
		t.Fatalf("read back with the key: %v: %s", err, out)
	}
	if out, err := qemuIO(t, ov, other, nil, "read 0 4k"); err == nil || !bytes.Contains(out, []byte("Invalid password")) {
		t.Fatalf("a wrong key was not refused: %v: %s", err, out)
	}
	// A clone's overlay over the encrypted one (a snapshot's disk) is under
	// the clone's own key and needs both keys.
	clone := filepath.Join(dir, "clone.qcow2")
	if err := CreateEncrypted(ctx, qemuImg, ov, "qcow2", clone, 0, other, key); err != nil {
		t.Fatal(err)
	}
	if out, err := qemuIO(t, clone, other, key, "read -P 0x43 0 1M"); err != nil {
		t.Fatalf("clone reads its base's data: %v: %s", err, out)
	}
	if out, err := qemuIO(t, clone, other, other, "read 0 4k"); err == nil {
		t.Fatalf("clone opened with a wrong backing key: %s", out)
	}
	if err := CreateEncrypted(ctx, qemuImg, base, "raw", filepath.Join(dir, "short.qcow2"), 0, key[:16], nil); err == nil {
		t.Fatal("a short key was accepted")
	}
}

// TestTemplates: overlays made from a template open under their own key
// only, with QEMU's own LUKS code (qemu-io), and share nothing secret.
func TestTemplates(t *testing.T) {
	qemuImg := needQEMUIO(t)
	ctx := context.Background()
	dir := t.TempDir()
	base := filepath.Join(dir, "base.raw")
	if err := os.WriteFile(base, bytes.Repeat([]byte{0x42}, 8<<20), 0o444); err != nil {
		t.Fatal(err)
	}
	tpl := &Templates{QEMUImg: qemuImg}
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	a, b := filepath.Join(dir, "a.qcow2"), filepath.Join(dir, "b.qcow2")
	if err := tpl.Create(ctx, base, "raw", a, 16<<20, k1); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := tpl.Create(ctx, base, "raw", b, 16<<20, k2); err != nil {
		t.Fatal(err)
	}
	t.Logf("second overlay from the template in %v", time.Since(start))
	if got, err := VirtualSize(ctx, qemuImg, b, "qcow2"); err != nil || got != 16<<20 {
		t.Fatalf("virtual size %d (%v)", got, err)
	}
	for _, c := range []struct {
		path     string
		key, bad []byte
	}{{a, k1, k2}, {b, k2, k1}} {
		if out, err := qemuIO(t, c.path, c.key, nil, "read -P 0x42 0 1M"); err != nil {
			t.Fatalf("%s: the base through the overlay: %v: %s", c.path, err, out)
		}
		if out, err := qemuIO(t, c.path, c.key, nil, "write -P 0x43 4M 1M"); err != nil {
			t.Fatalf("%s: write: %v: %s", c.path, err, out)
		}
		if out, err := qemuIO(t, c.path, c.key, nil, "read -P 0x43 4M 1M"); err != nil {
			t.Fatalf("%s: read back: %v: %s", c.path, err, out)
		}
		if out, err := qemuIO(t, c.path, c.bad, nil, "read 0 4k"); err == nil || !bytes.Contains(out, []byte("Invalid password")) {
			t.Fatalf("%s: opened under another overlay's key: %v: %s", c.path, err, out)
		}
		raw, _ := os.ReadFile(c.path)
		if bytes.Contains(raw, bytes.Repeat([]byte("C"), 64)) {
			t.Fatalf("%s holds the guest's data in plain text", c.path)
		}
	}
	// Two overlays of one template share no key material.
	ra, _ := os.ReadFile(a)
	rb, _ := os.ReadFile(b)
	off, _, err := cryptoHeader(ra)
	if err != nil {
		t.Fatal(err)
	}
	slot0 := off + int64(binary.BigEndian.Uint32(ra[off+208+40:]))*512
	if bytes.Equal(ra[off+112:off+132], rb[off+112:off+132]) || bytes.Equal(ra[slot0:slot0+512], rb[slot0:slot0+512]) {
		t.Error("two overlays share a master key digest or key material")
	}
	if fi, _ := os.Stat(b); fi.Size() > 64<<20 {
		t.Errorf("the copy is %d bytes", fi.Size())
	}
	if _, _, err := cryptoHeader([]byte("QFI\xfb not really")); !errors.Is(err, ErrTemplate) {
		t.Errorf("garbage: %v", err)
	}

	// Another process (a restarted plugin, another engine) finds the
	// template kept beside the base: no qemu-img (none here) to run.
	kept, _ := filepath.Glob(filepath.Join(dir, ".base.raw.*.luks-template"))
	if len(kept) != 1 {
		t.Fatalf("templates kept beside the base: %v", kept)
	}
	c := filepath.Join(dir, "c.qcow2")
	if err := (&Templates{QEMUImg: filepath.Join(dir, "no-qemu-img")}).Create(ctx, base, "raw", c, 16<<20, k1); err != nil {
		t.Fatalf("from the kept template: %v", err)
	}
	if out, err := qemuIO(t, c, k1, nil, "read -P 0x42 0 1M"); err != nil {
		t.Fatalf("the overlay from the kept template: %v: %s", err, out)
	}
	// A kept file that is not a template is made again.
	os.WriteFile(kept[0], []byte("QFI\xfb not really"), 0o600)
	d := filepath.Join(dir, "d.qcow2")
	if err := (&Templates{QEMUImg: qemuImg}).Create(ctx, base, "raw", d, 16<<20, k2); err != nil {
		t.Fatal(err)
	}
	if out, err := qemuIO(t, d, k2, nil, "read -P 0x42 0 1M"); err != nil {
		t.Fatalf("the overlay after a bad kept template: %v: %s", err, out)
	}
	if _, err := loadTemplate(kept[0]); err != nil {
		t.Errorf("the bad kept template was not replaced: %v", err)
	}
}

// needQEMUIO skips without qemu-img and qemu-io and returns qemu-img.
func needQEMUIO(t *testing.T) string {
	t.Helper()
	qemuImg, err := exec.LookPath("qemu-img")
	if err != nil {
		t.Skip("qemu-img is not installed (make deps installs qemu-utils)")
	}
	if _, err := exec.LookPath("qemu-io"); err != nil {
		t.Skip("qemu-io is not installed (make deps installs qemu-utils)")
	}
	return qemuImg
}
