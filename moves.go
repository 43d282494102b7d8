package harebox

import (
	"context"
	"net/http"
	"time"

	"github.com/harebox/harebox/move"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/volume"
)

// Moving sandboxes between the hosts of a deployment is package mover's;
// the runtime checks who may, and holds, wakes and lets go of the boxes a
// move takes.

// DrainReport is what a drain did: the sandboxes it moved, and those it
// could not move, with why.
type DrainReport = move.DrainReport

// moveStale and moveEvery are mover.Options' Stale and Every (tests set
// them: SetMoveTiming).
var moveStale, moveEvery = 30 * time.Second, 10 * time.Second

// Move moves sandbox id to host to: the operator only. A running or
// paused sandbox resumes there as it was, its processes running on; a
// hibernated or stopped one stays so there (a stopped one's disk goes).
func (e *Engine) Move(ctx context.Context, id, to string) (*move.Result, error) {
	return e.rt.Move(ctx, id, to)
}

// Drain marks this host (name) draining, so that no new sandbox goes
// here, and moves its sandboxes one by one to the hosts placement picks
// (the operator only). A sandbox no host can take (or has room for), or
// that cannot move (one whose volume another sandbox holds too, one that
// stopped on its own), stays, and the report says why.
func (e *Engine) Drain(ctx context.Context, name string) (*DrainReport, error) {
	return e.rt.Drain(ctx, name)
}

// Undrain lets new sandboxes go to this host (name) again (the operator
// only).
func (e *Engine) Undrain(ctx context.Context, name string) error { return e.rt.Undrain(ctx, name) }

// Stopping tells the engine that its process is about to stop (hareboxd
// calls it on SIGTERM, before its HTTP servers shut down): no move starts
// from here on, so a drain under way stops after the move it is making,
// reporting the sandboxes it did not move as stayed. The move under way
// finishes. (A process that dies in the middle of a move anyway leaves it
// to be finished or rolled back when the host starts again.)
func (e *Engine) Stopping() { e.moves.Stop() }

// Moves serves this host's side of moves from other hosts (mount it on
// the internal endpoint only).
func (e *Engine) Moves() http.Handler { return move.NewReceiver(e.moves) }

// moveVolumes are the volumes' side of moves (mover.Volumes): the
// volumes' service, its transaction in a move's narrowed.
type moveVolumes struct{ *volume.Service }

func (v moveVolumes) Owns(id, name string) bool { return volume.Owns(id, name) }

func (v moveVolumes) Hand(ctx context.Context, tx store.Tx, rec *store.Sandbox, vs []*store.Volume, to string) error {
	return v.Service.Hand(ctx, tx, rec, vs, to)
}
