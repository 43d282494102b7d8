// Package overlay creates qcow2 copy-on-write overlays over base disk
// images, plain or LUKS-encrypted under a machine's key, for every backend
// that gives a machine its own writable layer; and hands such keys to QEMU
// processes without writing them anywhere.
package overlay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/harebox/harebox/hypervisor"
)

// Create makes a qcow2 overlay at path over base (in baseFormat). Its
// virtual size is sizeBytes, or the base's size if that is larger (an
// overlay never hides part of its base). qemuImg is the qemu-img binary.
func Create(ctx context.Context, qemuImg, base, baseFormat, path string, sizeBytes int64) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	args := []string{"create", "-q", "-f", "qcow2", "-F", baseFormat, "-b", base, path}
	if sizeBytes > 0 {
		baseSize, err := VirtualSize(ctx, qemuImg, base, baseFormat)
		if err != nil {
			return err
		}
		if sizeBytes > baseSize {
			args = append(args, strconv.FormatInt(sizeBytes, 10))
		}
	}
	if out, err := exec.CommandContext(ctx, qemuImg, args...).CombinedOutput(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return hypervisor.Errorf(hypervisor.ErrUnavailable, "overlay for %s: %s not found", base, qemuImg)
		}
		return fmt.Errorf("qemu-img create overlay of %s: %w: %s", base, err, bytes.TrimSpace(out))
	}
	return nil
}

// CreateEncrypted makes a LUKS-encrypted qcow2 overlay at path over base:
// what the guest writes is encrypted under key, the base stays plain and
// shared. baseKey opens a base that is itself encrypted (a snapshot's
// disk), or is nil.
//
// The passphrase is a random 256-bit key, so PBKDF stretching adds no
// strength: iter-time is the minimum, which keeps every open fast.
func CreateEncrypted(ctx context.Context, qemuImg, base, baseFormat, path string, sizeBytes int64, key, baseKey []byte) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if len(key) != hypervisor.KeySize {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "overlay: key of %d bytes", len(key))
	}
	// The size is given and the backing not opened (-u): an encrypted
	// backing would need its key just to be measured.
	baseSize, err := VirtualSize(ctx, qemuImg, base, baseFormat)
	if err != nil {
		return err
	}
	size := max(sizeBytes, baseSize)
	err = RunKeyed(ctx, qemuImg, key, func(sec []string) []string {
		return append(append([]string{"create"}, sec...), "-q", "-f", "qcow2", "-u", "-F", baseFormat, "-b", base,
			"-o", "encrypt.format=luks,encrypt.key-secret=key,encrypt.iter-time=1", path, strconv.FormatInt(size, 10))
	})
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("encrypted overlay of %s: %w", base, err)
	}
	return nil
}

// RunKeyed runs qemu-img with key as the secret "key" (args gets the
// secret's arguments and returns the command line after "qemu-img"),
// again while QEMU's PBKDF benchmark flakes (Retryable), at most 8 times
// more.
func RunKeyed(ctx context.Context, qemuImg string, key []byte, args func(sec []string) []string) error {
	for attempt := 0; ; attempt++ {
		var sec Secrets
		if err := sec.Add("key", key); err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, qemuImg, args(sec.Args())...)
		sec.Apply(cmd)
		out, err := cmd.CombinedOutput()
		sec.Close()
		if err == nil {
			return nil
		}
		if errors.Is(err, exec.ErrNotFound) {
			return hypervisor.Errorf(hypervisor.ErrUnavailable, "%s not found", qemuImg)
		}
		if !Retryable(out) || attempt == 8 || ctx.Err() != nil {
			return fmt.Errorf("qemu-img %s: %w: %s", args(nil)[0], err, bytes.TrimSpace(out))
		}
	}
}

// VirtualSize is a disk image's size as the guest sees it.
func VirtualSize(ctx context.Context, qemuImg, path, format string) (int64, error) {
	out, err := exec.CommandContext(ctx, qemuImg, "info", "--output=json", "-f", format, path).Output()
	if err != nil {
		return 0, fmt.Errorf("qemu-img info %s: %w", path, err)
	}
	var info struct {
		VirtualSize int64 `json:"virtual-size"`
	}
	if err := json.Unmarshal(out, &info); err != nil || info.VirtualSize <= 0 {
		return 0, fmt.Errorf("qemu-img info %s: no virtual size (%v)", path, err)
	}
	return info.VirtualSize, nil
}
