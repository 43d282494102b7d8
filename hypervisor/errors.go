package hypervisor

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
)

// Portable error kinds. Backends wrap them with %w (or return an *Error) so
// that callers on either side of the plugin boundary can use errors.Is.
var (
	ErrNotFound    = errors.New("not found")
	ErrInvalid     = errors.New("invalid argument")
	ErrUnsupported = errors.New("unsupported")
	ErrExists      = errors.New("already exists")
	ErrState       = errors.New("invalid state")
	ErrUnavailable = errors.New("backend unavailable")
)

// Kinds lists the portable kinds, in the order the plugin encodes them.
var Kinds = []error{ErrNotFound, ErrInvalid, ErrUnsupported, ErrExists, ErrState, ErrUnavailable}

// KindOf returns the portable kind err wraps, or nil.
func KindOf(err error) error {
	for _, k := range Kinds {
		if errors.Is(err, k) {
			return k
		}
	}
	return nil
}

// Error pairs a portable kind with a message.
type Error struct {
	Kind error
	Msg  string
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Kind }

// Errorf formats a message that wraps kind.
func Errorf(kind error, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

var idRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// ValidID reports whether id is usable as a machine ID.
func ValidID(id string) bool { return idRE.MatchString(id) }

// Validate checks the parts of a spec every backend relies on.
func (s *Spec) Validate() error {
	switch {
	case !ValidID(s.ID):
		return Errorf(ErrInvalid, "spec.id %q: want 1-64 of [a-zA-Z0-9_-]", s.ID)
	case s.VCPUs < 1 || s.VCPUs > 64:
		return Errorf(ErrInvalid, "spec.vcpus %d: want 1-64", s.VCPUs)
	case s.MemoryMB < 64 || s.MemoryMB > 256<<10:
		return Errorf(ErrInvalid, "spec.memory_mb %d: want 64-262144", s.MemoryMB)
	case s.Kernel == "" || !filepath.IsAbs(s.Kernel):
		return Errorf(ErrInvalid, "spec.kernel %q: want an absolute path", s.Kernel)
	case s.Initrd != "" && !filepath.IsAbs(s.Initrd):
		return Errorf(ErrInvalid, "spec.initrd %q: want an absolute path", s.Initrd)
	case s.StateDir == "" || !filepath.IsAbs(s.StateDir):
		return Errorf(ErrInvalid, "spec.state_dir %q: want an absolute path", s.StateDir)
	case len(s.Disks) > 8:
		return Errorf(ErrInvalid, "spec.disks: at most 8")
	}
	if err := s.ValidKeys(); err != nil {
		return err
	}
	for i, d := range s.Disks {
		if !filepath.IsAbs(d.Path) {
			return Errorf(ErrInvalid, "spec.disks[%d].path %q: want an absolute path", i, d.Path)
		}
		switch d.Format {
		case "", "raw", "qcow2":
		default:
			return Errorf(ErrInvalid, "spec.disks[%d].format %q: want raw or qcow2", i, d.Format)
		}
	}
	if n := s.Network; n != nil {
		if !regexp.MustCompile(`^[a-zA-Z0-9_.-]{1,15}$`).MatchString(n.Tap) {
			return Errorf(ErrInvalid, "spec.network.tap %q: want a device name", n.Tap)
		}
		if !regexp.MustCompile(`^([0-9a-f]{2}:){5}[0-9a-f]{2}$`).MatchString(n.MAC) {
			return Errorf(ErrInvalid, "spec.network.mac %q: want lower-case aa:bb:cc:dd:ee:ff", n.MAC)
		}
	}
	return nil
}

// ValidKeys checks the lengths of a spec's keys; Validate calls it, and
// Restore on its partial spec.
func (s *Spec) ValidKeys() error {
	for _, k := range []struct {
		name string
		key  []byte
	}{{"data_key", s.DataKey}, {"snapshot_key", s.SnapshotKey}} {
		if len(k.key) != 0 && len(k.key) != KeySize {
			return Errorf(ErrInvalid, "spec.%s: %d bytes, want %d", k.name, len(k.key), KeySize)
		}
	}
	return nil
}
