package sandboxrt

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/internal/mounts"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
)

// Delete destroys a sandbox: its VM, disks and network. Deleting a deleted
// sandbox is an error; the record stays, with state deleted.
func (e *Runtime) Delete(ctx context.Context, id string) (err error) {
	defer e.audited(ctx, "deleteSandbox", id, &err)
	if err := e.check(ctx, "deleteSandbox", id); err != nil {
		return err
	}
	b := e.boxes.get(id)
	if b == nil {
		rec, err := e.record(ctx, id)
		if err != nil {
			return err
		}
		switch rec.State {
		case sandbox.StateDeleted:
			return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is already deleted", id)
		case sandbox.StateCreating:
			// Its Create is in flight in this engine (a crashed engine's
			// creates are cleaned up at start).
			return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is being created; delete it once it is running", id)
		}
		// A stopped sandbox: nothing runs, but clean up what is left. Its
		// box is registered while it goes, so a Start (or a second
		// Delete) waits for it instead of racing it.
		nb := &box{rec: rec, deleting: make(chan struct{})}
		b = e.boxes.putIfAbsent(nb)
	}
	b.deletingOnce.Do(func() { close(b.deleting) })
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gone != nil {
		return b.gone
	}
	if e.shared {
		// It may have moved to another host since here() looked.
		if cur, err := e.store.GetSandbox(ctx, id); err == nil && e.hosts.Foreign(cur) {
			if e.boxes.get(id) == b && b.m == nil {
				e.boxes.forget(id)
			}
			return elsewhereErr("sandbox "+id, cur.Host)
		}
	}
	if err := sandbox.CanTransition(b.rec.State, sandbox.StateDeleted); err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx) // a delete that started finishes
	// ...the engine's death too: the record says so before anything
	// goes, and the engine finishes it when it starts again (Adopt).
	b.rec.SetExtra(deletingKey, true)
	if err := e.store.PutSandbox(ctx, b.rec); err != nil {
		delete(b.rec.Extra, deletingKey)
		return err
	}
	e.opts.Step("delete-marked", id)
	e.meter.Final(ctx, b.rec)
	err = e.destroy(ctx, b)
	e.opts.Step("delete-destroyed", id)
	if b.rec.State == sandbox.StateRunning || b.rec.State == sandbox.StatePaused {
		e.capacity.Release(b.rec.Size)
	}
	b.rec.State = sandbox.StateDeleted
	e.boxes.forget(id)
	if perr := e.store.PutSandbox(ctx, b.rec); perr != nil {
		err = errors.Join(err, perr)
	}
	// A URL published while the sandbox was being destroyed (CreateURL
	// checks the state again after its own write) goes too.
	if ferr := e.urls.Forget(ctx, id); ferr != nil {
		err = errors.Join(err, ferr)
	}
	e.log.Info("sandbox deleted", "id", id)
	return err
}

// deletingKey marks, in a record's extras, a sandbox whose delete began.
const deletingKey = "deleting"

// deleting says whether rec's delete began (its record says so).
func deleting(rec *store.Sandbox) bool {
	_, ok := rec.Extra[deletingKey]
	return ok
}

// destroy stops the VM and removes everything the sandbox had on the host.
// It is used on failed creates, deletes and stray records; it is
// idempotent.
func (e *Runtime) destroy(ctx context.Context, b *box) error {
	var errs []error
	// The key goes first: whatever is left behind after this point is
	// ciphertext without a key.
	if err := sandboxkeys.Erase(ctx, e.sec, b.rec.ID); err != nil {
		errs = append(errs, err)
	}
	if len(b.rec.Volumes) > 0 && b.agent != nil {
		// What the guest wrote to its volumes reaches their disks.
		e.volumes.Unmount(ctx, b.rec, b.agent)
	}
	e.hangUp(b, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s was deleted during the call", b.rec.ID))
	b.given.Close()
	if b.m != nil {
		// (A machine that is gone, with the plugin it lived in or on its
		// own, is what a delete wants; its files go below. A plugin that
		// just died is relaunched: the call is tried again for a while.)
		if err := retryUnavailable(ctx, func() error { return b.m.Kill(ctx) }); err != nil && !errors.Is(err, hypervisor.ErrState) && !errors.Is(err, hypervisor.ErrNotFound) {
			errs = append(errs, err)
		}
		if err := retryUnavailable(ctx, func() error { return b.m.Cleanup(ctx) }); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			errs = append(errs, err)
		}
	} else if b.rec.Handle != nil {
		if m, err := e.hv.Attach(ctx, *b.rec.Handle); err == nil {
			m.Kill(ctx)
			m.Cleanup(ctx)
		}
	}
	procs.KillVMMs(b.rec.StateDir)
	if err := mounts.RemoveAll(b.rec.StateDir); err != nil {
		errs = append(errs, err)
	}
	if err := e.hibernation.Remove(b.rec.ID); err != nil {
		errs = append(errs, err)
	}
	if err := e.net.Detach(ctx, b.rec.ID); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, e.forgetStored(ctx, b))
	if err := e.volumes.Release(ctx, b.rec); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// retryUnavailable calls f until it fails for another reason than an
// unavailable hypervisor (a plugin being relaunched), for up to 10 s.
func retryUnavailable(ctx context.Context, f func() error) error {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.Multiplier, bo.RandomizationFactor = 200*time.Millisecond, 200*time.Millisecond, 1, 0
	bo.MaxElapsedTime = 10 * time.Second
	return backoff.Retry(func() error {
		err := f()
		if errors.Is(err, hypervisor.ErrUnavailable) && ctx.Err() == nil {
			return err
		}
		return backoff.Permanent(err) // (nil: done)
	}, bo)
}

// forgetStored removes what a sandbox keeps in the store and the secret
// store, its data key aside (erased first, by the caller): its URLs,
// environment and CA key, console identity, command history, and what it
// reserved in its budgets (a settled sandbox has nothing left to release).
func (e *Runtime) forgetStored(ctx context.Context, b *box) error {
	return errors.Join(e.urls.Forget(ctx, b.rec.ID), e.guests.Erase(ctx, b.rec.ID), sandboxkeys.Forget(ctx, e.sec, b.rec.ID), e.history.Erase(ctx, b.rec.ID),
		e.meter.Release(ctx, b.rec), e.mesh.Leave(ctx, b.rec.ID))
}
