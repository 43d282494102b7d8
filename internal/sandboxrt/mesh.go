package sandboxrt

import (
	"context"

	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/mesh"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// setMesh gives the network rec's place on its project's mesh with its
// mesh rules resolved for policy (mesh.Applier); if changedOnly, only
// when they changed.
func (e *Runtime) setMesh(ctx context.Context, rec *store.Sandbox, policy *firewall.Policy, changedOnly bool) (*network.Attachment, error) {
	if e.meshApply == nil {
		return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "sandbox %s is on its project's mesh, which this host's network does not serve", rec.ID)
	}
	return e.meshApply.Apply(ctx, rec, policy, changedOnly)
}

// refreshMesh gives the network the mesh rules of this host's mesh
// sandboxes again, resolved as the store says now (a peer joined or
// left, a project's default changed: mesh.NoticeTopic), one round per
// wake of meshWake, coalesced.
func (e *Runtime) refreshMesh() {
	defer e.wg.Done()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-e.meshWake:
		}
		live := map[string]bool{}
		for _, b := range e.boxes.all() {
			b.mu.Lock()
			rec := b.rec
			live[rec.ID] = true
			if mesh.Of(rec) != nil && (rec.State == sandbox.StateRunning || rec.State == sandbox.StatePaused) {
				p, _ := firewall.Stored(rec.Extra[firewall.RecordKey])
				if _, err := e.setMesh(e.ctx, rec, p, true); err != nil && e.ctx.Err() == nil {
					e.log.Warn("mesh: cannot renew a sandbox's mesh rules", "id", rec.ID, "err", err)
				}
			}
			b.mu.Unlock()
		}
		e.meshApply.Keep(func(id string) bool { return live[id] })
	}
}

// WakeMesh has refreshMesh run a round (once for any number of calls
// meanwhile).
func (e *Runtime) WakeMesh() {
	select {
	case e.meshWake <- struct{}{}:
	default:
	}
}
