package envd

// envd's filesystem service (Connect) over the engine's file calls, for
// the E2B SDK's sandbox.files: Stat, MakeDir, Move, ListDir, Remove, and
// watches, streamed (WatchDir) or polled (CreateWatcher,
// GetWatcherEvents, RemoveWatcher). Paths are the user's (Resolve); each
// call is the engine's, authorized and audited as the principal the
// access token names: a watch as listFiles (it shows a directory's names
// as a listing does), MakeDir as statFile then mkdir, Move as moveFile
// (and mkdir of a missing parent, as envd makes it).
//
// What the host bounds here: a sandbox's watches at once (maxWatches,
// streamed and polled together), a polled watcher's queued events
// (maxQueuedEvents: past it, or when the sandbox dropped events, the
// watch fails rather than go on incomplete), a polled watcher no one
// fetches from (dropped after watcherIdle; its watch in the sandbox ends
// with it, and when the sandbox goes the watch ends and the watcher
// answers why once, then is dropped), the keepalive interval a client
// asks for, and a path's length. A listing's size is the engine's
// (agentclient.MaxListEntries): one past it is refused, not cut short,
// since E2B's answer cannot say it was. Owners are named only for the
// ids every image has (root, the default user); any other is its number,
// as envd gives an id it cannot name: the guest's /etc/passwd is the
// guest's claim, not asked.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/harebox/harebox/agent/layout"
	fspb "github.com/harebox/harebox/e2b/envdpb/filesystem"
	"github.com/harebox/harebox/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
)

// Filesystem is the engine's file calls envd's filesystem service makes
// (harebox.Engine has them), each authorized and audited by the engine
// for the principal in the context.
type Filesystem interface {
	StatFile(ctx context.Context, id, path string) (*sandbox.FileInfo, error)
	ListFiles(ctx context.Context, id, path string, depth int) ([]sandbox.FileInfo, bool, error)
	Mkdir(ctx context.Context, id, path string, mode uint32, owner string) (*sandbox.FileInfo, error)
	MoveFile(ctx context.Context, id, from, to string) (*sandbox.FileInfo, error)
	RemoveFile(ctx context.Context, id, path string, recursive bool) error
	WatchDir(ctx context.Context, id, path string, recursive bool) (sandbox.Watcher, error)
}

// The host's bounds on envd's file calls.
const (
	// maxWatches bounds a sandbox's watches at once, streamed and polled
	// together (the agent allows as many).
	maxWatches = 16
	// maxQueuedEvents bounds a polled watcher's events not yet fetched.
	maxQueuedEvents = 1024
	// watchKeepalive is a streamed watch's keepalive when the client
	// asks for none (keepaliveOf).
	watchKeepalive = 50 * time.Second
	// maxPathBytes bounds a path, as the agent does.
	maxPathBytes = 4096
)

// watcherIdle drops a polled watcher no one fetched from for as long (a
// variable for the tests only).
var watcherIdle = 2 * time.Minute

// filesystemService is envd's filesystem service.
type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	s *Server

	mu       sync.Mutex
	watches  map[string]int            // by sandbox: streamed and polled
	watchers map[string]*polledWatcher // by sandbox and watcher ID
}

// resolve is the absolute path of an envd request's p for the caller;
// a call that changes a path needs one (the home is not "").
func resolve(ctx context.Context, p string, required bool) (string, error) {
	switch {
	case p == "" && required:
		return "", connect.NewError(connect.CodeInvalidArgument, errors.New("a path is required"))
	case len(p) > maxPathBytes:
		return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("a path is longer than %d bytes", maxPathBytes))
	}
	return Resolve(p, userOf(ctx)), nil
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	p, err := resolve(ctx, req.Msg.GetPath(), false)
	if err != nil {
		return nil, err
	}
	fi, err := f.s.opts.Filesystem.StatFile(ctx, sandboxOf(ctx), p)
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: entryInfo(fi)}), nil
}

// MakeDir makes a directory and its parents, owned by the caller; one
// that exists already is AlreadyExists (the SDK's makeDir answers false).
func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	p, err := resolve(ctx, req.Msg.GetPath(), true)
	if err != nil {
		return nil, err
	}
	id := sandboxOf(ctx)
	fi, err := f.s.opts.Filesystem.StatFile(ctx, id, p)
	switch {
	case err == nil && fi.Type == "dir":
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory already exists: %s", p))
	case err == nil:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path already exists but it is not a directory: %s", p))
	case !errors.Is(err, model.ErrNotFound):
		return nil, rpcError(err)
	}
	if fi, err = f.s.opts.Filesystem.Mkdir(ctx, id, p, 0, userOf(ctx)); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: entryInfo(fi)}), nil
}

// Move renames source to destination, making destination's missing
// parents owned by the caller first, as envd does.
func (f *filesystemService) Move(ctx context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	from, err := resolve(ctx, req.Msg.GetSource(), true)
	if err != nil {
		return nil, err
	}
	to, err := resolve(ctx, req.Msg.GetDestination(), true)
	if err != nil {
		return nil, err
	}
	id := sandboxOf(ctx)
	if _, err := f.s.opts.Filesystem.StatFile(ctx, id, filepath.Dir(to)); errors.Is(err, model.ErrNotFound) {
		if _, err := f.s.opts.Filesystem.Mkdir(ctx, id, filepath.Dir(to), 0, userOf(ctx)); err != nil {
			return nil, rpcError(err)
		}
	}
	fi, err := f.s.opts.Filesystem.MoveFile(ctx, id, from, to)
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: entryInfo(fi)}), nil
}

// ListDir lists a directory down to depth levels (0 as 1: its entries).
func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	p, err := resolve(ctx, req.Msg.GetPath(), false)
	if err != nil {
		return nil, err
	}
	depth := req.Msg.GetDepth()
	if depth > sandbox.MaxListDepth {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("depth must be at most %d", sandbox.MaxListDepth))
	}
	list, truncated, err := f.s.opts.Filesystem.ListFiles(ctx, sandboxOf(ctx), p, int(depth))
	if err != nil {
		return nil, rpcError(err)
	}
	if truncated {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("%s has more than %d entries down to depth %d: list less deep", p, len(list), max(depth, 1)))
	}
	out := &fspb.ListDirResponse{Entries: make([]*fspb.EntryInfo, len(list))}
	for i := range list {
		out.Entries[i] = entryInfo(&list[i])
	}
	return connect.NewResponse(out), nil
}

// Remove removes a file or a directory with what is below it; a path
// that is not there is removed already (envd's os.RemoveAll).
func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	p, err := resolve(ctx, req.Msg.GetPath(), true)
	if err != nil {
		return nil, err
	}
	if err := f.s.opts.Filesystem.RemoveFile(ctx, sandboxOf(ctx), p, true); err != nil && !errors.Is(err, model.ErrNotFound) {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}

// WatchDir streams a directory's changes: the start event once the watch
// is in place (the SDK waits for it), then each change, and a keepalive
// when nothing else went for the interval the client asked.
func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	dir, err := resolve(ctx, req.Msg.GetPath(), false)
	if err != nil {
		return err
	}
	id := sandboxOf(ctx)
	if err := f.acquire(id); err != nil {
		return err
	}
	defer f.release(id)
	w, err := f.s.opts.Filesystem.WatchDir(ctx, id, dir, req.Msg.GetRecursive())
	if err != nil {
		return rpcError(err)
	}
	defer w.Close()
	if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return fmt.Errorf("send the start event: %w", err)
	}
	events, errc, done := make(chan sandbox.FileEvent), make(chan error, 1), make(chan struct{})
	defer close(done)
	go func() {
		for {
			ev, err := w.Next()
			if err != nil {
				errc <- err
				return
			}
			select {
			case events <- ev:
			case <-done:
				return
			}
		}
	}()
	every := keepaliveOf(req.Header(), watchKeepalive)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		var msg *fspb.WatchDirResponse
		select {
		case ev := <-events:
			fe, err := f.event(ctx, id, dir, ev, req.Msg.GetIncludeEntry())
			if err != nil {
				return err
			}
			msg = &fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: fe}}
			tick.Reset(every)
		case <-tick.C:
			msg = &fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}
		case err := <-errc:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return rpcError(err)
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := stream.Send(msg); err != nil {
			return fmt.Errorf("send a watch event: %w", err)
		}
	}
}

var eventTypes = map[string]fspb.EventType{
	"create": fspb.EventType_EVENT_TYPE_CREATE, "write": fspb.EventType_EVENT_TYPE_WRITE,
	"remove": fspb.EventType_EVENT_TYPE_REMOVE, "rename": fspb.EventType_EVENT_TYPE_RENAME,
	"chmod": fspb.EventType_EVENT_TYPE_CHMOD,
}

// event is a change under dir as envd reports it: its name relative to
// dir, and, asked for, its entry when it is still there. Events the
// sandbox dropped end the watch: what follows would be incomplete.
func (f *filesystemService) event(ctx context.Context, id, dir string, ev sandbox.FileEvent, withEntry bool) (*fspb.FilesystemEvent, error) {
	if ev.Dropped > 0 {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the sandbox dropped %d events of this watch (they came faster than they were read): watch again", ev.Dropped))
	}
	name, err := filepath.Rel(dir, ev.Path)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("an event outside the watched directory: %w", err))
	}
	out := &fspb.FilesystemEvent{Name: name, Type: eventTypes[ev.Op]}
	if withEntry && out.Type != fspb.EventType_EVENT_TYPE_REMOVE && out.Type != fspb.EventType_EVENT_TYPE_RENAME {
		if fi, err := f.s.opts.Filesystem.StatFile(ctx, id, ev.Path); err == nil {
			out.Entry = entryInfo(fi)
		}
	}
	return out, nil
}

// acquire counts a watch of sandbox id, refused past maxWatches.
func (f *filesystemService) acquire(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.watches == nil {
		f.watches, f.watchers = map[string]int{}, map[string]*polledWatcher{}
	}
	if f.watches[id] >= maxWatches {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the sandbox has %d watches already; stop one first", maxWatches))
	}
	f.watches[id]++
	return nil
}

func (f *filesystemService) release(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.watches[id]--; f.watches[id] <= 0 {
		delete(f.watches, id)
	}
}

// polledWatcher is a watch whose events wait to be fetched.
type polledWatcher struct {
	sandbox string
	w       sandbox.Watcher
	cancel  context.CancelFunc
	idle    *time.Timer

	mu     sync.Mutex
	events []*fspb.FilesystemEvent
	err    error // why the watch ended, answered once its events are fetched
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	dir, err := resolve(ctx, req.Msg.GetPath(), false)
	if err != nil {
		return nil, err
	}
	id := sandboxOf(ctx)
	if err := f.acquire(id); err != nil {
		return nil, err
	}
	// The watch outlives this request (the principal and user stay, for
	// the entries' stats).
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w, err := f.s.opts.Filesystem.WatchDir(wctx, id, dir, req.Msg.GetRecursive())
	if err != nil {
		cancel()
		f.release(id)
		return nil, rpcError(err)
	}
	wid := "w" + rand.Text()
	pw := &polledWatcher{sandbox: id, w: w, cancel: cancel}
	pw.idle = time.AfterFunc(watcherIdle, func() { f.drop(id, wid) })
	f.mu.Lock()
	f.watchers[id+"/"+wid] = pw
	f.mu.Unlock()
	go f.collect(wctx, pw, dir, req.Msg.GetIncludeEntry())
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: wid}), nil
}

// collect queues a polled watch's events until it ends.
func (f *filesystemService) collect(ctx context.Context, pw *polledWatcher, dir string, withEntry bool) {
	defer pw.w.Close()
	for {
		ev, err := pw.w.Next()
		var fe *fspb.FilesystemEvent
		if err == nil {
			fe, err = f.event(ctx, pw.sandbox, dir, ev, withEntry)
		}
		pw.mu.Lock()
		if err == nil && len(pw.events) >= maxQueuedEvents {
			err = connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("more than %d events waited to be fetched: watch again", maxQueuedEvents))
		}
		if err != nil {
			pw.err = rpcError(err)
			pw.mu.Unlock()
			return
		}
		pw.events = append(pw.events, fe)
		pw.mu.Unlock()
	}
}

// GetWatcherEvents answers the events queued since the last call; once
// the watch has ended and they are fetched, why it ended, and the
// watcher is gone.
func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	id, wid := sandboxOf(ctx), req.Msg.GetWatcherId()
	f.mu.Lock()
	pw := f.watchers[id+"/"+wid]
	f.mu.Unlock()
	if pw == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher with id %.64q not found", wid))
	}
	pw.idle.Reset(watcherIdle)
	pw.mu.Lock()
	events, err := pw.events, pw.err
	pw.events = nil
	pw.mu.Unlock()
	if len(events) == 0 && err != nil {
		f.drop(id, wid)
		return nil, err
	}
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: events}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	if !f.drop(sandboxOf(ctx), req.Msg.GetWatcherId()) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher with id %.64q not found", req.Msg.GetWatcherId()))
	}
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}

// drop ends sandbox id's polled watcher wid, if it is there.
func (f *filesystemService) drop(id, wid string) bool {
	f.mu.Lock()
	pw := f.watchers[id+"/"+wid]
	delete(f.watchers, id+"/"+wid)
	f.mu.Unlock()
	if pw == nil {
		return false
	}
	f.release(id)
	pw.idle.Stop()
	pw.cancel()
	pw.w.Close()
	return true
}

var fileTypes = map[string]fspb.FileType{
	"file": fspb.FileType_FILE_TYPE_FILE, "dir": fspb.FileType_FILE_TYPE_DIRECTORY, "symlink": fspb.FileType_FILE_TYPE_SYMLINK,
}

// entryInfo is fi as envd describes it (its mode the permission bits,
// its permissions as Go's FileMode prints them, as envd's do).
func entryInfo(fi *sandbox.FileInfo) *fspb.EntryInfo {
	m := fs.FileMode(fi.Mode & 0o777)
	for bit, mode := range map[uint32]fs.FileMode{0o4000: fs.ModeSetuid, 0o2000: fs.ModeSetgid, 0o1000: fs.ModeSticky} {
		if fi.Mode&bit != 0 {
			m |= mode
		}
	}
	switch fi.Type {
	case "dir":
		m |= fs.ModeDir
	case "symlink":
		m |= fs.ModeSymlink
	case "other":
		m |= fs.ModeIrregular
	}
	e := &fspb.EntryInfo{
		Name: fi.Name, Type: fileTypes[fi.Type], Path: fi.Path, Size: fi.Size,
		Mode: fi.Mode & 0o777, Permissions: m.String(),
		Owner: idName(fi.UID), Group: idName(fi.GID),
	}
	if !fi.ModTime.IsZero() {
		e.ModifiedTime = timestamppb.New(fi.ModTime)
	}
	if fi.Type == "symlink" {
		e.SymlinkTarget = &fi.LinkTarget
	}
	return e
}

// idName names a user or group id every image has (root; the default
// user and its group); any other is its number.
func idName(id uint32) string {
	switch id {
	case 0:
		return "root"
	case layout.DefaultUID:
		return layout.DefaultUser
	}
	return strconv.FormatUint(uint64(id), 10)
}
