package images

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// bzImage wraps payload (compressed data) the way the kernel's build does:
// a setup header saying where it is, and the decompressed size after it.
func bzImage(payload []byte, size int) []byte {
	le := binary.LittleEndian
	b := make([]byte, 2*512) // boot sector and one setup sector
	b[0x1f1] = 1
	copy(b[0x202:], "HdrS")
	le.PutUint16(b[0x206:], 0x20f)
	le.PutUint32(b[0x248:], 16) // from the protected-mode code's start
	le.PutUint32(b[0x24c:], uint32(len(payload)+4))
	b = append(b, make([]byte, 16)...)
	b = append(b, payload...)
	return le.AppendUint32(b, uint32(size))
}

// The host's kernel (Debian's: xz with the x86 filter) gives its ELF
// image with a PVH entry; the same image under gzip and zstd, as other
// kernels ship it, too. What is not such a kernel is refused, saying why.
func TestVmlinux(t *testing.T) {
	ctx := context.Background()
	kernels, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(kernels) == 0 {
		t.Skip("no kernel in /boot (make deps installs linux-image-amd64)")
	}
	raw, err := os.ReadFile(kernels[0])
	if err != nil {
		t.Fatal(err)
	}
	elfImage, err := vmlinux(ctx, raw)
	if err != nil {
		t.Fatalf("%s: %v", kernels[0], err)
	}
	if !bytes.HasPrefix(elfImage, []byte("\x7fELF")) || len(elfImage) < len(raw) {
		t.Fatalf("%s: %d bytes that are not its ELF image", kernels[0], len(elfImage))
	}

	var gz bytes.Buffer
	w, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	w.Write(elfImage)
	w.Close()
	enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	zs := enc.EncodeAll(elfImage, nil)
	for name, payload := range map[string][]byte{"gzip": gz.Bytes(), "zstd": zs} {
		got, err := vmlinux(ctx, bzImage(payload, len(elfImage)))
		if err != nil || !bytes.Equal(got, elfImage) {
			t.Errorf("%s: %d bytes, %v", name, len(got), err)
		}
	}

	var notELF bytes.Buffer
	w = gzip.NewWriter(&notELF)
	w.Write([]byte("not a kernel"))
	w.Close()
	for _, c := range []struct {
		name, want string
		b          []byte
	}{
		{"not a bzImage", "not a bzImage", []byte("MZ nothing here")},
		{"payload outside the file", "outside the file", raw[:len(raw)/2]},
		{"unknown compressor", "does not decompress", bzImage([]byte("BZh91AY&SY"), 100)},
		{"wrong size", "the kernel says", bzImage(gz.Bytes(), len(elfImage)+1)},
		{"not an ELF image", "not an ELF image", bzImage(notELF.Bytes(), len("not a kernel"))},
		{"truncated stream", "payload", bzImage(gz.Bytes()[:gz.Len()/2], len(elfImage))},
	} {
		if _, err := vmlinux(ctx, c.b); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	// An ELF image without the PVH note (its notes cut out).
	noPVH := bytes.Clone(elfImage)
	for i := 0; ; {
		j := bytes.Index(noPVH[i:], []byte("Xen\x00"))
		if j < 0 {
			break
		}
		copy(noPVH[i+j:], "Nix\x00")
		i += j + 4
	}
	if err := hasPVH(noPVH); err == nil || !strings.Contains(err.Error(), "no PVH entry") {
		t.Errorf("without its notes: %v", err)
	}
}
