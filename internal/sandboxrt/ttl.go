package sandboxrt

import (
	"context"
	"errors"
	"time"

	"github.com/harebox/harebox/sandbox"
)

// reapExpired deletes sandboxes whose TTL has passed (expiry is stored, so
// a sandbox that expired while the engine was down goes at the next start),
// keeps console logs bounded, and applies history retention every minute.
func (e *Runtime) reapExpired() {
	defer e.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for tick := 0; ; tick++ {
		if tick%60 == 0 {
			// Retention holds across restarts: at start, then each minute.
			e.PurgeRetention(e.ctx)
			e.reapStopped(e.ctx)
		}
		now := time.Now()
		var due []string
		for _, b := range e.boxes.all() {
			// (Read under its lock, as SetTimeout writes it; a busy box
			// is looked at again the next second.)
			if !b.mu.TryLock() {
				continue
			}
			if exp := b.rec.ExpiresAt; exp != nil && !exp.After(now) {
				due = append(due, b.rec.ID)
			}
			b.mu.Unlock()
		}
		for _, id := range due {
			e.log.Info("sandbox TTL expired", "id", id)
			if err := e.Delete(e.ctx, id); err != nil && !errors.Is(err, sandbox.ErrState) {
				e.log.Warn("TTL delete failed", "id", id, "err", err)
			}
		}
		e.boundSerialLogs()
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reapStopped deletes the stopped sandboxes whose TTL has passed (they are
// not live, so the reaper's every-second look at the live ones misses
// them).
func (e *Runtime) reapStopped(ctx context.Context) {
	recs, err := e.store.ListSandboxes(ctx)
	if err != nil {
		return
	}
	now := time.Now()
	for _, r := range recs {
		if e.hosts.Foreign(r) {
			continue
		}
		if (r.State == sandbox.StateStopped || r.State == sandbox.StateHibernated) && r.Kept && r.ExpiresAt != nil && !r.ExpiresAt.After(now) {
			e.log.Info("stopped sandbox TTL expired", "id", r.ID)
			if err := e.Delete(ctx, r.ID); err != nil && !errors.Is(err, sandbox.ErrState) {
				e.log.Warn("TTL delete failed", "id", r.ID, "err", err)
			}
		}
	}
}
