// Package monitor is sandbox monitoring: samples of every sandbox created
// with monitoring on (CPU, memory, disk, network, measured from the host
// side), the queries on them, their retention (an account's history
// retention), and who may read the server's own metrics.
package monitor

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Store is what monitoring needs of the store: the samples, and the
// accounts' retention.
type Store interface {
	PutMetrics(ctx context.Context, m *store.MetricSample) error
	ListMetrics(ctx context.Context, sandboxID string, from, to time.Time, limit int) ([]*store.MetricSample, error)
	PurgeMetrics(ctx context.Context, accountID string, before time.Time) error
	ListAccounts(ctx context.Context) ([]*store.Account, error)
}

// Sandboxes is what monitoring needs of the sandboxes (the engine).
type Sandboxes interface {
	// Check authorizes action on sandbox id for the principal in ctx. A
	// sandbox the principal may not see is ErrNotFound, exactly like a
	// missing one.
	Check(ctx context.Context, action, id string) error
	// Sandbox returns sandbox id's stored record (ErrNotFound: none).
	Sandbox(ctx context.Context, id string) (*sandbox.Sandbox, error)
	// Monitored calls fn with each live sandbox created with monitoring on
	// that is running or paused, and its machine, one at a time and
	// outside the sandbox's lock (a slow measure holds up no lifecycle
	// call); one busy in a lifecycle call is left to the next round.
	Monitored(ctx context.Context, fn func(vm hypervisor.Machine, rec *store.Sandbox))
}

// Options are a Service's parts.
type Options struct {
	Store     Store
	Sandboxes Sandboxes
	// Meter counts each sandbox's traffic; nil: none is measured.
	Meter network.Meter
	Now   func() time.Time
	Log   *slog.Logger
}

// Service samples and keeps the sandboxes' metrics. It is safe for
// concurrent use.
type Service struct{ o Options }

// New returns a Service over o.
func New(o Options) *Service { return &Service{o: o} }

// Run samples every monitored sandbox each interval until ctx is done.
func (s *Service) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Sample(ctx)
		}
	}
}

// Sample takes one sample of every live sandbox created with monitoring
// on; Run calls it every interval.
func (s *Service) Sample(ctx context.Context) {
	s.o.Sandboxes.Monitored(ctx, func(vm hypervisor.Machine, rec *store.Sandbox) {
		m := s.sample(ctx, vm, rec)
		if err := s.o.Store.PutMetrics(ctx, m); err != nil {
			s.o.Log.Warn("monitoring: cannot store a sample", "id", m.SandboxID, "err", err)
		}
	})
}

// sample measures a sandbox from the host: its VMM process, its disk
// files, its link. What cannot be read stays zero.
func (s *Service) sample(ctx context.Context, vm hypervisor.Machine, rec *store.Sandbox) *store.MetricSample {
	m := &store.MetricSample{SandboxID: rec.ID, AccountID: rec.AccountID, Time: s.o.Now().UTC()}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if info, err := vm.Info(ictx); err == nil && info.PID > 0 {
		m.CPUSeconds, m.MemoryBytes = processUse(info.PID)
	}
	m.DiskBytes = DiskUse(rec.StateDir)
	if s.o.Meter != nil {
		m.NetSentBytes, m.NetReceivedBytes, _ = s.o.Meter.Traffic(rec.ID)
	}
	return m
}

// processUse reads a process's CPU time (user and system) and resident
// memory from /proc.
func processUse(pid int) (cpuSeconds float64, rssBytes int64) {
	if st, err := procs.ReadStat(pid); err == nil {
		cpuSeconds = st.CPU.Seconds()
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

// DiskUse is what the files in a machine's directory take on the host's
// disk (allocated blocks: a sparse overlay counts what it holds).
func DiskUse(dir string) int64 {
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

// Query selects a sandbox's samples.
type Query struct {
	// From (at or after) and To (before) bound the samples' times.
	From, To time.Time
	// Limit bounds the answer (default 1000, at most 10000).
	Limit int
}

// Metrics returns a sandbox's samples, oldest first, kept as its
// account's history retention says (none for a sandbox created with
// monitoring off), for the principal in ctx.
func (s *Service) Metrics(ctx context.Context, id string, q Query) ([]*store.MetricSample, error) {
	if err := s.o.Sandboxes.Check(ctx, "getSandboxMetrics", id); err != nil {
		return nil, err
	}
	if _, err := s.o.Sandboxes.Sandbox(ctx, id); err != nil {
		return nil, err
	}
	if q.Limit == 0 {
		q.Limit = 1000
	}
	if q.Limit < 0 || q.Limit > 10000 {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "limit", "must be 1 to 10000")
	}
	l, err := s.o.Store.ListMetrics(ctx, id, q.From, q.To, q.Limit)
	if l == nil {
		l = []*store.MetricSample{}
	}
	return l, err
}

// Purge applies every account's retention to its samples now: they are
// kept as long as its command history.
func (s *Service) Purge(ctx context.Context) {
	accs, err := s.o.Store.ListAccounts(ctx)
	if err != nil {
		return
	}
	now := s.o.Now()
	for _, a := range accs {
		if d := a.Retention.HistoryDays; d != nil {
			if err := s.o.Store.PurgeMetrics(ctx, a.ID, now.Add(-time.Duration(*d)*24*time.Hour)); err != nil {
				s.o.Log.Warn("monitoring: cannot purge samples", "account", a.ID, "err", err)
			}
		}
	}
}

// MayReadServer says whether p may read the server's metrics: host-wide
// numbers, across accounts, are for the operator, and for a key whose
// scope names them (getServerMetrics or metrics:read), not one that may
// do "everything" in its own account.
func MayReadServer(p authz.Principal) error {
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

// Stats is the engine at a glance (its runtime's counts), for the server's /metrics.
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

// CreateStats sums the creates served one way: how many, and how long
// they and each of their steps took, in seconds.
type CreateStats struct {
	Count   int
	Seconds float64
	Phases  map[string]float64
}

// Activity says what m's VMM has done since it started, for an error
// about a guest that does not answer: whether it still runs, and the CPU
// time it used (a guest that spins uses a core, one hung idle next to
// nothing). A backend that names no process: its state only.
func Activity(ctx context.Context, m hypervisor.Machine) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	info, err := m.Info(ctx)
	if err != nil {
		return fmt.Sprintf("the VMM does not answer: %v", err)
	}
	if info.PID <= 0 || info.Started.IsZero() {
		return fmt.Sprintf("the VMM is %s", info.State)
	}
	cpu, _ := processUse(info.PID)
	return fmt.Sprintf("the VMM is %s and used %.1f CPU-s in the %.0f s since it started", info.State, cpu, time.Since(info.Started).Seconds())
}
