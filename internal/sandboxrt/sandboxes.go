package sandboxrt

import (
	"context"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Get returns a sandbox, including deleted ones.
func (e *Runtime) Get(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	if err := e.check(ctx, "getSandbox", id); err != nil {
		return nil, err
	}
	if b := e.boxes.get(id); b != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.view(), nil
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	return &rec.Sandbox, nil
}

// List returns the sandboxes that match f, oldest first. Deleted
// sandboxes are listed only when f.State asks for them.
func (e *Runtime) List(ctx context.Context, f sandbox.ListFilter) ([]*sandbox.Sandbox, error) {
	p := authz.From(ctx)
	if err := authz.Allowed(p, "listSandboxes"); err != nil {
		return nil, err
	}
	var accountID, projectID, fleetID string
	if f.Account != "" || f.Project != "" || f.Fleet != "" {
		err := e.store.Update(ctx, func(tx store.Tx) error {
			if f.Project == "" && f.Fleet == "" {
				acc, err := e.tenants.Account(ctx, tx, f.Account)
				if err != nil {
					return sandbox.Errorf(sandbox.ErrInvalid, "account", "%v", err)
				}
				accountID = acc.ID
				return nil
			}
			acc, proj, err := e.tenants.ProjectIn(ctx, tx, f.Account, f.Project)
			if err != nil {
				field := "project"
				if acc == nil {
					field = "account"
				}
				return sandbox.Errorf(sandbox.ErrInvalid, field, "%v", err)
			}
			accountID = acc.ID
			projectID = proj.ID
			if f.Fleet != "" {
				fl, err := e.tenants.Fleet(ctx, tx, proj, f.Fleet)
				if err != nil {
					return sandbox.Errorf(sandbox.ErrInvalid, "fleet", "%v", err)
				}
				fleetID = fl.ID
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	recs, err := e.store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	out := []*sandbox.Sandbox{}
	for _, r := range recs {
		s := &r.Sandbox
		if b := e.boxes.get(r.ID); b != nil {
			b.mu.Lock()
			s = b.view()
			b.mu.Unlock()
		}
		if s.State == sandbox.StateDeleted && f.State != sandbox.StateDeleted {
			continue
		}
		if (accountID != "" && s.AccountID != accountID) || (projectID != "" && s.ProjectID != projectID) ||
			(fleetID != "" && s.FleetID != fleetID) || !authz.Visible(p, authz.TargetOf(s)) {
			continue
		}
		if f.Match(s) {
			out = append(out, s)
		}
	}
	return out, nil
}

// Pause freezes a running sandbox's VM.
func (e *Runtime) Pause(ctx context.Context, id string) (_ *sandbox.Sandbox, err error) {
	defer e.audited(ctx, "pauseSandbox", id, &err)
	if err := e.check(ctx, "pauseSandbox", id); err != nil {
		return nil, err
	}
	return e.pause(ctx, id)
}

func (e *Runtime) pause(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return e.transition(ctx, id, sandbox.StatePaused, func(b *box) error {
		if err := b.m.Pause(ctx); err != nil {
			return err
		}
		// (It is paused whatever the caller does now: so is its meter.)
		e.meter.Transition(context.WithoutCancel(ctx), b.rec, sandbox.StatePaused, false)
		return nil
	})
}

// Resume continues a paused sandbox.
func (e *Runtime) Resume(ctx context.Context, id string) (_ *sandbox.Sandbox, err error) {
	defer e.audited(ctx, "resumeSandbox", id, &err)
	if err := e.check(ctx, "resumeSandbox", id); err != nil {
		return nil, err
	}
	if e.boxes.get(id) == nil {
		if rec, err := e.record(ctx, id); err == nil && rec.State == sandbox.StateHibernated {
			return e.wake(ctx, rec)
		}
	}
	box, err := e.transition(ctx, id, sandbox.StateRunning, func(b *box) error {
		// Its budgets must have room for it to run again.
		if err := e.meter.Transition(ctx, b.rec, sandbox.StateRunning, true); err != nil {
			return err
		}
		return b.m.Resume(ctx)
	})
	if err != nil {
		return nil, err
	}
	// The guest clock stood still while paused. Best effort, and outside the
	// sandbox's lock: a stalling guest must not hold up its lifecycle.
	if b := e.boxes.get(id); b != nil {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if c, err := b.client(sctx, e); err == nil {
			c.SyncTime(sctx, time.Now())
		}
	}
	return box, nil
}

func (e *Runtime) transition(ctx context.Context, id string, to sandbox.State, f func(*box) error) (*sandbox.Sandbox, error) {
	b, err := e.liveOrErr(ctx, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gone != nil {
		return nil, b.gone
	}
	if err := sandbox.CanTransition(b.rec.State, to); err != nil {
		return nil, err
	}
	if err := f(b); err != nil {
		return nil, err
	}
	b.rec.State = to
	if err := e.store.PutSandbox(ctx, b.rec); err != nil {
		return nil, err
	}
	return b.view(), nil
}
