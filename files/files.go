// Package files reads and writes the files of running sandboxes through
// their guest agents: whole files streamed in and out under a size limit,
// stat, listings down to a depth, directories, renames, removals and
// watches.
//
// Every call is authorized on its sandbox for the principal in the
// context and (all but a stat) recorded in the audit log, as the
// engine's own calls are. The engine gives the service its running
// sandboxes' agents (Sandboxes), with the agent's errors translated into
// kinds.
package files

import (
	"context"
	"errors"
	"io"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/sandbox"
)

// Agent is what the service needs of a sandbox's agent (agentclient.Client's
// file calls).
type Agent interface {
	WriteFile(ctx context.Context, path string, r io.Reader, o agentclient.WriteOptions) (agentclient.FileInfo, error)
	ReadFile(ctx context.Context, path string, w io.Writer, offset, limit int64) (int64, error)
	Stat(ctx context.Context, path string) (agentclient.FileInfo, error)
	ListTree(ctx context.Context, path string, depth, limit int) ([]agentclient.FileInfo, bool, error)
	Rename(ctx context.Context, from, to string) (agentclient.FileInfo, error)
	Mkdir(ctx context.Context, path string, mode uint32, owner string) (agentclient.FileInfo, error)
	Remove(ctx context.Context, path string, recursive bool) error
	Watch(ctx context.Context, dir string, recursive bool) (*agentclient.Watcher, error)
}

// Sandboxes is what the service needs of the sandboxes (the engine).
type Sandboxes interface {
	// Check authorizes action on sandbox id for the principal in ctx. A
	// sandbox the principal may not see is ErrNotFound, exactly like a
	// missing one.
	Check(ctx context.Context, action, id string) error
	// Running returns the agent of sandbox id, which must be running
	// (the caller has authorized the call); its errors are sandbox
	// errors.
	Running(ctx context.Context, id string) (Agent, error)
	// AccountOf is the account sandbox id belongs to, for its audit
	// entries ("" when there is no such sandbox).
	AccountOf(ctx context.Context, id string) string
}

// Auditor records a call, and how it ended, in the audit log.
type Auditor interface {
	Record(ctx context.Context, action, accountID, target string, err error)
}

// Options are a Service's parts.
type Options struct {
	Sandboxes Sandboxes
	Audit     Auditor
	// MaxFileBytes bounds one file written or read; default
	// DefaultMaxFileBytes.
	MaxFileBytes int64
}

// DefaultMaxFileBytes is Options.MaxFileBytes's default.
const DefaultMaxFileBytes = 256 << 20

// Service reads and writes the sandboxes' files. It is safe for
// concurrent use.
type Service struct{ o Options }

// New returns a Service.
func New(o Options) *Service {
	if o.MaxFileBytes <= 0 {
		o.MaxFileBytes = DefaultMaxFileBytes
	}
	return &Service{o: o}
}

// audited records, when a call ends, what the principal in ctx did to
// sandbox id (and how it ended) in the audit log.
func (s *Service) audited(ctx context.Context, action, id string, err *error) {
	s.o.Audit.Record(ctx, action, s.o.Sandboxes.AccountOf(ctx, id), id, *err)
}

// agent authorizes action on sandbox id and returns its agent.
func (s *Service) agent(ctx context.Context, action, id string) (Agent, error) {
	if err := s.o.Sandboxes.Check(ctx, action, id); err != nil {
		return nil, err
	}
	return s.o.Sandboxes.Running(ctx, id)
}

// errTooLarge is returned by limitReader past its limit.
var errTooLarge = errors.New("too large")

// limitReader fails (rather than silently stopping) past n bytes, so an
// oversized upload is refused instead of truncated.
type limitReader struct {
	r io.Reader
	n int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n < 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > l.n+1 {
		p = p[:l.n+1]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	if l.n < 0 {
		return n, errTooLarge
	}
	return n, err
}

// Write streams r into path in sandbox id. The file appears whole or not
// at all; a file larger than the limit is refused.
func (s *Service) Write(ctx context.Context, id, path string, r io.Reader, o sandbox.WriteOptions) (_ *sandbox.FileInfo, err error) {
	defer s.audited(ctx, "writeFile", id, &err)
	if o.Mode > 0o7777 {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "mode", "must be at most 07777")
	}
	c, err := s.agent(ctx, "writeFile", id)
	if err != nil {
		return nil, err
	}
	fi, err := c.WriteFile(ctx, path, &limitReader{r: r, n: s.o.MaxFileBytes}, agentclient.WriteOptions{Mode: o.Mode, Owner: o.Owner, MakeParents: o.MakeParents})
	if errors.Is(err, errTooLarge) {
		return nil, sandbox.Errorf(sandbox.ErrTooLarge, "", "file is larger than the %d-byte limit", s.o.MaxFileBytes)
	}
	if err != nil {
		return nil, err
	}
	return info(fi), nil
}

// Read copies a file of sandbox id into w. A file larger than the limit
// is refused before anything is written.
func (s *Service) Read(ctx context.Context, id, path string, w io.Writer) (_ int64, err error) {
	defer s.audited(ctx, "readFile", id, &err)
	c, err := s.agent(ctx, "readFile", id)
	if err != nil {
		return 0, err
	}
	fi, err := c.Stat(ctx, path)
	if err != nil {
		return 0, err
	}
	if fi.Type != "file" {
		return 0, sandbox.Errorf(sandbox.ErrInvalid, "path", "%s is a %s, not a regular file", path, fi.Type)
	}
	if fi.Size > s.o.MaxFileBytes {
		return 0, sandbox.Errorf(sandbox.ErrTooLarge, "path", "%s is %d bytes, over the %d-byte limit", path, fi.Size, s.o.MaxFileBytes)
	}
	// The file may grow between stat and read: the limit holds anyway.
	return c.ReadFile(ctx, path, w, 0, s.o.MaxFileBytes)
}

// Stat describes a path in sandbox id.
func (s *Service) Stat(ctx context.Context, id, path string) (*sandbox.FileInfo, error) {
	c, err := s.agent(ctx, "statFile", id)
	if err != nil {
		return nil, err
	}
	fi, err := c.Stat(ctx, path)
	if err != nil {
		return nil, err
	}
	return info(fi), nil
}

// List lists a directory of sandbox id and its subdirectories down to
// depth levels (0 or 1: the directory's entries alone).
func (s *Service) List(ctx context.Context, id, path string, depth int) (_ []sandbox.FileInfo, _ bool, err error) {
	defer s.audited(ctx, "listFiles", id, &err)
	if depth < 0 || depth > sandbox.MaxListDepth {
		return nil, false, sandbox.Errorf(sandbox.ErrInvalid, "depth", "must be from 0 to %d", sandbox.MaxListDepth)
	}
	c, err := s.agent(ctx, "listFiles", id)
	if err != nil {
		return nil, false, err
	}
	list, truncated, err := c.ListTree(ctx, path, depth, 0)
	if err != nil {
		return nil, false, err
	}
	out := make([]sandbox.FileInfo, len(list))
	for i, fi := range list {
		out[i] = *info(fi)
	}
	return out, truncated, nil
}

// Mkdir creates a directory and its parents in sandbox id, owned by
// owner ("user", "root" or "name:group"; empty means the default user).
func (s *Service) Mkdir(ctx context.Context, id, path string, mode uint32, owner string) (_ *sandbox.FileInfo, err error) {
	defer s.audited(ctx, "mkdir", id, &err)
	c, err := s.agent(ctx, "mkdir", id)
	if err != nil {
		return nil, err
	}
	fi, err := c.Mkdir(ctx, path, mode, owner)
	if err != nil {
		return nil, err
	}
	return info(fi), nil
}

// Remove removes a path in sandbox id (a directory with recursive).
func (s *Service) Remove(ctx context.Context, id, path string, recursive bool) (err error) {
	defer s.audited(ctx, "removeFile", id, &err)
	c, err := s.agent(ctx, "removeFile", id)
	if err != nil {
		return err
	}
	return c.Remove(ctx, path, recursive)
}

// Move renames a file or directory in sandbox id (rename(2): within one
// file system, replacing a file at to).
func (s *Service) Move(ctx context.Context, id, from, to string) (_ *sandbox.FileInfo, err error) {
	defer s.audited(ctx, "moveFile", id, &err)
	c, err := s.agent(ctx, "moveFile", id)
	if err != nil {
		return nil, err
	}
	fi, err := c.Rename(ctx, from, to)
	if err != nil {
		return nil, err
	}
	return info(fi), nil
}

// Watch watches a directory of sandbox id (and, recursive, its
// subdirectories) until the watcher is closed or ctx ends. A watch shows
// the names in a directory as a listing does: it is authorized and
// audited (when it starts) as listFiles.
func (s *Service) Watch(ctx context.Context, id, path string, recursive bool) (_ sandbox.Watcher, err error) {
	defer s.audited(ctx, "listFiles", id, &err)
	c, err := s.agent(ctx, "listFiles", id)
	if err != nil {
		return nil, err
	}
	w, err := c.Watch(ctx, path, recursive)
	if err != nil {
		return nil, err
	}
	return watcher{w}, nil
}

// watcher is an agent's watch as a sandbox.Watcher.
type watcher struct{ *agentclient.Watcher }

func (w watcher) Next() (sandbox.FileEvent, error) {
	ev, err := w.Watcher.Next()
	return sandbox.FileEvent{Path: ev.Path, Op: string(ev.Op), Dropped: ev.Dropped}, err
}

func info(fi agentclient.FileInfo) *sandbox.FileInfo {
	v := sandbox.FileInfo(fi)
	return &v
}
