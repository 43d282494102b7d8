// Package overlay creates qcow2 copy-on-write overlays over base disk
// images, plain or LUKS-encrypted under a machine's key, for every backend
// that gives a machine its own writable layer; and hands such keys to QEMU
// processes without writing them anywhere.
package overlay

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// CreateEncrypted makes a LUKS-encrypted qcow2 overlay at path over base
// (in baseFormat): what the guest writes is encrypted under key, the base
// stays as it is and shared. Its virtual size is sizeBytes, or the base's
// if that is larger. A base that is itself encrypted (a snapshot's disk)
// is not opened: the VMM opens it with its own key. With no base (""),
// path is an empty encrypted disk of sizeBytes. The file is written here,
// not by qemu-img (see writeEncrypted); qemuImg only measures a base of a
// format other than raw and qcow2.
func CreateEncrypted(ctx context.Context, qemuImg, base, baseFormat, path string, sizeBytes int64, key []byte) error {
	if len(key) != hypervisor.KeySize {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "overlay: key of %d bytes", len(key))
	}
	size := sizeBytes
	if base != "" {
		baseSize, err := VirtualSize(ctx, qemuImg, base, baseFormat)
		if err != nil {
			return err
		}
		size = max(size, baseSize)
	}
	if err := writeEncrypted(path, base, baseFormat, size, Passphrase(key)); err != nil {
		return fmt.Errorf("encrypted overlay of %s: %w", base, err)
	}
	return nil
}

// RunKeyed runs qemu-img with key as the secret "key" (args gets the
// secret's arguments and returns the command line after "qemu-img").
func RunKeyed(ctx context.Context, qemuImg string, key []byte, args func(sec []string) []string) error {
	var sec Secrets
	if err := sec.Add("key", key); err != nil {
		return err
	}
	defer sec.Close()
	cmd := exec.CommandContext(ctx, qemuImg, args(sec.Args())...)
	sec.Apply(cmd)
	out, err := cmd.CombinedOutput()
	if errors.Is(err, exec.ErrNotFound) {
		return hypervisor.Errorf(hypervisor.ErrUnavailable, "%s not found", qemuImg)
	}
	if err != nil {
		return fmt.Errorf("qemu-img %s: %w: %s", args(nil)[0], err, bytes.TrimSpace(out))
	}
	return nil
}

// VirtualSize is a disk image's size as the guest sees it: read from the
// file for raw and qcow2 images, from qemu-img info for others.
func VirtualSize(ctx context.Context, qemuImg, path, format string) (int64, error) {
	switch format {
	case "raw":
		f, err := os.Open(path)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		return f.Seek(0, io.SeekEnd) // (a block device's size too)
	case "qcow2":
		f, err := os.Open(path)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		var h [32]byte
		if _, err := io.ReadFull(f, h[:]); err != nil {
			return 0, fmt.Errorf("%s: read its qcow2 header: %w", path, err)
		}
		if string(h[:4]) != qcow2Magic {
			return 0, fmt.Errorf("%s: not a qcow2 image", path)
		}
		return int64(binary.BigEndian.Uint64(h[24:])), nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
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
