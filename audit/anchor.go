package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/harebox/harebox/internal/fsync"
	"github.com/harebox/harebox/store"
)

// Anchor keeps a copy of every checkpoint outside the database, where a
// writer of the database alone cannot rewrite it: Verify compares the
// chain against it, so a tail cut together with its checkpoints shows.
type Anchor interface {
	// Put keeps c, durably, before it returns.
	Put(ctx context.Context, c *store.AuditCheckpoint) error
	// Checkpoints returns every checkpoint kept, oldest first.
	Checkpoints(ctx context.Context) ([]*store.AuditCheckpoint, error)
	// String names the anchor for a report ("file:PATH", "none").
	String() string
}

// None keeps nothing: the chain's end is only as safe as the database.
var None Anchor = none{}

type none struct{}

func (none) Put(context.Context, *store.AuditCheckpoint) error { return nil }
func (none) Checkpoints(context.Context) ([]*store.AuditCheckpoint, error) {
	return nil, nil
}
func (none) String() string { return "none" }

// ParseAnchor reads an anchor's setting: "none", or "file:PATH" (see
// OpenFileAnchor).
func ParseAnchor(v string) (Anchor, error) {
	switch {
	case v == "none":
		return None, nil
	case strings.HasPrefix(v, "file:") && filepath.IsAbs(v[len("file:"):]):
		return OpenFileAnchor(v[len("file:"):])
	}
	return nil, fmt.Errorf("audit anchor %q: want none or file:/ABSOLUTE/PATH", v)
}

// maxAnchorLine bounds one line of an anchor file (a checkpoint is about
// 250 bytes).
const maxAnchorLine = 4096

// FileAnchor appends each checkpoint to a file as one JSON line (seq,
// hash, time, sig), synced before Put returns. The file is only ever
// opened to append: made append-only (chattr +a), owned by another user,
// or shipped off the host by a log collector, it survives a rewrite of
// the database and of the data directory.
type FileAnchor struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

// OpenFileAnchor opens (creates, mode 0600) the anchor file at path.
func OpenFileAnchor(path string) (*FileAnchor, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit anchor: %w", err)
	}
	// The file's name survives a crash too.
	fsync.Dir(filepath.Dir(path))
	return &FileAnchor{path: path, f: f}, nil
}

// Put implements Anchor: one write of one line, then fsync.
func (a *FileAnchor) Put(_ context.Context, c *store.AuditCheckpoint) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.f.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("audit anchor %s: %w", a.path, err)
	}
	if err := a.f.Sync(); err != nil {
		return fmt.Errorf("audit anchor %s: %w", a.path, err)
	}
	return nil
}

// Checkpoints implements Anchor. A last line without its newline is a
// write that a crash cut short, and is left out; any other line that does
// not read is an error.
func (a *FileAnchor) Checkpoints(context.Context) ([]*store.AuditCheckpoint, error) {
	b, err := os.ReadFile(a.path)
	if err != nil {
		return nil, fmt.Errorf("audit anchor: %w", err)
	}
	if i := bytes.LastIndexByte(b, '\n'); i+1 < len(b) {
		b = b[:i+1]
	}
	var out []*store.AuditCheckpoint
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, maxAnchorLine)
	for n := 1; sc.Scan(); n++ {
		c := &store.AuditCheckpoint{}
		if err := json.Unmarshal(sc.Bytes(), c); err != nil {
			return nil, fmt.Errorf("audit anchor %s line %d: %w", a.path, n, err)
		}
		out = append(out, c)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("audit anchor %s: %w", a.path, err)
	}
	return out, nil
}

// String implements Anchor.
func (a *FileAnchor) String() string { return "file:" + a.path }

// Close closes the file.
func (a *FileAnchor) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.f.Close()
}
