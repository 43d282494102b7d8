package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/harebox/harebox/agent/agentpb"
)

// WatchOp is what changed.
type WatchOp string

// The ops a watch reports (a name moved in is created, one moved away
// renamed).
const (
	OpCreate WatchOp = "create"
	OpWrite  WatchOp = "write"
	OpRemove WatchOp = "remove"
	OpRename WatchOp = "rename"
	OpChmod  WatchOp = "chmod"
)

var watchOps = map[agentpb.WatchOp]WatchOp{
	agentpb.WatchOp_WATCH_OP_CREATE: OpCreate, agentpb.WatchOp_WATCH_OP_WRITE: OpWrite,
	agentpb.WatchOp_WATCH_OP_REMOVE: OpRemove, agentpb.WatchOp_WATCH_OP_RENAME: OpRename,
	agentpb.WatchOp_WATCH_OP_CHMOD: OpChmod,
}

// WatchEvent is one change under a watched directory.
type WatchEvent struct {
	// Path is the file's, below the watched directory.
	Path string
	Op   WatchOp
	// Dropped counts the events the agent dropped before this one (the
	// reader was too slow).
	Dropped uint64
}

// Watcher is a watch in place (Watch): Next returns its events.
type Watcher struct {
	c      *Client
	dir    string
	stream agentpb.Agent_WatchClient
	cancel context.CancelFunc
}

// Watch watches dir (and, recursive, its subdirectories) and returns once
// the watch is in place; it lasts until Close or ctx ends. Protocol 4.
func (c *Client) Watch(ctx context.Context, dir string, recursive bool) (_ *Watcher, err error) {
	defer classify(&err)
	// (ctx's deadline stays on the host, as Attach's does.)
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	w := &Watcher{c: c, dir: dir, cancel: func() { stop(); cancel() }}
	defer func() {
		if err != nil {
			w.Close()
		}
	}()
	if w.stream, err = c.rpc.Watch(sctx, &agentpb.WatchRequest{Path: dir, Recursive: recursive}); err != nil {
		return nil, c.wrap("watch", err)
	}
	// Its first message says it is in place; a guest that does not say so
	// in time fails the call.
	t := time.AfterFunc(c.opts.CallTimeout, cancel)
	m, err := w.stream.Recv()
	t.Stop()
	switch {
	case err != nil:
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, c.wrap("watch", err)
	case m.GetPath() != "" || m.GetOp() != agentpb.WatchOp_WATCH_OP_UNSPECIFIED:
		return nil, fmt.Errorf("%w: watch: an event before the watch was in place", ErrGuest)
	}
	return w, nil
}

// Next waits for the next event. It fails once the watch ends: Close,
// the caller's ctx, or the watched directory gone (of kind not found).
func (w *Watcher) Next() (_ WatchEvent, err error) {
	defer classify(&err)
	m, err := w.stream.Recv()
	if errors.Is(err, io.EOF) {
		return WatchEvent{}, fmt.Errorf("%w: watch: the stream ended without a reason", ErrGuest)
	}
	if err != nil {
		return WatchEvent{}, w.c.wrap("watch", err)
	}
	op, ok := watchOps[m.GetOp()]
	if !ok || len(m.GetPath()) > 4096 || !below(w.dir, m.GetPath()) {
		return WatchEvent{}, fmt.Errorf("%w: watch: a bad event (op %d, path %.64q)", ErrGuest, m.GetOp(), m.GetPath())
	}
	return WatchEvent{Path: m.GetPath(), Op: op, Dropped: m.GetDropped()}, nil
}

// Close ends the watch.
func (w *Watcher) Close() { w.cancel() }
