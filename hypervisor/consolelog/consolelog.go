// Package consolelog keeps a VM's console as a file of records encrypted
// to a public key (an age X25519 recipient), so that whichever process
// drains the console (a backend plugin, restarted or not) can append to
// it without holding any secret, and only the holder of the identity (the
// engine, whose copy is sealed under the sandbox's data key) can read it.
//
// A record is a 4-byte big-endian length and one age message. The file is
// bounded: an append that would pass the bound starts the file over.
// Reading checks every length against the file and MaxRecord; a record
// that does not decrypt is an error, not skipped.
package consolelog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"filippo.io/age"
)

// MaxBytes is the default bound of a console log file.
const MaxBytes = 8 << 20

// MaxRecord bounds one record's plaintext.
const MaxRecord = 1 << 20

// NewIdentity makes a fresh identity; its Recipient is what the backend
// gets.
func NewIdentity() (*age.X25519Identity, error) { return age.GenerateX25519Identity() }

// Appender appends records to one console log.
type Appender struct {
	path string
	to   age.Recipient
	max  int64
}

// NewAppender checks the recipient (an "age1..." string) and returns an
// appender to path bounded at max bytes (MaxBytes if 0).
func NewAppender(path, recipient string, max int64) (*Appender, error) {
	r, err := age.ParseX25519Recipient(recipient)
	if err != nil {
		return nil, fmt.Errorf("consolelog: recipient: %w", err)
	}
	if max <= 0 {
		max = MaxBytes
	}
	return &Appender{path: path, to: r, max: max}, nil
}

// Append encrypts p (at most MaxRecord bytes at a time) and appends it.
func (a *Appender) Append(p []byte) error {
	for len(p) > 0 {
		n := min(len(p), MaxRecord)
		if err := a.append(p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

func (a *Appender) append(p []byte) error {
	var buf bytes.Buffer
	buf.Write([]byte{0, 0, 0, 0})
	w, err := age.Encrypt(&buf, a.to)
	if err != nil {
		return err
	}
	if _, err := w.Write(p); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	rec := buf.Bytes()
	binary.BigEndian.PutUint32(rec, uint32(len(rec)-4))
	f, err := os.OpenFile(a.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size()+int64(len(rec)) > a.max {
		// Start over rather than grow past the bound (O_APPEND writes
		// land at the new end).
		if err := f.Truncate(0); err != nil {
			return err
		}
	}
	// One write per record: a concurrent appender cannot split it.
	_, err = f.Write(rec)
	return err
}

// ErrCorrupt reports a log whose framing does not hold.
var ErrCorrupt = errors.New("consolelog: corrupt log")

// Tail decrypts the end of the log at path: at least the last n bytes of
// console output where the log has them. A missing file is empty.
func Tail(path string, id age.Identity, n int) ([]byte, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// Frame first (cheap), then decrypt from the end until n bytes.
	var recs [][]byte
	for off := 0; off < len(b); {
		if len(b)-off < 4 {
			return nil, fmt.Errorf("%w: a cut length at %d", ErrCorrupt, off)
		}
		l := int(binary.BigEndian.Uint32(b[off:]))
		if l > MaxRecord+64<<10 || l > len(b)-off-4 {
			return nil, fmt.Errorf("%w: a record of %d bytes at %d", ErrCorrupt, l, off)
		}
		recs = append(recs, b[off+4:off+4+l])
		off += 4 + l
	}
	var out [][]byte
	total := 0
	for i := len(recs) - 1; i >= 0 && total < n; i-- {
		r, err := age.Decrypt(bytes.NewReader(recs[i]), id)
		if err != nil {
			return nil, fmt.Errorf("consolelog: record %d: %w", i, err)
		}
		p, err := io.ReadAll(io.LimitReader(r, MaxRecord+1))
		if err != nil {
			return nil, fmt.Errorf("consolelog: record %d: %w", i, err)
		}
		out = append(out, p)
		total += len(p)
	}
	var all []byte
	for i := len(out) - 1; i >= 0; i-- {
		all = append(all, out[i]...)
	}
	if len(all) > n {
		all = all[len(all)-n:]
	}
	return all, nil
}
