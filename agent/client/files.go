package client

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/harebox/harebox/agent/agentpb"
)

// FileInfo describes a file in the guest.
type FileInfo struct {
	Path       string    `json:"path"`
	Name       string    `json:"name"`
	Type       string    `json:"type"` // file, dir, symlink, other
	Size       int64     `json:"size"`
	Mode       uint32    `json:"mode"`
	UID        uint32    `json:"uid"`
	GID        uint32    `json:"gid"`
	ModTime    time.Time `json:"mtime"`
	LinkTarget string    `json:"link_target,omitempty"`
}

// WriteOptions tune WriteFile.
type WriteOptions struct {
	Mode        uint32 // 0 means 0644
	Owner       string // "" means the default user
	MakeParents bool
	Append      bool
}

// WriteFile streams r into path in the guest.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, o WriteOptions) (_ FileInfo, err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	st, err := c.rpc.WriteFile(ctx)
	if err != nil {
		return FileInfo{}, c.wrap("write file", err)
	}
	h := &agentpb.WriteFileHeader{Path: path, Mode: o.Mode, Owner: o.Owner, MakeParents: o.MakeParents, Append: o.Append}
	if err := st.Send(&agentpb.WriteFileRequest{Msg: &agentpb.WriteFileRequest_Header{Header: h}}); err != nil {
		_, rerr := st.CloseAndRecv()
		return FileInfo{}, c.wrap("write file", firstErr(rerr, err))
	}
	buf := make([]byte, 256<<10)
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := st.Send(&agentpb.WriteFileRequest{Msg: &agentpb.WriteFileRequest_Data{Data: buf[:n]}}); err != nil {
				// The agent refused mid-stream; its status says why.
				_, rerr := st.CloseAndRecv()
				return FileInfo{}, c.wrap("write file", firstErr(rerr, err))
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			// Cancelling the stream makes the agent discard the temp file.
			cancel()
			return FileInfo{}, fmt.Errorf("write file: read source: %w", rerr)
		}
	}
	fi, err := st.CloseAndRecv()
	if err != nil {
		return FileInfo{}, c.wrap("write file", err)
	}
	return fileInfo(fi)
}

// ReadFile copies a guest file into w, at most limit bytes (0: no limit
// beyond the caller's writer). It returns the number of bytes copied.
func (c *Client) ReadFile(ctx context.Context, path string, w io.Writer, offset, limit int64) (_ int64, err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	st, err := c.rpc.ReadFile(ctx, &agentpb.ReadFileRequest{Path: path, Offset: offset, Limit: limit})
	if err != nil {
		return 0, c.wrap("read file", err)
	}
	var n int64
	for {
		ch, err := st.Recv()
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, c.wrap("read file", err)
		}
		if len(ch.Data) > MaxChunk {
			return n, fmt.Errorf("%w: read file: chunk of %d bytes", ErrGuest, len(ch.Data))
		}
		if limit > 0 && n+int64(len(ch.Data)) > limit {
			return n, fmt.Errorf("%w: read file: more than the %d bytes asked for", ErrGuest, limit)
		}
		if _, err := w.Write(ch.Data); err != nil {
			return n, fmt.Errorf("read file: %w", err)
		}
		n += int64(len(ch.Data))
	}
}

// Stat describes path (without following a final symlink).
func (c *Client) Stat(ctx context.Context, path string) (_ FileInfo, err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	fi, err := c.rpc.Stat(ctx, &agentpb.PathRequest{Path: path})
	if err != nil {
		return FileInfo{}, c.wrap("stat", err)
	}
	return fileInfo(fi)
}

// ListDir lists a directory; truncated says the listing was capped.
func (c *Client) ListDir(ctx context.Context, path string, limit int) (_ []FileInfo, _ bool, err error) {
	return c.ListTree(ctx, path, 1, limit)
}

// ListTree lists a directory and its subdirectories down to depth levels
// (1: the directory's entries alone), each directory's entries before its
// subdirectories'; truncated says the listing was capped (protocol 4 for
// a depth over 1). Every entry is below path.
func (c *Client) ListTree(ctx context.Context, path string, depth, limit int) (_ []FileInfo, _ bool, err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	if limit <= 0 || limit > MaxListEntries {
		limit = MaxListEntries
	}
	req := &agentpb.ListDirRequest{Path: path, Limit: uint32(limit)}
	if depth > 1 {
		if err := c.need(4, "listing with a depth"); err != nil {
			return nil, false, err
		}
		req.Depth = uint32(depth)
	}
	r, err := c.rpc.ListDir(ctx, req)
	if err != nil {
		return nil, false, c.wrap("list", err)
	}
	if len(r.Entries) > limit {
		return nil, false, fmt.Errorf("%w: list: %d entries, asked for %d", ErrGuest, len(r.Entries), limit)
	}
	out := make([]FileInfo, 0, len(r.Entries))
	for _, e := range r.Entries {
		fi, err := fileInfo(e)
		if err != nil {
			return nil, false, err
		}
		if depth > 1 && !below(path, fi.Path) {
			return nil, false, fmt.Errorf("%w: list: an entry %.64q outside %.64q", ErrGuest, fi.Path, path)
		}
		out = append(out, fi)
	}
	return out, r.Truncated, nil
}

// below reports whether p is a path under dir (a clean one: no "..").
func below(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != "." && filepath.IsLocal(rel) && filepath.Clean(p) == p
}

// Rename moves from to to (rename(2): within a file system, replacing a
// file at to); protocol 4.
func (c *Client) Rename(ctx context.Context, from, to string) (_ FileInfo, err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	fi, err := c.rpc.Rename(ctx, &agentpb.RenameRequest{From: from, To: to})
	if err != nil {
		return FileInfo{}, c.wrap("rename", err)
	}
	return fileInfo(fi)
}

// Mkdir creates path and its parents.
func (c *Client) Mkdir(ctx context.Context, path string, mode uint32, owner string) (_ FileInfo, err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	fi, err := c.rpc.Mkdir(ctx, &agentpb.MkdirRequest{Path: path, Mode: mode, Owner: owner})
	if err != nil {
		return FileInfo{}, c.wrap("mkdir", err)
	}
	return fileInfo(fi)
}

// Remove deletes path (a directory only with recursive, or if empty).
func (c *Client) Remove(ctx context.Context, path string, recursive bool) (err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	_, err = c.rpc.Remove(ctx, &agentpb.RemoveRequest{Path: path, Recursive: recursive})
	return c.wrap("remove", err)
}

// Chmod sets permission bits.
func (c *Client) Chmod(ctx context.Context, path string, mode uint32) (err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	_, err = c.rpc.Chmod(ctx, &agentpb.ChmodRequest{Path: path, Mode: mode})
	return c.wrap("chmod", err)
}

// Chown sets the owner ("user" or "user:group").
func (c *Client) Chown(ctx context.Context, path, owner string) (err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	_, err = c.rpc.Chown(ctx, &agentpb.ChownRequest{Path: path, Owner: owner})
	return c.wrap("chown", err)
}

var fileTypes = map[agentpb.FileType]string{
	agentpb.FileType_FILE_TYPE_REGULAR:   "file",
	agentpb.FileType_FILE_TYPE_DIRECTORY: "dir",
	agentpb.FileType_FILE_TYPE_SYMLINK:   "symlink",
	agentpb.FileType_FILE_TYPE_OTHER:     "other",
}

// fileInfo validates a guest-reported FileInfo.
func fileInfo(p *agentpb.FileInfo) (FileInfo, error) {
	t, ok := fileTypes[p.GetType()]
	switch {
	case p == nil:
		return FileInfo{}, fmt.Errorf("%w: empty file info", ErrGuest)
	case !ok:
		return FileInfo{}, fmt.Errorf("%w: file type %d", ErrGuest, p.Type)
	case len(p.Path) > 4096 || strings.ContainsRune(p.Path, 0),
		len(p.Name) > 255 || strings.ContainsAny(p.Name, "/\x00"),
		len(p.LinkTarget) > 4096 || strings.ContainsRune(p.LinkTarget, 0),
		p.Size < 0, p.Mode > 0o7777:
		return FileInfo{}, fmt.Errorf("%w: file info for %.64q", ErrGuest, p.Path)
	}
	return FileInfo{
		Path: p.Path, Name: p.Name, Type: t, Size: p.Size, Mode: p.Mode,
		UID: p.Uid, GID: p.Gid, ModTime: time.Unix(0, p.MtimeUnixNano).UTC(), LinkTarget: p.LinkTarget,
	}, nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil && e != io.EOF {
			return e
		}
	}
	return nil
}
