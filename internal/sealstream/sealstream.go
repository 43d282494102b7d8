// Package sealstream encrypts a byte stream of any length (a VM's memory
// snapshot) in authenticated chunks under a 32-byte key, so that what
// reaches the disk is ciphertext and a truncated, reordered, altered or
// wrongly keyed file is refused instead of read.
//
// Format: a header of magic and a random 32-byte salt; then records of a
// 4-byte big-endian ciphertext length and an AES-256-GCM ciphertext. Each
// file gets its own subkey (HKDF-SHA256 of the key and salt), the nonce is
// the record counter, and the last record is marked in its nonce, so a file
// cut at a record boundary does not pass for a shorter one (the STREAM
// construction of Hoang, Reyhanitabar, Rogaway and Vizár).
package sealstream

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// ChunkSize is the plaintext size of every record but the last.
const ChunkSize = 256 << 10

// KeySize is the key length.
const KeySize = 32

const (
	magic    = "HBSEAL1\n"
	saltSize = 32
	info     = "harebox sealstream v1"
)

// ErrAuth reports a stream that does not decrypt under the key: wrong key,
// altered, truncated or reordered.
var ErrAuth = errors.New("sealstream: stream does not authenticate (wrong key or damaged)")

func newAEAD(key, salt []byte) (cipher.AEAD, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("sealstream: key is %d bytes, want %d", len(key), KeySize)
	}
	sub, err := hkdf.Key(sha256.New, key, salt, info, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(sub)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func nonce(n []byte, counter uint64, last bool) []byte {
	clear(n)
	binary.BigEndian.PutUint64(n[3:11], counter)
	if last {
		n[11] = 1
	}
	return n
}

// Writer seals what is written to it. Close writes the last record; a
// stream without it does not open.
type Writer struct {
	w       io.Writer
	aead    cipher.AEAD
	buf     []byte
	out     []byte
	nonce   []byte
	counter uint64
	closed  bool
}

// NewWriter writes the header to w and returns a Writer sealing under key.
func NewWriter(w io.Writer, key []byte) (*Writer, error) {
	salt := make([]byte, saltSize)
	if _, err := rand.Read(salt); err != nil {
		return nil, err
	}
	aead, err := newAEAD(key, salt)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(append([]byte(magic), salt...)); err != nil {
		return nil, err
	}
	return &Writer{w: w, aead: aead, buf: make([]byte, 0, ChunkSize), nonce: make([]byte, aead.NonceSize())}, nil
}

// Write implements io.Writer.
func (s *Writer) Write(p []byte) (int, error) {
	if s.closed {
		return 0, errors.New("sealstream: write after close")
	}
	n := 0
	for len(p) > 0 {
		if len(s.buf) == ChunkSize {
			// A full buffer is flushed only when more follows, so the
			// last record is always the one Close writes.
			if err := s.flush(false); err != nil {
				return n, err
			}
		}
		k := copy(s.buf[len(s.buf):ChunkSize], p)
		s.buf = s.buf[:len(s.buf)+k]
		p = p[k:]
		n += k
	}
	return n, nil
}

func (s *Writer) flush(last bool) error {
	s.out = s.aead.Seal(append(s.out[:0], 0, 0, 0, 0), nonce(s.nonce, s.counter, last), s.buf, nil)
	binary.BigEndian.PutUint32(s.out, uint32(len(s.out)-4))
	s.counter++
	s.buf = s.buf[:0]
	_, err := s.w.Write(s.out)
	return err
}

// Close writes the last record. It does not close the underlying writer.
func (s *Writer) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	return s.flush(true)
}

// Reader opens a sealed stream.
type Reader struct {
	r       io.Reader
	aead    cipher.AEAD
	nonce   []byte
	rec     []byte
	pbuf    []byte // plaintext; not rec, since a failed Open clears its output
	plain   []byte
	counter uint64
	done    bool
	err     error
}

// NewReader reads the header from r and returns a Reader opening under key.
func NewReader(r io.Reader, key []byte) (*Reader, error) {
	hdr := make([]byte, len(magic)+saltSize)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, fmt.Errorf("sealstream: header: %w", err)
	}
	if string(hdr[:len(magic)]) != magic {
		return nil, errors.New("sealstream: not a sealed stream")
	}
	aead, err := newAEAD(key, hdr[len(magic):])
	if err != nil {
		return nil, err
	}
	return &Reader{r: r, aead: aead, nonce: make([]byte, aead.NonceSize())}, nil
}

// Read implements io.Reader. It returns ErrAuth for a damaged stream and
// io.EOF only after the last record authenticated.
func (s *Reader) Read(p []byte) (int, error) {
	for len(s.plain) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		if s.done {
			return 0, io.EOF
		}
		s.err = s.next()
	}
	n := copy(p, s.plain)
	s.plain = s.plain[n:]
	return n, nil
}

func (s *Reader) next() error {
	var l [4]byte
	if _, err := io.ReadFull(s.r, l[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: ends before its last record", ErrAuth)
		}
		return err
	}
	n := int(binary.BigEndian.Uint32(l[:]))
	if n < s.aead.Overhead() || n > ChunkSize+s.aead.Overhead() {
		return fmt.Errorf("%w: record of %d bytes", ErrAuth, n)
	}
	if cap(s.rec) < n {
		s.rec = make([]byte, n)
	}
	s.rec = s.rec[:n]
	if _, err := io.ReadFull(s.r, s.rec); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: cut inside a record", ErrAuth)
		}
		return err
	}
	// A record is either a middle one (full size) or the last one.
	plain, err := s.aead.Open(s.pbuf[:0], nonce(s.nonce, s.counter, false), s.rec, nil)
	if err != nil {
		plain, err = s.aead.Open(s.pbuf[:0], nonce(s.nonce, s.counter, true), s.rec, nil)
		if err != nil {
			return ErrAuth
		}
		s.done = true
	} else if len(plain) != ChunkSize {
		return fmt.Errorf("%w: short middle record", ErrAuth)
	}
	s.counter++
	s.pbuf = plain
	s.plain = plain
	return nil
}
