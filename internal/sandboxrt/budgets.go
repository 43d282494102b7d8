package sandboxrt

import (
	"context"
	"time"

	"github.com/harebox/harebox/budget/meter"
	"github.com/harebox/harebox/store"
)

// Budgets and metering. Package budget keeps the budgets and the ledger
// (the REST API calls it directly for budget CRUD and usage); package
// budget/meter meters the sandboxes against them. The engine calls the
// meter at fixed points of a sandbox's life (Admit when it is placed,
// Transition on a state change, Final and Release when it goes), starts
// its loop every MeterInterval, and gives it its sandboxes (sandboxView)
// and the budgets' actions on them.

// Locked implements meter.Sandboxes: a box busy in a lifecycle call (a
// hung hypervisor, a long delete) is waited for until roundLockWait past
// the round's start, in all, then left to the next round.
func (s sandboxView) Locked(fn func(rec *store.Sandbox)) {
	deadline := time.Now().Add(roundLockWait)
	for _, b := range s.e.boxes.all() {
		if !b.lockBy(deadline) {
			continue
		}
		fn(b.rec)
		b.mu.Unlock()
	}
}

// Unboxed implements meter.Sandboxes: the records of the creates (from
// their placement until they are registered or fail) and of the kept
// sandboxes (stopped by Stop, or hibernated); the engine writes none once
// it is there.
func (s sandboxView) Unboxed() (creating, kept []*store.Sandbox) { return s.e.boxes.unboxed() }

// Matching implements meter.Sandboxes.
func (s sandboxView) Matching(match func(rec *store.Sandbox) bool) []meter.Live {
	var out []meter.Live
	for _, b := range s.e.boxes.all() {
		if !match(b.rec) {
			continue
		}
		b.mu.Lock()
		st := b.rec.State
		b.mu.Unlock()
		out = append(out, meter.Live{ID: b.rec.ID, State: st})
	}
	return out
}

func (s sandboxView) Here(id string) bool {
	return s.e.boxes.isKept(id) || s.e.boxes.get(id) != nil
}

func (s sandboxView) Elsewhere(rec *store.Sandbox) bool { return s.e.hosts.Foreign(rec) }

func (s sandboxView) CanStop() bool { return s.e.reuse }

func (s sandboxView) Pause(ctx context.Context, id string) error {
	_, err := s.e.Pause(ctx, id)
	return err
}

func (s sandboxView) Stop(ctx context.Context, id string) error {
	_, err := s.e.Stop(ctx, id)
	return err
}

func (s sandboxView) Delete(ctx context.Context, id string) error { return s.e.Delete(ctx, id) }
