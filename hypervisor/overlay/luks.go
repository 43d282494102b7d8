package overlay

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/crypto/xts"
)

// Making a LUKS overlay with qemu-img costs QEMU's PBKDF benchmark (about
// 2.4 s here, and it fails now and then on kernels whose thread CPU clock
// is coarse). For a passphrase that is itself a random 256-bit key the
// stretching buys nothing, so Templates pays for qemu-img once per base
// and size: it keeps that empty overlay in memory and gives every new
// overlay a copy with a fresh LUKS header (a new master key, salts and
// UUID, and key slot 0 under the new passphrase), written the way the
// LUKS1 on-disk format specification says, with the layout (offsets,
// stripes, cipher) qemu-img chose. No data was ever written under the
// template's master key, and the copy keeps nothing of it.

// Templates makes encrypted overlays from per-base templates.
type Templates struct {
	QEMUImg string

	mu sync.Mutex
	m  map[string]*template
}

type template struct {
	data           []byte
	hdrOff, hdrLen int64
}

// ErrTemplate reports a template this code cannot rewrite; the caller
// makes the overlay with qemu-img instead.
var ErrTemplate = errors.New("overlay: unexpected LUKS template")

// Create makes an encrypted overlay like CreateEncrypted over a base that
// is not itself encrypted.
func (t *Templates) Create(ctx context.Context, base, baseFormat, path string, sizeBytes int64, key []byte) error {
	tpl, err := t.get(ctx, base, baseFormat, filepath.Dir(path), sizeBytes)
	if err == nil {
		err = tpl.write(path, Passphrase(key))
	}
	if errors.Is(err, ErrTemplate) {
		os.Remove(path)
		return CreateEncrypted(ctx, t.QEMUImg, base, baseFormat, path, sizeBytes, key, nil)
	}
	return err
}

func (t *Templates) get(ctx context.Context, base, baseFormat, scratch string, sizeBytes int64) (*template, error) {
	fi, err := os.Stat(base)
	if err != nil {
		return nil, err
	}
	// A rebuilt base (new mtime or size) gets a new template.
	id := fmt.Sprintf("%s\x00%s\x00%d\x00%d\x00%d", base, baseFormat, sizeBytes, fi.Size(), fi.ModTime().UnixNano())
	t.mu.Lock()
	defer t.mu.Unlock()
	if tpl := t.m[id]; tpl != nil {
		return tpl, nil
	}
	sum := sha256.Sum256([]byte(id))
	kept := filepath.Join(filepath.Dir(base), "."+filepath.Base(base)+"."+hex.EncodeToString(sum[:8])+".luks-template")
	tpl, err := loadTemplate(kept)
	if err != nil {
		if tpl, err = t.make(ctx, base, baseFormat, scratch, sizeBytes); err != nil {
			return nil, err
		}
		keep(kept, tpl.data)
	}
	if t.m == nil {
		t.m = map[string]*template{}
	}
	t.m[id] = tpl
	return tpl, nil
}

// make has qemu-img make a template (the benchmark's cost).
func (t *Templates) make(ctx context.Context, base, baseFormat, scratch string, sizeBytes int64) (*template, error) {
	tmp := filepath.Join(scratch, "template-"+strconv.FormatInt(int64(len(t.m)), 10)+".qcow2")
	throwaway := make([]byte, 32)
	rand.Read(throwaway)
	defer os.Remove(tmp)
	if err := CreateEncrypted(ctx, t.QEMUImg, base, baseFormat, tmp, sizeBytes, throwaway, nil); err != nil {
		return nil, err
	}
	return loadTemplate(tmp)
}

func loadTemplate(path string) (*template, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	off, l, err := cryptoHeader(data)
	if err != nil {
		return nil, err
	}
	return &template{data: data, hdrOff: off, hdrLen: l}, nil
}

// keep writes a template to path whole or not at all (processes may race
// to: each writes an equally good one). A directory that cannot be
// written keeps none.
func keep(path string, data []byte) {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp-*")
	if err != nil {
		return
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync() // (renamed only once it is on disk whole)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
}

// write writes a copy of the template with a fresh LUKS header for
// passphrase, keeping the file sparse.
func (tpl *template) write(path, passphrase string) error {
	region := bytes.Clone(tpl.data[tpl.hdrOff : tpl.hdrOff+tpl.hdrLen])
	if err := rekey(region, passphrase); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = writeSparse(f, tpl.data, tpl.hdrOff, region)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

// writeSparse writes data where it is not zero, then region (the new
// header, the same length as the old) over the old one.
func writeSparse(f *os.File, data []byte, regionOff int64, region []byte) error {
	const block = 64 << 10
	zero := make([]byte, block)
	for off := 0; off < len(data); off += block {
		chunk := data[off:min(off+block, len(data))]
		if bytes.Equal(chunk, zero[:len(chunk)]) {
			continue
		}
		if _, err := f.WriteAt(chunk, int64(off)); err != nil {
			return err
		}
	}
	if _, err := f.WriteAt(region, regionOff); err != nil {
		return err
	}
	return f.Truncate(int64(len(data)))
}

// qcow2 and LUKS1 layout constants.
const (
	qcow2Magic       = "QFI\xfb"
	qcow2CryptoLUKS  = 2
	extCryptoHeader  = 0x0537be77
	luksMagic        = "LUKS\xba\xbe"
	luksHeaderSize   = 592
	luksSlotEnabled  = 0x00AC71F3
	luksSlotDisabled = 0x0000DEAD
	luksSector       = 512
	luksIters        = 1000 // QEMU's minimum; see the comment on Templates
)

// cryptoHeader finds the LUKS header region of a qcow2 v3 image.
func cryptoHeader(b []byte) (off, length int64, err error) {
	be := binary.BigEndian
	if len(b) < 104 || string(b[:4]) != qcow2Magic || be.Uint32(b[4:]) != 3 || be.Uint32(b[32:]) != qcow2CryptoLUKS {
		return 0, 0, fmt.Errorf("%w: not a LUKS qcow2 v3 image", ErrTemplate)
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
	return 0, 0, fmt.Errorf("%w: no crypto header extension", ErrTemplate)
}

// rekey rewrites a LUKS1 header region in place: new master key, digest,
// salts and UUID; slot 0 opened by passphrase; the other slots disabled.
func rekey(region []byte, passphrase string) error {
	be := binary.BigEndian
	h := region[:luksHeaderSize]
	str := func(b []byte) string { return string(bytes.TrimRight(b, "\x00")) }
	if string(h[:6]) != luksMagic || be.Uint16(h[6:]) != 1 || str(h[8:40]) != "aes" ||
		str(h[40:72]) != "xts-plain64" || str(h[72:104]) != "sha256" || be.Uint32(h[108:]) != 64 {
		return fmt.Errorf("%w: want LUKS1 aes-xts-plain64 sha256 with a 512-bit key", ErrTemplate)
	}
	slot := func(i int) []byte { return h[208+48*i : 208+48*(i+1)] }
	s0 := slot(0)
	keyOff, stripes := int64(be.Uint32(s0[40:]))*luksSector, int(be.Uint32(s0[44:]))
	const keyLen = 64
	material := keyLen * stripes
	padded := (material + luksSector - 1) / luksSector * luksSector
	if stripes != 4000 || keyOff < luksHeaderSize || keyOff+int64(padded) > int64(len(region)) {
		return fmt.Errorf("%w: key slot 0 layout", ErrTemplate)
	}

	mk := random(keyLen)
	mkSalt := random(32)
	digest, err := pbkdf2.Key(sha256.New, string(mk), mkSalt, luksIters, 20)
	if err != nil {
		return err
	}
	copy(h[112:132], digest)
	copy(h[132:164], mkSalt)
	be.PutUint32(h[164:], luksIters)
	clear(h[168:208])
	copy(h[168:208], newUUID())

	salt := random(32)
	kek, err := pbkdf2.Key(sha256.New, passphrase, salt, luksIters, keyLen)
	if err != nil {
		return err
	}
	split := make([]byte, padded)
	afSplit(split[:material], mk, stripes)
	c, err := xts.NewCipher(aes.NewCipher, kek)
	if err != nil {
		return err
	}
	for i := 0; i < padded/luksSector; i++ {
		sec := split[i*luksSector : (i+1)*luksSector]
		c.Encrypt(sec, sec, uint64(i))
	}
	copy(region[keyOff:], split)
	be.PutUint32(s0[0:], luksSlotEnabled)
	be.PutUint32(s0[4:], luksIters)
	copy(s0[8:40], salt)
	for i := 1; i < 8; i++ {
		s := slot(i)
		be.PutUint32(s[0:], luksSlotDisabled)
		be.PutUint32(s[4:], 0)
		clear(s[8:40])
	}
	return nil
}

// afSplit is LUKS's anti-forensic split of key into stripes blocks: all
// but the last random, each folded in with the SHA-256 diffuser, the last
// the key XOR the fold.
func afSplit(out, key []byte, stripes int) {
	n := len(key)
	d := make([]byte, n)
	for i := 0; i < stripes-1; i++ {
		s := out[i*n : (i+1)*n]
		rand.Read(s)
		for j := range d {
			d[j] ^= s[j]
		}
		diffuse(d)
	}
	last := out[(stripes-1)*n : stripes*n]
	for j := range last {
		last[j] = d[j] ^ key[j]
	}
}

// diffuse replaces each digest-sized block j of b by SHA-256(be32(j) ||
// block), cut to the block's length.
func diffuse(b []byte) {
	for j, off := 0, 0; off < len(b); j, off = j+1, off+sha256.Size {
		end := min(off+sha256.Size, len(b))
		var iv [4]byte
		binary.BigEndian.PutUint32(iv[:], uint32(j))
		h := sha256.New()
		h.Write(iv[:])
		h.Write(b[off:end])
		copy(b[off:end], h.Sum(nil))
	}
}

func random(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func newUUID() []byte {
	u := random(16)
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	return fmt.Appendf(nil, "%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}
