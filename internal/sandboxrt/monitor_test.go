package sandboxrt

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// machine is a running machine as the monitoring round hands it on
// (it calls none of its methods).
type machine struct{ hypervisor.Machine }

// TestSampleWaitsOutShortHolds: the metering round and the monitoring
// round tick together (15 s is three 5 s meter intervals), and metering
// holds each box's lock for a store write. A sampler that skipped every
// box it found locked lost that race round after round, and a sandbox got
// no sample at all; it now waits a short hold out, and still moves on
// from a long one.
func TestSampleWaitsOutShortHolds(t *testing.T) {
	ctx := context.Background()
	var wg sync.WaitGroup
	r := New(ctx, &wg, Config{}, slog.Default())
	b := &box{rec: &store.Sandbox{Sandbox: sandbox.Sandbox{ID: "sbx-1", State: sandbox.StateRunning, Monitoring: true}},
		m: machine{}, deleting: make(chan struct{})}
	r.boxes.put(b)
	sampled := func() int {
		n := 0
		r.Views().Monitor.Monitored(ctx, func(vm hypervisor.Machine, rec *store.Sandbox) {
			if rec.ID == b.rec.ID {
				n++
			}
		})
		return n
	}
	hold := func(d time.Duration) (done chan struct{}) {
		locked, done := make(chan struct{}), make(chan struct{})
		go func() {
			b.mu.Lock()
			close(locked)
			time.Sleep(d)
			b.mu.Unlock()
			close(done)
		}()
		<-locked
		return done
	}

	<-hold(0) // (the box is sampled when no one holds it)
	if n := sampled(); n != 1 {
		t.Fatalf("a free box: %d samples, want 1", n)
	}
	hold(50 * time.Millisecond) // a store write's worth
	if n := sampled(); n != 1 {
		t.Fatalf("a box held for 50 ms: %d samples, want 1", n)
	}
	done := hold(3 * roundLockWait) // a lifecycle call
	start := time.Now()
	if n := sampled(); n != 0 {
		t.Fatalf("a busy box was sampled: %d samples", n)
	}
	if took := time.Since(start); took > 2*roundLockWait {
		t.Fatalf("the round waited %v for a busy box", took)
	}
	<-done
}
