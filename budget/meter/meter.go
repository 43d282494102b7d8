// Package meter meters sandboxes against their budgets: it reserves a new
// sandbox's first interval when it is admitted, settles what a sandbox
// held at each of its transitions and every interval (and a snapshot's
// storage), ends its reservation when it goes, and does what a reached
// budget says (pause, stop or delete the sandboxes it covers). The
// budgets and the ledger are package budget's; the sandboxes are the
// engine's, given through Sandboxes.
package meter

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Store is what metering reads of the store: the snapshots it meters, and
// the reservations it checks at start.
type Store interface {
	GetSandbox(ctx context.Context, id string) (*store.Sandbox, error)
	GetSnapshot(ctx context.Context, id string) (*store.Snapshot, error)
	ListSnapshots(ctx context.Context) ([]*store.Snapshot, error)
	GetVolume(ctx context.Context, id string) (*store.Volume, error)
	ListVolumes(ctx context.Context, projectID string) ([]*store.Volume, error)
	ListReservations(ctx context.Context) ([]*store.Reservation, error)
}

// Live is a live sandbox and its state when it was read.
type Live struct {
	ID    string
	State sandbox.State
}

// Sandboxes is what metering needs of the sandboxes (the engine).
type Sandboxes interface {
	// Locked calls fn with each live sandbox's record, one at a time and
	// under the sandbox's lock (a settlement and the sandbox's
	// transitions are serialized, so each charges what it held). One busy
	// in a lifecycle call is left to the next round.
	Locked(fn func(rec *store.Sandbox))
	// Unboxed returns, read at once, the records of the sandboxes with no
	// machine to lock that hold what they reserved: those being created
	// (they boot) and those kept with their disks (stopped or
	// hibernated). These records are not written once there.
	Unboxed() (creating, kept []*store.Sandbox)
	// Matching returns the live sandboxes whose records match, each with
	// its state read under its lock (waited for); match is called outside
	// it (a sandbox's place, labels and key never change).
	Matching(match func(rec *store.Sandbox) bool) []Live
	// Here reports whether sandbox id is live or kept on this host.
	Here(id string) bool
	// Elsewhere reports whether rec is another host's sandbox (that host
	// settles it).
	Elsewhere(rec *store.Sandbox) bool
	// CanStop reports whether a stopped sandbox can be started again (the
	// backend boots a machine again on its disks).
	CanStop() bool
	// Pause, Stop and Delete are a budget's actions on a sandbox, for the
	// principal in ctx.
	Pause(ctx context.Context, id string) error
	Stop(ctx context.Context, id string) error
	Delete(ctx context.Context, id string) error
}

// Options are a Service's parts.
type Options struct {
	Budgets   *budget.Service
	Store     Store
	Sandboxes Sandboxes
	// Traffic counts each sandbox's egress; nil: none is charged.
	Traffic network.Meter
	// Interval is what a reservation covers (negative: 5 s).
	Interval time.Duration
	Now      func() time.Time
	Log      *slog.Logger
}

// Service meters the sandboxes. It is safe for concurrent use.
type Service struct {
	o Options
	// wake asks the loop to act on a budget just reached.
	wake chan struct{}
	// acting serializes the rounds of actions (the loop's, on a wake,
	// and a Settle's): two at once would each act on part of a budget's
	// sandboxes and record part of what it did.
	acting sync.Mutex
}

// New returns a Service over o.
func New(o Options) *Service { return &Service{o: o, wake: make(chan struct{}, 1)} }

// reserveFor is how long a reservation made now covers: one metering
// interval, or what is left of the sandbox's TTL if that is less.
func (s *Service) reserveFor(rec *store.Sandbox, now time.Time) time.Duration {
	d := s.o.Interval
	if d < 0 {
		d = 5 * time.Second
	}
	if rec.ExpiresAt != nil {
		d = max(0, min(d, rec.ExpiresAt.Sub(now)))
	}
	return d
}

// held is what a sandbox in state holds: a stopped one only its disk, a
// hibernated one its disk and its hibernation files (snapshot storage);
// one running, paused or being created its size.
func held(rec *store.Sandbox, state sandbox.State) budget.Resources {
	switch state {
	case sandbox.StateStopped:
		return budget.Resources{DiskGB: rec.Size.DiskGB}
	case sandbox.StateHibernated:
		return budget.Resources{DiskGB: rec.Size.DiskGB, SnapshotBytes: rec.HibernatedBytes}
	}
	return budget.Resources{VCPUs: rec.Size.VCPUs, MemoryMB: rec.Size.MemoryMB, DiskGB: rec.Size.DiskGB, Paused: state == sandbox.StatePaused}
}

// Admit reserves a new sandbox's first interval in its budgets, inside
// the transaction that places it.
func (s *Service) Admit(ctx context.Context, tx store.Tx, rec *store.Sandbox) error {
	amount := s.o.Budgets.Prices().Cost(held(rec, sandbox.StateRunning), s.reserveFor(rec, s.o.Now()))
	return s.o.Budgets.Admit(ctx, tx, rec.ID, budget.SubjectOf(rec), amount)
}

// Transition charges what rec held since its last settlement and reserves
// its next interval in the state it goes to; with admit, a budget without
// room refuses (and nothing changes). The caller holds the sandbox's
// lock.
func (s *Service) Transition(ctx context.Context, rec *store.Sandbox, next sandbox.State, admit bool) error {
	events, err := s.o.Budgets.Settle(ctx, budget.Meter{
		SandboxID: rec.ID, Subject: budget.SubjectOf(rec), Held: held(rec, rec.State),
		Next: held(rec, next), NextFor: s.reserveFor(rec, s.o.Now()), Admit: admit, Egress: s.egress(rec),
	})
	if err != nil && !admit {
		s.o.Log.Warn("metering failed", "id", rec.ID, "err", err)
	}
	s.reached(events)
	return err
}

// Final charges what rec held up to now and ends its reservation.
func (s *Service) Final(ctx context.Context, rec *store.Sandbox) {
	events, err := s.o.Budgets.Settle(ctx, budget.Meter{SandboxID: rec.ID, Subject: budget.SubjectOf(rec), Held: held(rec, rec.State), Final: true, Egress: s.egress(rec)})
	if err != nil {
		s.o.Log.Warn("metering failed", "id", rec.ID, "err", err)
	}
	s.reached(events)
}

// Keep meters a sandbox kept again in state (a start that failed, after
// Final) from a fresh reservation.
func (s *Service) Keep(ctx context.Context, rec *store.Sandbox, state sandbox.State) error {
	_, err := s.o.Budgets.Settle(ctx, budget.Meter{SandboxID: rec.ID, Subject: budget.SubjectOf(rec),
		Held: held(rec, state), Next: held(rec, state), NextFor: s.reserveFor(rec, s.o.Now())})
	return err
}

// egress reads rec's egress counter, if the network counts (and the link
// is there: a sandbox without one has sent nothing more).
func (s *Service) egress(rec *store.Sandbox) *uint64 {
	if s.o.Traffic == nil {
		return nil
	}
	n, _, err := s.o.Traffic.Traffic(rec.ID)
	if err != nil {
		return nil
	}
	return &n
}

// Release ends rec's reservation without a charge: a create refused
// before anything ran, or a VM found gone (when it stopped is not known).
func (s *Service) Release(ctx context.Context, rec *store.Sandbox) error {
	_, err := s.o.Budgets.Settle(ctx, budget.Meter{SandboxID: rec.ID, Subject: budget.SubjectOf(rec), Final: true})
	return err
}

// reached wakes the loop when a budget's action became due.
func (s *Service) reached(events []budget.Event) {
	for _, ev := range events {
		if ev.Reached {
			s.Wake()
			return
		}
	}
}

// Wake asks the loop to do the actions of the budgets that are due now
// (one was reached, here or on another host that shares the store).
func (s *Service) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Settle meters every live sandbox up to now against its budgets, then
// does the actions of the budgets that were reached. The engine calls it
// every interval (Run) and at start.
func (s *Service) Settle(ctx context.Context) error {
	s.SettleAll(ctx)
	return s.act(ctx)
}

// SettleAll meters every live sandbox and snapshot up to now, without
// the actions (Settle; the engine calls it alone at Close).
func (s *Service) SettleAll(ctx context.Context) {
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
	creating, kept := s.o.Sandboxes.Unboxed()
	for _, rec := range creating {
		recs = append(recs, unboxed{rec, sandbox.StateRunning})
	}
	for _, rec := range kept {
		recs = append(recs, unboxed{rec, rec.State}) // stopped or hibernated
	}
	// A box busy in a lifecycle call (a hung hypervisor, a long delete) is
	// settled next round: metering and the actions of every other sandbox
	// go on.
	s.o.Sandboxes.Locked(func(rec *store.Sandbox) {
		if st := rec.State; st == sandbox.StateRunning || st == sandbox.StatePaused {
			s.Transition(ctx, rec, st, false)
		}
	})
	for _, u := range recs {
		events, err := s.o.Budgets.Settle(ctx, budget.Meter{SandboxID: u.rec.ID, Subject: budget.SubjectOf(u.rec), Held: held(u.rec, u.state),
			Next: held(u.rec, u.state), NextFor: s.reserveFor(u.rec, s.o.Now()), Reserved: true})
		if err != nil {
			s.o.Log.Warn("metering failed", "id", u.rec.ID, "err", err)
		}
		s.reached(events)
	}
	s.settleSnapshots(ctx)
	s.settleVolumes(ctx)
}

// settleVolumes meters the volumes' disks, each under its own ID,
// against the budgets that cover its project.
func (s *Service) settleVolumes(ctx context.Context) {
	vols, err := s.o.Store.ListVolumes(ctx, "")
	if err != nil {
		s.o.Log.Warn("metering volumes failed", "err", err)
		return
	}
	for _, v := range vols {
		if err := s.Volume(ctx, v, v.SizeGB, v.SizeGB, false); err != nil {
			s.o.Log.Warn("metering failed", "volume", v.ID, "err", err)
		}
	}
}

// Volume charges a volume's disk (heldGB, disk GB-hours) up to now and
// reserves its next interval at nextGB: with admit, a budget without
// room refuses; nextGB 0 ends it (deleted).
func (s *Service) Volume(ctx context.Context, v *store.Volume, heldGB, nextGB int, admit bool) error {
	rec := &store.Sandbox{Sandbox: sandbox.Sandbox{ID: v.ID, AccountID: v.AccountID, ProjectID: v.ProjectID}}
	m := budget.Meter{SandboxID: v.ID, Subject: budget.SubjectOf(rec), Held: budget.Resources{DiskGB: heldGB}, Admit: admit, Final: nextGB == 0}
	if nextGB > 0 {
		m.Next, m.NextFor = budget.Resources{DiskGB: nextGB}, s.reserveFor(rec, s.o.Now())
	}
	events, err := s.o.Budgets.Settle(ctx, m)
	s.reached(events)
	return err
}

// settleSnapshots meters the stored snapshots' storage, each under its
// own ID, against the budgets that cover its source.
func (s *Service) settleSnapshots(ctx context.Context) {
	snaps, err := s.o.Store.ListSnapshots(ctx)
	if err != nil {
		s.o.Log.Warn("metering snapshots failed", "err", err)
		return
	}
	for _, sn := range snaps {
		if err := s.Snapshot(ctx, sn, false, false); err != nil {
			s.o.Log.Warn("metering failed", "snapshot", sn.ID, "err", err)
		}
	}
}

// Snapshot charges a snapshot's storage up to now and reserves its next
// interval: with admit, a budget without room refuses; final ends it.
func (s *Service) Snapshot(ctx context.Context, sn *store.Snapshot, admit, final bool) error {
	rec := &store.Sandbox{Sandbox: sandbox.Sandbox{ID: sn.ID, AccountID: sn.AccountID, ProjectID: sn.ProjectID, FleetID: sn.Source.FleetID, Labels: sn.Labels},
		KeyID: sn.KeyID, KeyAncestors: sn.KeyAncestors}
	r := budget.Resources{SnapshotBytes: sn.Bytes}
	m := budget.Meter{SandboxID: sn.ID, Subject: budget.SubjectOf(rec), Held: r, Admit: admit, Final: final}
	if !final {
		m.Next, m.NextFor = r, s.reserveFor(rec, s.o.Now())
	}
	events, err := s.o.Budgets.Settle(ctx, m)
	s.reached(events)
	return err
}

// act does what the budgets whose action is due say: pause or delete the
// sandboxes they cover (deny_new and notify have nothing to do: the
// admission refuses, the audit log has the event). A budget that pauses
// or deletes holds for the rest of its period, so a sandbox in scope that
// still runs (it was booting, or an attempt failed) is acted on at the
// next round; an action decided before a crash is done at the next start.
func (s *Service) act(ctx context.Context) error {
	s.acting.Lock()
	defer s.acting.Unlock()
	due, err := s.o.Budgets.Enforced(ctx)
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
			for _, id := range s.covered(bg) {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer func() { <-sem; wg.Done() }()
					var err error
					switch bg.Action {
					case budget.Pause:
						err = s.o.Sandboxes.Pause(octx, id)
					case budget.Stop:
						if s.o.Sandboxes.CanStop() {
							err = s.o.Sandboxes.Stop(octx, id)
						} else {
							// A backend that cannot start a sandbox again
							// cannot stop one: it is paused instead.
							err = s.o.Sandboxes.Pause(octx, id)
						}
					default:
						err = s.o.Sandboxes.Delete(octx, id)
					}
					if err != nil {
						s.o.Log.Warn("budget action failed; retried next round", "budget", bg.ID, "action", bg.Action, "id", id, "err", err)
						return
					}
					mu.Lock()
					done = append(done, id)
					mu.Unlock()
				}()
			}
			wg.Wait()
		}
		if bg.Pending || len(done) > 0 {
			s.o.Log.Info("budget reached", "budget", bg.ID, "account", bg.AccountID, "action", bg.Action, "sandboxes", len(done))
		}
		if err := s.o.Budgets.Acted(ctx, bg, done); err != nil {
			return err
		}
	}
	return nil
}

// covered lists the IDs of the live sandboxes bg's action falls on.
func (s *Service) covered(bg *store.Budget) []string {
	var out []string
	matching := s.o.Sandboxes.Matching(func(rec *store.Sandbox) bool { return budget.Covers(bg, budget.SubjectOf(rec)) })
	for _, l := range matching {
		if l.State == sandbox.StateRunning || (l.State == sandbox.StatePaused && bg.Action != budget.Pause && (bg.Action != budget.Stop || s.o.Sandboxes.CanStop())) {
			out = append(out, l.ID)
		}
	}
	return out
}

// Reconcile releases, at start, what sandboxes that are neither live nor
// kept with their disks still hold (a path that failed to release it): a
// reservation nothing will settle would keep its budgets from admitting
// for good.
func (s *Service) Reconcile(ctx context.Context) error {
	rs, err := s.o.Store.ListReservations(ctx)
	if err != nil {
		return err
	}
	for _, r := range rs {
		if s.o.Sandboxes.Here(r.SandboxID) {
			continue // (a stopped sandbox's disk is metered)
		}
		if sandbox.ValidSnapshotID(r.SandboxID) {
			if _, err := s.o.Store.GetSnapshot(ctx, r.SandboxID); err == nil {
				continue // (a snapshot's storage is metered)
			}
		}
		if _, err := s.o.Store.GetVolume(ctx, r.SandboxID); err == nil {
			continue // (a volume's disk is metered)
		}
		rec, err := s.o.Store.GetSandbox(ctx, r.SandboxID)
		if err != nil {
			rec = &store.Sandbox{Sandbox: sandbox.Sandbox{ID: r.SandboxID}}
		}
		if s.o.Sandboxes.Elsewhere(rec) {
			continue // (another host's sandbox: that host settles it)
		}
		s.o.Log.Warn("releasing the budget reservation of a sandbox that is not live", "id", r.SandboxID)
		if err := s.Release(ctx, rec); err != nil {
			return err
		}
	}
	return nil
}

// Run settles every interval, and does the budgets' actions when one is
// reached (Wake), until ctx is done.
func (s *Service) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.Settle(ctx); err != nil && ctx.Err() == nil {
				s.o.Log.Warn("metering failed", "err", err)
			}
		case <-s.wake:
			if err := s.act(ctx); err != nil && ctx.Err() == nil {
				s.o.Log.Warn("budget actions failed", "err", err)
			}
		}
	}
}
