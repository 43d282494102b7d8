package harebox

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/sandbox"
)

// TestSampleWaitsOutShortHolds: the metering round and the monitoring
// round tick together (15 s is three 5 s meter intervals), and metering
// holds each box's lock for a store write. A sampler that skipped every
// box it found locked lost that race round after round, and a sandbox got
// no sample at all; it now waits a short hold out, and still moves on
// from a long one.
func TestSampleWaitsOutShortHolds(t *testing.T) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "hbm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	eng, err := New(ctx, Options{DataDir: dir, Hypervisor: hv, HealthInterval: -1, MeterInterval: time.Hour, MetricsInterval: -1,
		Images: map[string]images.Image{sandbox.DefaultImage: memhv.Image(dir)}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	s, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	b := eng.boxes.get(s.ID)
	samples := func() int {
		l, err := eng.store.ListMetrics(ctx, s.ID, time.Time{}, time.Time{}, 100)
		if err != nil {
			t.Fatal(err)
		}
		return len(l)
	}
	hold := func(d time.Duration) {
		locked := make(chan struct{})
		go func() {
			b.mu.Lock()
			close(locked)
			time.Sleep(d)
			b.mu.Unlock()
		}()
		<-locked
	}

	hold(50 * time.Millisecond) // a store write's worth
	eng.Monitor().Sample(ctx)
	if n := samples(); n != 1 {
		t.Fatalf("a box held for 50 ms: %d samples, want 1", n)
	}

	hold(3 * roundLockWait) // a lifecycle call
	start := time.Now()
	eng.Monitor().Sample(ctx)
	if took := time.Since(start); took > 2*roundLockWait {
		t.Fatalf("the round waited %v for a busy box", took)
	}
	if n := samples(); n != 1 {
		t.Fatalf("a busy box was sampled: %d samples", n)
	}
	b.mu.Lock() // (the hold is over before the engine closes)
	b.mu.Unlock()
}
