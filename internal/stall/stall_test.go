package stall

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	r := Rule{Idle: 30 * time.Second, CPU: 60 * time.Second}
	t0 := time.Unix(1000, 0)
	at := func(s int, cpu, wait time.Duration) sample {
		return sample{at: t0.Add(time.Duration(s) * time.Second), cpu: cpu, wait: wait}
	}
	for _, c := range []struct {
		name  string
		seen  []sample
		spun  bool
		idle  bool
		keeps int
	}{
		{name: "booting", seen: []sample{at(0, 0, 0), at(10, 9*time.Second, 0), at(30, 25*time.Second, 0)}, keeps: 3},
		{name: "young", seen: []sample{at(0, 0, 0), at(20, 100*time.Millisecond, 0)}, keeps: 2},
		{name: "idle", seen: []sample{at(0, 5*time.Second, 0), at(15, 5*time.Second, 0), at(31, 7*time.Second, 0)}, idle: true},
		// A VMM starved of CPU waits to run: not idle.
		{name: "starved", seen: []sample{at(0, 0, 0), at(30, time.Second, 20*time.Second)}, keeps: 2},
		// Samples older than the window's start are dropped.
		{name: "dropped", seen: []sample{at(0, 0, 0), at(2, time.Second, 0), at(33, 20*time.Second, 0)}, keeps: 2},
		// A thread that exited took its wait with it.
		{name: "idle after an exit", seen: []sample{at(0, 5*time.Second, 9*time.Second), at(30, 6*time.Second, 2*time.Second)}, idle: true},
		{name: "spun", seen: []sample{at(0, 0, 0), at(70, 60*time.Second, 0)}, spun: true},
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
// spins, one that works within the rule is left alone.
func TestWatch(t *testing.T) {
	r := Rule{Idle: 600 * time.Millisecond, CPU: 900 * time.Millisecond, Every: 100 * time.Millisecond}
	start := func(script string) *exec.Cmd {
		c := exec.Command("sh", "-c", script)
		if script == "work" {
			c = exec.Command(os.Args[0], "-test.run=^TestWorker$")
			c.Env = append(os.Environ(), "STALL_TEST_WORKER=1")
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	watch := func(c *exec.Cmd, within time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		wctx, stop := r.Watch(ctx, c.Process.Pid)
		defer stop()
		<-wctx.Done()
		return context.Cause(wctx)
	}
	var se *Error
	if err := watch(start("exec sleep 60"), 10*time.Second); !errors.As(err, &se) || se.Spun {
		t.Errorf("a sleeping process: %v", err)
	}
	if err := watch(start("while :; do :; done"), 10*time.Second); !errors.As(err, &se) || !se.Spun {
		t.Errorf("a looping process: %v", err)
	}
	// Busy a fifth of the time: not idle, and under the CPU.
	if err := watch(start("work"), 1500*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a process at work: %v", err)
	}
	// A process that exits is no stall: the watch just stops.
	c := start("exit 0")
	c.Wait()
	if err := watch(c, 1500*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("an exited process: %v", err)
	}
}

// TestWorker is TestWatch's process at work: busy 20 ms of every 100.
func TestWorker(t *testing.T) {
	if os.Getenv("STALL_TEST_WORKER") == "" {
		t.Skip("a helper process of TestWatch")
	}
	for {
		for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end); {
		}
		time.Sleep(80 * time.Millisecond)
	}
}
