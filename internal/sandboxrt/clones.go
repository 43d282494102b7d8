package sandboxrt

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/harebox/harebox/clone"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/mesh"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
)

// Golden snapshots and the warm pool are package clone's: a create asks
// it for a golden snapshot to restore from (goldenFor), or claims an idle
// member (resolveCreate) and takes its machine over (claimBoot); its
// reservation goes through the pool, which gives up idle members for it
// (reserveCreate). The engine gives it the host's capacity and its naming
// of machines (cloneHost).

// cloneHost implements clone.Host.
type cloneHost struct{ e *Runtime }

func (h cloneHost) Reserve(res sandbox.Resources) error { return h.e.capacity.Reserve(res) }
func (h cloneHost) Release(res sandbox.Resources)       { h.e.capacity.Release(res) }

func (h cloneHost) BootSpec(id, stateDir string, img images.Image, res sandbox.Resources, att *network.Attachment) hypervisor.Spec {
	return imageSpec(id, stateDir, img, res, att)
}

func (h cloneHost) SandboxSpec(id string) hypervisor.Spec {
	dir := filepath.Join(h.e.machinesDir(), id)
	return hypervisor.Spec{ID: id, StateDir: dir, SerialLog: serialLog(dir), Labels: map[string]string{"harebox.sandbox": id}}
}

// goldenFor returns the ready golden snapshot of img at res to restore
// from, or nil (the create boots); with none made yet, one is started.
func (e *Runtime) goldenFor(name string, img images.Image, res sandbox.Resources) *clone.Origin {
	snap, key := e.clones.Golden(name, img, res)
	if snap == nil {
		return nil
	}
	return &clone.Origin{Snap: snap, Key: key, Golden: true, SharedMemory: e.clones.SharedMemory(), Done: func() {}}
}

// claimBoot makes a claimed member the sandbox b: b's firewall policy in
// force, the machine and agent connection taken over, its place on the
// mesh, the clock (unless the pool set it lately), files and CA as a
// boot gives them.
func (e *Runtime) claimBoot(ctx context.Context, b *box, pm *clone.Member) error {
	rec := b.rec
	// The box owns the machine from here: a failure destroys it.
	b.useMachine(pm.Machine)
	b.amu.Lock()
	b.agent = pm.Agent
	b.amu.Unlock()
	policy, err := firewall.Stored(rec.Extra[firewall.RecordKey])
	if err != nil {
		return err
	}
	// (Its attachment exists: this puts the policy in force, and its
	// place on the mesh, which its guest learns below.)
	att, err := e.attach(ctx, rec, policy)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	if mesh.Of(rec) == nil {
		att = nil // (the member's network as it is)
	}
	h := pm.Machine.Handle()
	rec.Handle = &h
	if err := e.store.PutSandbox(ctx, rec); err != nil {
		return err
	}
	b.phases.mark("claim")
	bctx, cancel := context.WithTimeout(ctx, e.opts.BootTimeout)
	defer cancel()
	c, err := b.client(bctx, e)
	if err != nil {
		return err
	}
	// Its machine-id and entropy are its own already: the pool gave them
	// when it restored the member (clone.Service.newMember), and no one
	// ran anything on it since. A claim adds only its place on the mesh.
	if att != nil && att.Cmdline != "" {
		if err := c.SetNetwork(bctx, att.Cmdline); err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		b.phases.mark("identity")
	}
	if err := e.provision(bctx, b, c, pm.ClockSet); err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	b.phases.mark("provision")
	rec.State = sandbox.StateRunning
	return nil
}
