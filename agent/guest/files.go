package guest

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/internal/fsync"
)

const (
	readChunk  = 64 << 10
	maxListDir = 10000
	// maxListDepth bounds a listing's depth (the recursion's).
	maxListDepth = 64
	maxPathLen   = 4096
	defaultFile  = 0o644
	defaultDir   = 0o755
)

// CheckPath accepts only absolute, clean paths without NUL: the host names
// exactly the file it means, with no ".." games.
func CheckPath(p string) error {
	switch {
	case p == "":
		return status.Error(codes.InvalidArgument, "path is empty")
	case len(p) > maxPathLen:
		return status.Error(codes.InvalidArgument, "path is too long")
	case strings.IndexByte(p, 0) >= 0:
		return status.Error(codes.InvalidArgument, "path contains NUL")
	case !filepath.IsAbs(p):
		return status.Errorf(codes.InvalidArgument, "path %q is not absolute", p)
	case filepath.Clean(p) != p:
		return status.Errorf(codes.InvalidArgument, "path %q is not clean", p)
	}
	return nil
}

// CheckMode accepts permission bits up to 07777.
func CheckMode(m uint32) error {
	if m&^0o7777 != 0 {
		return status.Errorf(codes.InvalidArgument, "mode %o has bits beyond 07777", m)
	}
	return nil
}

// fsError maps an OS error to the gRPC code the host can act on.
func fsError(op string, err error) error {
	// Errors that already carry a code (from a nested check) keep it.
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
		return err
	}
	code := codes.Internal
	switch {
	// First: Go also counts ENOTEMPTY as fs.ErrExist.
	case errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EISDIR),
		errors.Is(err, unix.ENOTEMPTY), errors.Is(err, unix.ELOOP),
		errors.Is(err, unix.EBUSY), errors.Is(err, unix.EXDEV):
		code = codes.FailedPrecondition
	case errors.Is(err, fs.ErrNotExist):
		code = codes.NotFound
	case errors.Is(err, fs.ErrExist):
		code = codes.AlreadyExists
	case errors.Is(err, fs.ErrPermission), errors.Is(err, unix.EROFS):
		code = codes.PermissionDenied
	case errors.Is(err, errUnknownUser), errors.Is(err, errUnknownGroup), errors.Is(err, errBadOwner),
		errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENAMETOOLONG):
		code = codes.InvalidArgument
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		code = codes.ResourceExhausted
	}
	return status.Errorf(code, "%s: %v", op, err)
}

// fileInfo describes path (not following a final symlink).
func fileInfo(path string) (*agentpb.FileInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return toFileInfo(path, fi), nil
}

func toFileInfo(path string, fi fs.FileInfo) *agentpb.FileInfo {
	out := &agentpb.FileInfo{
		Path:          path,
		Name:          fi.Name(),
		Size:          fi.Size(),
		MtimeUnixNano: fi.ModTime().UnixNano(),
	}
	switch m := fi.Mode(); {
	case m.IsRegular():
		out.Type = agentpb.FileType_FILE_TYPE_REGULAR
	case m.IsDir():
		out.Type = agentpb.FileType_FILE_TYPE_DIRECTORY
	case m&fs.ModeSymlink != 0:
		out.Type = agentpb.FileType_FILE_TYPE_SYMLINK
		out.LinkTarget, _ = os.Readlink(path)
	default:
		out.Type = agentpb.FileType_FILE_TYPE_OTHER
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		out.Mode = st.Mode & 0o7777
		out.Uid = st.Uid
		out.Gid = st.Gid
	} else {
		out.Mode = uint32(fi.Mode().Perm())
	}
	return out
}

// owner resolves an owner spec; empty means the default user (else root).
func (s *Server) owner(spec string) (uid, gid int, err error) {
	if strings.IndexByte(spec, 0) >= 0 {
		return 0, 0, status.Error(codes.InvalidArgument, "owner contains NUL")
	}
	u, g, err := s.lookupOwner(spec)
	if err != nil {
		return 0, 0, fsError("owner", err)
	}
	return int(u), int(g), nil
}

// WriteFile streams data into a temp file beside the path and renames it
// into place when the stream ends cleanly (append mode writes in place).
func (s *Server) WriteFile(stream agentpb.Agent_WriteFileServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return status.Error(codes.InvalidArgument, "the first write message must be the header")
	}
	if err := CheckPath(h.GetPath()); err != nil {
		return err
	}
	if err := CheckMode(h.GetMode()); err != nil {
		return err
	}
	mode := goMode(h.GetMode())
	if mode == 0 {
		mode = defaultFile
	}
	uid, gid, err := s.owner(h.GetOwner())
	if err != nil {
		return err
	}
	dir := filepath.Dir(h.GetPath())
	if h.GetMakeParents() {
		if err := mkdirAllOwned(dir, defaultDir, uid, gid); err != nil {
			return fsError("create parents", err)
		}
	}
	if fi, err := os.Stat(h.GetPath()); err == nil && fi.IsDir() {
		return status.Errorf(codes.FailedPrecondition, "%s is a directory", h.GetPath())
	}
	if h.GetAppend() {
		err = s.appendFile(stream, h, mode, uid, gid)
	} else {
		err = replaceFile(stream, h.GetPath(), mode, uid, gid)
	}
	if err != nil {
		return err
	}
	info, err := fileInfo(h.GetPath())
	if err != nil {
		return fsError("stat", err)
	}
	return stream.SendAndClose(info)
}

// copyStream writes every data message to f until the client half-closes.
func copyStream(stream agentpb.Agent_WriteFileServer, f *os.File) error {
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		data, ok := req.GetMsg().(*agentpb.WriteFileRequest_Data)
		if !ok {
			return status.Error(codes.InvalidArgument, "only data may follow the header")
		}
		if _, err := f.Write(data.Data); err != nil {
			return fsError("write", err)
		}
	}
}

func replaceFile(stream agentpb.Agent_WriteFileServer, path string, mode os.FileMode, uid, gid int) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".harebox-*")
	if err != nil {
		return fsError("create", err)
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()
	// Explicit chmod: the process umask must not change the asked-for mode.
	if err := f.Chmod(mode); err != nil {
		return fsError("chmod", err)
	}
	if err := f.Chown(uid, gid); err != nil {
		return fsError("chown", err)
	}
	// chown clears setuid/setgid bits; set the mode again.
	if err := f.Chmod(mode); err != nil {
		return fsError("chmod", err)
	}
	if err := copyStream(stream, f); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fsError("sync", err)
	}
	if err := f.Close(); err != nil {
		return fsError("close", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fsError("rename", err)
	}
	done = true
	fsync.Dir(filepath.Dir(path))
	return nil
}

// appendFile appends in place. A new file gets the header's mode and owner;
// an existing one keeps its own unless the header names them explicitly.
func (s *Server) appendFile(stream agentpb.Agent_WriteFileServer, h *agentpb.WriteFileHeader, mode os.FileMode, uid, gid int) error {
	path := h.GetPath()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_EXCL, mode)
	created := err == nil
	if errors.Is(err, fs.ErrExist) {
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND|syscall.O_NONBLOCK, 0)
	}
	if err != nil {
		return fsError("open", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return status.Errorf(codes.FailedPrecondition, "%s is not a regular file", path)
	}
	if created || h.GetOwner() != "" {
		if err := f.Chown(uid, gid); err != nil {
			return fsError("chown", err)
		}
	}
	if created || h.GetMode() != 0 || h.GetOwner() != "" {
		if err := f.Chmod(mode); err != nil {
			return fsError("chmod", err)
		}
	}
	if err := copyStream(stream, f); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fsError("sync", err)
	}
	return nil
}

// ReadFile streams a regular file in 64 KiB chunks.
func (s *Server) ReadFile(req *agentpb.ReadFileRequest, stream agentpb.Agent_ReadFileServer) error {
	if err := CheckPath(req.GetPath()); err != nil {
		return err
	}
	if req.GetOffset() < 0 || req.GetLimit() < 0 {
		return status.Error(codes.InvalidArgument, "offset and limit must not be negative")
	}
	// O_NONBLOCK: opening a FIFO must not hang; it is refused below anyway.
	f, err := os.OpenFile(req.GetPath(), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return fsError("open", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fsError("stat", err)
	}
	if !fi.Mode().IsRegular() {
		return status.Errorf(codes.FailedPrecondition, "%s is not a regular file", req.GetPath())
	}
	var r io.Reader = io.NewSectionReader(f, req.GetOffset(), 1<<62)
	if req.GetLimit() > 0 {
		r = io.LimitReader(r, req.GetLimit())
	}
	buf := make([]byte, readChunk)
	for {
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			if err := stream.Send(&agentpb.ReadFileChunk{Data: buf[:n]}); err != nil {
				return err
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return fsError("read", err)
		}
	}
}

// Stat describes a path without following a final symlink.
func (s *Server) Stat(_ context.Context, req *agentpb.PathRequest) (*agentpb.FileInfo, error) {
	if err := CheckPath(req.GetPath()); err != nil {
		return nil, err
	}
	info, err := fileInfo(req.GetPath())
	if err != nil {
		return nil, fsError("stat", err)
	}
	return info, nil
}

// ListDir lists at most the limit (capped at maxListDir) entries, sorted by
// name, reading no more of a huge directory than it needs; with a depth
// over 1, each subdirectory's entries follow the directory's, down to
// depth levels (symbolic links are not followed), within the same limit.
func (s *Server) ListDir(_ context.Context, req *agentpb.ListDirRequest) (*agentpb.ListDirResponse, error) {
	if err := CheckPath(req.GetPath()); err != nil {
		return nil, err
	}
	limit := int(req.GetLimit())
	if limit <= 0 || limit > maxListDir {
		limit = maxListDir
	}
	depth := max(int(req.GetDepth()), 1)
	if depth > maxListDepth {
		return nil, status.Errorf(codes.InvalidArgument, "depth must be at most %d", maxListDepth)
	}
	resp := &agentpb.ListDirResponse{}
	if err := listDir(resp, req.GetPath(), depth, limit); err != nil {
		return nil, err
	}
	return resp, nil
}

func listDir(resp *agentpb.ListDirResponse, dir string, depth, limit int) error {
	f, err := os.Open(dir)
	if err != nil {
		return fsError("open", err)
	}
	// One more than what is left tells whether there were more.
	left := limit - len(resp.Entries)
	ents, err := f.ReadDir(left + 1)
	f.Close()
	if err != nil && err != io.EOF {
		return fsError("read dir", err)
	}
	if len(ents) > left {
		ents = ents[:left]
		resp.Truncated = true
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	var subdirs []string
	for _, de := range ents {
		fi, err := de.Info()
		if err != nil {
			continue // removed since it was listed
		}
		p := filepath.Join(dir, de.Name())
		resp.Entries = append(resp.Entries, toFileInfo(p, fi))
		if fi.IsDir() {
			subdirs = append(subdirs, p)
		}
	}
	for _, sub := range subdirs {
		if depth <= 1 || resp.Truncated {
			break
		}
		// A subdirectory that cannot be read (its permissions, or gone) is
		// listed, without its entries.
		if err := listDir(resp, sub, depth-1, limit); err != nil && status.Code(err) != codes.PermissionDenied && status.Code(err) != codes.NotFound {
			return err
		}
	}
	return nil
}

// Rename moves a file or directory within its file system, replacing an
// existing file at to (rename(2), as mv does).
func (s *Server) Rename(_ context.Context, req *agentpb.RenameRequest) (*agentpb.FileInfo, error) {
	for _, p := range []string{req.GetFrom(), req.GetTo()} {
		if err := CheckPath(p); err != nil {
			return nil, err
		}
	}
	if req.GetFrom() == "/" {
		return nil, status.Error(codes.InvalidArgument, "refusing to move /")
	}
	if err := os.Rename(req.GetFrom(), req.GetTo()); err != nil {
		return nil, fsError("rename", err)
	}
	info, err := fileInfo(req.GetTo())
	if err != nil {
		return nil, fsError("stat", err)
	}
	return info, nil
}

// Mkdir is mkdir -p: directories it creates get the mode and owner; existing
// ones are left alone.
func (s *Server) Mkdir(_ context.Context, req *agentpb.MkdirRequest) (*agentpb.FileInfo, error) {
	if err := CheckPath(req.GetPath()); err != nil {
		return nil, err
	}
	if err := CheckMode(req.GetMode()); err != nil {
		return nil, err
	}
	mode := goMode(req.GetMode())
	if mode == 0 {
		mode = defaultDir
	}
	uid, gid, err := s.owner(req.GetOwner())
	if err != nil {
		return nil, err
	}
	if err := mkdirAllOwned(req.GetPath(), mode, uid, gid); err != nil {
		return nil, fsError("mkdir", err)
	}
	info, err := fileInfo(req.GetPath())
	if err != nil {
		return nil, fsError("stat", err)
	}
	return info, nil
}

// mkdirAllOwned creates path and missing parents with mode and owner.
func mkdirAllOwned(path string, mode os.FileMode, uid, gid int) error {
	fi, err := os.Stat(path)
	if err == nil {
		if fi.IsDir() {
			return nil
		}
		return &fs.PathError{Op: "mkdir", Path: path, Err: unix.EEXIST}
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if parent := filepath.Dir(path); parent != path {
		if err := mkdirAllOwned(parent, mode, uid, gid); err != nil {
			return err
		}
	}
	if err := os.Mkdir(path, mode); err != nil {
		if errors.Is(err, fs.ErrExist) {
			if fi, serr := os.Stat(path); serr == nil && fi.IsDir() {
				return nil // created concurrently
			}
		}
		return err
	}
	if err := os.Lchown(path, uid, gid); err != nil {
		return err
	}
	// Not subject to umask, unlike mkdir(2).
	return os.Chmod(path, mode)
}

// Remove deletes a file or empty directory, or a whole tree when recursive.
func (s *Server) Remove(_ context.Context, req *agentpb.RemoveRequest) (*agentpb.Empty, error) {
	if err := CheckPath(req.GetPath()); err != nil {
		return nil, err
	}
	if req.GetPath() == "/" {
		return nil, status.Error(codes.InvalidArgument, "refusing to remove /")
	}
	if _, err := os.Lstat(req.GetPath()); err != nil {
		return nil, fsError("remove", err)
	}
	var err error
	if req.GetRecursive() {
		err = os.RemoveAll(req.GetPath())
	} else {
		err = os.Remove(req.GetPath())
	}
	if err != nil {
		return nil, fsError("remove", err)
	}
	return &agentpb.Empty{}, nil
}

// Chmod sets permission bits (following symlinks, as chmod(1) does).
func (s *Server) Chmod(_ context.Context, req *agentpb.ChmodRequest) (*agentpb.Empty, error) {
	if err := CheckPath(req.GetPath()); err != nil {
		return nil, err
	}
	if err := CheckMode(req.GetMode()); err != nil {
		return nil, err
	}
	if err := os.Chmod(req.GetPath(), goMode(req.GetMode())); err != nil {
		return nil, fsError("chmod", err)
	}
	return &agentpb.Empty{}, nil
}

// goMode converts Unix permission bits to an os.FileMode: Go keeps
// setuid/setgid/sticky in flags of its own, not in bits 07000.
func goMode(m uint32) os.FileMode {
	out := os.FileMode(m & 0o777)
	if m&unix.S_ISUID != 0 {
		out |= os.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		out |= os.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		out |= os.ModeSticky
	}
	return out
}

// Chown sets owner and group ("user" or "user:group", names or ids).
func (s *Server) Chown(_ context.Context, req *agentpb.ChownRequest) (*agentpb.Empty, error) {
	if err := CheckPath(req.GetPath()); err != nil {
		return nil, err
	}
	if req.GetOwner() == "" {
		return nil, status.Error(codes.InvalidArgument, "owner is empty")
	}
	uid, gid, err := s.owner(req.GetOwner())
	if err != nil {
		return nil, err
	}
	if err := os.Chown(req.GetPath(), uid, gid); err != nil {
		return nil, fsError("chown", err)
	}
	return &agentpb.Empty{}, nil
}
