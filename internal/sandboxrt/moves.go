package sandboxrt

import (
	"context"
	"errors"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/move"
	"github.com/harebox/harebox/move/mover"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Moving sandboxes between the hosts of a deployment is package mover's:
// here are who may, and the runtime as a move holds, wakes and lets go
// of boxes (moveRuntime).

// Move moves sandbox id to host to: the operator only. A running or
// paused sandbox resumes there as it was, its processes running on; a
// hibernated or stopped one stays so there (a stopped one's disk goes).
func (e *Runtime) Move(ctx context.Context, id, to string) (_ *move.Result, err error) {
	defer e.audited(ctx, "moveSandbox", id, &err)
	if err := e.check(ctx, "moveSandbox", id); err != nil {
		return nil, err
	}
	return e.moves.Move(ctx, id, to)
}

// Drain marks this host (name) draining, so that no new sandbox goes
// here, and moves its sandboxes one by one to the hosts placement picks
// (the operator only). A sandbox no host can take (or has room for), or
// that cannot move (one with volumes, one that stopped on its own),
// stays, and the report says why.
func (e *Runtime) Drain(ctx context.Context, name string) (_ *move.DrainReport, err error) {
	defer func() { e.audit.Record(ctx, "drainHost", "", name, err) }()
	if err := e.drainable(ctx, "drainHost", name); err != nil {
		return nil, err
	}
	return e.moves.Drain(ctx, name, e.Move)
}

// Undrain lets new sandboxes go to this host (name) again (the operator
// only).
func (e *Runtime) Undrain(ctx context.Context, name string) (err error) {
	defer func() { e.audit.Record(ctx, "undrainHost", "", name, err) }()
	if err := e.drainable(ctx, "undrainHost", name); err != nil {
		return err
	}
	return e.hosts.SetDraining(ctx, false)
}

// drainable checks a drain or undrain of host name: the operator's, and
// of this host (the REST layer sends it to the host it names).
func (e *Runtime) drainable(ctx context.Context, action, name string) error {
	if err := authz.Allowed(authz.From(ctx), action); err != nil {
		return err
	}
	if name != e.hosts.Name() {
		if _, err := e.hosts.Get(ctx, name); errors.Is(err, store.ErrNotFound) {
			return sandbox.Errorf(sandbox.ErrNotFound, "", "no host %q", name)
		}
		return elsewhereErr("host "+name, name)
	}
	return nil
}

// moveRuntime is the engine's boxes as a move needs them.
type moveRuntime struct{ e *Runtime }

var _ mover.Runtime = moveRuntime{}

// Hold hibernates sandbox id if it runs (or is paused), and holds its
// box, locked and registered, so that no other call runs it here until
// the move lets go of it. It returns the state the sandbox was in.
func (r moveRuntime) Hold(ctx context.Context, id string) (mover.Held, sandbox.State, error) {
	e := r.e
	if b := e.boxes.get(id); b != nil {
		b.mu.Lock()
		from := b.rec.State
		if b.gone != nil || (from != sandbox.StateRunning && from != sandbox.StatePaused) {
			b.mu.Unlock()
			return nil, "", sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is busy (%s): try again", id, from)
		}
		if err := e.hibernate(ctx, b, true); err != nil {
			if b.rec.State == sandbox.StateHibernated { // (its VM gone: kept, not held)
				snap := *b.rec
				e.boxes.drop(id, &snap)
			}
			b.mu.Unlock()
			return nil, "", err
		}
		return heldBox{e, b}, from, nil
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, "", err
	}
	b := &box{rec: rec, deleting: make(chan struct{})}
	b.mu.Lock()
	prev, ok := e.boxes.take(b)
	if !ok {
		b.mu.Unlock()
		return nil, "", sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is busy: try again", id)
	}
	// It may have been resumed or deleted since it was read.
	if cur, err := e.store.GetSandbox(ctx, id); err != nil || cur.State != rec.State || !cur.Kept || e.hosts.Foreign(cur) {
		e.boxes.drop(id, prev)
		b.mu.Unlock()
		return nil, "", sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is no longer %s here", id, rec.State)
	}
	return heldBox{e, b}, rec.State, nil
}

func (r moveRuntime) Record(ctx context.Context, id string) (*store.Sandbox, error) {
	return r.e.record(ctx, id)
}
func (r moveRuntime) Wake(ctx context.Context, rec *store.Sandbox) (*sandbox.Sandbox, error) {
	return r.e.wake(ctx, rec)
}
func (r moveRuntime) Pause(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return r.e.pause(ctx, id)
}

func (r moveRuntime) TakeUp(ctx context.Context, rec *store.Sandbox) {
	e := r.e
	if err := e.urls.Took(ctx, rec.ID); err != nil {
		e.log.Warn("move: loading the URLs of the sandbox taken up", "id", rec.ID, "err", err)
	}
	if err := e.meter.Keep(ctx, rec, rec.State); err != nil {
		e.log.Warn("move: metering the sandbox taken up", "id", rec.ID, "err", err)
	}
	e.boxes.drop(rec.ID, rec)
}

func (r moveRuntime) Live(id string) (*sandbox.Sandbox, bool) {
	if b := r.e.boxes.get(id); b != nil {
		return b.view(), true
	}
	return nil, false
}

func (r moveRuntime) ImageDir(rec *store.Sandbox) (string, error) {
	img, err := r.e.imageOf(rec)
	return img.Dir, err
}

func (r moveRuntime) Fits(size sandbox.Resources) error {
	if err := r.e.capacity.Reserve(size); err != nil {
		return err
	}
	r.e.capacity.Release(size)
	return nil
}

// heldBox is a box a move holds: locked, registered.
type heldBox struct {
	e *Runtime
	b *box
}

func (h heldBox) Record() *store.Sandbox { return h.b.rec }

func (h heldBox) Handed(ctx context.Context, to string) {
	id := h.b.rec.ID
	h.e.meter.Final(ctx, h.b.rec)
	h.e.urls.Left(id)
	h.letGo(nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "sandbox %s moved to host %s: ask again", id, to))
}

func (h heldBox) Lost() {
	h.letGo(nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "sandbox %s was being moved: ask again", h.b.rec.ID))
}

func (h heldBox) Keep() *store.Sandbox {
	snap := *h.b.rec
	h.letGo(&snap, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s was being moved: try again", snap.ID))
	return &snap
}

// letGo takes the box out of the table (keeping kept, if not nil) and
// unlocks it, gone: a call that waited for its lock tries again.
func (h heldBox) letGo(kept *store.Sandbox, gone error) {
	if kept != nil {
		h.e.boxes.drop(kept.ID, kept)
	} else {
		h.e.boxes.forget(h.b.rec.ID)
	}
	h.b.gone = gone
	h.b.mu.Unlock()
}
