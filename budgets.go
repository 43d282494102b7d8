package harebox

import (
	"context"
	"sync"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Budgets are the engine's budgets and metered usage.
func (e *Engine) Budgets() *budget.Service { return e.budgets }

// reserveFor is how long a reservation made now covers: one metering
// interval, or what is left of the sandbox's TTL if that is less.
func (e *Engine) reserveFor(rec *store.Sandbox, now time.Time) time.Duration {
	d := e.opts.MeterInterval
	if d < 0 {
		d = 5 * time.Second
	}
	if rec.ExpiresAt != nil {
		d = max(0, min(d, rec.ExpiresAt.Sub(now)))
	}
	return d
}

// held is what a sandbox in state holds: a stopped one only its disk, a
// hibernated one its disk and its hibernation files (snapshot storage).
func held(rec *store.Sandbox, state sandbox.State) budget.Resources {
	switch state {
	case sandbox.StateStopped:
		return budget.Resources{DiskGB: rec.Size.DiskGB}
	case sandbox.StateHibernated:
		return budget.Resources{DiskGB: rec.Size.DiskGB, SnapshotBytes: rec.HibernatedBytes}
	}
	return budget.Resources{VCPUs: rec.Size.VCPUs, MemoryMB: rec.Size.MemoryMB, DiskGB: rec.Size.DiskGB, Paused: state == sandbox.StatePaused}
}

// admit reserves a new sandbox's first interval in its budgets, inside
// the transaction that places it.
func (e *Engine) admit(ctx context.Context, tx store.Tx, rec *store.Sandbox) error {
	amount := e.budgets.Prices().Cost(held(rec, sandbox.StateRunning), e.reserveFor(rec, e.opts.Now()))
	return e.budgets.Admit(ctx, tx, rec.ID, budget.SubjectOf(rec), amount)
}

// settle charges what b held since its last settlement and reserves its
// next interval in the state it goes to; with admit, a budget without room
// refuses (and nothing changes). The caller holds b.mu.
func (e *Engine) settle(ctx context.Context, b *box, next sandbox.State, admit bool) error {
	events, err := e.budgets.Settle(ctx, budget.Meter{
		SandboxID: b.rec.ID, Subject: budget.SubjectOf(b.rec), Held: held(b.rec, b.rec.State),
		Next: held(b.rec, next), NextFor: e.reserveFor(b.rec, e.opts.Now()), Admit: admit, Egress: e.egress(b),
	})
	if err != nil && !admit {
		e.log.Warn("metering failed", "id", b.rec.ID, "err", err)
	}
	e.reached(events)
	return err
}

// settleFinal charges what b held up to now and ends its reservation.
func (e *Engine) settleFinal(ctx context.Context, b *box) {
	events, err := e.budgets.Settle(ctx, budget.Meter{SandboxID: b.rec.ID, Subject: budget.SubjectOf(b.rec), Held: held(b.rec, b.rec.State), Final: true, Egress: e.egress(b)})
	if err != nil {
		e.log.Warn("metering failed", "id", b.rec.ID, "err", err)
	}
	e.reached(events)
}

// egress reads b's egress counter, if the network counts (and the link is
// there: a sandbox without one has sent nothing more).
func (e *Engine) egress(b *box) *uint64 {
	m, ok := e.net.(network.Meter)
	if !ok {
		return nil
	}
	n, _, err := m.Traffic(b.rec.ID)
	if err != nil {
		return nil
	}
	return &n
}

// releaseBudgets ends b's reservation without a charge: a create refused
// before anything ran, or a VM found gone (when it stopped is not known).
func (e *Engine) releaseBudgets(ctx context.Context, b *box) error {
	_, err := e.budgets.Settle(ctx, budget.Meter{SandboxID: b.rec.ID, Subject: budget.SubjectOf(b.rec), Final: true})
	return err
}

// reached wakes the meter loop when a budget's action became due.
func (e *Engine) reached(events []budget.Event) {
	for _, ev := range events {
		if ev.Reached {
			select {
			case e.wakeActions <- struct{}{}:
			default:
			}
			return
		}
	}
}

// Settle meters every live sandbox up to now against its budgets, then
// does the actions of the budgets that were reached. The engine calls it
// every MeterInterval, at start and (without the actions) at Close.
func (e *Engine) Settle(ctx context.Context) error {
	e.settleAll(ctx)
	return e.act(ctx)
}

func (e *Engine) settleAll(ctx context.Context) {
	// Sandboxes without a box to lock, by what they hold: one that is
	// booting holds what it reserved from its admission on (it is charged
	// as it boots, so a long boot cannot outrun its budgets unseen); one
	// that is stopped keeps its disk (disk GB-hours). Their records'
	// place and size do not change.
	type unboxed struct {
		rec   *store.Sandbox
		state sandbox.State
	}
	var recs []unboxed
	e.mu.Lock()
	for _, rec := range e.creating {
		recs = append(recs, unboxed{rec, sandbox.StateRunning})
	}
	for _, rec := range e.kept {
		recs = append(recs, unboxed{rec, rec.State}) // stopped or hibernated
	}
	e.mu.Unlock()
	deadline := time.Now().Add(roundLockWait)
	for _, b := range e.liveBoxes() {
		// A box busy in a lifecycle call (a hung hypervisor, a long
		// delete) is settled next round: the round waits roundLockWait
		// at most for all of them, and metering and the actions of every
		// other sandbox go on.
		if !b.lockBy(deadline) {
			continue
		}
		if s := b.rec.State; s == sandbox.StateRunning || s == sandbox.StatePaused {
			e.settle(ctx, b, s, false)
		}
		b.mu.Unlock()
	}
	for _, u := range recs {
		events, err := e.budgets.Settle(ctx, budget.Meter{SandboxID: u.rec.ID, Subject: budget.SubjectOf(u.rec), Held: held(u.rec, u.state),
			Next: held(u.rec, u.state), NextFor: e.reserveFor(u.rec, e.opts.Now()), Reserved: true})
		if err != nil {
			e.log.Warn("metering failed", "id", u.rec.ID, "err", err)
		}
		e.reached(events)
	}
	e.settleSnapshots(ctx)
}

// settleSnapshots meters the stored snapshots' storage, each under its
// own ID, against the budgets that cover its source.
func (e *Engine) settleSnapshots(ctx context.Context) {
	snaps, err := e.store.ListSnapshots(ctx)
	if err != nil {
		e.log.Warn("metering snapshots failed", "err", err)
		return
	}
	for _, s := range snaps {
		if _, err := e.settleSnapshot(ctx, s, false, false); err != nil {
			e.log.Warn("metering failed", "snapshot", s.ID, "err", err)
		}
	}
}

// settleSnapshot charges a snapshot's storage up to now and reserves its
// next interval: with admit, a budget without room refuses; final ends it.
func (e *Engine) settleSnapshot(ctx context.Context, s *store.Snapshot, admit, final bool) ([]budget.Event, error) {
	rec := &store.Sandbox{Sandbox: sandbox.Sandbox{ID: s.ID, AccountID: s.AccountID, ProjectID: s.ProjectID, FleetID: s.Source.FleetID, Labels: s.Labels},
		KeyID: s.KeyID, KeyAncestors: s.KeyAncestors}
	r := budget.Resources{SnapshotBytes: s.Bytes}
	m := budget.Meter{SandboxID: s.ID, Subject: budget.SubjectOf(rec), Held: r, Admit: admit, Final: final}
	if !final {
		m.Next, m.NextFor = r, e.reserveFor(rec, e.opts.Now())
	}
	events, err := e.budgets.Settle(ctx, m)
	e.reached(events)
	return events, err
}

// act does what the budgets whose action is due say: pause or delete the
// sandboxes they cover (deny_new and notify have nothing to do: the
// admission refuses, the audit log has the event). A budget that pauses
// or deletes holds for the rest of its period, so a sandbox in scope that
// still runs (it was booting, or an attempt failed) is acted on at the
// next round; an action decided before a crash is done at the next start.
func (e *Engine) act(ctx context.Context) error {
	due, err := e.budgets.Enforced(ctx)
	if err != nil {
		return err
	}
	// The engine acts for the budget, not for whoever called.
	octx := authz.WithPrincipal(context.WithoutCancel(ctx), authz.Operator)
	for _, bg := range due {
		var done []string
		if bg.Action == budget.Pause || bg.Action == budget.Stop || bg.Action == budget.Delete {
			// At most 8 at once: a stop or delete takes seconds (a guest
			// may ignore its power button for 45 s), and one budget's
			// sandboxes must not hold up the others' metering for long.
			var mu sync.Mutex
			var wg sync.WaitGroup
			sem := make(chan struct{}, 8)
			for _, b := range e.covered(bg) {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer func() { <-sem; wg.Done() }()
					var err error
					switch bg.Action {
					case budget.Pause:
						_, err = e.Pause(octx, b.rec.ID)
					case budget.Stop:
						if e.reuse {
							_, err = e.Stop(octx, b.rec.ID)
						} else {
							// A backend that cannot start a sandbox again
							// cannot stop one: it is paused instead.
							_, err = e.Pause(octx, b.rec.ID)
						}
					default:
						err = e.Delete(octx, b.rec.ID)
					}
					if err != nil {
						e.log.Warn("budget action failed; retried next round", "budget", bg.ID, "action", bg.Action, "id", b.rec.ID, "err", err)
						return
					}
					mu.Lock()
					done = append(done, b.rec.ID)
					mu.Unlock()
				}()
			}
			wg.Wait()
		}
		if bg.Pending || len(done) > 0 {
			e.log.Info("budget reached", "budget", bg.ID, "account", bg.AccountID, "action", bg.Action, "sandboxes", len(done))
		}
		if err := e.budgets.Acted(ctx, bg, done); err != nil {
			return err
		}
	}
	return nil
}

// reconcileReservations releases, at start, what sandboxes that are
// neither live nor stopped with their disks still hold (a path that failed to release it): a reservation
// nothing will settle would keep its budgets from admitting for good.
func (e *Engine) reconcileReservations(ctx context.Context) error {
	rs, err := e.store.ListReservations(ctx)
	if err != nil {
		return err
	}
	for _, r := range rs {
		e.mu.Lock()
		_, kept := e.kept[r.SandboxID]
		e.mu.Unlock()
		if kept || e.live(r.SandboxID) != nil {
			continue // (a stopped sandbox's disk is metered)
		}
		if sandbox.ValidSnapshotID(r.SandboxID) {
			if _, err := e.store.GetSnapshot(ctx, r.SandboxID); err == nil {
				continue // (a snapshot's storage is metered)
			}
		}
		rec, err := e.store.GetSandbox(ctx, r.SandboxID)
		if err != nil {
			rec = &store.Sandbox{Sandbox: sandbox.Sandbox{ID: r.SandboxID}}
		}
		if e.elsewhere(rec) {
			continue // (another host's sandbox: that host settles it)
		}
		e.log.Warn("releasing the budget reservation of a sandbox that is not live", "id", r.SandboxID)
		if err := e.releaseBudgets(ctx, &box{rec: rec}); err != nil {
			return err
		}
	}
	return nil
}

// covered lists the live sandboxes bg's action falls on.
func (e *Engine) covered(bg *store.Budget) []*box {
	var out []*box
	for _, b := range e.liveBoxes() {
		// (A sandbox's place, labels and key never change.)
		if !budget.Covers(bg, budget.SubjectOf(b.rec)) {
			continue
		}
		b.mu.Lock()
		s := b.rec.State
		b.mu.Unlock()
		if s == sandbox.StateRunning || (s == sandbox.StatePaused && bg.Action != budget.Pause && (bg.Action != budget.Stop || e.reuse)) {
			out = append(out, b)
		}
	}
	return out
}

func (e *Engine) meterLoop(every time.Duration) {
	defer e.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
			if err := e.Settle(e.ctx); err != nil && e.ctx.Err() == nil {
				e.log.Warn("metering failed", "err", err)
			}
		case <-e.wakeActions:
			if err := e.act(e.ctx); err != nil && e.ctx.Err() == nil {
				e.log.Warn("budget actions failed", "err", err)
			}
		}
	}
}
