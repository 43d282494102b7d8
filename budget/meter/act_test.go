package meter

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/internal/testdomains"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// pausing is two running sandboxes whose pauses wait for release.
type pausing struct {
	account string
	entered chan struct{} // a pause began
	release chan struct{}

	mu     sync.Mutex
	paused map[string]int
}

func (p *pausing) Locked(func(*store.Sandbox))                {}
func (p *pausing) Unboxed() (creating, kept []*store.Sandbox) { return nil, nil }
func (p *pausing) Here(string) bool                           { return true }
func (p *pausing) Elsewhere(*store.Sandbox) bool              { return false }
func (p *pausing) CanStop() bool                              { return true }
func (p *pausing) Stop(context.Context, string) error         { return nil }
func (p *pausing) Delete(context.Context, string) error       { return nil }
func (p *pausing) Matching(match func(*store.Sandbox) bool) []Live {
	var out []Live
	for _, id := range []string{"sbx-a", "sbx-b"} {
		if !match(&store.Sandbox{Sandbox: sandbox.Sandbox{ID: id, AccountID: p.account}}) {
			continue
		}
		p.mu.Lock()
		st := sandbox.StateRunning
		if p.paused[id] > 0 {
			st = sandbox.StatePaused
		}
		p.mu.Unlock()
		out = append(out, Live{ID: id, State: st})
	}
	return out
}

func (p *pausing) Pause(_ context.Context, id string) error {
	select {
	case p.entered <- struct{}{}:
	default:
	}
	<-p.release
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused[id]++; p.paused[id] > 1 {
		return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is paused", id)
	}
	return nil
}

// TestActsOnceAtATime: the loop's round of actions (on a wake) and a
// Settle's can start together. One does a reached budget's action on
// each sandbox and records it; the other waits, then finds nothing left
// to do, so that what a Settle returned after is all in the audit log.
func TestActsOnceAtATime(t *testing.T) {
	p := testdomains.New(t)
	ctx := context.Background()
	budgets := budget.New(p.Store, p.Tenants, budget.Prices{}, time.Now)
	budgets.Audit = p.Audit
	now := time.Now().UTC()
	b := &store.Budget{ID: "bud-1", AccountID: p.Account.ID, Name: "all", Scope: store.BudgetScope{Kind: budget.ScopeAccount},
		Period: budget.Total, Limit: 1, Action: budget.Pause, CreatedAt: now, PeriodStart: now, ReachedAt: &now}
	if err := p.Store.Update(ctx, func(tx store.Tx) error { return tx.PutBudget(ctx, b) }); err != nil {
		t.Fatal(err)
	}
	sb := &pausing{account: p.Account.ID, entered: make(chan struct{}, 1), release: make(chan struct{}), paused: map[string]int{}}
	m := New(Options{Budgets: budgets, Store: p.Store, Sandboxes: sb, Interval: time.Hour, Now: time.Now, Log: slog.Default()})

	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); m.Settle(ctx) }()
	}
	<-sb.entered
	time.Sleep(100 * time.Millisecond) // (time for a second round to start pausing too)
	close(sb.release)
	wg.Wait()
	for _, id := range []string{"sbx-a", "sbx-b"} {
		if n := sb.paused[id]; n != 1 {
			t.Errorf("%s: paused %d times", id, n)
		}
	}
	l, err := p.Audit.List(ctx, store.AuditFilter{Action: "budgetPause", Principal: "budget:" + b.ID})
	if err != nil || len(l) != 2 {
		t.Errorf("audit budgetPause: %d entries, want 2 (%v)", len(l), err)
	}
}
