package harebox_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/budget/money"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Stop keeps a sandbox's disk, key and record and gives its capacity
// back; Start boots it on that disk, across an engine restart too. A
// sandbox that stopped on its own cannot start; a stopped one deletes.
func TestStopStart(t *testing.T) {
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	opts.Capacity = harebox.Capacity{VCPUs: 2, MemoryMB: 4096, DiskGB: 100}
	opts.HealthInterval = -1
	ctx := context.Background()
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { eng.Close() }()
	two := sandbox.Size{VCPUs: 2, MemoryMB: 512, DiskGB: 1}
	box, err := eng.Create(ctx, sandbox.CreateRequest{Name: "kept", Size: two})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.WriteFile(ctx, box.ID, "/home/user/keep", strings.NewReader("kept"), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Start(ctx, box.ID); !errors.Is(err, sandbox.ErrState) {
		t.Fatalf("start a running sandbox: %v", err)
	}
	s, err := eng.Stop(ctx, box.ID)
	if err != nil || s.State != sandbox.StateStopped {
		t.Fatalf("stop: %+v %v", s, err)
	}
	if _, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "true"}); !errors.Is(err, sandbox.ErrState) {
		t.Fatalf("exec in a stopped sandbox: %v", err)
	}
	if _, err := eng.Stop(ctx, box.ID); !errors.Is(err, sandbox.ErrState) {
		t.Fatalf("stop a stopped sandbox: %v", err)
	}
	// It keeps its name while stopped.
	if _, err := eng.Create(ctx, sandbox.CreateRequest{Name: "kept", Size: sandbox.Size{VCPUs: 1, MemoryMB: 256, DiskGB: 1}}); !errors.Is(err, sandbox.ErrExists) {
		t.Fatalf("a second sandbox named as a stopped one: %v", err)
	}
	// Its 2 vCPUs are free: another sandbox of that size fits, and then
	// the stopped one does not start until it goes.
	other, err := eng.Create(ctx, sandbox.CreateRequest{Size: two})
	if err != nil {
		t.Fatal("create beside a stopped sandbox:", err)
	}
	if _, err := eng.Start(ctx, box.ID); !errors.Is(err, sandbox.ErrCapacity) {
		t.Fatalf("start on a full host: %v", err)
	}
	if err := eng.Delete(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	// A restarted engine keeps it stopped, and startable.
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	if eng, err = harebox.New(ctx, opts); err != nil {
		t.Fatal(err)
	}
	if got, _ := eng.Get(ctx, box.ID); got.State != sandbox.StateStopped {
		t.Fatalf("after a restart: %s", got.State)
	}
	s, err = eng.Start(ctx, box.ID)
	if err != nil || s.State != sandbox.StateRunning {
		t.Fatalf("start: %+v %v", s, err)
	}
	var buf bytes.Buffer
	if _, err := eng.ReadFile(ctx, box.ID, "/home/user/keep", &buf); err != nil || buf.String() != "kept" {
		t.Fatalf("the file after stop and start: %q %v", buf.String(), err)
	}
	if r, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "echo back"}); err != nil || r.Stdout != "back\n" {
		t.Fatalf("exec after start: %+v %v", r, err)
	}
	// Stopped on its own (the VM went away): its disk went with it.
	m, _ := hv.Machine(box.ID)
	m.Kill(ctx)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got, _ := eng.Get(ctx, box.ID); got.State == sandbox.StateStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the killed VM was not noticed")
		}
	}
	if _, err := eng.Start(ctx, box.ID); !errors.Is(err, sandbox.ErrState) || !strings.Contains(err.Error(), "disk is gone") {
		t.Fatalf("start a sandbox that stopped on its own: %v", err)
	}
	// A stopped sandbox deletes, files and key with it.
	kept, err := eng.Create(ctx, sandbox.CreateRequest{Size: two})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Stop(ctx, kept.ID); err != nil {
		t.Fatal(err)
	}
	if err := eng.Delete(ctx, kept.ID); err != nil {
		t.Fatal("delete a stopped sandbox:", err)
	}
	if _, err := os.Stat(filepath.Join(opts.DataDir, "m", kept.ID)); !os.IsNotExist(err) {
		t.Fatalf("the stopped sandbox's files after delete: %v", err)
	}
}

// A budget that stops: the sandboxes in scope stop (and cost nothing
// more), and Start is refused like a create.
func TestBudgetStop(t *testing.T) {
	eng, clk, _ := budgetEngine(t)
	ctx := context.Background()
	b := newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeAccount}, Limit: 3 * dollar / 2, Action: budget.Stop})
	s, err := eng.Create(ctx, sandbox.CreateRequest{Size: oneVCPU})
	if err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Hour)
	if err := eng.Meter().Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if st := state(t, eng, s.ID); st != sandbox.StateStopped {
		t.Fatalf("under a reached stop budget the sandbox is %s", st)
	}
	clk.advance(time.Hour)
	eng.Meter().Settle(ctx)
	if got, _ := eng.Budgets().Get(ctx, b.ID); got.Spent != dollar || got.Reserved != 0 {
		t.Fatalf("spent %s reserved %s: a stopped sandbox costs nothing", got.Spent, got.Reserved)
	}
	if _, err := eng.Start(ctx, s.ID); !errors.Is(err, sandbox.ErrBudget) {
		t.Fatalf("start under the reached budget: %v", err)
	}
	if st := state(t, eng, s.ID); st != sandbox.StateStopped {
		t.Fatalf("after a refused start: %s", st)
	}
	if err := eng.Budgets().Delete(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Start(ctx, s.ID); err != nil {
		t.Fatal("start once the budget is gone:", err)
	}
}

// A stopped sandbox's disk is charged (its vCPUs and memory are not),
// across an engine restart too, until it is deleted.
func TestStoppedDiskCharged(t *testing.T) {
	eng, clk, opts := budgetEngine(t, budget.Prices{VCPUHour: dollar, DiskGBHour: 1000})
	ctx := context.Background()
	b := newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeAccount}, Limit: 1000 * dollar, Action: budget.Notify})
	s, err := eng.Create(ctx, sandbox.CreateRequest{Size: sandbox.Size{VCPUs: 1, MemoryMB: 256, DiskGB: 10}})
	if err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Hour) // 1 vCPU-hour and 10 GB-hours: $1.01
	if _, err := eng.Stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	spentAt := func() money.USD {
		got, _ := eng.Budgets().Get(ctx, b.ID)
		return got.Spent
	}
	if got := spentAt(); got != dollar+10_000 {
		t.Fatalf("spent %s when stopped, want 1.01", got)
	}
	// Disk is $0.001 per GB-hour here: 10 GB for 2 hours is $0.02.
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Hour)
	if eng, err = harebox.New(ctx, opts); err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	clk.advance(time.Hour)
	eng.Meter().Settle(ctx)
	if got := spentAt(); got != dollar+30_000 {
		t.Fatalf("spent %s after 2 h stopped, want 1.03", got)
	}
	if err := eng.Delete(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Hour)
	eng.Meter().Settle(ctx)
	if got, _ := eng.Budgets().Get(ctx, b.ID); got.Spent != dollar+30_000 || got.Reserved != 0 {
		t.Fatalf("after delete: spent %s reserved %s", got.Spent, got.Reserved)
	}
}

// Start and Delete of a stopped sandbox at once: whichever comes first,
// the sandbox ends deleted and nothing of it is metered or kept.
func TestStartDeleteRace(t *testing.T) {
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	opts.HealthInterval = -1
	ctx := context.Background()
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	for round := range 20 {
		s, err := eng.Create(ctx, sandbox.CreateRequest{Size: sandbox.Size{VCPUs: 1, MemoryMB: 256, DiskGB: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := eng.Stop(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := eng.Start(ctx, s.ID); done <- err }()
		if err := eng.Delete(ctx, s.ID); err != nil {
			t.Fatalf("round %d: delete: %v", round, err)
		}
		if err := <-done; err != nil && !errors.Is(err, sandbox.ErrState) {
			t.Fatalf("round %d: start: %v", round, err)
		}
		if got, _ := eng.Get(ctx, s.ID); got.State != sandbox.StateDeleted {
			t.Fatalf("round %d: after start and delete at once the sandbox is %s", round, got.State)
		}
		if _, err := os.Stat(filepath.Join(opts.DataDir, "m", s.ID)); !os.IsNotExist(err) {
			t.Fatalf("round %d: its files: %v", round, err)
		}
	}
	if st, err := eng.Stats(ctx); err != nil || st.Sandboxes[sandbox.StateStopped] != 0 {
		t.Fatalf("stopped sandboxes left: %+v %v", st, err)
	}
}
