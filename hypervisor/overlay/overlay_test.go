package overlay

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
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
	return runOpened(t, path, key, backingKey, func(secArgs []string, opts string) *exec.Cmd {
		return exec.Command("qemu-io", append(secArgs, "--image-opts", opts, "-c", cmd)...)
	})
}

// qemuImgKeyed runs qemu-img's subcommand on an encrypted image opened
// with its key (and its backing's).
func qemuImgKeyed(t *testing.T, qemuImg, path string, key, backingKey []byte, sub string) ([]byte, error) {
	t.Helper()
	return runOpened(t, path, key, backingKey, func(secArgs []string, opts string) *exec.Cmd {
		return exec.Command(qemuImg, append(append([]string{sub}, secArgs...), "--image-opts", opts)...)
	})
}

// runOpened runs the command cmd makes of the secrets' arguments and the
// image options that open path with key (and its backing with
// backingKey, if any).
func runOpened(t *testing.T, path string, key, backingKey []byte, cmd func(secArgs []string, opts string) *exec.Cmd) ([]byte, error) {
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
	c := cmd(sec.Args(), opts)
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
	if err := CreateEncrypted(ctx, qemuImg, base, "raw", ov, 16<<20, key); err != nil {
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
	if err := CreateEncrypted(ctx, qemuImg, ov, "qcow2", clone, 0, other); err != nil {
		t.Fatal(err)
	}
	if out, err := qemuIO(t, clone, other, key, "read -P 0x43 0 1M"); err != nil {
		t.Fatalf("clone reads its base's data: %v: %s", err, out)
	}
	if out, err := qemuIO(t, clone, other, other, "read 0 4k"); err == nil {
		t.Fatalf("clone opened with a wrong backing key: %s", out)
	}
	if err := CreateEncrypted(ctx, qemuImg, base, "raw", filepath.Join(dir, "short.qcow2"), 0, key[:16]); err == nil {
		t.Fatal("a short key was accepted")
	}
}

// TestEncryptedImages: the files CreateEncrypted writes itself are what
// QEMU expects (qemu-img check finds nothing wrong: header, refcounts, L1),
// open under their own key only with QEMU's own LUKS code (qemu-io), share
// nothing secret, and come in every shape asked for: over a raw base,
// over an encrypted one, with no base, small and large.
func TestEncryptedImages(t *testing.T) {
	qemuImg := needQEMUIO(t)
	ctx := context.Background()
	dir := t.TempDir()
	base := filepath.Join(dir, "base.raw")
	if err := os.WriteFile(base, bytes.Repeat([]byte{0x42}, 8<<20), 0o444); err != nil {
		t.Fatal(err)
	}
	check := func(path, format string, want int64, key, backingKey []byte) {
		t.Helper()
		if out, err := qemuImgKeyed(t, qemuImg, path, key, backingKey, "check"); err != nil || !bytes.Contains(out, []byte("No errors were found")) {
			t.Fatalf("qemu-img check %s: %v\n%s", path, err, out)
		}
		var info struct {
			VirtualSize   int64  `json:"virtual-size"`
			Encrypted     bool   `json:"encrypted"`
			BackingFormat string `json:"backing-filename-format"`
		}
		out, err := exec.Command(qemuImg, "info", "--output=json", "-f", "qcow2", path).Output()
		if err != nil || json.Unmarshal(out, &info) != nil || info.VirtualSize != want || !info.Encrypted || info.BackingFormat != format {
			t.Fatalf("qemu-img info %s: %v\n%s", path, err, out)
		}
		if got, err := VirtualSize(ctx, qemuImg, path, "qcow2"); err != nil || got != want {
			t.Fatalf("VirtualSize %s: %d %v, want %d", path, got, err, want)
		}
	}
	k1, k2, k3 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32), bytes.Repeat([]byte{3}, 32)
	a, b := filepath.Join(dir, "a.qcow2"), filepath.Join(dir, "b.qcow2")
	for _, c := range []struct {
		path string
		key  []byte
	}{{a, k1}, {b, k2}} {
		start := time.Now()
		if err := CreateEncrypted(ctx, qemuImg, base, "raw", c.path, 16<<20, c.key); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s written in %v", c.path, time.Since(start))
		check(c.path, "raw", 16<<20, c.key, nil)
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
		// What QEMU wrote into it left it consistent.
		if out, err := qemuImgKeyed(t, qemuImg, c.path, c.key, nil, "check"); err != nil {
			t.Fatalf("qemu-img check %s after writes: %v\n%s", c.path, err, out)
		}
	}
	// Two overlays share no key material.
	ra, _ := os.ReadFile(a)
	rb, _ := os.ReadFile(b)
	off, _, err := cryptoHeader(ra)
	if err != nil {
		t.Fatal(err)
	}
	slot0 := off + int64(binary.BigEndian.Uint32(ra[off+208+40:]))*512
	if bytes.Equal(ra[off+112:off+132], rb[off+112:off+132]) || bytes.Equal(ra[slot0:slot0+512], rb[slot0:slot0+512]) ||
		bytes.Equal(ra[off+168:off+208], rb[off+168:off+208]) {
		t.Error("two overlays share a master key digest, key material or a UUID")
	}

	// Over an encrypted base (a snapshot's disk): the base is not opened
	// to make it, and the overlay reads through to it with both keys.
	c := filepath.Join(dir, "c.qcow2")
	if err := CreateEncrypted(ctx, qemuImg, a, "qcow2", c, 0, k3); err != nil {
		t.Fatal(err)
	}
	check(c, "qcow2", 16<<20, k3, k1)
	if out, err := qemuIO(t, c, k3, k1, "read -P 0x43 4M 1M"); err != nil {
		t.Fatalf("through to the encrypted base: %v: %s", err, out)
	}

	// No base: an empty disk, of a size that needs more than one L1
	// entry (each maps 512 MiB), written to at its far end.
	d := filepath.Join(dir, "d.qcow2")
	if err := CreateEncrypted(ctx, qemuImg, "", "", d, 5<<30, k1); err != nil {
		t.Fatal(err)
	}
	check(d, "", 5<<30, k1, nil)
	if out, err := qemuIO(t, d, k1, nil, "write -P 0x44 4607M 1M"); err != nil {
		t.Fatalf("write at the end: %v: %s", err, out)
	}
	if out, err := qemuIO(t, d, k1, nil, "read -P 0 0 1M"); err != nil {
		t.Fatalf("an empty disk reads zeros: %v: %s", err, out)
	}
	if fi, _ := os.Stat(d); fi.Size() > 8<<20 {
		t.Errorf("the empty disk is %d bytes", fi.Size())
	}
	if err := CreateEncrypted(ctx, qemuImg, "", "", d, 16<<20, k1); err == nil {
		t.Error("an existing file was overwritten")
	}
	if err := CreateEncrypted(ctx, qemuImg, filepath.Join(dir, "missing"), "raw", filepath.Join(dir, "e.qcow2"), 0, k1); err == nil {
		t.Error("an overlay of a missing base was made")
	}
	if _, _, err := cryptoHeader([]byte("QFI\xfb not really")); err == nil {
		t.Error("garbage has a crypto header")
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

// cryptoHeader finds the LUKS header region of a qcow2 v3 image.
func cryptoHeader(b []byte) (off, length int64, err error) {
	be := binary.BigEndian
	if len(b) < 104 || string(b[:4]) != qcow2Magic || be.Uint32(b[4:]) != 3 || be.Uint32(b[32:]) != qcow2CryptoLUKS {
		return 0, 0, errors.New("not a LUKS qcow2 v3 image")
	}
	p := int(be.Uint32(b[100:])) // header_length
	for p+8 <= len(b) && p < 1<<16 {
		typ, l := be.Uint32(b[p:]), int(be.Uint32(b[p+4:]))
		if typ == 0 {
			break
		}
		if typ == extCryptoHeader && l == 16 && p+24 <= len(b) {
			off, length = int64(be.Uint64(b[p+8:])), int64(be.Uint64(b[p+16:]))
			if off <= 0 || length < luksHeaderSize || off+length > int64(len(b)) {
				break
			}
			return off, length, nil
		}
		p += 8 + (l+7)&^7
	}
	return 0, 0, errors.New("no crypto header extension")
}
