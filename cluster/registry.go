// Package cluster holds what the hosts of one deployment share: the
// registry of hosts in the store (leases, down hosts and their lost
// sandboxes, placement), the deployment's certificate authority, and the
// forwarding of a request to the host that runs its sandbox over mutual
// TLS.
package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Host is a host as the registry holds it.
type Host = store.Host

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
	// TLS is this host's side of the deployment's mutual TLS (the
	// certificate it serves its internal endpoint and calls the other
	// hosts with): moving a sandbox to another host needs it.
	TLS *TLS
}

// Options configure a Registry.
type Options struct {
	HostOptions
	Store    store.Store
	Site     string
	Country  string // the site's
	Capacity sandbox.Resources
	// Used reports what this host's sandboxes reserve now.
	Used func() sandbox.Resources
	// Revived is called when this host finds that the others marked it
	// down (and its sandboxes lost) while it ran: its sandboxes' records
	// must be written again.
	Revived func(ctx context.Context)
	// Sandboxes is the engine: which sandboxes are live here, and what
	// goes with a removed host's sandboxes and snapshots (Remove).
	Sandboxes Sandboxes
	// Audit records Remove.
	Audit Recorder
	Now   func() time.Time
	Log   *slog.Logger
}

// Recorder records a change in the audit log (audit.Log).
type Recorder interface {
	Record(ctx context.Context, action, accountID, target string, err error)
}

// Registry keeps this host's lease in the store and marks the hosts
// whose lease lapsed down; it says where a sandbox runs, and removes a
// host that is gone.
type Registry struct {
	opts  Options
	db    Store
	nudge chan struct{}
	// draining is this host's row's Draining, as of its last renewal or
	// change.
	draining atomic.Bool
	// shared: other hosts may share the store (see Foreign).
	shared bool
}

// Tx is what the registry needs of a store transaction.
type Tx interface {
	GetHost(ctx context.Context, name string) (*store.Host, error)
	PutHost(ctx context.Context, h *store.Host) error
	PutSandbox(ctx context.Context, s *store.Sandbox) error
	SandboxesOn(ctx context.Context, host string, states ...sandbox.State) ([]*store.Sandbox, error)
}

// Store is what the registry needs of the store.
type Store interface {
	Update(ctx context.Context, fn func(tx Tx) error) error
	GetHost(ctx context.Context, name string) (*store.Host, error)
	ListHosts(ctx context.Context) ([]*store.Host, error)
	DeleteHost(ctx context.Context, name string) error
	GetSandbox(ctx context.Context, id string) (*store.Sandbox, error)
	PutSandbox(ctx context.Context, s *store.Sandbox) error
	SandboxesOn(ctx context.Context, host string, states ...sandbox.State) ([]*store.Sandbox, error)
	GetSnapshot(ctx context.Context, id string) (*store.Snapshot, error)
	ListSnapshots(ctx context.Context) ([]*store.Snapshot, error)
	Scrub(ctx context.Context) error
	Notify(ctx context.Context, topic, payload string) error
}

// NoticeTopic is the store notice of a host removed from the deployment
// (its name): the other hosts drop what they keep of it (their mesh
// tunnels to it).
const NoticeTopic = "host"

// Register claims this host's name in the store (store.ErrInUse if another
// process runs by it) and marks the host up. Without a name the host
// takes the machine's host name.
func Register(ctx context.Context, opts Options) (*Registry, error) {
	if opts.Name == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, sandbox.Errorf(sandbox.ErrInvalid, "host", "no host name given, and the machine's: %v", err)
		}
		opts.Name = h
	}
	if opts.Name == "" {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "host", "a host needs a name")
	}
	if opts.Lease <= 0 {
		opts.Lease = 15 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Used == nil {
		opts.Used = func() sandbox.Resources { return sandbox.Resources{} }
	}
	if c, ok := opts.Store.(interface {
		Claim(ctx context.Context, host string) error
	}); ok {
		if err := c.Claim(ctx, opts.Name); err != nil {
			return nil, err
		}
	}
	r := &Registry{opts: opts, db: store.Narrow(opts.Store, func(tx store.Tx) Tx { return tx }), nudge: make(chan struct{}, 1)}
	sh, ok := opts.Store.(interface{ Shared() bool })
	r.shared = ok && sh.Shared()
	if _, err := r.renew(ctx, true); err != nil {
		return nil, err
	}
	return r, nil
}

// Name is this host's name.
func (r *Registry) Name() string { return r.opts.Name }

// Shared reports whether other hosts may share the store (PostgreSQL);
// one that is not (SQLite) is this host's alone.
func (r *Registry) Shared() bool { return r.shared }

// renew writes this host's row: up, with a new lease. revived says
// whether it was marked down meanwhile.
func (r *Registry) renew(ctx context.Context, start bool) (revived bool, err error) {
	now := r.opts.Now().UTC()
	err = r.db.Update(ctx, func(tx Tx) error {
		h, err := tx.GetHost(ctx, r.opts.Name)
		switch {
		case errors.Is(err, store.ErrNotFound):
			h = &Host{Name: r.opts.Name}
		case err != nil:
			return err
		}
		revived = !start && !h.Up
		if start || !h.Up {
			h.StartedAt = now
		}
		h.Site, h.Country, h.Address, h.Capacity, h.Used = r.opts.Site, r.opts.Country, r.opts.Address, r.opts.Capacity, r.opts.Used()
		h.Up, h.RenewedAt, h.LeaseUntil = true, now, now.Add(r.opts.Lease)
		r.draining.Store(h.Draining)
		return tx.PutHost(ctx, h)
	})
	if err != nil {
		return false, fmt.Errorf("cluster: renew the lease of host %s: %w", r.opts.Name, err)
	}
	return revived, nil
}

// Draining reports whether this host is draining: no new sandbox goes
// here.
func (r *Registry) Draining() bool { return r.draining.Load() }

// SetDraining marks this host draining (no new sandbox goes here) or not.
func (r *Registry) SetDraining(ctx context.Context, on bool) error {
	err := r.db.Update(ctx, func(tx Tx) error {
		h, err := tx.GetHost(ctx, r.opts.Name)
		if err != nil {
			return err
		}
		h.Draining = on
		return tx.PutHost(ctx, h)
	})
	if err != nil {
		return fmt.Errorf("cluster: host %s: %w", r.opts.Name, err)
	}
	r.draining.Store(on)
	return nil
}

// Changed tells the registry that what this host's sandboxes reserve
// changed: Run writes it (with a renewal) at once, so that the other
// hosts place creates on what it runs now.
func (r *Registry) Changed() {
	select {
	case r.nudge <- struct{}{}:
	default:
	}
}

// Run renews this host's lease and marks the hosts whose lease lapsed
// down, every third of the lease, until ctx ends; it renews at once when
// told that what this host runs Changed.
func (r *Registry) Run(ctx context.Context) {
	t := time.NewTicker(r.opts.Lease / 3)
	defer t.Stop()
	for {
		sweep := false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			sweep = true
		case <-r.nudge:
		}
		revived, err := r.renew(ctx, false)
		if err != nil {
			if ctx.Err() == nil {
				r.opts.Log.Warn("cannot renew this host's lease", "err", err)
			}
			continue
		}
		if revived {
			r.opts.Log.Warn("this host was marked down while it ran; its sandboxes are written again")
			if r.opts.Revived != nil {
				r.opts.Revived(ctx)
			}
		}
		if !sweep {
			continue
		}
		if err := r.Sweep(ctx); err != nil && ctx.Err() == nil {
			r.opts.Log.Warn("cannot check the other hosts' leases", "err", err)
		}
	}
}

// Sweep marks every other host whose lease lapsed down, and its running
// and paused sandboxes lost (not deleted: its VMs may run still, and the
// host takes them again when it is back).
func (r *Registry) Sweep(ctx context.Context) error {
	hosts, err := r.db.ListHosts(ctx)
	if err != nil {
		return err
	}
	now := r.opts.Now()
	for _, h := range hosts {
		if h.Name == r.opts.Name || !h.Up || now.Before(h.LeaseUntil) {
			continue
		}
		n := 0
		err := r.db.Update(ctx, func(tx Tx) error {
			n = 0
			cur, err := tx.GetHost(ctx, h.Name)
			if err != nil {
				return err
			}
			if !cur.Up || now.Before(cur.LeaseUntil) { // (renewed, or marked, meanwhile)
				return nil
			}
			cur.Up = false
			if err := tx.PutHost(ctx, cur); err != nil {
				return err
			}
			recs, err := tx.SandboxesOn(ctx, h.Name, sandbox.StateRunning, sandbox.StatePaused)
			if err != nil {
				return err
			}
			for _, rec := range recs {
				rec.State = sandbox.StateLost
				rec.Error = fmt.Sprintf("its host %s stopped renewing its lease at %s", h.Name, cur.LeaseUntil.UTC().Format(time.RFC3339))
				if err := tx.PutSandbox(ctx, rec); err != nil {
					return err
				}
				n++
			}
			return nil
		})
		if err != nil {
			return err
		}
		r.opts.Log.Warn("a host's lease lapsed: it is down, its sandboxes lost", "host", h.Name, "sandboxes", n)
	}
	return nil
}

// Get returns a host's row.
func (r *Registry) Get(ctx context.Context, name string) (*Host, error) {
	return r.db.GetHost(ctx, name)
}

// Hosts lists the hosts that share the store, up or down, for the
// principal in the context (the operator only: hosts are the
// deployment's, not an account's).
func (r *Registry) Hosts(ctx context.Context) ([]*Host, error) {
	if err := authz.Allowed(authz.From(ctx), "listHosts"); err != nil {
		return nil, err
	}
	return r.db.ListHosts(ctx)
}

// Place picks the host a new sandbox of size goes to: among the hosts of
// the site asked for (where.Name), else of any site of the country asked
// for (where.Country), else of this host's site, that are up, can be
// reached (this one, or one with an address), are not draining and have
// room for it, the least loaded (the larger of its CPU and memory shares
// in use); this host on a tie. It returns ErrCapacity when none has room.
func (r *Registry) Place(ctx context.Context, size sandbox.Resources, where sandbox.Site) (*Host, error) {
	hosts, err := r.db.ListHosts(ctx)
	if err != nil {
		return nil, err
	}
	now := r.opts.Now()
	var best *Host
	bestLoad := 0.0
	for _, h := range hosts {
		self := h.Name == r.opts.Name
		if self { // (fresher than its row, and up: it is asking)
			h.Used, h.Capacity, h.Up, h.LeaseUntil = r.opts.Used(), r.opts.Capacity, true, now.Add(time.Hour)
		}
		at := sandbox.Site{Name: h.Site, Country: h.Country}
		if self {
			h.Draining = r.draining.Load()
		}
		if (where == sandbox.Site{} && h.Site != r.opts.Site) || !Within(at, where) || !h.Up || !now.Before(h.LeaseUntil) || (!self && h.Address == "") || h.Draining || !fits(h, size) {
			continue
		}
		l := load(h, size)
		if best == nil || l < bestLoad || (l == bestLoad && self) {
			best, bestLoad = h, l
		}
	}
	if best == nil {
		return nil, NoRoom(where, r.opts.Site, size)
	}
	return best, nil
}

// Within reports whether site at is where a create asked to be: the
// site it names, in the country it names (each if it names one).
func Within(at, where sandbox.Site) bool {
	return (where.Name == "" || at.Name == where.Name) && (where.Country == "" || at.Country == where.Country)
}

// NoRoom is the error of a create that no host of where (or of site here,
// if where names none) can take.
func NoRoom(where sandbox.Site, here string, size sandbox.Resources) error {
	at := "site " + here
	switch {
	case where.Name != "" && where.Country != "":
		at = "site " + where.Name + " in " + where.Country
	case where.Name != "":
		at = "site " + where.Name
	case where.Country != "":
		at = "country " + where.Country
	}
	return sandbox.Errorf(sandbox.ErrCapacity, "", "no host of %s is up with room for %d vCPUs and %d MB", at, size.VCPUs, size.MemoryMB)
}

func fits(h *Host, s sandbox.Resources) bool {
	return h.Used.VCPUs+s.VCPUs <= h.Capacity.VCPUs && h.Used.MemoryMB+s.MemoryMB <= h.Capacity.MemoryMB &&
		h.Used.DiskGB+s.DiskGB <= h.Capacity.DiskGB
}

// load is the share of a host's CPU or memory (the larger) in use once
// a sandbox of size s is there.
func load(h *Host, s sandbox.Resources) float64 {
	cpu := float64(h.Used.VCPUs+s.VCPUs) / float64(max(h.Capacity.VCPUs, 1))
	mem := float64(h.Used.MemoryMB+s.MemoryMB) / float64(max(h.Capacity.MemoryMB, 1))
	return max(cpu, mem)
}

// askedKey is where a sandbox's record keeps the site or country its
// create asked for (its extras), so that a move keeps it there.
const askedKey = "site_asked"

// SetAsked records on rec the site or country its create asked for
// (nothing when it asked for neither).
func SetAsked(rec *store.Sandbox, where sandbox.Site) {
	if where != (sandbox.Site{}) {
		rec.SetExtra(askedKey, where)
	}
}

// Asked is the site or country rec's create asked for (zero: neither).
func Asked(rec *store.Sandbox) sandbox.Site {
	var where sandbox.Site
	if raw, ok := rec.Extra[askedKey]; ok {
		json.Unmarshal(raw, &where)
	}
	return where
}
