package sandboxrt

import (
	"context"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/monitor"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Monitoring is package monitor's: it samples the sandboxes the engine
// gives it (sandboxView.Monitored) every MetricsInterval, answers the
// metrics queries (the REST API calls it directly) and purges samples by
// retention (PurgeRetention). The counts of the engine itself (Stats)
// are the engine's.

// Monitored implements monitor.Sandboxes: a box busy in a lifecycle call
// is waited for until roundLockWait past the round's start, as the
// metering round does, then left to the next round.
func (s sandboxView) Monitored(ctx context.Context, fn func(vm hypervisor.Machine, rec *store.Sandbox)) {
	deadline := time.Now().Add(roundLockWait)
	for _, b := range s.e.boxes.all() {
		if !b.lockBy(deadline) {
			continue
		}
		st, monitored, vm, rec := b.rec.State, b.rec.Monitoring, b.m, *b.rec
		b.mu.Unlock()
		if !monitored || (st != sandbox.StateRunning && st != sandbox.StatePaused) || vm == nil {
			continue
		}
		fn(vm, &rec)
	}
}

// PurgeRetention applies every account's retention now: its command
// history, and its monitoring samples, kept as long as history.
func (e *Runtime) PurgeRetention(ctx context.Context) {
	e.monitor.Purge(ctx)
	e.history.Purge(ctx)
}

// Stats returns the engine's counts now (for a principal that
// monitor.MayReadServer allows: they are the host's, across accounts).
func (e *Runtime) Stats(ctx context.Context) (monitor.Stats, error) {
	if err := monitor.MayReadServer(authz.From(ctx)); err != nil {
		return monitor.Stats{}, err
	}
	st := monitor.Stats{Sandboxes: map[sandbox.State]int{}}
	boxes := e.boxes.all()
	st.Reserved, st.Limit = e.capacity.Used(), e.capacity.Limit()
	creating, kept := e.boxes.unboxed()
	st.Sandboxes[sandbox.StateCreating] = len(creating)
	for _, r := range kept {
		st.Sandboxes[r.State]++ // stopped or hibernated
	}
	st.Pool = e.clones.Idle()
	st.Creates = e.creates.snapshot()
	for _, b := range boxes {
		// One in a lifecycle call is counted as busy, not waited for.
		if !b.mu.TryLock() {
			st.Busy++
			continue
		}
		st.Sandboxes[b.rec.State]++
		b.mu.Unlock()
	}
	return st, nil
}
