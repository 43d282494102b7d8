package harebox

import (
	"context"
	"errors"

	"github.com/harebox/harebox/apikey"
	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/clone"
	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/ingress"
	"github.com/harebox/harebox/mesh"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// HostOptions name this host among the hosts that share a store (see
// cluster.HostOptions).
type HostOptions = cluster.HostOptions

// registerHost claims this host's name in the store and marks it up.
func (e *Engine) registerHost(ctx context.Context) error {
	reg, err := cluster.Register(ctx, cluster.Options{
		HostOptions: e.opts.Host, Store: e.store, Site: e.opts.Site.Name, Country: e.opts.Site.Country, Capacity: e.capacity.Limit(),
		Used: e.capacity.Used, Revived: e.rt.RewriteRecords, Sandboxes: e.rt.Views().Hosts, Audit: e.audit, Log: e.log,
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
		e.rt.WakeMesh()
	case ingress.NoticeTopic:
		e.urls.Noticed(e.ctx, payload)
	case clone.PoolNoticeTopic:
		go e.loadPool() // (stopping idle members takes a while: the other notices first)
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
		e.rt.WakeMesh()
		e.urls.Noticed(e.ctx, "")
		go e.loadPool()
	}
}

// loadPool applies the warm pool's setting as the store has it now.
func (e *Engine) loadPool() {
	if p := e.pool.Load(); p != nil { // (nil until New made it)
		p.Load(e.ctx)
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
