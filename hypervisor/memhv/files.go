package memhv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/agent/guest"
)

// Limits of the fake guest, the real agent's where it has them.
const (
	readChunk  = 64 << 10
	maxListDir = 10000
	// maxListDepth is the agent's bound on a listing's depth.
	maxListDepth = 64
	defaultFile  = 0o644
	defaultDir   = 0o755
	// maxFileBytes bounds one file, so a runaway test fails instead of
	// eating the host's memory (a full disk in a real guest).
	maxFileBytes = 256 << 20
)

// node is a file or directory. Data is never changed in place once
// stored, so a reader may keep a slice of it without the lock.
type node struct {
	Dir   bool      `json:"dir,omitempty"`
	Data  []byte    `json:"data,omitempty"`
	Mode  uint32    `json:"mode"`
	UID   uint32    `json:"uid"`
	GID   uint32    `json:"gid"`
	MTime time.Time `json:"mtime"`
}

// fsys is the guest's filesystem: clean absolute paths to nodes. There are
// no symlinks, devices or hard links.
type fsys struct {
	mu    sync.Mutex
	nodes map[string]*node
}

// newFS returns the tree of a fresh guest.
func newFS() *fsys {
	now := time.Now()
	id := make([]byte, 16)
	rand.Read(id)
	f := &fsys{nodes: map[string]*node{}}
	for _, d := range []struct {
		path string
		mode uint32
		uid  uint32
	}{{"/", 0o755, 0}, {"/etc", 0o755, 0}, {"/tmp", 0o1777, 0}, {"/root", 0o700, 0}, {"/home", 0o755, 0}, {"/home/user", 0o755, 1000}} {
		f.nodes[d.path] = &node{Dir: true, Mode: d.mode, UID: d.uid, GID: d.uid, MTime: now}
	}
	f.nodes["/etc/machine-id"] = &node{Data: []byte(hex.EncodeToString(id) + "\n"), Mode: 0o444, MTime: now}
	f.nodes["/etc/hostname"] = &node{Data: []byte("harebox\n"), Mode: 0o644, MTime: now}
	return f
}

// clone copies the tree, for a snapshot.
func (f *fsys) clone() *fsys {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := &fsys{nodes: make(map[string]*node, len(f.nodes))}
	for p, n := range f.nodes {
		cp := *n
		c.nodes[p] = &cp
	}
	return c
}

// put stores a file (under f.mu).
func (f *fsys) put(p string, data []byte, mode, uid, gid uint32) *node {
	n := &node{Data: data, Mode: mode, UID: uid, GID: gid, MTime: time.Now()}
	f.nodes[p] = n
	return n
}

// missing explains why p does not exist (under f.mu), with the code the
// real agent gives: an ancestor that is a file is ENOTDIR.
func (f *fsys) missing(op, p string) error {
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		if n, ok := f.nodes[d]; ok {
			if !n.Dir {
				return status.Errorf(codes.FailedPrecondition, "%s %s: not a directory", op, p)
			}
			return status.Errorf(codes.NotFound, "%s %s: no such file or directory", op, p)
		}
	}
}

// get returns the node at p (under f.mu).
func (f *fsys) get(op, p string) (*node, error) {
	if n, ok := f.nodes[p]; ok {
		return n, nil
	}
	return nil, f.missing(op, p)
}

// mkdirAll is mkdir -p (under f.mu): new directories get mode and owner.
func (f *fsys) mkdirAll(p string, mode, uid, gid uint32) error {
	if n, ok := f.nodes[p]; ok {
		if n.Dir {
			return nil
		}
		return status.Errorf(codes.AlreadyExists, "mkdir %s: file exists", p)
	}
	if err := f.missing("mkdir", p); status.Code(err) != codes.NotFound {
		return err
	}
	if err := f.mkdirAll(filepath.Dir(p), mode, uid, gid); err != nil {
		return err
	}
	f.nodes[p] = &node{Dir: true, Mode: mode, UID: uid, GID: gid, MTime: time.Now()}
	return nil
}

func fileInfo(p string, n *node) *agentpb.FileInfo {
	fi := &agentpb.FileInfo{
		Path: p, Name: filepath.Base(p), Type: agentpb.FileType_FILE_TYPE_REGULAR, Size: int64(len(n.Data)),
		Mode: n.Mode, Uid: n.UID, Gid: n.GID, MtimeUnixNano: n.MTime.UnixNano(),
	}
	if n.Dir {
		fi.Type = agentpb.FileType_FILE_TYPE_DIRECTORY
	}
	return fi
}

// The fake agent accepts exactly the paths and modes the real one does.
var (
	checkPath = guest.CheckPath
	checkMode = guest.CheckMode
)

// account is a guest user. The fake guest has the users of the real
// images: root and "user" (the default).
type account struct {
	uid, gid uint32
	home     string
}

var accounts = map[string]account{"root": {0, 0, "/root"}, "user": {1000, 1000, "/home/user"}}

// lookupUser resolves a name or numeric id; empty means "user".
func lookupUser(spec string) (account, error) {
	if spec == "" {
		spec = "user"
	}
	if a, ok := accounts[spec]; ok {
		return a, nil
	}
	if id, err := strconv.ParseUint(spec, 10, 32); err == nil {
		for _, a := range accounts {
			if a.uid == uint32(id) {
				return a, nil
			}
		}
		return account{uint32(id), uint32(id), "/"}, nil
	}
	return account{}, fmt.Errorf("unknown user %q", spec)
}

// lookupOwner resolves "user" or "user:group"; its errors are
// InvalidArgument, as the real agent's.
func lookupOwner(spec string) (uid, gid uint32, err error) {
	user, group, hasGroup := strings.Cut(spec, ":")
	if strings.IndexByte(spec, 0) >= 0 || hasGroup && user == "" {
		return 0, 0, status.Errorf(codes.InvalidArgument, "owner: bad owner %q", spec)
	}
	a, err := lookupUser(user)
	if err != nil {
		return 0, 0, status.Errorf(codes.InvalidArgument, "owner: %v", err)
	}
	gid = a.gid
	if hasGroup && group != "" {
		g, ok := accounts[group]
		id, perr := strconv.ParseUint(group, 10, 32)
		switch {
		case ok:
			gid = g.gid
		case perr == nil:
			gid = uint32(id)
		default:
			return 0, 0, status.Errorf(codes.InvalidArgument, "owner: unknown group %q", group)
		}
	}
	return a.uid, gid, nil
}

// enter waits for the machine to run and checks a call's path.
func (a *agent) enter(ctx context.Context, path string) error {
	if err := a.m.awake(ctx); err != nil {
		return err
	}
	return checkPath(path)
}

// WriteFile stores the streamed data when the stream ends cleanly.
func (a *agent) WriteFile(stream agentpb.Agent_WriteFileServer) error {
	if err := a.m.awake(stream.Context()); err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return status.Error(codes.InvalidArgument, "the first write message must be the header")
	}
	if err := checkPath(h.GetPath()); err != nil {
		return err
	}
	if err := checkMode(h.GetMode()); err != nil {
		return err
	}
	uid, gid, err := lookupOwner(h.GetOwner())
	if err != nil {
		return err
	}
	// Fail before the data comes, as the real agent does, and check again
	// when storing it.
	if err := a.fs.lockedPrepare(h, uid, gid); err != nil {
		return err
	}
	var buf bytes.Buffer
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		data, ok := req.GetMsg().(*agentpb.WriteFileRequest_Data)
		if !ok {
			return status.Error(codes.InvalidArgument, "only data may follow the header")
		}
		if buf.Len()+len(data.Data) > maxFileBytes {
			return status.Errorf(codes.ResourceExhausted, "write %s: no space left on device", h.GetPath())
		}
		buf.Write(data.Data)
	}
	f := a.fs
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.prepare(h, uid, gid); err != nil {
		return err
	}
	p, mode := h.GetPath(), h.GetMode()
	if mode == 0 {
		mode = defaultFile
	}
	n, ok := f.nodes[p]
	switch {
	case !ok || !h.GetAppend():
		n = f.put(p, buf.Bytes(), mode, uid, gid)
	default:
		// Append keeps the file's mode and owner unless the header names
		// them; the full slice expression copies rather than writes in place.
		data := append(n.Data[:len(n.Data):len(n.Data)], buf.Bytes()...)
		m := *n
		if h.GetMode() != 0 || h.GetOwner() != "" {
			m.Mode = mode
		}
		if h.GetOwner() != "" {
			m.UID, m.GID = uid, gid
		}
		n = f.put(p, data, m.Mode, m.UID, m.GID)
	}
	return stream.SendAndClose(fileInfo(p, n))
}

func (f *fsys) lockedPrepare(h *agentpb.WriteFileHeader, uid, gid uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.prepare(h, uid, gid)
}

// prepare makes parents if asked and checks that the file can be written
// (under f.mu).
func (f *fsys) prepare(h *agentpb.WriteFileHeader, uid, gid uint32) error {
	p := h.GetPath()
	if h.GetMakeParents() {
		if err := f.mkdirAll(filepath.Dir(p), defaultDir, uid, gid); err != nil {
			return err
		}
	}
	if dir, ok := f.nodes[filepath.Dir(p)]; !ok || !dir.Dir {
		return f.missing("create", p)
	}
	if n, ok := f.nodes[p]; ok && n.Dir {
		return status.Errorf(codes.FailedPrecondition, "%s is a directory", p)
	}
	return nil
}

// ReadFile streams a file in 64 KiB chunks.
func (a *agent) ReadFile(req *agentpb.ReadFileRequest, stream agentpb.Agent_ReadFileServer) error {
	if err := a.enter(stream.Context(), req.GetPath()); err != nil {
		return err
	}
	if req.GetOffset() < 0 || req.GetLimit() < 0 {
		return status.Error(codes.InvalidArgument, "offset and limit must not be negative")
	}
	a.fs.mu.Lock()
	n, err := a.fs.get("open", req.GetPath())
	a.fs.mu.Unlock()
	if err != nil {
		return err
	}
	if n.Dir {
		return status.Errorf(codes.FailedPrecondition, "%s is not a regular file", req.GetPath())
	}
	data := n.Data[min(req.GetOffset(), int64(len(n.Data))):]
	if l := req.GetLimit(); l > 0 && l < int64(len(data)) {
		data = data[:l]
	}
	for len(data) > 0 {
		k := min(len(data), readChunk)
		if err := stream.Send(&agentpb.ReadFileChunk{Data: data[:k]}); err != nil {
			return err
		}
		data = data[k:]
	}
	return nil
}

func (a *agent) Stat(ctx context.Context, req *agentpb.PathRequest) (*agentpb.FileInfo, error) {
	if err := a.enter(ctx, req.GetPath()); err != nil {
		return nil, err
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	n, err := a.fs.get("stat", req.GetPath())
	if err != nil {
		return nil, err
	}
	return fileInfo(req.GetPath(), n), nil
}

// ListDir lists at most the limit (capped) entries, sorted by name.
func (a *agent) ListDir(ctx context.Context, req *agentpb.ListDirRequest) (*agentpb.ListDirResponse, error) {
	p := req.GetPath()
	if err := a.enter(ctx, p); err != nil {
		return nil, err
	}
	limit := int(req.GetLimit())
	if limit <= 0 || limit > maxListDir {
		limit = maxListDir
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	n, err := a.fs.get("open", p)
	if err != nil {
		return nil, err
	}
	if !n.Dir {
		return nil, status.Errorf(codes.FailedPrecondition, "read dir %s: not a directory", p)
	}
	depth := max(int(req.GetDepth()), 1)
	if depth > maxListDepth {
		return nil, status.Errorf(codes.InvalidArgument, "depth must be at most %d", maxListDepth)
	}
	resp := &agentpb.ListDirResponse{}
	a.fs.list(resp, p, depth, limit)
	return resp, nil
}

// list lists dir's entries, then its subdirectories' down to depth, as
// the agent does.
func (f *fsys) list(resp *agentpb.ListDirResponse, dir string, depth, limit int) {
	var names []string
	for q := range f.nodes {
		if q != "/" && filepath.Dir(q) == dir {
			names = append(names, q)
		}
	}
	sort.Strings(names)
	if left := limit - len(resp.Entries); len(names) > left {
		names, resp.Truncated = names[:left], true
	}
	for _, q := range names {
		resp.Entries = append(resp.Entries, fileInfo(q, f.nodes[q]))
	}
	for _, q := range names {
		if depth <= 1 || resp.Truncated {
			return
		}
		if f.nodes[q].Dir {
			f.list(resp, q, depth-1, limit)
		}
	}
}

// Rename moves a file or a directory with what is below it, replacing a
// file at to, as rename(2) does.
func (a *agent) Rename(ctx context.Context, req *agentpb.RenameRequest) (*agentpb.FileInfo, error) {
	from, to := req.GetFrom(), req.GetTo()
	for _, p := range []string{from, to} {
		if err := a.enter(ctx, p); err != nil {
			return nil, err
		}
	}
	if from == "/" {
		return nil, status.Error(codes.InvalidArgument, "refusing to move /")
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	n, err := a.fs.get("rename", from)
	if err != nil {
		return nil, err
	}
	if parent, ok := a.fs.nodes[filepath.Dir(to)]; !ok || !parent.Dir {
		return nil, a.fs.missing("rename", filepath.Dir(to))
	}
	if cur, ok := a.fs.nodes[to]; ok && cur.Dir != n.Dir {
		return nil, status.Errorf(codes.FailedPrecondition, "rename %s: a %s is in the way", to, map[bool]string{true: "directory", false: "file"}[cur.Dir])
	}
	if strings.HasPrefix(to, from+"/") {
		return nil, status.Errorf(codes.InvalidArgument, "rename %s: into itself", from)
	}
	var below []string
	for q := range a.fs.nodes {
		if strings.HasPrefix(q, to+"/") && to != from {
			return nil, status.Errorf(codes.FailedPrecondition, "rename %s: directory not empty", to)
		}
		if strings.HasPrefix(q, from+"/") {
			below = append(below, q)
		}
	}
	for _, q := range below {
		m := a.fs.nodes[q]
		delete(a.fs.nodes, q)
		a.fs.nodes[to+strings.TrimPrefix(q, from)] = m
	}
	delete(a.fs.nodes, from)
	a.fs.nodes[to] = n
	return fileInfo(to, n), nil
}

// Mkdir is mkdir -p.
func (a *agent) Mkdir(ctx context.Context, req *agentpb.MkdirRequest) (*agentpb.FileInfo, error) {
	if err := a.enter(ctx, req.GetPath()); err != nil {
		return nil, err
	}
	if err := checkMode(req.GetMode()); err != nil {
		return nil, err
	}
	mode := req.GetMode()
	if mode == 0 {
		mode = defaultDir
	}
	uid, gid, err := lookupOwner(req.GetOwner())
	if err != nil {
		return nil, err
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	if err := a.fs.mkdirAll(req.GetPath(), mode, uid, gid); err != nil {
		return nil, err
	}
	return fileInfo(req.GetPath(), a.fs.nodes[req.GetPath()]), nil
}

// MountVolume mounts a plugged-in volume: the fake makes its directory,
// owned as the real agent leaves a fresh volume's root.
func (a *agent) MountVolume(ctx context.Context, req *agentpb.MountVolumeRequest) (*agentpb.Empty, error) {
	if err := a.enter(ctx, req.GetPath()); err != nil {
		return nil, err
	}
	if _, ok := a.m.plugged(req.GetSerial()); !ok {
		return nil, status.Errorf(codes.NotFound, "no disk with serial %q appeared", req.GetSerial())
	}
	uid, gid, err := lookupOwner(req.GetOwner())
	if err != nil {
		return nil, err
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	if err := a.fs.mkdirAll(req.GetPath(), defaultDir, uid, gid); err != nil {
		return nil, err
	}
	return &agentpb.Empty{}, nil
}

// FreezeVolume and ThawVolume accept any path the fake could have
// mounted: its volumes hold nothing to make clean.
func (a *agent) FreezeVolume(ctx context.Context, req *agentpb.FreezeVolumeRequest) (*agentpb.Empty, error) {
	if err := a.enter(ctx, req.GetPath()); err != nil {
		return nil, err
	}
	return &agentpb.Empty{}, nil
}

func (a *agent) ThawVolume(ctx context.Context, req *agentpb.PathRequest) (*agentpb.Empty, error) {
	if err := a.enter(ctx, req.GetPath()); err != nil {
		return nil, err
	}
	return &agentpb.Empty{}, nil
}

// UnmountVolume accepts any path the fake could have mounted.
func (a *agent) UnmountVolume(ctx context.Context, req *agentpb.PathRequest) (*agentpb.Empty, error) {
	if err := a.enter(ctx, req.GetPath()); err != nil {
		return nil, err
	}
	return &agentpb.Empty{}, nil
}

// Remove deletes a file or empty directory, or a whole tree when recursive.
func (a *agent) Remove(ctx context.Context, req *agentpb.RemoveRequest) (*agentpb.Empty, error) {
	p := req.GetPath()
	if err := a.enter(ctx, p); err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, status.Error(codes.InvalidArgument, "refusing to remove /")
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	if _, err := a.fs.get("remove", p); err != nil {
		return nil, err
	}
	var below []string
	for q := range a.fs.nodes {
		if strings.HasPrefix(q, p+"/") {
			below = append(below, q)
		}
	}
	if len(below) > 0 && !req.GetRecursive() {
		return nil, status.Errorf(codes.FailedPrecondition, "remove %s: directory not empty", p)
	}
	for _, q := range below {
		delete(a.fs.nodes, q)
	}
	delete(a.fs.nodes, p)
	return &agentpb.Empty{}, nil
}

func (a *agent) Chmod(ctx context.Context, req *agentpb.ChmodRequest) (*agentpb.Empty, error) {
	if err := a.enter(ctx, req.GetPath()); err != nil {
		return nil, err
	}
	if err := checkMode(req.GetMode()); err != nil {
		return nil, err
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	n, err := a.fs.get("chmod", req.GetPath())
	if err != nil {
		return nil, err
	}
	n.Mode = req.GetMode()
	return &agentpb.Empty{}, nil
}

func (a *agent) Chown(ctx context.Context, req *agentpb.ChownRequest) (*agentpb.Empty, error) {
	if err := a.enter(ctx, req.GetPath()); err != nil {
		return nil, err
	}
	if req.GetOwner() == "" {
		return nil, status.Error(codes.InvalidArgument, "owner is empty")
	}
	uid, gid, err := lookupOwner(req.GetOwner())
	if err != nil {
		return nil, err
	}
	a.fs.mu.Lock()
	defer a.fs.mu.Unlock()
	n, err := a.fs.get("chown", req.GetPath())
	if err != nil {
		return nil, err
	}
	n.UID, n.GID = uid, gid
	return &agentpb.Empty{}, nil
}
