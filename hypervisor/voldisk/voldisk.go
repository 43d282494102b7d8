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

// Check says which tool is missing, if one is.
func (t Tools) Check() error {
	for _, tool := range []string{t.qemuImg(), t.mkfs()} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("voldisk: %s is not installed (make deps installs it)", tool)
		}
	}
	return nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Maker makes volume files.
type Maker struct {
	Tools Tools
}

// minSize is the smallest volume.
const minSize = 16 << 20

// Create makes the volume file path, sizeBytes large, holding an empty
// ext4 filesystem whose UUID is fsUUID (random if empty), encrypted
// under key. The filesystem is made in a sparse scratch file beside path
// (it holds no data, only the empty filesystem's structures) and copied
// into the encrypted file, which keeps only what is not zero.
func (m *Maker) Create(ctx context.Context, path string, sizeBytes int64, key []byte, fsUUID string) (err error) {
	if len(key) != hypervisor.KeySize {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "voldisk: key of %d bytes", len(key))
	}
	if sizeBytes < minSize {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "voldisk: a volume is at least 16 MiB")
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := overlay.CreateEncrypted(ctx, m.Tools.qemuImg(), "", "", path, sizeBytes, key); err != nil {
		return fmt.Errorf("voldisk: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(path)
		}
	}()
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
	args := []string{"-q", "-F", "-m", "0", "-L", "volume", "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard"}
	if fsUUID != "" {
		args = append(args, "-U", fsUUID)
	}
	if out, err := exec.CommandContext(ctx, m.Tools.mkfs(), append(args, scratch)...).CombinedOutput(); err != nil {
		return fmt.Errorf("voldisk: mkfs.ext4: %w: %s", err, bytes.TrimSpace(out))
	}
	return qemuImg(ctx, m.Tools, key, func(sec []string) []string {
		return append(append([]string{"convert"}, sec...), "-q", "-n", "-f", "raw", scratch, "--target-image-opts", imageOpts(path))
	})
}

// imageOpts opens the encrypted file path with the secret "key".
func imageOpts(path string) string {
	return "driver=qcow2,file.filename=" + strings.ReplaceAll(path, ",", ",,") + ",encrypt.key-secret=key"
}

// Grow makes the volume file path sizeBytes large (never smaller); the
// guest grows the filesystem into it when it next mounts it writable.
func Grow(ctx context.Context, t Tools, path string, sizeBytes int64, key []byte) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return qemuImg(ctx, t, key, func(sec []string) []string {
		return append(append([]string{"resize"}, sec...), "-q", "--image-opts", imageOpts(path), strconv.FormatInt(sizeBytes, 10))
	})
}

// qemuImg runs qemu-img with key as the secret "key".
func qemuImg(ctx context.Context, t Tools, key []byte, args func(sec []string) []string) error {
	if err := overlay.RunKeyed(ctx, t.qemuImg(), key, args); err != nil {
		return fmt.Errorf("voldisk: %w", err)
	}
	return nil
}

// Layer makes path, an empty layer over the volume file base (a qcow2 of
// the same key): what is written to it from then on leaves base as it
// was.
func Layer(ctx context.Context, t Tools, base, path string, key []byte) error {
	return overlay.CreateEncrypted(ctx, t.qemuImg(), base, "qcow2", path, 0, key)
}

// Fold folds the layers of a volume into its first file: chain is the
// volume's files, top first, the first last. What the top read is what
// the first reads afterwards; the layers' files are removed.
func Fold(ctx context.Context, t Tools, chain []string, key []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	for len(chain) > 1 {
		// The top into the one under it.
		if err := qemuImg(ctx, t, key, func(sec []string) []string {
			return append(append([]string{"commit"}, sec...), "-q", "-d", "--image-opts", chainOpts(chain))
		}); err != nil {
			return err
		}
		if err := os.Remove(chain[0]); err != nil {
			return fmt.Errorf("voldisk: %w", err)
		}
		chain = chain[1:]
	}
	return nil
}

// chainOpts opens a chain of encrypted files (top first) with the secret
// "key".
func chainOpts(chain []string) string {
	var b strings.Builder
	prefix := ""
	for _, p := range chain {
		fmt.Fprintf(&b, "%sdriver=qcow2,%sfile.filename=%s,%sencrypt.key-secret=key,", prefix, prefix, strings.ReplaceAll(p, ",", ",,"), prefix)
		prefix += "backing."
	}
	return strings.TrimSuffix(b.String(), ",")
}
