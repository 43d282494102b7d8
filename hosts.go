package harebox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/harebox/harebox/apikey"
	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
)

// HostOptions name this host among the hosts that share a store (a
// PostgreSQL database). Each engine runs the sandboxes it created and
// takes only those again at start; the others' it sees in lists.
type HostOptions struct {
	// Name is this host's name in the deployment; default the machine's
	// host name. Two engines on one store never run by the same name.
	Name string
	// Address is this host's internal endpoint (https://HOST:PORT) where
	// the other hosts' servers forward requests for its sandboxes; ""
	// (one host, or a library engine) places every create here.
	Address string
	// Lease is how long the host stays up in the store without renewing
	// it (default 15 s; renewed every third). When it lapses, another
	// host marks it down and its running sandboxes lost.
	Lease time.Duration
}

// registerHost claims this host's name in the store and marks it up.
func (e *Engine) registerHost(ctx context.Context) error {
	name := e.opts.Host.Name
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return sandbox.Errorf(sandbox.ErrInvalid, "host", "no host name given, and the machine's: %v", err)
		}
		name = h
	}
	reg, err := cluster.Register(ctx, cluster.Options{
		Store: e.store, Name: name, Site: e.opts.Site.Name, Address: e.opts.Host.Address,
		Capacity: e.capacity.Limit(), Lease: e.opts.Host.Lease, Log: e.log,
		Used:    e.capacity.Used,
		Revived: e.rewriteRecords,
	})
	if err != nil {
		return err
	}
	e.hosts = reg
	sh, ok := e.store.(interface{ Shared() bool })
	e.shared = ok && sh.Shared()
	e.keys.Shared = e.shared
	return nil
}

// usedChanged tells the other hosts (through this host's row) what this
// host reserves now; before the host registered (adopt), its first
// renewal does.
func (e *Engine) usedChanged() {
	if e.hosts != nil {
		e.hosts.Changed()
	}
}

// HostName is the name of the host this engine runs as.
func (e *Engine) HostName() string { return e.hosts.Name() }

// Hosts lists the hosts that share the store, up or down (the operator
// only: hosts are the deployment's, not an account's).
func (e *Engine) Hosts(ctx context.Context) ([]*cluster.Host, error) {
	if err := authz.Allowed(authz.From(ctx), "listHosts"); err != nil {
		return nil, err
	}
	return e.hosts.Hosts(ctx)
}

// Elsewhere says where a sandbox of another host runs: its host's row,
// or nil for a sandbox of this host or one that does not exist (the
// engine answers for those itself).
func (e *Engine) Elsewhere(ctx context.Context, id string) (*cluster.Host, error) {
	if e.boxes.get(id) != nil || !sandbox.ValidID(id) {
		return nil, nil
	}
	rec, err := e.store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !e.elsewhere(rec) {
		return nil, nil
	}
	h, err := e.hosts.Get(ctx, rec.Host)
	if errors.Is(err, store.ErrNotFound) {
		return &cluster.Host{Name: rec.Host}, nil // (a host that never registered: down)
	}
	return h, err
}

// Place picks the host a create of size goes to (see cluster.Place):
// this one, or another to forward the create to.
func (e *Engine) Place(ctx context.Context, size sandbox.Resources) (*cluster.Host, error) {
	return e.hosts.Place(ctx, size)
}

// elsewhere reports whether a record belongs to another host. Records
// from before hosts existed have none: the host that opens the store
// first takes them. A store that is not shared (SQLite) is one host's,
// whatever its name was when it wrote them (a renamed machine keeps its
// sandboxes).
func (e *Engine) elsewhere(rec *store.Sandbox) bool {
	return e.shared && rec.Host != "" && rec.Host != e.hosts.Name()
}

// notice acts on a change another host made (store.Notify): caches drop
// what changed, or everything when changes may have been missed.
func (e *Engine) notice(topic, payload string) {
	switch topic {
	case apikey.NoticeTopic:
		e.keys.Changed(payload)
	case audit.NoticeTopic:
		e.audit.Appended()
	case budget.NoticeTopic:
		e.meter.Wake()
	case "":
		e.keys.Changed("")
		e.audit.Appended()
		e.meter.Wake()
	}
}

// rewriteRecords writes this host's live sandboxes' records again, as they
// are: another host marked them lost while this one ran (its lease
// lapsed: the database was out of reach, or the host stalled).
func (e *Engine) rewriteRecords(ctx context.Context) {
	for _, b := range e.boxes.all() {
		// (Under its lock: a change that writes it meanwhile is not
		// overwritten with what it was.)
		b.mu.Lock()
		if err := e.store.PutSandbox(ctx, b.rec); err != nil {
			e.log.Warn("cannot write a sandbox's record again", "id", b.rec.ID, "err", err)
		}
		b.mu.Unlock()
	}
}

// SnapshotElsewhere says where a snapshot's files are when another host
// has them (the host of the sandbox it was taken of), as Elsewhere does
// for a sandbox: restores and deletes of it go there.
func (e *Engine) SnapshotElsewhere(ctx context.Context, id string) (*cluster.Host, error) {
	snap, err := e.store.GetSnapshot(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return e.Elsewhere(ctx, snap.SandboxID)
}

// RemoveHost takes a host that is down out of the deployment for good
// (the operator only): its sandboxes that are not deleted become deleted,
// their data keys erased (what is left on its disks is ciphertext without
// a key), their URLs, environment, history and budget reservations gone;
// snapshots of its sandboxes go too (their files were on it). It returns
// the sandboxes it deleted. A host that is up, or whose lease has not
// lapsed yet, is refused: stop it first. If the host starts again, it
// finds its sandboxes deleted and removes what is left of them.
func (e *Engine) RemoveHost(ctx context.Context, name string) (deleted []string, err error) {
	defer func() { e.audit.Record(ctx, "deleteHost", "", name, err) }()
	if err := authz.Allowed(authz.From(ctx), "deleteHost"); err != nil {
		return nil, err
	}
	if name == e.hosts.Name() {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "host %s is this one", name)
	}
	h, err := e.hosts.Get(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no host %q", name)
	}
	if err != nil {
		return nil, err
	}
	if h.Up || time.Now().Before(h.LeaseUntil) {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "host %s is up (its lease runs until %s): stop it first", name, h.LeaseUntil.UTC().Format(time.RFC3339))
	}
	recs, err := e.store.SandboxesOn(ctx, name)
	if err != nil {
		return nil, err
	}
	octx := authz.WithPrincipal(context.WithoutCancel(ctx), authz.Operator)
	var errs []error
	for _, rec := range recs {
		if rec.State == sandbox.StateDeleted {
			continue
		}
		b := &box{rec: rec}
		errs = append(errs, sandboxkeys.Erase(octx, e.sec, rec.ID), e.forgetStored(octx, b))
		rec.State, rec.Handle, rec.Kept = sandbox.StateDeleted, nil, false
		rec.Error = fmt.Sprintf("its host %s was removed from the deployment", name)
		if err := e.store.PutSandbox(octx, rec); err != nil {
			errs = append(errs, err)
			continue
		}
		deleted = append(deleted, rec.ID)
	}
	errs = append(errs, e.forgetSnapshotsOf(octx, recs))
	if err := errors.Join(errs...); err != nil {
		return deleted, err // (the host stays: removing it again finishes)
	}
	if err := e.store.Scrub(octx); err != nil {
		e.log.Warn("scrub after removing a host failed", "host", name, "err", err)
	}
	if err := e.store.DeleteHost(octx, name); err != nil && !errors.Is(err, store.ErrNotFound) {
		return deleted, err
	}
	return deleted, nil
}

// forgetSnapshotsOf drops the snapshots of recs' sandboxes from the store
// and the secret store (their files were on a host that is gone).
func (e *Engine) forgetSnapshotsOf(ctx context.Context, recs []*store.Sandbox) error {
	of := map[string]bool{}
	for _, r := range recs {
		of[r.ID] = true
	}
	all, err := e.store.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range all {
		if of[s.SandboxID] {
			c := *s
			c.Dir = "" // (not on this host)
			errs = append(errs, e.snaps.Drop(ctx, &c))
		}
	}
	return errors.Join(errs...)
}
