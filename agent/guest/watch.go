package guest

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/agentpb"
)

// Watches: inotify over a directory and, recursive, its subdirectories,
// for the host (E2B's WatchDir). Each is bounded, since the host calls
// them for its users: at most maxWatches at once on the agent, each over
// at most maxWatchDirs directories, holding at most watchQueue events
// for a slow reader; beyond that, events are dropped and counted.
const (
	maxWatches   = 16
	maxWatchDirs = 4096
	watchQueue   = 1024
)

const watchMask = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MODIFY | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_DONT_FOLLOW | unix.IN_EXCL_UNLINK

// Watch implements agentpb.AgentServer.
func (s *Server) Watch(req *agentpb.WatchRequest, stream agentpb.Agent_WatchServer) error {
	dir := req.GetPath()
	if err := CheckPath(dir); err != nil {
		return err
	}
	if s.watches.Add(1) > maxWatches {
		s.watches.Add(-1)
		return status.Errorf(codes.ResourceExhausted, "%d watches run already", maxWatches)
	}
	defer s.watches.Add(-1)
	if fi, err := os.Stat(dir); err != nil {
		return fsError("watch", err)
	} else if !fi.IsDir() {
		return status.Errorf(codes.FailedPrecondition, "watch: %s is not a directory", dir)
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return status.Errorf(codes.ResourceExhausted, "watch: inotify: %v", err)
	}
	// (Non-blocking: reads wait in the runtime's poller, and Close ends
	// them.)
	w := &watcher{fd: fd, f: os.NewFile(uintptr(fd), "inotify"), recursive: req.GetRecursive(), dirs: map[int32]string{}}
	defer w.f.Close()
	if err := w.add(dir); err != nil {
		return err
	}
	if err := stream.Send(&agentpb.WatchEvent{}); err != nil { // in place
		return err
	}
	events := make(chan *agentpb.WatchEvent, watchQueue)
	go w.read(events)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return status.Errorf(codes.NotFound, "watch: %s is gone", dir)
			}
			if err := stream.Send(ev); err != nil {
				return err
			}
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

type watcher struct {
	fd        int
	f         *os.File
	recursive bool
	mu        sync.Mutex
	dirs      map[int32]string // by watch descriptor
	root      int32
}

// add watches dir and, recursive, the directories below it.
func (w *watcher) add(dir string) error {
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask)
	if err != nil {
		return fsError("watch", err)
	}
	w.mu.Lock()
	if len(w.dirs) >= maxWatchDirs {
		w.mu.Unlock()
		unix.InotifyRmWatch(w.fd, uint32(wd))
		return status.Errorf(codes.ResourceExhausted, "watch: more than %d directories", maxWatchDirs)
	}
	if len(w.dirs) == 0 {
		w.root = int32(wd)
	}
	w.dirs[int32(wd)] = dir
	w.mu.Unlock()
	if !w.recursive {
		return nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil // (gone or unreadable since: nothing below to watch)
	}
	for _, de := range ents {
		if de.IsDir() { // (not a link to one)
			if err := w.add(filepath.Join(dir, de.Name())); status.Code(err) == codes.ResourceExhausted {
				return err
			}
		}
	}
	return nil
}

// read turns inotify's events into the stream's until the file is closed
// or the watched directory goes; then it closes out. An event out cannot
// take is dropped, and counted on the next one it takes.
func (w *watcher) read(out chan<- *agentpb.WatchEvent) {
	defer close(out)
	var dropped uint64
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			return
		}
		for b := buf[:n]; len(b) >= unix.SizeofInotifyEvent; {
			wd := int32(binary.NativeEndian.Uint32(b[0:]))
			mask := binary.NativeEndian.Uint32(b[4:])
			nameLen := int(binary.NativeEndian.Uint32(b[12:]))
			if unix.SizeofInotifyEvent+nameLen > len(b) {
				break
			}
			name := string(bytes.TrimRight(b[unix.SizeofInotifyEvent:unix.SizeofInotifyEvent+nameLen], "\x00"))
			b = b[unix.SizeofInotifyEvent+nameLen:]
			if mask&unix.IN_Q_OVERFLOW != 0 {
				dropped++
				continue
			}
			w.mu.Lock()
			dir, known := w.dirs[wd]
			if mask&unix.IN_IGNORED != 0 {
				delete(w.dirs, wd)
			}
			root := wd == w.root
			w.mu.Unlock()
			if !known {
				continue
			}
			if mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED) != 0 {
				if root {
					return // the watched directory itself went
				}
				continue // (its parent reported it)
			}
			ev := &agentpb.WatchEvent{Path: filepath.Join(dir, name), Op: opOf(mask)}
			if ev.Op == agentpb.WatchOp_WATCH_OP_UNSPECIFIED {
				continue
			}
			if ev.Op == agentpb.WatchOp_WATCH_OP_CREATE && mask&unix.IN_ISDIR != 0 && w.recursive {
				w.add(ev.Path) // (past the bound its changes go unseen)
			}
			ev.Dropped = dropped
			select {
			case out <- ev:
				dropped = 0
			default:
				dropped++
			}
		}
	}
}

// opOf is the op of an inotify event: a name moved in is created there,
// one moved away is renamed (as fsnotify has it).
func opOf(mask uint32) agentpb.WatchOp {
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		return agentpb.WatchOp_WATCH_OP_CREATE
	case mask&unix.IN_MODIFY != 0:
		return agentpb.WatchOp_WATCH_OP_WRITE
	case mask&unix.IN_DELETE != 0:
		return agentpb.WatchOp_WATCH_OP_REMOVE
	case mask&unix.IN_MOVED_FROM != 0:
		return agentpb.WatchOp_WATCH_OP_RENAME
	case mask&unix.IN_ATTRIB != 0:
		return agentpb.WatchOp_WATCH_OP_CHMOD
	}
	return agentpb.WatchOp_WATCH_OP_UNSPECIFIED
}
