package sandboxrt

import (
	"context"
	"errors"

	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
)

// RewriteRecords writes this host's live sandboxes' records again, as they
// are: another host marked them lost while this one ran (its lease
// lapsed: the database was out of reach, or the host stalled).
func (e *Runtime) RewriteRecords(ctx context.Context) {
	for _, b := range e.boxes.all() {
		// (Under its lock: a change that writes it meanwhile is not
		// overwritten with what it was.)
		b.mu.Lock()
		if b.gone == nil { // (a box a move let go of: its record is not this one's to write)
			if err := e.store.PutSandbox(ctx, b.rec); err != nil {
				e.log.Warn("cannot write a sandbox's record again", "id", b.rec.ID, "err", err)
			}
		}
		b.mu.Unlock()
	}
}

// hostView is the engine as the registry of hosts sees it
// (cluster.Sandboxes).
type hostView struct{ e *Runtime }

func (v hostView) Live(id string) bool { return v.e.boxes.get(id) != nil }

// Forget erases a removed host's sandbox's data key first, then what it
// keeps in the store and the secret store.
func (v hostView) Forget(ctx context.Context, rec *store.Sandbox) error {
	return errors.Join(sandboxkeys.Erase(ctx, v.e.sec, rec.ID), v.e.forgetStored(ctx, &box{rec: rec}))
}

func (v hostView) DropVolumes(ctx context.Context, host string) error {
	return v.e.volumes.DropHost(ctx, host)
}

func (v hostView) DropSnapshot(ctx context.Context, s *store.Snapshot) error {
	return v.e.snaps.Drop(ctx, s)
}
