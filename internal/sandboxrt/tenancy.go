package sandboxrt

import (
	"context"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
)

// check authorizes action on sandbox id for the principal in ctx. A
// sandbox the principal may not see is ErrNotFound, exactly like a missing
// one. The operator passes without a lookup.
func (e *Runtime) check(ctx context.Context, action, id string) error {
	if err := e.allowed(ctx, action, id); err != nil {
		return err
	}
	return e.here(ctx, action, id)
}

func (e *Runtime) allowed(ctx context.Context, action, id string) error {
	p := authz.From(ctx)
	if p.Operator {
		return nil
	}
	if err := authz.Allowed(p, action); err != nil {
		return err
	}
	var s *sandbox.Sandbox
	if b := e.boxes.get(id); b != nil {
		// Tenancy fields never change after create: no lock needed.
		s = &b.rec.Sandbox
	} else {
		rec, err := e.record(ctx, id)
		if err != nil {
			return err
		}
		s = &rec.Sandbox
	}
	if !authz.Visible(p, authz.TargetOf(s)) {
		return sandbox.Errorf(sandbox.ErrNotFound, "", "no sandbox %q", id)
	}
	return nil
}

// here refuses to act on another host's sandbox (its VM, disk and files
// are there): a get reads its record, anything else goes to its host (a
// REST server forwards it there).
func (e *Runtime) here(ctx context.Context, action, id string) error {
	if !e.shared || action == "getSandbox" || e.boxes.get(id) != nil {
		return nil
	}
	rec, err := e.store.GetSandbox(ctx, id)
	if err != nil || !e.hosts.Foreign(rec) {
		return nil
	}
	return elsewhereErr("sandbox "+id, rec.Host)
}

func elsewhereErr(what, host string) error {
	return sandbox.Errorf(sandbox.ErrUnavailable, "", "%s is on host %s: ask that host (a hareboxd with an internal endpoint forwards it there)", what, host)
}

// Authorize reports whether the principal in ctx may do action on sandbox
// id, which must exist: nil, or the error the call itself would return
// first. A server uses it to answer before it commits to a stream.
func (e *Runtime) Authorize(ctx context.Context, action, id string) (err error) {
	defer func() {
		if err != nil { // the call will not be made: record its refusal
			e.audited(ctx, action, id, &err)
		}
	}()
	if err := e.check(ctx, action, id); err != nil {
		return err
	}
	if e.boxes.get(id) == nil {
		_, err := e.record(ctx, id)
		return err
	}
	return nil
}

// place puts a new sandbox's record in its account, project and fleet
// (tenant.Place), pins its environment, gives it its place on its
// project's mesh and admits it against its budgets, all in tx, the
// create's transaction.
func (e *Runtime) place(ctx context.Context, tx store.Tx, req *sandbox.CreateRequest, rec *store.Sandbox) error {
	proj, err := e.tenants.Place(ctx, tx, req, rec)
	if err != nil {
		return err
	}
	if err := e.guests.Pin(ctx, tx, req, proj, rec); err != nil {
		return err
	}
	if err := e.mesh.Join(ctx, tx, req, proj, rec); err != nil {
		return err
	}
	if err := e.meter.Admit(ctx, tx, rec); err != nil {
		return err
	}
	return tx.PutSandbox(ctx, rec)
}

// placeDefault puts a record that predates tenancy in the default account's
// default project.
func (e *Runtime) placeDefault(ctx context.Context, rec *store.Sandbox) error {
	return e.store.Update(ctx, func(tx store.Tx) error {
		p, err := tx.ProjectByName(ctx, e.defaultAcc.ID, tenant.DefaultName)
		if err != nil {
			return err
		}
		rec.AccountID, rec.ProjectID, rec.Project = e.defaultAcc.ID, p.ID, p.Name
		rec.Monitoring, rec.Snapshots = true, true
		return tx.PutSandbox(ctx, rec)
	})
}

// audited records, when a call ends, what the principal in ctx did to
// sandbox id (and how it ended) in the audit log.
func (e *Runtime) audited(ctx context.Context, action, id string, err *error) {
	e.audit.Record(ctx, action, e.accountOf(ctx, id), id, *err)
}

// accountOf is the account of sandbox id for its audit entries ("" when
// there is no such sandbox).
func (e *Runtime) accountOf(ctx context.Context, id string) string {
	if b := e.boxes.get(id); b != nil {
		return b.rec.AccountID
	}
	if rec, err := e.store.GetSandbox(ctx, id); err == nil && sandbox.ValidID(id) {
		return rec.AccountID
	}
	return ""
}

// OnSandbox authorizes action on sandbox id, which must exist, for the
// principal in ctx, then calls call, and records the action and how it
// ended in the audit log: a domain's service called directly (by the REST
// layer) on a sandbox is checked and audited as the engine's own calls are.
func (e *Runtime) OnSandbox(ctx context.Context, action, id string, call func(context.Context) error) (err error) {
	defer e.audited(ctx, action, id, &err)
	if err := e.check(ctx, action, id); err != nil {
		return err
	}
	if _, err := e.record(ctx, id); err != nil && e.boxes.get(id) == nil {
		return err
	}
	return call(ctx)
}
