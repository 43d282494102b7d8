package images

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/klauspost/compress/zstd"
)

// A bzImage (the vmlinuz a distribution ships) first runs its own
// decompressor, and under TCG that costs more than the rest of a boot:
// measured with the minimal image, 5.2 CPU-s from QEMU's start to init,
// 2.2 CPU-s from the kernel's ELF image (vmlinux) through its PVH entry
// point, which QEMU's microvm and Cloud Hypervisor both boot. So Build
// keeps the kernel as that ELF image when the bzImage's payload is one
// with a PVH entry, and the bzImage otherwise.

// KernelELFFile is the kernel's ELF image in an image directory (Build
// writes it in place of KernelFile where it can).
const KernelELFFile = "vmlinux"

// maxVmlinux bounds the decompressed kernel (Debian's is 66 MB).
const maxVmlinux = 512 << 20

var (
	magicGzip = []byte{0x1f, 0x8b}
	magicXZ   = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
	magicZstd = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// vmlinux returns the ELF kernel inside bzImage, with a PVH entry point,
// or an error saying why there is none.
func vmlinux(ctx context.Context, bzImage []byte) ([]byte, error) {
	le := binary.LittleEndian
	// The setup header (the kernel's boot protocol, 2.08 and later for
	// the payload's place).
	if len(bzImage) < 0x250 || string(bzImage[0x202:0x206]) != "HdrS" || le.Uint16(bzImage[0x206:]) < 0x208 {
		return nil, errors.New("not a bzImage of boot protocol 2.08 or later")
	}
	setup := int(bzImage[0x1f1])
	if setup == 0 {
		setup = 4
	}
	start := (setup + 1) * 512
	off, n := int64(le.Uint32(bzImage[0x248:])), int64(le.Uint32(bzImage[0x24c:]))
	if n <= 4 || int64(start)+off+n > int64(len(bzImage)) {
		return nil, fmt.Errorf("payload at %d+%d, %d bytes: outside the file", start, off, n)
	}
	payload := bzImage[int64(start)+off : int64(start)+off+n]
	// The kernel's build appends the decompressed size (32 bits) to the
	// compressed data, whatever the compressor.
	size := int64(le.Uint32(payload[len(payload)-4:]))
	payload = payload[:len(payload)-4]
	var out []byte
	var err error
	switch {
	case bytes.HasPrefix(payload, magicGzip):
		var r *gzip.Reader
		if r, err = gzip.NewReader(bytes.NewReader(payload)); err == nil {
			r.Multistream(false)
			out, err = readBounded(r)
		}
	case bytes.HasPrefix(payload, magicZstd):
		var r *zstd.Decoder
		if r, err = zstd.NewReader(bytes.NewReader(payload), zstd.WithDecoderMaxMemory(maxVmlinux)); err == nil {
			out, err = readBounded(r)
			r.Close()
		}
	case bytes.HasPrefix(payload, magicXZ):
		// xz-utils: the kernel's streams use the x86 BCJ filter, which
		// Go's xz packages do not decode.
		cmd := exec.CommandContext(ctx, "xz", "--decompress", "--stdout", "--single-stream")
		cmd.Stdin = bytes.NewReader(payload)
		var stdout io.ReadCloser
		if stdout, err = cmd.StdoutPipe(); err == nil {
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err = cmd.Start(); err == nil {
				out, err = readBounded(stdout)
				stdout.Close()
				if werr := cmd.Wait(); err == nil && werr != nil {
					err = fmt.Errorf("xz: %w: %s", werr, bytes.TrimSpace(stderr.Bytes()))
				}
			}
		}
	default:
		return nil, fmt.Errorf("payload compressed with a format this builder does not decompress (%x)", payload[:min(6, len(payload))])
	}
	if err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	if int64(len(out)) != size {
		return nil, fmt.Errorf("payload: %d bytes decompressed, the kernel says %d", len(out), size)
	}
	if err := hasPVH(out); err != nil {
		return nil, err
	}
	return out, nil
}

// writeKernel puts the kernel into the image directory being built (tmp,
// to be final): its ELF image where there is one, else the bzImage.
func writeKernel(ctx context.Context, lg *logger, kernel, tmp, final string, img *Image) error {
	b, err := os.ReadFile(kernel)
	if err != nil {
		return err
	}
	elfImage, err := vmlinux(ctx, b)
	if err != nil {
		lg.step("kernel %s: booting it as it is (no ELF image to boot instead: %v)", kernel, err)
		return copyFile(ctx, kernel, filepath.Join(tmp, KernelFile), 0o644)
	}
	lg.step("kernel %s: its ELF image, booted through its PVH entry", kernel)
	img.Kernel = filepath.Join(final, KernelELFFile)
	return os.WriteFile(filepath.Join(tmp, KernelELFFile), elfImage, 0o644)
}

func readBounded(r io.Reader) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxVmlinux+1))
	if err == nil && len(b) > maxVmlinux {
		err = fmt.Errorf("over %d bytes", maxVmlinux)
	}
	return b, err
}

// hasPVH checks that b is an x86-64 ELF kernel with a PVH entry point
// (the Xen ELF note XEN_ELFNOTE_PHYS32_ENTRY).
func hasPVH(b []byte) error {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("payload: not an ELF image: %w", err)
	}
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("payload: an ELF image for %v", f.Machine)
	}
	const phys32Entry = 18
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE || p.Filesz > 1<<20 {
			continue
		}
		notes := make([]byte, p.Filesz)
		if _, err := p.ReadAt(notes, 0); err != nil {
			continue
		}
		for len(notes) >= 12 {
			namesz, descsz, typ := f.ByteOrder.Uint32(notes), f.ByteOrder.Uint32(notes[4:]), f.ByteOrder.Uint32(notes[8:])
			name := 12 + (int64(namesz)+3)&^3
			next := name + (int64(descsz)+3)&^3
			if next > int64(len(notes)) {
				break
			}
			if typ == phys32Entry && namesz == 4 && string(notes[12:15]) == "Xen" {
				return nil
			}
			notes = notes[next:]
		}
	}
	return errors.New("payload: no PVH entry point (CONFIG_PVH)")
}
