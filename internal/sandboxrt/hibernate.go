package sandboxrt

import (
	"context"
	"os"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/kinds"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/move/mover"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Hibernation: Hibernate writes a running or paused sandbox's memory,
// device state and disk into its hibernation files (clone.Hibernation),
// then stops its VMM and gives up its network: it holds no host RAM and
// is charged for its disk only. Resume (wake) restores it from those
// files, under the same ID, key and machine-id, on a fresh network
// attachment (the guest's interface is moved to it), and removes them.

// Hibernate writes a sandbox's memory to disk and frees its host RAM.
func (e *Runtime) Hibernate(ctx context.Context, id string) (_ *sandbox.Sandbox, err error) {
	defer e.audited(ctx, "hibernateSandbox", id, &err)
	if err := e.check(ctx, "hibernateSandbox", id); err != nil {
		return nil, err
	}
	b, err := e.liveOrErr(ctx, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.gone; err != nil {
		return nil, err
	}
	if err := e.hibernate(ctx, b, false); err != nil {
		return nil, err
	}
	return b.view(), nil
}

// hibernate hibernates b, whose lock the caller holds. With hold, b stays
// registered (a move holds it so until it is done); else it is kept.
func (e *Runtime) hibernate(ctx context.Context, b *box, hold bool) error {
	id := b.rec.ID
	if err := sandbox.CanTransition(b.rec.State, sandbox.StateHibernated); err != nil {
		return err
	}
	mover.ClearMark(b.rec) // (what a move that could not finish left)
	if err := e.snaps.MayTake(b.rec); err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx) // a hibernate that started finishes
	if err := e.hibernation.Prepare(id); err != nil {
		return err
	}
	// Its volumes stay attached to it, but not to its machine: they are
	// detached before it is written (a process with a file open on one
	// loses it) and mounted again when it wakes.
	detached := false
	if len(b.rec.Volumes) > 0 {
		if err := e.detachVolumes(ctx, b); err != nil {
			e.hibernation.Remove(id)
			return err
		}
		detached = true
	}
	// The host hangs up first, so that the resumed guest's agent starts a
	// fresh session at once (see clone.Service.makeGolden).
	b.closeAgent(sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is being hibernated", id))
	time.Sleep(time.Second)
	// Snapshot leaves the machine paused: nothing runs after this point.
	if b.rec.State == sandbox.StateRunning {
		markPaused(b.rec.StateDir)
	}
	defer unmarkPaused(b.rec.StateDir)
	size, err := e.hibernation.Write(ctx, b.m, id, b.keys.Data)
	if err != nil {
		if s, serr := b.m.Info(ctx); serr == nil && s.State == hypervisor.StatePaused && b.rec.State == sandbox.StateRunning {
			b.m.Resume(ctx)
		}
		b.useMachine(b.m) // (it runs on: its agent may be called again)
		if detached {
			if c, cerr := b.client(ctx, e); cerr == nil {
				e.volumes.Mount(ctx, b.rec, b.m, c)
			}
		}
		return kinds.Of("hibernate", err)
	}
	// Charged up to now as it ran; from now on, its disk and these files.
	b.rec.HibernatedBytes = size
	e.meter.Transition(ctx, b.rec, sandbox.StateHibernated, false)
	// The record says hibernated before the VMM goes: an engine that dies
	// from here on finishes the job (clone.Hibernation.Finish).
	prev := b.rec.State
	if hold {
		// (A move's: one the host dies in from here is rolled back.)
		mover.MarkHeld(b.rec, prev)
	}
	b.rec.State, b.rec.Kept, b.rec.Error = sandbox.StateHibernated, true, ""
	if err := e.store.PutSandbox(ctx, b.rec); err != nil {
		mover.ClearMark(b.rec)
		b.rec.State, b.rec.Kept = prev, false
		e.hibernation.Remove(id)
		if prev == sandbox.StateRunning {
			b.m.Resume(ctx)
		}
		b.useMachine(b.m)
		return err
	}
	if hold {
		e.opts.Step("move-held", id)
	}
	e.hangUp(b, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is being hibernated", id))
	if err := b.m.Kill(ctx); err != nil {
		e.log.Warn("hibernate: stopping the VMM", "id", id, "err", err)
	}
	b.m.Wait(ctx)
	if err := b.m.Cleanup(ctx); err != nil {
		e.log.Warn("hibernate: cleaning up the VMM's files", "id", id, "err", err)
	}
	procs.KillVMMs(b.rec.StateDir)
	if err := e.net.Detach(ctx, id); err != nil {
		e.log.Warn("hibernate: cannot give up the sandbox's network", "id", id, "err", err)
	}
	e.capacity.Release(b.rec.Size)
	b.rec.Handle = nil
	if !hold {
		snap := *b.rec
		e.boxes.drop(id, &snap)
	}
	if err := e.store.PutSandbox(ctx, b.rec); err != nil {
		return err
	}
	e.log.Info("sandbox hibernated", "id", id, "bytes", e.hibernation.Bytes(id))
	return nil
}

// wake resumes a hibernated sandbox: admitted again (host capacity,
// budgets) as a create is, then restored from its hibernation files.
func (e *Runtime) wake(ctx context.Context, rec *store.Sandbox) (*sandbox.Sandbox, error) {
	id := rec.ID
	out, err := e.bringBack(ctx, rec, "resumed", func(b *box, img images.Image) error {
		o, err := e.hibernation.Origin(id, b.keys.Data)
		if err != nil {
			return err
		}
		// What a VMM it had left is in the way of the restore.
		procs.KillVMMs(rec.StateDir)
		os.RemoveAll(rec.StateDir)
		err = e.boot(ctx, b, img, false, o)
		// A move's mark (its target resuming it) goes with the outcome,
		// in the record's next write; until then a host that dies in
		// this resume finds it, and resumes it when it comes back.
		mover.ClearMark(b.rec)
		if err != nil && b.m != nil {
			// The hibernation files stay what it is made from.
			bg := context.WithoutCancel(ctx)
			b.m.Kill(bg)
			b.m.Wait(bg)
			b.m.Cleanup(bg)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	e.hibernation.Remove(id)
	e.log.Info("sandbox resumed from hibernation", "id", id)
	return out, nil
}
