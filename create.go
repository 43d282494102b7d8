package harebox

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Create boots a new sandbox and returns it once its agent answers.
func (e *Engine) Create(ctx context.Context, req sandbox.CreateRequest) (out *sandbox.Sandbox, err error) {
	created := false // (then create recorded it)
	defer func() {
		if !created {
			e.audited(ctx, "createSandbox", "", &err)
		}
	}()
	// Rights first: a key that may not create learns nothing from the
	// request's validation (which images exist, ...).
	if err := mayCreate(authz.From(ctx)); err != nil {
		return nil, err
	}
	var o *origin
	if req.Snapshot != "" {
		if o, err = e.openSnapshot(ctx, &req); err != nil {
			return nil, err
		}
		defer o.done()
		// (Its files are on the host of the sandbox it was taken of.)
		if h, err := e.SnapshotElsewhere(ctx, req.Snapshot); err != nil || h != nil {
			if err != nil {
				return nil, err
			}
			return nil, elsewhereErr("snapshot "+req.Snapshot, h.Name)
		}
	}
	created = true
	return e.create(ctx, req, o)
}

// create makes a sandbox: booted from its image, or restored from o. The
// audit log's entry of the create commits with its admission (the record,
// its budgets' reservation); one that fails after that gets a second
// entry, which says how it failed.
func (e *Engine) create(ctx context.Context, req sandbox.CreateRequest, o *origin) (_ *sandbox.Sandbox, err error) {
	admitted := "" // the sandbox's ID once its admission committed
	defer func() {
		if err != nil {
			e.audited(ctx, "createSandbox", admitted, &err)
		}
	}()
	began := time.Now()
	res, imgName, err := req.Resolve()
	if err != nil {
		return nil, err
	}
	var img images.Image
	var pm *member // a pool member this create claims
	if o != nil {
		res, imgName = o.snap.Size, o.snap.Image
		if img, err = e.imageOf(&store.Sandbox{Sandbox: sandbox.Sandbox{Image: o.snap.Image}, ImageDir: o.snap.ImageDir}); err != nil {
			return nil, sandbox.Errorf(sandbox.ErrInvalid, "snapshot", "the image build under snapshot %s is gone: %v", o.snap.ID, err)
		}
	} else if img, err = e.image(imgName); err != nil {
		return nil, err
	} else {
		pm = e.claimMember(img, res)
	}
	claimed := false // the box owns the member's machine
	if pm != nil {
		// Its host capacity passes to this create; until the box owns
		// its machine, a failure stops it.
		defer func() {
			if !claimed {
				e.discard(pm)
			}
		}()
	} else if err := e.reserveEvicting(res); err != nil {
		return nil, err
	} else if o == nil {
		// (After the reservation: a golden boot that this starts comes
		// after the create.)
		o = e.goldenFor(img, res) // nil: it boots
	}
	now := time.Now().UTC()
	id := sandbox.NewID()
	if pm != nil {
		id = pm.id
	}
	rec := &store.Sandbox{
		Sandbox: sandbox.Sandbox{
			ID: id, Name: req.Name, State: sandbox.StateCreating, Image: imgName, Size: res,
			Labels: req.Labels, NoEnv: req.NoEnv, Site: e.opts.Site, Host: e.hosts.Name(), CreatedAt: now,
			Monitoring: req.Monitoring == nil || *req.Monitoring, Snapshots: req.Snapshots == nil || *req.Snapshots,
		},
		StateDir: filepath.Join(e.machinesDir(), id),
		ImageDir: img.Dir,
	}
	if req.TTLSeconds > 0 {
		exp := now.Add(time.Duration(req.TTLSeconds) * time.Second)
		rec.ExpiresAt = &exp
	}
	rec.Served = "boot"
	switch {
	case pm != nil:
		rec.Served = "pool"
	case o != nil:
		rec.Served = "snapshot"
	}
	if err := e.initialPolicy(&req, rec); err != nil {
		e.release(res)
		return nil, err
	}
	// The record exists before anything is made, so a crash half way is
	// cleaned up on the next start; it is placed in its project in the
	// same transaction.
	if err := e.store.Update(ctx, func(tx store.Tx) error {
		if err := e.place(ctx, tx, &req, rec); err != nil {
			return err
		}
		if o != nil && !o.golden && rec.AccountID != o.snap.AccountID {
			return sandbox.Errorf(sandbox.ErrInvalid, "snapshot", "snapshot %s belongs to another account", o.snap.ID)
		}
		return e.audit.RecordIn(ctx, tx, "createSandbox", rec.AccountID, rec.ID, nil)
	}); err != nil {
		e.release(res)
		return nil, err
	}
	admitted = rec.ID
	if req.Name != "" {
		release, err := e.claimName(rec.AccountID, req.Name)
		if err != nil {
			// Nothing was made: the record and the reservation go too.
			e.release(res)
			e.releaseBudgets(context.WithoutCancel(ctx), &box{rec: rec})
			e.store.DeleteSandbox(context.WithoutCancel(ctx), rec.ID)
			return nil, err
		}
		defer release() // after the box (which carries the name) is registered
	}
	// Metered while it boots (see settleAll).
	snap := *rec
	e.mu.Lock()
	e.creating[id] = &snap
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.creating, id) // (registered or failed by now)
		e.mu.Unlock()
	}()
	// The box's lifecycle lock is held until the sandbox is registered and
	// stored as running, so a Delete that races with it waits its turn.
	b := &box{rec: rec, deleting: make(chan struct{}), phases: newPhases(began)}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.phases.mark("admit")
	if pm != nil && pm.key != nil {
		err = e.keepKeys(ctx, b, pm.key, pm.console)
	} else {
		err = e.newDataKey(ctx, b)
	}
	if err == nil {
		vars := req.Env
		if vars == nil && o != nil {
			vars = o.env // the source's own
		}
		err = e.sealEnv(ctx, b, vars)
	}
	if err == nil {
		err = e.makeCA(ctx, b)
	}
	if err == nil {
		err = e.loadEnv(ctx, b)
	}
	if err == nil {
		err = e.loadCredentials(ctx, b)
	}
	b.phases.mark("prepare")
	if err == nil && pm != nil {
		claimed = true
		err = e.claimBoot(ctx, b, pm)
	} else if err == nil {
		err = e.boot(ctx, b, img, false, o)
	}
	var took time.Duration
	if err == nil {
		took = time.Since(began)
		rec.CreatePhases = b.phases.ms
		rec.CreatePhases["total"] = float64(took.Microseconds()) / 1000
	}
	if err == nil {
		e.mu.Lock()
		e.boxes[id] = b
		e.mu.Unlock()
		if err = e.store.PutSandbox(ctx, rec); err != nil {
			e.mu.Lock()
			delete(e.boxes, id)
			e.mu.Unlock()
		}
	}
	if err != nil {
		e.log.Warn("create failed", "id", id, "err", err)
		// What it held while it tried is charged (a failed boot ran).
		e.settleFinal(context.WithoutCancel(ctx), b)
		e.destroy(context.WithoutCancel(ctx), b)
		e.release(res)
		rec.State = sandbox.StateDeleted
		rec.Error = err.Error()
		e.store.PutSandbox(context.WithoutCancel(ctx), rec)
		return nil, err
	}
	e.watch(b)
	e.creates.add(rec.Served, took, b.phases)
	b.phases = nil
	if pm != nil {
		e.log.Info("sandbox created from the pool", "id", id, "name", req.Name, "image", imgName, "took", time.Since(now).Round(time.Millisecond))
	} else if o != nil {
		e.log.Info("sandbox created from a snapshot", "id", id, "name", req.Name, "snapshot", o.snap.ID, "source", o.snap.SandboxID, "took", time.Since(now).Round(time.Millisecond))
	} else {
		e.log.Info("sandbox created", "id", id, "name", req.Name, "image", imgName, "vcpus", res.VCPUs, "memory_mb", res.MemoryMB)
	}
	return b.view(), nil
}

// boot attaches the network, launches the VM and waits for its agent.
// With reuse, the machine boots again on the disk it left (Start); with
// o, it is restored from a snapshot and given its own identity.
func (e *Engine) boot(ctx context.Context, b *box, img images.Image, reuse bool, o *origin) error {
	rec := b.rec
	policy, err := policyOf(rec.Extra[policyKey])
	if err != nil {
		return err
	}
	att, err := e.net.Attach(ctx, rec.ID, policy)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	spec := imageSpec(rec.ID, rec.StateDir, img, rec.Size, att)
	spec.SerialLog, spec.Labels = serialLog(rec.StateDir), map[string]string{"harebox.sandbox": rec.ID}
	spec.DataKey, spec.Reuse = b.key, reuse
	if b.console != nil {
		spec.ConsoleRecipient = b.console.Recipient().String()
	}
	var m hypervisor.Machine
	if o != nil {
		spec.SnapshotKey = o.key
		m, err = e.hv.Restore(ctx, o.snap.Dir, spec)
		if err != nil {
			return hvErr(fmt.Errorf("restore: %w", err))
		}
	} else if m, err = e.hv.Launch(ctx, spec); err != nil {
		return hvErr(fmt.Errorf("launch: %w", err))
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
	c, err := b.client(bctx, e)
	if err != nil {
		return fmt.Errorf("boot: %w (serial log: %s)", err, consoleTail(b, 1500))
	}
	b.phases.mark("agent")
	if o != nil {
		if err := e.newIdentity(bctx, c, att, o.wake); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		b.phases.mark("identity")
	}
	if err := e.provision(bctx, b, c); err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	b.phases.mark("provision")
	// Create stores the running state once the box is registered.
	rec.State = sandbox.StateRunning
	return nil
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
// host's clock, its environment's files and its credentials CA.
func (e *Engine) provision(ctx context.Context, b *box, c *agentclient.Client) error {
	if err := c.SyncTime(ctx, time.Now()); err != nil {
		return err
	}
	if err := e.deliverFiles(ctx, b, c); err != nil {
		return err
	}
	return e.installCA(ctx, b, c)
}
