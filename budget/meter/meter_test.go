package meter

import (
	"testing"
	"time"

	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// TestReserveFor: a reservation covers one interval (5 s when the engine
// settles nothing on its own), cut to what is left of the sandbox's TTL.
func TestReserveFor(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { t := now.Add(d); return &t }
	for _, c := range []struct {
		every, want time.Duration
		expires     *time.Time
	}{
		{every: time.Minute, want: time.Minute},
		{every: -1, want: 5 * time.Second},
		{every: time.Minute, expires: at(10 * time.Second), want: 10 * time.Second},
		{every: time.Minute, expires: at(time.Hour), want: time.Minute},
		{every: time.Minute, expires: at(-time.Second), want: 0},
	} {
		s := New(Options{Interval: c.every})
		rec := &store.Sandbox{Sandbox: sandbox.Sandbox{ExpiresAt: c.expires}}
		if got := s.reserveFor(rec, now); got != c.want {
			t.Errorf("interval %v, expires %v: reserves %v, want %v", c.every, c.expires, got, c.want)
		}
	}
}

// TestHeld: a stopped sandbox holds its disk, a hibernated one its disk
// and its files; running, paused or booting, its size.
func TestHeld(t *testing.T) {
	rec := &store.Sandbox{Sandbox: sandbox.Sandbox{Size: sandbox.Resources{VCPUs: 2, MemoryMB: 1024, DiskGB: 10}}, HibernatedBytes: 5e8}
	size := budget.Resources{VCPUs: 2, MemoryMB: 1024, DiskGB: 10}
	paused := size
	paused.Paused = true
	for state, want := range map[sandbox.State]budget.Resources{
		sandbox.StateRunning:    size,
		sandbox.StateCreating:   size,
		sandbox.StatePaused:     paused,
		sandbox.StateStopped:    {DiskGB: 10},
		sandbox.StateHibernated: {DiskGB: 10, SnapshotBytes: 5e8},
	} {
		if got := held(rec, state); got != want {
			t.Errorf("%s: holds %+v, want %+v", state, got, want)
		}
	}
}
