package harebox

import (
	"context"
	"errors"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/move"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// DrainReport is what a drain did: the sandboxes it moved, and those it
// could not move, with why.
type DrainReport = move.DrainReport

// Drain marks this host (name) draining, so that no new sandbox goes
// here, and moves its sandboxes one by one to the hosts placement picks
// (the operator only). A sandbox no host can take (or has room for), or
// that cannot move (one with volumes, one that stopped on its own),
// stays, and the report says why.
func (e *Engine) Drain(ctx context.Context, name string) (_ *DrainReport, err error) {
	defer func() { e.audit.Record(ctx, "drainHost", "", name, err) }()
	if err := e.drainable(ctx, "drainHost", name); err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx) // a drain that started finishes
	if err := e.hosts.SetDraining(ctx, true); err != nil {
		return nil, err
	}
	recs, err := e.store.SandboxesOn(ctx, name, sandbox.StateRunning, sandbox.StatePaused, sandbox.StateHibernated, sandbox.StateStopped)
	if err != nil {
		return nil, err
	}
	rep := &DrainReport{Host: name, Moved: []move.Moved{}, Stayed: []move.Stayed{}}
	for _, rec := range recs {
		var size sandbox.Resources
		if resumes(rec.State) {
			size = rec.Size // (a kept one holds no capacity there)
		}
		h, err := e.hosts.Place(ctx, size, sandbox.Site{})
		if err == nil && h.Name == name {
			err = sandbox.Errorf(sandbox.ErrCapacity, "", "no other host has room for it")
		}
		var res *move.Result
		if err == nil {
			res, err = e.Move(ctx, rec.ID, h.Name)
		}
		if err != nil {
			rep.Stayed = append(rep.Stayed, move.Stayed{ID: rec.ID, Error: err.Error()})
			continue
		}
		rep.Moved = append(rep.Moved, move.Moved{ID: rec.ID, To: res.To, PausedMS: res.PausedMS})
	}
	return rep, nil
}

// Undrain lets new sandboxes go to this host (name) again (the operator
// only).
func (e *Engine) Undrain(ctx context.Context, name string) (err error) {
	defer func() { e.audit.Record(ctx, "undrainHost", "", name, err) }()
	if err := e.drainable(ctx, "undrainHost", name); err != nil {
		return err
	}
	return e.hosts.SetDraining(ctx, false)
}

// drainable checks a drain or undrain of host name: the operator's, and
// of this host (the REST layer sends it to the host it names).
func (e *Engine) drainable(ctx context.Context, action, name string) error {
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
