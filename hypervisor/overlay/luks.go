package overlay

import (
	"bytes"
	"crypto/aes"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"

	"golang.org/x/crypto/xts"
)

// qemu-img's create of a LUKS overlay runs QEMU's PBKDF benchmark (about
// 2.4 CPU-s, and it fails now and then on kernels whose thread CPU clock
// is coarse) to choose iteration counts. The passphrase here is itself a
// random 256-bit key, so stretching buys nothing: the file is written
// here instead, an empty qcow2 v3 image (QEMU's docs/interop/qcow2.txt)
// laid out as qemu-img lays one out (header, refcount table, refcount
// block, L1 table, then the LUKS header in the clusters after them), with
// a LUKS1 header (the on-disk format specification) under a fresh master
// key, key slot 0 opened by the passphrase at QEMU's minimum iterations.

// writeEncrypted writes the empty encrypted qcow2 image path (created
// new: it must not exist) of virtual size bytes over backing (in
// backingFormat; none if empty), opened by passphrase.
func writeEncrypted(path, backing, backingFormat string, size int64, passphrase string) error {
	img, err := encryptedImage(backing, backingFormat, size, passphrase)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = writeSparse(f, img)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

// encryptedImage is the whole file writeEncrypted writes.
func encryptedImage(backing, backingFormat string, size int64, passphrase string) ([]byte, error) {
	be := binary.BigEndian
	const (
		cluster    = 1 << qcow2ClusterBits
		l2Covers   = cluster * (cluster / 8) // what an L1 entry maps
		luksLen    = luksPayloadSectors * luksSector
		luksSpan   = (luksLen + cluster - 1) / cluster
		refcounts  = cluster / 2 // 16-bit refcounts in one block
		maxBacking = 1023        // QEMU's limit on a backing file name
	)
	if size <= 0 || size > 1<<50 {
		return nil, fmt.Errorf("overlay: virtual size %d", size)
	}
	if len(backing) > maxBacking || (backing == "") != (backingFormat == "") {
		return nil, fmt.Errorf("overlay: backing file %q (%q)", backing, backingFormat)
	}
	size = (size + luksSector - 1) &^ (luksSector - 1)
	l1Size := (size + l2Covers - 1) / l2Covers
	l1Off := int64(3 * cluster)
	luksOff := l1Off + (l1Size*8+cluster-1)/cluster*cluster
	clusters := luksOff/cluster + luksSpan
	if clusters > refcounts {
		return nil, fmt.Errorf("overlay: virtual size %d needs too large an L1 table", size)
	}
	img := make([]byte, clusters*cluster)

	h := img[:cluster]
	copy(h, qcow2Magic)
	be.PutUint32(h[4:], 3)
	be.PutUint32(h[20:], qcow2ClusterBits)
	be.PutUint64(h[24:], uint64(size))
	be.PutUint32(h[32:], qcow2CryptoLUKS)
	be.PutUint32(h[36:], uint32(l1Size))
	be.PutUint64(h[40:], uint64(l1Off))
	be.PutUint64(h[48:], cluster) // the refcount table, one cluster
	be.PutUint32(h[56:], 1)
	be.PutUint32(h[96:], 4)            // refcount_order: 16-bit refcounts
	be.PutUint32(h[100:], qcow2HdrLen) // (with the compression type, zlib)
	p := qcow2HdrLen
	ext := func(typ uint32, data []byte) {
		be.PutUint32(h[p:], typ)
		be.PutUint32(h[p+4:], uint32(len(data)))
		copy(h[p+8:], data)
		p += 8 + (len(data)+7)&^7
	}
	if backing != "" {
		ext(extBackingFormat, []byte(backingFormat))
	}
	fde := make([]byte, 16)
	be.PutUint64(fde, uint64(luksOff))
	be.PutUint64(fde[8:], luksLen)
	ext(extCryptoHeader, fde)
	ext(0, nil)
	if backing != "" {
		be.PutUint64(h[8:], uint64(p))
		be.PutUint32(h[16:], uint32(len(backing)))
		copy(h[p:], backing)
	}

	be.PutUint64(img[cluster:], 2*cluster) // the table's one block
	for i := range clusters {
		be.PutUint16(img[2*cluster+2*i:], 1) // every cluster of the file is used once
	}

	l := img[luksOff : luksOff+luksLen]
	copy(l, luksMagic)
	be.PutUint16(l[6:], 1)
	copy(l[8:], "aes")
	copy(l[40:], "xts-plain64")
	copy(l[72:], "sha256")
	be.PutUint32(l[104:], luksPayloadSectors)
	be.PutUint32(l[108:], luksKeyBytes)
	for i := range 8 {
		s := l[208+48*i:]
		be.PutUint32(s[40:], uint32(luksSlotsStart+i*luksSlotSectors))
		be.PutUint32(s[44:], luksStripes)
	}
	if err := keys(l, passphrase); err != nil {
		return nil, err
	}
	return img, nil
}

// writeSparse writes data where it is not zero.
func writeSparse(f *os.File, data []byte) error {
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
	return f.Truncate(int64(len(data)))
}

// qcow2 and LUKS1 layout constants.
const (
	qcow2Magic         = "QFI\xfb"
	qcow2ClusterBits   = 16
	qcow2HdrLen        = 112
	qcow2CryptoLUKS    = 2
	extBackingFormat   = 0xe2792aca
	extCryptoHeader    = 0x0537be77
	luksMagic          = "LUKS\xba\xbe"
	luksHeaderSize     = 592
	luksSlotEnabled    = 0x00AC71F3
	luksSlotDisabled   = 0x0000DEAD
	luksSector         = 512
	luksKeyBytes       = 64 // AES-256 in XTS mode
	luksStripes        = 4000
	luksSlotsStart     = 8   // sectors: the header, aligned to 4 KiB
	luksSlotSectors    = 504 // a slot's key material (64 x 4000), aligned to 4 KiB
	luksPayloadSectors = luksSlotsStart + 8*luksSlotSectors
	luksIters          = 1000 // QEMU's minimum: see the top of this file
)

// keys fills in region's LUKS1 header (laid out by encryptedImage): a
// new master key, its digest, salts and UUID; slot 0 opened by
// passphrase; the other slots disabled.
func keys(region []byte, passphrase string) error {
	be := binary.BigEndian
	h := region[:luksHeaderSize]
	slot := func(i int) []byte { return h[208+48*i : 208+48*(i+1)] }
	s0 := slot(0)
	const keyLen, stripes = luksKeyBytes, luksStripes
	keyOff := int64(luksSlotsStart * luksSector)
	material := keyLen * stripes
	padded := (material + luksSector - 1) / luksSector * luksSector

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
