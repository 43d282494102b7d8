package harebox

import (
	"context"
	"errors"
	"io"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/sandbox"
)

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

// WriteFile streams r into path in the sandbox. The file appears whole or
// not at all; a file larger than the engine's limit is refused.
func (e *Engine) WriteFile(ctx context.Context, id, path string, r io.Reader, o sandbox.WriteOptions) (_ *sandbox.FileInfo, err error) {
	defer e.audited(ctx, "writeFile", id, &err)
	if o.Mode > 0o7777 {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "mode", "must be at most 07777")
	}
	_, c, err := e.agentFor(ctx, "writeFile", id)
	if err != nil {
		return nil, err
	}
	fi, err := c.WriteFile(ctx, path, &limitReader{r: r, n: e.opts.MaxFileBytes}, agentclient.WriteOptions{Mode: o.Mode, Owner: o.Owner, MakeParents: o.MakeParents})
	if errors.Is(err, errTooLarge) {
		return nil, sandbox.Errorf(sandbox.ErrTooLarge, "", "file is larger than the %d-byte limit", e.opts.MaxFileBytes)
	}
	if err != nil {
		return nil, err
	}
	return fileInfo(fi), nil
}

// ReadFile copies a file from the sandbox into w. Files larger than the
// engine's limit are refused before anything is written.
func (e *Engine) ReadFile(ctx context.Context, id, path string, w io.Writer) (_ int64, err error) {
	defer e.audited(ctx, "readFile", id, &err)
	_, c, err := e.agentFor(ctx, "readFile", id)
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
	if fi.Size > e.opts.MaxFileBytes {
		return 0, sandbox.Errorf(sandbox.ErrTooLarge, "path", "%s is %d bytes, over the %d-byte limit", path, fi.Size, e.opts.MaxFileBytes)
	}
	// The file may grow between stat and read: the limit holds anyway.
	n, err := c.ReadFile(ctx, path, w, 0, e.opts.MaxFileBytes)
	if err != nil {
		return n, err
	}
	return n, nil
}

// StatFile describes a path in the sandbox.
func (e *Engine) StatFile(ctx context.Context, id, path string) (*sandbox.FileInfo, error) {
	_, c, err := e.agentFor(ctx, "statFile", id)
	if err != nil {
		return nil, err
	}
	fi, err := c.Stat(ctx, path)
	if err != nil {
		return nil, err
	}
	return fileInfo(fi), nil
}

// ListFiles lists a directory in the sandbox and its subdirectories down
// to depth levels (0 or 1: the directory's entries alone).
func (e *Engine) ListFiles(ctx context.Context, id, path string, depth int) (_ []sandbox.FileInfo, _ bool, err error) {
	defer e.audited(ctx, "listFiles", id, &err)
	if depth < 0 || depth > sandbox.MaxListDepth {
		return nil, false, sandbox.Errorf(sandbox.ErrInvalid, "depth", "must be from 0 to %d", sandbox.MaxListDepth)
	}
	_, c, err := e.agentFor(ctx, "listFiles", id)
	if err != nil {
		return nil, false, err
	}
	list, truncated, err := c.ListTree(ctx, path, depth, 0)
	if err != nil {
		return nil, false, err
	}
	out := make([]sandbox.FileInfo, len(list))
	for i, fi := range list {
		out[i] = *fileInfo(fi)
	}
	return out, truncated, nil
}

// Mkdir creates a directory and its parents in the sandbox, owned by
// owner ("user", "root" or "name:group"; empty means the default user).
func (e *Engine) Mkdir(ctx context.Context, id, path string, mode uint32, owner string) (_ *sandbox.FileInfo, err error) {
	defer e.audited(ctx, "mkdir", id, &err)
	_, c, err := e.agentFor(ctx, "mkdir", id)
	if err != nil {
		return nil, err
	}
	fi, err := c.Mkdir(ctx, path, mode, owner)
	if err != nil {
		return nil, err
	}
	return fileInfo(fi), nil
}

// RemoveFile removes a path in the sandbox (directories with recursive).
func (e *Engine) RemoveFile(ctx context.Context, id, path string, recursive bool) (err error) {
	defer e.audited(ctx, "removeFile", id, &err)
	_, c, err := e.agentFor(ctx, "removeFile", id)
	if err != nil {
		return err
	}
	if err := c.Remove(ctx, path, recursive); err != nil {
		return err
	}
	return nil
}

// MoveFile renames a file or directory in the sandbox (rename(2): within
// one file system, replacing a file at to).
func (e *Engine) MoveFile(ctx context.Context, id, from, to string) (_ *sandbox.FileInfo, err error) {
	defer e.audited(ctx, "moveFile", id, &err)
	_, c, err := e.agentFor(ctx, "moveFile", id)
	if err != nil {
		return nil, err
	}
	fi, err := c.Rename(ctx, from, to)
	if err != nil {
		return nil, err
	}
	return fileInfo(fi), nil
}

// WatchDir watches a directory in the sandbox (and, recursive, its
// subdirectories) until the watcher is closed or ctx ends. A watch shows
// the names in a directory as a listing does: it is authorized and
// audited (when it starts) as listFiles.
func (e *Engine) WatchDir(ctx context.Context, id, path string, recursive bool) (_ sandbox.Watcher, err error) {
	defer e.audited(ctx, "listFiles", id, &err)
	_, c, err := e.agentFor(ctx, "listFiles", id)
	if err != nil {
		return nil, err
	}
	w, err := c.Watch(ctx, path, recursive)
	if err != nil {
		return nil, err
	}
	return watcher{w}, nil
}

// watcher is an agent's watch as the engine's sandbox.Watcher.
type watcher struct{ *agentclient.Watcher }

func (w watcher) Next() (sandbox.FileEvent, error) {
	ev, err := w.Watcher.Next()
	return sandbox.FileEvent{Path: ev.Path, Op: string(ev.Op), Dropped: ev.Dropped}, err
}

func fileInfo(fi agentclient.FileInfo) *sandbox.FileInfo {
	v := sandbox.FileInfo(fi)
	return &v
}
