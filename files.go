package harebox

import (
	"context"
	"io"

	"github.com/harebox/harebox/files"
	"github.com/harebox/harebox/sandbox"
)

// A running sandbox's files are package files': it authorizes and audits
// each call on its sandbox and speaks to the sandbox's agent, which the
// runtime lends it. The methods below are the library's names for its
// calls.

// Files reads and writes the sandboxes' files, for the principal in the
// context.
func (e *Engine) Files() *files.Service { return e.files }

// WriteFile streams r into path in the sandbox. The file appears whole or
// not at all; a file larger than the engine's limit is refused.
func (e *Engine) WriteFile(ctx context.Context, id, path string, r io.Reader, o sandbox.WriteOptions) (*sandbox.FileInfo, error) {
	return e.files.Write(ctx, id, path, r, o)
}

// ReadFile copies a file from the sandbox into w. Files larger than the
// engine's limit are refused before anything is written.
func (e *Engine) ReadFile(ctx context.Context, id, path string, w io.Writer) (int64, error) {
	return e.files.Read(ctx, id, path, w)
}

// StatFile describes a path in the sandbox.
func (e *Engine) StatFile(ctx context.Context, id, path string) (*sandbox.FileInfo, error) {
	return e.files.Stat(ctx, id, path)
}

// ListFiles lists a directory in the sandbox and its subdirectories down
// to depth levels (0 or 1: the directory's entries alone).
func (e *Engine) ListFiles(ctx context.Context, id, path string, depth int) ([]sandbox.FileInfo, bool, error) {
	return e.files.List(ctx, id, path, depth)
}

// Mkdir creates a directory and its parents in the sandbox, owned by
// owner ("user", "root" or "name:group"; empty means the default user).
func (e *Engine) Mkdir(ctx context.Context, id, path string, mode uint32, owner string) (*sandbox.FileInfo, error) {
	return e.files.Mkdir(ctx, id, path, mode, owner)
}

// RemoveFile removes a path in the sandbox (directories with recursive).
func (e *Engine) RemoveFile(ctx context.Context, id, path string, recursive bool) error {
	return e.files.Remove(ctx, id, path, recursive)
}

// MoveFile renames a file or directory in the sandbox (rename(2): within
// one file system, replacing a file at to).
func (e *Engine) MoveFile(ctx context.Context, id, from, to string) (*sandbox.FileInfo, error) {
	return e.files.Move(ctx, id, from, to)
}

// WatchDir watches a directory in the sandbox (and, recursive, its
// subdirectories) until the watcher is closed or ctx ends; it is
// authorized and audited (when it starts) as listFiles.
func (e *Engine) WatchDir(ctx context.Context, id, path string, recursive bool) (sandbox.Watcher, error) {
	return e.files.Watch(ctx, id, path, recursive)
}
