// Package overlay creates qcow2 copy-on-write overlays over base disk
// images, for every backend that gives a machine its own writable layer.
package overlay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
