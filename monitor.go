package harebox

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// userHZ is the unit of the CPU times in /proc/PID/stat (fixed by the
// kernel's ABI at 100 on Linux).
const userHZ = 100

// monitorLoop samples every monitored sandbox each interval.
func (e *Engine) monitorLoop(every time.Duration) {
	defer e.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
			e.SampleMetrics(e.ctx)
		}
	}
}

// SampleMetrics takes one monitoring sample of every live sandbox created
// with monitoring on; the engine calls it every MetricsInterval.
func (e *Engine) SampleMetrics(ctx context.Context) {
	deadline := time.Now().Add(roundLockWait)
	for _, b := range e.liveBoxes() {
		// A box busy in a lifecycle call is sampled next round.
		if !b.lockBy(deadline) {
			continue
		}
		s, monitored, vm, rec := b.rec.State, b.rec.Monitoring, b.m, *b.rec
		b.mu.Unlock()
		if !monitored || (s != sandbox.StateRunning && s != sandbox.StatePaused) || vm == nil {
			continue
		}
		// (Measured outside the box's lock: a slow plugin call holds up
		// no lifecycle call.)
		if m := e.sample(ctx, vm, &rec); m != nil {
			if err := e.store.PutMetrics(ctx, m); err != nil {
				e.log.Warn("monitoring: cannot store a sample", "id", m.SandboxID, "err", err)
			}
		}
	}
}

// sample measures a sandbox from the host: its VMM process, its disk
// files, its link. What cannot be read stays zero.
func (e *Engine) sample(ctx context.Context, vm hypervisor.Machine, rec *store.Sandbox) *store.MetricSample {
	m := &store.MetricSample{SandboxID: rec.ID, AccountID: rec.AccountID, Time: e.opts.Now().UTC()}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if info, err := vm.Info(ictx); err == nil && info.PID > 0 {
		m.CPUSeconds, m.MemoryBytes = processUse(info.PID)
	}
	m.DiskBytes = diskUse(rec.StateDir)
	if nm, ok := e.net.(network.Meter); ok {
		m.NetSentBytes, m.NetReceivedBytes, _ = nm.Traffic(rec.ID)
	}
	return m
}

// processUse reads a process's CPU time (user and system) and resident
// memory from /proc.
func processUse(pid int) (cpuSeconds float64, rssBytes int64) {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		// The command name (field 2) may hold spaces: count from its end.
		if i := strings.LastIndexByte(string(b), ')'); i > 0 {
			f := strings.Fields(string(b[i+1:]))
			// utime and stime are fields 14 and 15, 12 and 13 after ")".
			if len(f) > 12 {
				u, _ := strconv.ParseUint(f[11], 10, 64)
				s, _ := strconv.ParseUint(f[12], 10, 64)
				cpuSeconds = float64(u+s) / userHZ
			}
		}
	}
	if f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				rssBytes = kb << 10
				break
			}
		}
	}
	return cpuSeconds, rssBytes
}

// diskUse is what the files in a machine's directory take on the host's
// disk (allocated blocks: a sparse overlay counts what it holds).
func diskUse(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// MetricsQuery selects a sandbox's samples.
type MetricsQuery struct {
	// From (at or after) and To (before) bound the samples' times.
	From, To time.Time
	// Limit bounds the answer (default 1000, at most 10000).
	Limit int
}

// Metrics returns a sandbox's monitoring samples, oldest first, kept as
// its account's history retention says (none for a sandbox created with
// monitoring off).
func (e *Engine) Metrics(ctx context.Context, id string, q MetricsQuery) (_ []*store.MetricSample, err error) {
	if err := e.check(ctx, "getSandboxMetrics", id); err != nil {
		return nil, err
	}
	if _, err := e.record(ctx, id); err != nil {
		return nil, err
	}
	if q.Limit == 0 {
		q.Limit = 1000
	}
	if q.Limit < 0 || q.Limit > 10000 {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "limit", "must be 1 to 10000")
	}
	l, err := e.store.ListMetrics(ctx, id, q.From, q.To, q.Limit)
	if l == nil {
		l = []*store.MetricSample{}
	}
	return l, err
}

// Stats is the engine at a glance, for the server's /metrics.
type Stats struct {
	// Sandboxes counts the live sandboxes by state; Busy those in a
	// lifecycle call just then (their state is changing).
	Sandboxes map[sandbox.State]int
	Busy      int
	// Reserved is what admitted sandboxes hold; Limit what admission
	// allows on this host.
	Reserved, Limit sandbox.Resources
	// Pool is how many idle pool members are ready (their host capacity
	// is in Reserved).
	Pool int
	// Creates sums the creates since the engine started, by how they were
	// served (boot, snapshot, pool).
	Creates map[string]CreateStats
}

// Stats returns the engine's counts now (the operator's, or a key's that
// names getServerMetrics or metrics:read explicitly: they are the host's,
// across accounts).
func (e *Engine) Stats(ctx context.Context) (Stats, error) {
	if err := mayReadServerMetrics(authz.From(ctx)); err != nil {
		return Stats{}, err
	}
	st := Stats{Sandboxes: map[sandbox.State]int{}}
	e.mu.Lock()
	boxes := make([]*box, 0, len(e.boxes))
	for _, b := range e.boxes {
		boxes = append(boxes, b)
	}
	st.Reserved, st.Limit = e.used, e.limit
	st.Sandboxes[sandbox.StateCreating] = len(e.creating)
	for _, r := range e.kept {
		st.Sandboxes[r.State]++ // stopped or hibernated
	}
	for _, l := range e.pool {
		st.Pool += len(l)
	}
	e.mu.Unlock()
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

// MayReadServerMetrics says whether the principal in ctx may read the
// server's metrics (what Stats checks), without counting anything.
func (e *Engine) MayReadServerMetrics(ctx context.Context) error {
	return mayReadServerMetrics(authz.From(ctx))
}

// mayReadServerMetrics: host-wide numbers are for the operator, and for a
// key whose scope names them (not one that may do "everything" in its
// own account).
func mayReadServerMetrics(p authz.Principal) error {
	if p.Operator {
		return nil
	}
	if err := authz.Allowed(p, "getServerMetrics"); err != nil {
		return err
	}
	if !slices.Contains(p.Scope.Actions, "getServerMetrics") && !slices.Contains(p.Scope.Actions, "metrics:read") {
		return sandbox.Errorf(sandbox.ErrForbidden, "", "the server's metrics are the host's, across accounts: a key needs getServerMetrics (or metrics:read) named in its actions")
	}
	return nil
}

// purgeRetention applies every account's retention now: its command
// history, and its monitoring samples, kept as long as history.
func (e *Engine) purgeRetention(ctx context.Context) {
	if accs, err := e.store.ListAccounts(ctx); err == nil {
		now := e.opts.Now()
		for _, a := range accs {
			if d := a.Retention.HistoryDays; d != nil {
				if err := e.store.PurgeMetrics(ctx, a.ID, now.Add(-time.Duration(*d)*24*time.Hour)); err != nil {
					e.log.Warn("monitoring: cannot purge samples", "account", a.ID, "err", err)
				}
			}
		}
	}
	e.history.Purge(ctx)
}
