package sandboxrt

import (
	"context"
	"errors"
	"os"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
)

// Stop shuts a running or paused sandbox down and keeps its disk, its data
// key and its record; Start boots it again on that disk. What ran in it
// (processes, memory) is gone; its network is given up and made again at
// Start. A stopped sandbox holds no host capacity and is charged for its disk only.
func (e *Runtime) Stop(ctx context.Context, id string) (_ *sandbox.Sandbox, err error) {
	defer e.audited(ctx, "stopSandbox", id, &err)
	if err := e.check(ctx, "stopSandbox", id); err != nil {
		return nil, err
	}
	if !e.reuse {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "", "this hypervisor backend cannot boot a sandbox again on its disk: stop is not available (pause or delete it)")
	}
	b, err := e.liveOrErr(ctx, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := sandbox.CanTransition(b.rec.State, sandbox.StateStopped); err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx) // a stop that started finishes
	if b.rec.State == sandbox.StateRunning {
		// The guest's writes reach its disk first (best effort: a guest
		// that does not answer is powered off all the same).
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		if c, err := b.client(sctx, e); err == nil {
			c.Exec(sctx, agentclient.ExecRequest{Argv: []string{"sync"}, User: "root", Timeout: 10 * time.Second}, nil)
		}
		cancel()
	}
	// A crash from here on finds it kept: its disk and key stay.
	b.rec.Kept = true
	if err := e.store.PutSandbox(ctx, b.rec); err != nil {
		b.rec.Kept = false
		return nil, err
	}
	// Calls in flight end here, saying why (the guest is about to go).
	e.hangUp(b, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is being stopped", id))
	sctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	if err := b.m.Shutdown(sctx); err != nil {
		// Shutdown stops the VMM itself when the guest does not power off.
		e.log.Warn("stop: the guest did not power off in time; its VMM was stopped", "id", id, "err", err)
	}
	if err := b.m.Wait(sctx); err != nil {
		b.m.Kill(ctx)
		if err := b.m.Wait(ctx); err != nil {
			return nil, err
		}
	}
	// What ran is charged up to now (its link's traffic too, before the
	// link goes); from now on, its disk.
	e.meter.Transition(ctx, b.rec, sandbox.StateStopped, false)
	if err := e.net.Detach(ctx, id); err != nil {
		e.log.Warn("stop: cannot give up the sandbox's network", "id", id, "err", err)
	}
	e.capacity.Release(b.rec.Size)
	b.rec.State, b.rec.Error, b.rec.Kept, b.rec.Handle = sandbox.StateStopped, "", true, nil
	snap := *b.rec
	e.boxes.drop(id, &snap)
	if err := e.store.PutSandbox(ctx, b.rec); err != nil {
		return nil, err
	}
	e.log.Info("sandbox stopped", "id", id)
	return b.view(), nil
}

// Start boots a sandbox that Stop stopped, on the disk it kept, with its
// environment, credentials and firewall policy; it is admitted again (host
// capacity, budgets) as a create is.
func (e *Runtime) Start(ctx context.Context, id string) (_ *sandbox.Sandbox, err error) {
	defer e.audited(ctx, "startSandbox", id, &err)
	if err := e.check(ctx, "startSandbox", id); err != nil {
		return nil, err
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec.State != sandbox.StateStopped {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is %s; only a stopped sandbox starts", id, rec.State)
	}
	if !rec.Kept {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s stopped on its own (%s): its disk is gone; delete it", id, rec.Error)
	}
	out, err := e.bringBack(ctx, rec, "started", func(b *box, img images.Image) error {
		return e.boot(ctx, b, img, true, nil)
	})
	if err == nil {
		e.log.Info("sandbox started", "id", id)
	}
	return out, err
}

// bringBack boots a kept sandbox (stopped by Stop, or hibernated) again:
// admitted as a create is (host capacity, budgets), with its keys, env,
// credentials and firewall policy; run launches its machine. On failure it
// is kept as it was, in the state it had.
func (e *Runtime) bringBack(ctx context.Context, rec *store.Sandbox, verb string, run func(*box, images.Image) error) (*sandbox.Sandbox, error) {
	id, from := rec.ID, rec.State
	img, err := e.imageOf(rec)
	if err != nil {
		return nil, err
	}
	if err := e.capacity.Reserve(rec.Size); err != nil {
		return nil, err
	}
	b := &box{rec: rec, deleting: make(chan struct{})}
	b.mu.Lock()
	defer b.mu.Unlock()
	// Only one at a time, and never beside a Delete: the box is
	// registered while it boots. Its record keeps its state until it runs
	// (boot stores the new handle): an engine that dies meanwhile finds it
	// kept, and stops the VMM it had launched.
	prev, ok := e.boxes.take(b)
	if !ok {
		e.capacity.Release(rec.Size)
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is being %s", id, verb)
	}
	// A Delete may have finished between the record read and the claim.
	if cur, err := e.store.GetSandbox(ctx, id); err != nil || cur.State != from || !cur.Kept || e.hosts.Foreign(cur) {
		if err != nil || cur.State != from || e.hosts.Foreign(cur) {
			prev = nil
		}
		e.boxes.drop(id, prev)
		e.capacity.Release(rec.Size)
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is no longer %s", id, from)
	}
	// What it kept is charged up to now; it is admitted afresh.
	e.meter.Final(ctx, b.rec)
	fail := func(err error) (*sandbox.Sandbox, error) {
		e.log.Warn("sandbox not "+verb, "id", id, "err", err)
		bg := context.WithoutCancel(ctx)
		if b.m != nil {
			b.m.Kill(bg)
			b.m.Wait(bg)
		}
		b.closeAgent(sandbox.Errorf(sandbox.ErrState, "", "sandbox %s did not start", id))
		e.meter.Final(bg, b.rec)
		e.net.Detach(bg, id)
		e.capacity.Release(rec.Size)
		rec.State, rec.Handle, rec.Kept = from, nil, true
		e.store.PutSandbox(bg, rec)
		// Kept again: what it keeps is metered again, from a fresh
		// reservation.
		snap := *rec
		e.boxes.drop(id, &snap)
		e.meter.Keep(bg, rec, from)
		return nil, err
	}
	if err := e.store.Update(ctx, func(tx store.Tx) error { return e.meter.Admit(ctx, tx, rec) }); err != nil {
		return fail(err)
	}
	if b.keys, err = sandboxkeys.Load(ctx, e.sec, rec.ID); err != nil {
		return fail(err)
	}
	if err := e.guests.LoadEnv(ctx, b.guest()); err != nil {
		return fail(err)
	}
	if err := e.guests.LoadCredentials(ctx, b.guest()); err != nil {
		return fail(err)
	}
	if e.shared {
		// Its URLs as the store has them (it may have moved here, with
		// URLs this host's ingress never loaded or holds stale).
		if err := e.urls.Took(ctx, id); err != nil {
			return fail(err)
		}
	}
	if err := run(b, img); err != nil {
		return fail(err)
	}
	rec.Kept, rec.HibernatedBytes = false, 0 // running: Stop or Hibernate keep it again
	if err := e.store.PutSandbox(ctx, rec); err != nil {
		return fail(err)
	}
	e.watch(b)
	return b.view(), nil
}

// imageOf is the image build a sandbox was created from (for records from
// before builds were recorded: the newest build of its image's name).
func (e *Runtime) imageOf(rec *store.Sandbox) (images.Image, error) {
	if rec.ImageDir == "" {
		return e.catalog.Lookup(rec.Image)
	}
	if img, ok := e.opts.Images[rec.Image]; ok && img.Dir == rec.ImageDir {
		return img, nil // (an image the embedder gave by name)
	}
	img, err := images.Load(rec.ImageDir)
	if errors.Is(err, os.ErrNotExist) {
		return images.Image{}, sandbox.Errorf(sandbox.ErrState, "", "the image build %s the sandbox was created from is gone", rec.ImageDir)
	}
	return img, err
}
