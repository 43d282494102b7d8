package stall

import (
	"context"
	"errors"
	"os/exec"
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	r := Rule{Idle: 30 * time.Second, CPU: 60 * time.Second}
	t0 := time.Unix(1000, 0)
	at := func(s int, cpu time.Duration, wait ...time.Duration) sample {
		smp := sample{at: t0.Add(time.Duration(s) * time.Second), cpu: cpu}
		for _, w := range wait {
			smp.wait += w
		}
		return smp
	}
	for _, c := range []struct {
		name  string
		seen  []sample
		spun  bool
		idle  bool
		keeps int
	}{
		{name: "booting", seen: []sample{at(0, 0), at(10, 9*time.Second), at(30, 25*time.Second)}, keeps: 3},
		{name: "young", seen: []sample{at(0, 0), at(20, 100*time.Millisecond)}, keeps: 2},
		{name: "idle", seen: []sample{at(0, 5*time.Second), at(15, 5*time.Second), at(31, 7*time.Second)}, idle: true},
		// A tenth of a CPU is not idle.
		{name: "slow", seen: []sample{at(0, 0), at(30, 3*time.Second)}, keeps: 2},
		// Nor is a boot starved of CPU: it waits to run all the time.
		{name: "starved", seen: []sample{at(0, 0), at(30, time.Second, 28*time.Second)}, keeps: 2},
		// An idle VMM on a busy host waits for its wake-ups, and less.
		{name: "idle on a busy host", seen: []sample{at(0, 0), at(30, time.Second, 10*time.Second)}, idle: true},
		// A thread that exited took its wait with it.
		{name: "idle after an exit", seen: []sample{at(0, 0, 9*time.Second), at(30, time.Second, 2*time.Second)}, idle: true},
		// Samples older than the window's start are dropped.
		{name: "dropped", seen: []sample{at(0, 0), at(2, time.Second), at(33, 20*time.Second)}, keeps: 2},
		{name: "spun", seen: []sample{at(0, 0), at(70, 60*time.Second)}, spun: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			stalled, keep := check(c.seen, r)
			switch {
			case c.spun || c.idle:
				if stalled == nil || stalled.Spun != c.spun {
					t.Fatalf("want a stall (spun %v), got %+v", c.spun, stalled)
				}
			case stalled != nil:
				t.Fatalf("stalled: %v", stalled)
			case len(keep) != c.keeps || keep[0] != c.seen[len(c.seen)-c.keeps]:
				t.Fatalf("kept %d samples, want the last %d", len(keep), c.keeps)
			}
		})
	}
}

// Watch on real processes: one that sleeps is idle, one that loops
// spins, one that has exited is left alone. (Each with only its rule in
// reach: a process of the test may get little CPU on a busy host.)
func TestWatch(t *testing.T) {
	idle := Rule{Idle: 600 * time.Millisecond, CPU: time.Hour, Every: 100 * time.Millisecond}
	spin := Rule{Idle: time.Hour, CPU: 300 * time.Millisecond, Every: 100 * time.Millisecond}
	watch := func(r Rule, script string, within time.Duration) error {
		c := exec.Command("sh", "-c", script)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { c.Process.Kill(); c.Wait() }()
		if script == "exit 0" {
			c.Wait()
		}
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		wctx, stop := r.Watch(ctx, c.Process.Pid)
		defer stop()
		<-wctx.Done()
		return context.Cause(wctx)
	}
	var se *Error
	if err := watch(idle, "exec sleep 60", 30*time.Second); !errors.As(err, &se) || se.Spun {
		t.Errorf("a sleeping process: %v", err)
	}
	if err := watch(spin, "while :; do :; done", 30*time.Second); !errors.As(err, &se) || !se.Spun {
		t.Errorf("a looping process: %v", err)
	}
	// A process that exits is no stall: the watch just stops.
	if err := watch(idle, "exit 0", 1500*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("an exited process: %v", err)
	}
}
