package harebox

import (
	"context"
	"errors"

	"github.com/harebox/harebox/apikey"
	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/ingress"
	"github.com/harebox/harebox/mesh"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
)

// HostOptions name this host among the hosts that share a store (see
// cluster.HostOptions).
type HostOptions = cluster.HostOptions

// registerHost claims this host's name in the store and marks it up.
func (e *Engine) registerHost(ctx context.Context) error {
	reg, err := cluster.Register(ctx, cluster.Options{
		HostOptions: e.opts.Host, Store: e.store, Site: e.opts.Site.Name, Country: e.opts.Site.Country, Capacity: e.capacity.Limit(),
		Used: e.capacity.Used, Revived: e.rewriteRecords, Sandboxes: hostView{e}, Audit: e.audit, Log: e.log,
	})
	if err != nil {
		return err
	}
	e.hosts = reg
	e.shared = reg.Shared()
	e.keys.Shared = e.shared
	return nil
}

// Cluster is the deployment's registry of hosts: this host's name, where
// a sandbox runs and a create goes, the hosts listed and removed (the
// REST layer calls it directly).
func (e *Engine) Cluster() *cluster.Registry { return e.hosts }

// usedChanged tells the other hosts (through this host's row) what this
// host reserves now; before the host registered (adopt), its first
// renewal does.
func (e *Engine) usedChanged() {
	if e.hosts != nil {
		e.hosts.Changed()
	}
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
	case mesh.NoticeTopic:
		if e.tunnels != nil {
			e.tunnels.Changed(payload)
		}
		e.wakeMesh()
	case ingress.NoticeTopic:
		e.urls.Noticed(e.ctx, payload)
	case cluster.NoticeTopic: // (a host removed)
		if e.tunnels != nil {
			e.tunnels.Changed("")
		}
	case "":
		e.keys.Changed("")
		e.audit.Appended()
		e.meter.Wake()
		if e.tunnels != nil {
			e.tunnels.Changed("")
		}
		e.wakeMesh()
		e.urls.Noticed(e.ctx, "")
	}
}

// RotateMeshKey has host name (this one or another) make a new key for
// its end of the mesh's tunnels, the operator only. The host publishes the
// new public key and its peers take it; connections between sandboxes
// across it stall for a moment and go on. Another host is asked through
// the store; it rotates within a second if it is up.
func (e *Engine) RotateMeshKey(ctx context.Context, name string) (err error) {
	defer func() { e.audit.Record(ctx, "rotateMeshKey", "", name, err) }()
	if err := authz.Allowed(authz.From(ctx), "rotateMeshKey"); err != nil {
		return err
	}
	h, err := e.store.GetHost(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return sandbox.Errorf(sandbox.ErrNotFound, "", "no host %q", name)
	}
	if err != nil {
		return err
	}
	if h.Mesh == nil {
		return sandbox.Errorf(sandbox.ErrState, "", "host %s has no mesh tunnel (hareboxd --mesh-endpoint)", name)
	}
	return mesh.AskRotate(ctx, store.Narrow(e.store, func(tx store.Tx) mesh.TunnelTx { return tx }), name)
}

// rewriteRecords writes this host's live sandboxes' records again, as they
// are: another host marked them lost while this one ran (its lease
// lapsed: the database was out of reach, or the host stalled).
func (e *Engine) rewriteRecords(ctx context.Context) {
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
type hostView struct{ e *Engine }

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
