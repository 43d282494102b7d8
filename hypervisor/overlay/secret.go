package overlay

import (
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
)

// Secrets hands keys to one QEMU process (qemu-img or the VMM) through
// inherited pipes: the key is never in argv (visible in /proc), in the
// environment or in a file. Each key becomes a QEMU secret object that
// reads /dev/fd/N to its end.
type Secrets struct {
	args  []string
	files []*os.File
}

// Passphrase is the LUKS passphrase for a key: QEMU wants UTF-8, so the
// key's base64.
func Passphrase(key []byte) string { return base64.StdEncoding.EncodeToString(key) }

// Add makes a secret object id holding key's passphrase.
func (s *Secrets) Add(id string, key []byte) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	// A pipe holds 64 KiB; the passphrase is 44 bytes, so this does not
	// block, and QEMU sees EOF after it.
	_, err = w.WriteString(Passphrase(key))
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		r.Close()
		return fmt.Errorf("overlay: key pipe: %w", err)
	}
	fd := 3 + len(s.files)
	s.files = append(s.files, r)
	s.args = append(s.args, "--object", fmt.Sprintf("secret,id=%s,file=/dev/fd/%d,format=raw", id, fd))
	return nil
}

// Args returns the --object arguments: after the subcommand for qemu-img,
// anywhere for qemu-io and the VMM (which accept one or two dashes).
func (s *Secrets) Args() []string { return s.args }

// Apply gives cmd the pipes; call it before cmd.Start and Close after.
func (s *Secrets) Apply(cmd *exec.Cmd) { cmd.ExtraFiles = append(cmd.ExtraFiles[:0:0], s.files...) }

// Close closes the host's ends of the pipes.
func (s *Secrets) Close() {
	for _, f := range s.files {
		f.Close()
	}
	s.files = nil
}
