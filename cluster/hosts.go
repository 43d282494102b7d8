package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Sandboxes is what the registry needs of the engine: whether a sandbox
// is live on this host, and what goes with the sandboxes and snapshots of
// a host that is removed.
type Sandboxes interface {
	// Live reports whether a sandbox is live on this host (the engine
	// answers for it; no look in the store).
	Live(id string) bool
	// Forget erases a sandbox's data key, then what it keeps in the store
	// and the secret store (its URLs, environment, history and budget
	// reservations).
	Forget(ctx context.Context, rec *store.Sandbox) error
	// DropSnapshot drops a snapshot from the store and the secret store;
	// its files are not on this host (Dir is "").
	DropSnapshot(ctx context.Context, s *store.Snapshot) error
	// DropVolumes erases the keys of a host's volumes, then their
	// records; their files are not on this host.
	DropVolumes(ctx context.Context, host string) error
}

// Foreign reports whether a record belongs to another host. Records
// from before hosts existed have none: the host that opens the store
// first takes them. A store that is not shared (SQLite) is one host's,
// whatever its name was when it wrote them (a renamed machine keeps its
// sandboxes).
func (r *Registry) Foreign(rec *store.Sandbox) bool {
	return r.shared && rec.Host != "" && rec.Host != r.opts.Name
}

// Elsewhere says where a sandbox of another host runs: its host's row,
// or nil for a sandbox of this host or one that does not exist (the
// engine answers for those itself).
func (r *Registry) Elsewhere(ctx context.Context, id string) (*Host, error) {
	if r.opts.Sandboxes.Live(id) || !sandbox.ValidID(id) {
		return nil, nil
	}
	rec, err := r.db.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !r.Foreign(rec) {
		return nil, nil
	}
	h, err := r.db.GetHost(ctx, rec.Host)
	if errors.Is(err, store.ErrNotFound) {
		return &Host{Name: rec.Host}, nil // (a host that never registered: down)
	}
	return h, err
}

// SnapshotElsewhere says where a snapshot's files are when another host
// has them (the host of the sandbox it was taken of), as Elsewhere does
// for a sandbox: restores and deletes of it go there.
func (r *Registry) SnapshotElsewhere(ctx context.Context, id string) (*Host, error) {
	snap, err := r.db.GetSnapshot(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return r.Elsewhere(ctx, snap.SandboxID)
}

// Remove takes a host that is down out of the deployment for good, for
// the principal in the context (the operator only): its sandboxes that
// are not deleted become deleted, their data keys erased (what is left on
// its disks is ciphertext without a key), their URLs, environment,
// history and budget reservations gone (Sandboxes.Forget); snapshots of
// its sandboxes go too (their files were on it). It returns the
// sandboxes it deleted. A host that is up, or whose lease has not lapsed
// yet, is refused: stop it first. If the host starts again, it finds its
// sandboxes deleted and removes what is left of them.
func (r *Registry) Remove(ctx context.Context, name string) (deleted []string, err error) {
	defer func() {
		if r.opts.Audit != nil {
			r.opts.Audit.Record(ctx, "deleteHost", "", name, err)
		}
	}()
	if err := authz.Allowed(authz.From(ctx), "deleteHost"); err != nil {
		return nil, err
	}
	if name == r.opts.Name {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "host %s is this one", name)
	}
	h, err := r.db.GetHost(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no host %q", name)
	}
	if err != nil {
		return nil, err
	}
	if h.Up || r.opts.Now().Before(h.LeaseUntil) {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "host %s is up (its lease runs until %s): stop it first", name, h.LeaseUntil.UTC().Format(time.RFC3339))
	}
	recs, err := r.db.SandboxesOn(ctx, name)
	if err != nil {
		return nil, err
	}
	octx := authz.WithPrincipal(context.WithoutCancel(ctx), authz.Operator)
	var errs []error
	for _, rec := range recs {
		if rec.State == sandbox.StateDeleted {
			continue
		}
		errs = append(errs, r.opts.Sandboxes.Forget(octx, rec))
		rec.State, rec.Handle, rec.Kept = sandbox.StateDeleted, nil, false
		rec.Error = fmt.Sprintf("its host %s was removed from the deployment", name)
		if err := r.db.PutSandbox(octx, rec); err != nil {
			errs = append(errs, err)
			continue
		}
		deleted = append(deleted, rec.ID)
	}
	errs = append(errs, r.dropSnapshotsOf(octx, recs), r.opts.Sandboxes.DropVolumes(octx, name))
	if err := errors.Join(errs...); err != nil {
		return deleted, err // (the host stays: removing it again finishes)
	}
	if err := r.db.Scrub(octx); err != nil {
		r.opts.Log.Warn("scrub after removing a host failed", "host", name, "err", err)
	}
	if err := r.db.DeleteHost(octx, name); err != nil && !errors.Is(err, store.ErrNotFound) {
		return deleted, err
	}
	if err := r.db.Notify(octx, NoticeTopic, name); err != nil {
		r.opts.Log.Warn("cannot tell the other hosts of a host's removal", "host", name, "err", err)
	}
	return deleted, nil
}

// dropSnapshotsOf drops the snapshots of recs' sandboxes from the store
// and the secret store (their files were on a host that is gone).
func (r *Registry) dropSnapshotsOf(ctx context.Context, recs []*store.Sandbox) error {
	of := map[string]bool{}
	for _, rec := range recs {
		of[rec.ID] = true
	}
	all, err := r.db.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range all {
		if of[s.SandboxID] {
			c := *s
			c.Dir = "" // (not on this host)
			errs = append(errs, r.opts.Sandboxes.DropSnapshot(ctx, &c))
		}
	}
	return errors.Join(errs...)
}
