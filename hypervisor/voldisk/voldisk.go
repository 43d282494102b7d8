// Package voldisk makes and grows the files behind volumes: an ext4
// filesystem in a qcow2 file encrypted (LUKS) under the volume's own key,
// which any backend that opens such files (QEMU itself, the storage
// daemon) plugs into a guest. The filesystem is made on the host, so a
// guest only mounts it; what the guest writes is only ever on the host
// encrypted.
package voldisk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/overlay"
)

// Tools are the host programs the package runs; empty fields are looked
// up on PATH.
type Tools struct {
	QEMUImg  string // qemu-img
	MkfsExt4 string // mkfs.ext4
}

func (t Tools) qemuImg() string { return or(t.QEMUImg, "qemu-img") }
func (t Tools) mkfs() string    { return or(t.MkfsExt4, "mkfs.ext4") }

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Create makes the volume file path, sizeBytes large, holding an empty
// ext4 filesystem, encrypted under key. The filesystem is made in a
// sparse scratch file beside path (it holds no data, only the empty
// filesystem's structures) and converted into the encrypted file, which
// keeps only what is not zero.
func Create(ctx context.Context, t Tools, path string, sizeBytes int64, key []byte) (err error) {
	if len(key) != hypervisor.KeySize {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "voldisk: key of %d bytes", len(key))
	}
	if sizeBytes < 16<<20 {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "voldisk: a volume is at least 16 MiB")
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	scratch := path + ".mkfs"
	defer os.Remove(scratch)
	f, err := os.OpenFile(scratch, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("voldisk: %w", err)
	}
	err = f.Truncate(sizeBytes)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("voldisk: %w", err)
	}
	// Inode tables and the journal are zeroed now (in the scratch file
	// that is a hole), so the guest's kernel has nothing to zero later.
	if out, err := exec.CommandContext(ctx, t.mkfs(), "-q", "-F", "-m", "0", "-L", "volume",
		"-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", scratch).CombinedOutput(); err != nil {
		return fmt.Errorf("voldisk: mkfs.ext4: %w: %s", err, bytes.TrimSpace(out))
	}
	defer func() {
		if err != nil {
			os.Remove(path)
		}
	}()
	return qemuImg(ctx, t, key, func(sec []string) []string {
		return append(append([]string{"convert"}, sec...), "-q", "-f", "raw", "-O", "qcow2",
			"-o", "encrypt.format=luks,encrypt.key-secret=key,encrypt.iter-time=1", scratch, path)
	})
}

// Grow makes the volume file path sizeBytes large (never smaller); the
// guest grows the filesystem into it when it next mounts it writable.
func Grow(ctx context.Context, t Tools, path string, sizeBytes int64, key []byte) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return qemuImg(ctx, t, key, func(sec []string) []string {
		return append(append([]string{"resize"}, sec...), "-q", "--image-opts",
			"driver=qcow2,file.filename="+strings.ReplaceAll(path, ",", ",,")+",encrypt.key-secret=key", strconv.FormatInt(sizeBytes, 10))
	})
}

// qemuImg runs qemu-img with the key as secret "key", again when its
// PBKDF benchmark flakes (overlay.Retryable).
func qemuImg(ctx context.Context, t Tools, key []byte, args func(sec []string) []string) error {
	for attempt := 0; ; attempt++ {
		var sec overlay.Secrets
		if err := sec.Add("key", key); err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, t.qemuImg(), args(sec.Args())...)
		sec.Apply(cmd)
		out, err := cmd.CombinedOutput()
		sec.Close()
		if err == nil {
			return nil
		}
		if errors.Is(err, exec.ErrNotFound) {
			return hypervisor.Errorf(hypervisor.ErrUnavailable, "voldisk: %s not found", t.qemuImg())
		}
		if attempt < 3 && overlay.Retryable(out) {
			continue
		}
		return fmt.Errorf("voldisk: qemu-img %s: %w: %s", args(nil)[0], err, bytes.TrimSpace(out))
	}
}
