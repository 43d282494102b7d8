package sandboxrt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/clone"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/stall"
	"github.com/harebox/harebox/mesh"
	"github.com/harebox/harebox/monitor"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// boot attaches the network, launches the VM and waits for its agent.
// With reuse, the machine boots again on the disk it left (Start); with
// o, it is restored from a snapshot and given its own identity.
func (e *Runtime) boot(ctx context.Context, b *box, img images.Image, reuse bool, o *clone.Origin) error {
	rec := b.rec
	policy, err := firewall.Stored(rec.Extra[firewall.RecordKey])
	if err != nil {
		return err
	}
	att, err := e.attach(ctx, rec, policy)
	var fe *firewall.Error
	switch {
	case errors.As(err, &fe):
		return firewall.Invalid(err) // (the policy, refused by the network)
	case err != nil:
		return bootFailed("the sandbox's network could not be set up", err)
	}
	spec := imageSpec(rec.ID, rec.StateDir, img, rec.Size, att)
	spec.SerialLog, spec.Labels = serialLog(rec.StateDir), map[string]string{"harebox.sandbox": rec.ID}
	spec.DataKey, spec.Reuse = b.keys.Data, reuse
	if b.keys.Console != nil {
		spec.ConsoleRecipient = b.keys.Console.Recipient().String()
	}
	var m hypervisor.Machine
	if o != nil {
		spec.SnapshotKey, spec.SharedMemory = o.Key, o.SharedMemory
		m, err = e.hv.Restore(ctx, o.Snap.Dir, spec)
		if err != nil && o.Golden && ctx.Err() == nil {
			// A golden snapshot is the host's cache, no one's data: this
			// create boots, and one that is at fault is made again. (The
			// restore's error, which names host paths, goes to the log.)
			e.log.Warn("a golden snapshot did not restore; the create boots", "id", rec.ID, "image", rec.Image, "err", err)
			if clone.SnapshotFault(err) {
				e.clones.Failed(img, rec.Size, o.Snap, err)
			}
			o, rec.Served, spec.SnapshotKey, spec.SharedMemory = nil, "boot", nil, false
			m, err = e.hv.Launch(ctx, spec)
		}
		if err != nil {
			return err
		}
	} else if m, err = e.hv.Launch(ctx, spec); err != nil {
		return err
	}
	if o != nil {
		b.phases.mark("restore")
	} else {
		b.phases.mark("launch")
	}
	b.useMachine(m)
	h := m.Handle()
	rec.Handle = &h
	if err := e.store.PutSandbox(ctx, rec); err != nil {
		return err
	}
	bctx, cancel := context.WithTimeout(ctx, e.opts.BootTimeout)
	defer cancel()
	if o != nil && !o.Golden && !o.Wake {
		// Snapshotted mid-session (a fork, a named snapshot): see
		// agentclient.HangUp.
		agentclient.HangUp(bctx, m.AgentEndpoint(), e.AgentOptions())
	}
	c, err := e.await(bctx, b, spec, o == nil && !reuse)
	if err != nil {
		vmm := monitor.Activity(context.WithoutCancel(ctx), b.m)
		return bootFailed("the sandbox's agent does not answer", fmt.Errorf("boot: %w (%s; serial log: %s)", err, vmm, consoleTail(b, 1500)))
	}
	b.phases.mark("agent")
	if o != nil {
		if err := clone.NewIdentity(bctx, c, att, o.Wake); err != nil {
			return bootFailed("the restored sandbox could not be given its own identity", fmt.Errorf("restore: %w", err))
		}
		b.phases.mark("identity")
	}
	if err := e.provision(bctx, b, c, time.Time{}); err != nil {
		return bootFailed("the sandbox could not be provisioned", fmt.Errorf("boot: %w", err))
	}
	b.phases.mark("provision")
	// Create stores the running state once the box is registered.
	rec.State = sandbox.StateRunning
	return nil
}

// await waits for the agent of b's new machine to answer. A fresh cold
// boot whose VMM stalls (see package stall) is paused and resumed, which
// wakes a guest that missed a wake-up; if it still does not answer, its
// machine is thrown away and spec launched again, once. (Only a fresh
// one: a restore, and a boot on the disk a stopped sandbox kept, are
// another's work that a relaunch could undo.)
func (e *Runtime) await(ctx context.Context, b *box, spec hypervisor.Spec, fresh bool) (*agentclient.Client, error) {
	if !fresh {
		return b.client(ctx, e)
	}
	var c *agentclient.Client
	dial := func(ctx context.Context) (err error) {
		c, err = b.client(ctx, e)
		return err
	}
	err := e.opts.Stall.Await(ctx, b.m, dial)
	var stalled *stall.Error
	if !errors.As(err, &stalled) {
		return c, err
	}
	id := b.rec.ID
	e.log.Warn("a boot stalled: pausing and resuming it", "id", id, "image", b.rec.Image, "stall", stalled, "serial", consoleTail(b, 600))
	m, woke, err := stall.Recover(ctx, e.hv, b.m, spec, dial)
	if woke {
		e.log.Warn("the stalled boot woke when paused and resumed", "id", id)
		return c, nil
	}
	e.log.Warn("the stalled boot is launched again", "id", id)
	if err != nil {
		return nil, err
	}
	b.useMachine(m)
	h := m.Handle()
	b.rec.Handle = &h
	if err := e.store.PutSandbox(ctx, b.rec); err != nil {
		return nil, err
	}
	return b.client(ctx, e)
}

// attach prepares rec's host network with policy in force, and its
// place on its project's mesh if it has one.
func (e *Runtime) attach(ctx context.Context, rec *store.Sandbox, policy *firewall.Policy) (*network.Attachment, error) {
	att, err := e.net.Attach(ctx, rec.ID, policy)
	if err != nil {
		return nil, err
	}
	if mesh.Of(rec) != nil {
		return e.setMesh(ctx, rec, policy, false)
	}
	return att, nil
}

// imageSpec is the spec of a machine that boots img at res, on its own
// overlay of the image's root disk, attached to att (if any).
func imageSpec(id, stateDir string, img images.Image, res sandbox.Resources, att *network.Attachment) hypervisor.Spec {
	spec := hypervisor.Spec{
		ID: id, VCPUs: res.VCPUs, MemoryMB: res.MemoryMB,
		Kernel: img.Kernel, Initrd: img.Initrd, Cmdline: img.Cmdline, StateDir: stateDir,
	}
	if img.RootDisk != "" {
		spec.Disks = []hypervisor.Disk{{Path: img.RootDisk, Format: img.RootDiskFormat, Overlay: true, SizeMB: int64(res.DiskGB) << 10}}
	}
	if att != nil {
		spec.Network = &hypervisor.Network{Tap: att.Tap, MAC: att.MAC}
		spec.Cmdline = strings.TrimSpace(spec.Cmdline + " " + att.Cmdline)
	}
	return spec
}

// provision gives a guest that answers what every boot gives it: the
// host's clock (unless it was set at clockSet, less than
// clone.ClockFresh ago), its environment's files and its credentials
// CA, and its volumes.
func (e *Runtime) provision(ctx context.Context, b *box, c *agentclient.Client, clockSet time.Time) error {
	if clockSet.IsZero() || time.Since(clockSet) >= clone.ClockFresh {
		if err := c.SyncTime(ctx, time.Now()); err != nil {
			return err
		}
	}
	if err := e.guests.Deliver(ctx, b.guest(), c); err != nil {
		return err
	}
	return e.volumes.Mount(ctx, b.rec, b.m, c)
}

// bootFailed gives a failed boot step its kind: unavailable, or timed out
// past the boot's deadline, never a server fault (500). An error with a
// kind already keeps it. msg is what the client is told; the cause, which
// can name host paths, goes to the log.
func bootFailed(msg string, err error) error {
	var se *sandbox.Error
	if errors.As(err, &se) {
		return fmt.Errorf("%s: %w", msg, err)
	}
	kind := sandbox.ErrUnavailable
	if errors.Is(err, context.DeadlineExceeded) {
		kind = sandbox.ErrTimeout
	}
	return &sandbox.Error{Kind: kind, Msg: msg, Err: err}
}
