// Package stall tells when a VM that is booting has stalled, from its
// VMM process as this host's kernel sees it: idle for a long while, or
// busy for many times what a boot costs, while its guest has not yet
// answered.
//
// Why from the outside: a handful of times in some hundreds of suite
// runs under TCG, a cold boot went quiet (or spun) and never answered;
// the guest's own words stop at that point, so only the VMM's use of
// the host shows it. A boot keeps a CPU busy; an idle guest's VMM uses a
// few percent of one (2 to 5% measured under TCG, on an idle host and at
// a load of 5 on 2 cores). A Debian guest's boot costs some 13 CPU-s
// under TCG, the minimal image's 5 (2026-12-07), and about one under KVM.
//
// A boot starved of CPU on a busy host uses little too, but it waits to
// run all the time; an idle VMM on a busy host waits too, for each of its
// short wake-ups, yet less (0.2 to 1.3 s of every 4 at that load). So a
// VMM is idle when it used under a tenth of a CPU and waited to run for
// under three quarters of the window.
package stall

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/internal/procs"
)

// Rule says when a boot has stalled. The zero Rule has the defaults.
type Rule struct {
	// Idle: over the last Idle (default 30 s), the VMM used less than a
	// tenth of a CPU and waited to run for less than three quarters of it.
	Idle time.Duration
	// CPU: the VMM has used this much CPU time since it started
	// (default 60 s: several boots' worth under TCG).
	CPU time.Duration
	// Every is how often the VMM is looked at (default 2 s).
	Every time.Duration
}

func (r Rule) withDefaults() Rule {
	if r.Idle <= 0 {
		r.Idle = 30 * time.Second
	}
	if r.CPU <= 0 {
		r.CPU = 60 * time.Second
	}
	if r.Every <= 0 {
		r.Every = 2 * time.Second
	}
	return r
}

// Error is the cause a watched context ends with when its VMM stalled.
type Error struct {
	// Spun: the VMM spent Rule.CPU; else it sat idle.
	Spun bool
	// CPU is what the VMM had used when it was found stalled.
	CPU time.Duration
	// For is how long it was idle (Spun false).
	For time.Duration
}

func (e *Error) Error() string {
	if e.Spun {
		return fmt.Sprintf("the VMM spun: %.0f CPU-s used and the guest has not answered", e.CPU.Seconds())
	}
	return fmt.Sprintf("the VMM sat idle for %.0f s (%.1f CPU-s used in all) and the guest has not answered", e.For.Seconds(), e.CPU.Seconds())
}

// Watch returns a context that ends with an *Error as its cause
// (context.Cause) once the VMM of process pid stalls by r, or when ctx
// ends. It stops looking when the process is gone (its exit is not a
// stall) or when the returned cancel is called.
func (r Rule) Watch(ctx context.Context, pid int) (context.Context, context.CancelFunc) {
	r = r.withDefaults()
	wctx, cancel := context.WithCancelCause(ctx)
	go func() {
		t := time.NewTicker(r.Every)
		defer t.Stop()
		var seen []sample
		for {
			s, err := use(pid)
			if err != nil {
				return
			}
			s.at = time.Now()
			seen = append(seen, s)
			var stalled *Error
			if stalled, seen = check(seen, r); stalled != nil {
				cancel(stalled)
				return
			}
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return wctx, func() { cancel(context.Canceled) }
}

// sample is what a VMM had used by a moment: CPU time (its threads',
// the exited ones' included) and time spent waiting for a CPU (its live
// threads').
type sample struct {
	at        time.Time
	cpu, wait time.Duration
}

// check applies r to samples in time order, the newest last; it returns
// the stall, if any, and the samples the next check needs.
func check(seen []sample, r Rule) (*Error, []sample) {
	last := seen[len(seen)-1]
	if last.cpu >= r.CPU {
		return &Error{Spun: true, CPU: last.cpu}, seen
	}
	// The newest sample at least Idle old starts the window.
	from := -1
	for i, s := range seen {
		if last.at.Sub(s.at) >= r.Idle {
			from = i
		}
	}
	if from < 0 {
		return nil, seen
	}
	s := seen[from]
	// (A thread that exits takes its wait with it: never below zero.)
	if last.cpu-s.cpu < r.Idle/10 && max(0, last.wait-s.wait) < r.Idle*3/4 {
		return &Error{CPU: last.cpu, For: last.at.Sub(s.at)}, seen
	}
	return nil, seen[from:]
}

// use reads process pid's CPU and wait times from /proc.
func use(pid int) (sample, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	st, err := procs.ReadStat(pid)
	if err != nil {
		return sample{}, fmt.Errorf("stall: %w", err)
	}
	if st.Exited() {
		return sample{}, fmt.Errorf("stall: process %d has exited", pid)
	}
	s := sample{cpu: st.CPU}
	tasks, _ := os.ReadDir(filepath.Join(dir, "task"))
	for _, t := range tasks {
		// run, wait and slices, in ns (the kernel's schedstats).
		b, err := os.ReadFile(filepath.Join(dir, "task", t.Name(), "schedstat"))
		if f := strings.Fields(string(b)); err == nil && len(f) >= 2 {
			w, _ := strconv.ParseInt(f[1], 10, 64)
			s.wait += time.Duration(w)
		}
	}
	return s, nil
}

// Await calls answer, which waits for the guest of m to answer, under a
// watch of m's VMM: it returns answer's error, or an *Error if the VMM
// stalled first. A machine that is no process of this host's is not
// watched.
func (r Rule) Await(ctx context.Context, m hypervisor.Machine, answer func(context.Context) error) error {
	info, err := m.Info(ctx)
	if err != nil || info.PID <= 0 {
		return answer(ctx)
	}
	wctx, stop := r.Watch(ctx, info.PID)
	defer stop()
	err = answer(wctx)
	var stalled *Error
	if err != nil && errors.As(context.Cause(wctx), &stalled) {
		return stalled
	}
	return err
}

// NudgeWait is how long a stalled boot, paused and resumed, has to answer.
const NudgeWait = 5 * time.Second

// Recover is what a stalled boot's caller does: it pauses and resumes m,
// which wakes a guest that missed a wake-up, and gives answer NudgeWait
// to succeed; if it does not, it kills m, removes its files and launches
// spec on hv again. It returns the machine to go on with (m, or the new
// one, whose answer is still to come) and whether m woke.
func Recover(ctx context.Context, hv hypervisor.Hypervisor, m hypervisor.Machine, spec hypervisor.Spec, answer func(context.Context) error) (_ hypervisor.Machine, woke bool, _ error) {
	if m.Pause(ctx) == nil && m.Resume(ctx) == nil {
		nctx, cancel := context.WithTimeout(ctx, NudgeWait)
		err := answer(nctx)
		cancel()
		if err == nil {
			return m, true, nil
		}
	}
	bg := context.WithoutCancel(ctx)
	m.Kill(bg)
	m.Wait(bg)
	if err := m.Cleanup(bg); err != nil {
		return nil, false, err
	}
	nm, err := hv.Launch(ctx, spec)
	return nm, false, err
}
