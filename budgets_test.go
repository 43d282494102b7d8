package harebox_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/apikey"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/budget/money"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
)

// clock is a controllable time for metering.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

const dollar = money.USD(1_000_000)

// budgetEngine is an engine on the fake hypervisor where a vCPU costs $1
// an hour and nothing else costs anything (or prices, if given), metered
// only when the test says, with reservations of one hour.
func budgetEngine(t *testing.T, prices ...budget.Prices) (*harebox.Engine, *clock, harebox.Options) {
	t.Helper()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	opts.Capacity = harebox.Capacity{VCPUs: 256, MemoryMB: 256 << 10, DiskGB: 10000}
	clk := &clock{now: time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC)}
	opts.Now = clk.Now
	opts.Prices = &budget.Prices{VCPUHour: dollar}
	if len(prices) > 0 {
		opts.Prices = &prices[0]
	}
	opts.MeterInterval = time.Hour
	opts.HealthInterval = -1
	eng, err := harebox.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng, clk, opts
}

var oneVCPU = sandbox.Size{VCPUs: 1, MemoryMB: 256, DiskGB: 1}

func newBudget(t *testing.T, eng *harebox.Engine, ctx context.Context, r budget.CreateRequest) *store.Budget {
	t.Helper()
	if r.Period == "" {
		r.Period = budget.Total
	}
	b, err := eng.Budgets().Create(ctx, "", r)
	if err != nil {
		t.Fatal("create budget:", err)
	}
	return b
}

func state(t *testing.T, eng *harebox.Engine, id string) sandbox.State {
	t.Helper()
	s, err := eng.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return s.State
}

// Many creates at once against a budget that fits three admit three:
// the reservations are made in the transaction that admits each.
func TestBudgetConcurrentCreates(t *testing.T) {
	for round := range 8 {
		t.Run(fmt.Sprint(round), concurrentCreates)
	}
}

func concurrentCreates(t *testing.T) {
	eng, _, _ := budgetEngine(t)
	ctx := context.Background()
	b := newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeAccount}, Limit: 3 * dollar, Action: budget.DenyNew})
	const n = 24
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = eng.Create(ctx, sandbox.CreateRequest{Size: oneVCPU})
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, sandbox.ErrBudget):
			t.Errorf("a refused create: %v, want ErrBudget", err)
		}
	}
	if ok != 3 {
		t.Fatalf("%d of %d creates admitted against a budget for 3", ok, n)
	}
	got, err := eng.Budgets().Get(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Reserved != 3*dollar || got.Spent != 0 {
		t.Fatalf("budget after the creates: spent %s reserved %s, want 0 and 3.00", got.Spent, got.Reserved)
	}
	t.Logf("refused: %v", errs[slicesIndexFunc(errs, func(e error) bool { return e != nil })])
}

func slicesIndexFunc(errs []error, f func(error) bool) int {
	for i, e := range errs {
		if f(e) {
			return i
		}
	}
	return -1
}

// A label budget that pauses: when its spend and the next interval of
// what it covers pass the limit, exactly the labelled sandboxes pause;
// they cannot resume, no new labelled sandbox is admitted, others are.
func TestBudgetLabelPause(t *testing.T) {
	eng, clk, _ := budgetEngine(t)
	ctx := context.Background()
	b := newBudget(t, eng, ctx, budget.CreateRequest{Name: "team-a", Scope: store.BudgetScope{Kind: budget.ScopeLabel, Labels: map[string]string{"team": "a"}},
		Limit: 3*dollar + dollar/2, Action: budget.Pause, WarnAt: []int{50}})
	mk := func(team string) string {
		s, err := eng.Create(ctx, sandbox.CreateRequest{Size: oneVCPU, Labels: map[string]string{"team": team}})
		if err != nil {
			t.Fatal(err)
		}
		return s.ID
	}
	a1, a2, other := mk("a"), mk("a"), mk("b")
	clk.advance(30 * time.Minute)
	if err := eng.Meter().Settle(ctx); err != nil {
		t.Fatal(err)
	}
	// $1 spent, $2 reserved: fits.
	for _, id := range []string{a1, a2, other} {
		if s := state(t, eng, id); s != sandbox.StateRunning {
			t.Fatalf("%s is %s before the limit", id, s)
		}
	}
	clk.advance(30 * time.Minute)
	if err := eng.Meter().Settle(ctx); err != nil {
		t.Fatal(err)
	}
	// $2 spent and $2 more reserved pass $3.50: the labelled ones pause.
	for id, want := range map[string]sandbox.State{a1: sandbox.StatePaused, a2: sandbox.StatePaused, other: sandbox.StateRunning} {
		if s := state(t, eng, id); s != want {
			t.Errorf("%s is %s, want %s", id, s, want)
		}
	}
	got, _ := eng.Budgets().Get(ctx, b.ID)
	if got.Spent != 2*dollar || got.ReachedAt == nil || got.Pending {
		t.Errorf("budget: spent %s reached %v pending %v", got.Spent, got.ReachedAt, got.Pending)
	}
	if _, err := eng.Resume(ctx, a1); !errors.Is(err, sandbox.ErrBudget) {
		t.Errorf("resume over the budget: %v", err)
	}
	if _, err := eng.Create(ctx, sandbox.CreateRequest{Size: oneVCPU, Labels: map[string]string{"team": "a"}}); !errors.Is(err, sandbox.ErrBudget) {
		t.Errorf("create in scope over the budget: %v", err)
	}
	if _, err := eng.Create(ctx, sandbox.CreateRequest{Size: oneVCPU, Labels: map[string]string{"team": "b"}}); err != nil {
		t.Errorf("create out of scope: %v", err)
	}
	// Paused, they cost nothing here: the spend stays.
	clk.advance(time.Hour)
	eng.Meter().Settle(ctx)
	if got, _ := eng.Budgets().Get(ctx, b.ID); got.Spent != 2*dollar {
		t.Errorf("spent while paused: %s", got.Spent)
	}
	// The audit log has the warning, the event and each pause, by the budget.
	for action, n := range map[string]int{"budgetWarning": 1, "budgetReached": 1, "budgetPause": 2} {
		l, err := eng.Audit().List(ctx, store.AuditFilter{Action: action, Principal: "budget:" + b.ID})
		if err != nil || len(l) != n {
			t.Errorf("audit %s: %d entries, want %d (%v)", action, len(l), n, err)
		}
	}
	// Usage by label adds up to the spend.
	groups, err := eng.Budgets().Usage(ctx, budget.UsageQuery{GroupBy: "label:team"})
	if err != nil {
		t.Fatal(err)
	}
	costs := map[string]money.USD{}
	for _, g := range groups {
		costs[g.Group] = g.Cost
	}
	if costs["a"] != 2*dollar || costs["b"] != 3*dollar {
		t.Errorf("usage by team: %+v", groups)
	}
}

// Usage names its groups: a project's, a sandbox's name, a key's
// description (for a caller that may read keys: another key sees the ID
// alone), and none for a label's value.
func TestUsageNames(t *testing.T) {
	eng, clk, _ := budgetEngine(t)
	ctx := context.Background()
	proj, err := eng.Tenants().CreateProject(ctx, "", tenant.CreateRequest{Name: "web"})
	if err != nil {
		t.Fatal(err)
	}
	k, err := eng.Keys().Create(ctx, apikey.CreateRequest{Description: "ci runner"})
	if err != nil {
		t.Fatal(err)
	}
	kctx := authz.WithPrincipal(ctx, authz.Principal{AccountID: k.AccountID, KeyID: k.ID, Scope: k.Scope})
	box, err := eng.Create(kctx, sandbox.CreateRequest{Size: oneVCPU, Name: "builder", Project: "web", Labels: map[string]string{"team": "red"}})
	if err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Hour)
	if err := eng.Meter().Settle(ctx); err != nil {
		t.Fatal(err)
	}
	names := func(ctx context.Context, by string) map[string]string {
		t.Helper()
		groups, err := eng.Budgets().Usage(ctx, budget.UsageQuery{GroupBy: by})
		if err != nil || len(groups) != 1 {
			t.Fatalf("usage by %s: %+v %v", by, groups, err)
		}
		return map[string]string{groups[0].Group: groups[0].Name}
	}
	for by, want := range map[string]map[string]string{
		"project":    {proj.ID: "web"},
		"sandbox":    {box.ID: "builder"},
		"key":        {k.ID: "ci runner"},
		"label:team": {"red": ""},
	} {
		if got := names(ctx, by); !maps.Equal(got, want) {
			t.Errorf("usage by %s: %v, want %v", by, got, want)
		}
	}
	// A key that may read usage but not keys: the key's ID alone.
	reader, err := eng.Keys().Create(ctx, apikey.CreateRequest{Scope: authz.Scope{Actions: []string{"getUsage"}}})
	if err != nil {
		t.Fatal(err)
	}
	rctx := authz.WithPrincipal(ctx, authz.Principal{AccountID: reader.AccountID, KeyID: reader.ID, Scope: reader.Scope})
	if got := names(rctx, "key"); !maps.Equal(got, map[string]string{k.ID: ""}) {
		t.Errorf("usage by key, for a key that may not read keys: %v", got)
	}
}

// A key's budget refuses that key's creates, not another key's.
func TestBudgetKeyScope(t *testing.T) {
	eng, _, _ := budgetEngine(t)
	ctx := context.Background()
	mkKey := func() context.Context {
		k, err := eng.Keys().Create(ctx, apikey.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return authz.WithPrincipal(ctx, authz.Principal{AccountID: k.AccountID, KeyID: k.ID, Scope: k.Scope})
	}
	k1, k2 := mkKey(), mkKey()
	newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeKey, Ref: authz.From(k1).KeyID}, Limit: dollar, Action: budget.DenyNew})
	if _, err := eng.Create(k1, sandbox.CreateRequest{Size: oneVCPU}); err != nil {
		t.Fatal("first create with the budgeted key:", err)
	}
	if _, err := eng.Create(k1, sandbox.CreateRequest{Size: oneVCPU}); !errors.Is(err, sandbox.ErrBudget) {
		t.Fatalf("second create with the budgeted key: %v", err)
	}
	for range 3 {
		if _, err := eng.Create(k2, sandbox.CreateRequest{Size: oneVCPU}); err != nil {
			t.Fatal("create with the other key:", err)
		}
	}

	// A key's own budget_usd is a budget on it and the keys it makes.
	two := 2 * dollar
	parent, err := eng.Keys().Create(ctx, apikey.CreateRequest{Scope: authz.Scope{Budget: &two}})
	if err != nil {
		t.Fatal(err)
	}
	pctx := authz.WithPrincipal(ctx, authz.Principal{AccountID: parent.AccountID, KeyID: parent.ID, Scope: parent.Scope})
	child, err := eng.Keys().Create(pctx, apikey.CreateRequest{Scope: authz.Scope{Budget: &two}})
	if err != nil {
		t.Fatal(err)
	}
	cctx := authz.WithPrincipal(ctx, authz.Principal{AccountID: child.AccountID, KeyID: child.ID, Scope: child.Scope})
	for range 2 {
		if _, err := eng.Create(cctx, sandbox.CreateRequest{Size: oneVCPU}); err != nil {
			t.Fatal("create with the child key:", err)
		}
	}
	if _, err := eng.Create(pctx, sandbox.CreateRequest{Size: oneVCPU}); !errors.Is(err, sandbox.ErrBudget) {
		t.Fatalf("create with the parent key once its child spent its budget_usd: %v", err)
	}
	l, err := eng.Budgets().List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range l {
		if b.FromKey {
			if err := eng.Budgets().Delete(ctx, b.ID); !errors.Is(err, sandbox.ErrInvalid) {
				t.Errorf("deleting a key's budget: %v", err)
			}
		}
	}
}

// A budget reached while the engine was down is acted on at start: the
// VMs kept running, the next engine charges that time.
func TestBudgetRestartAtLimit(t *testing.T) {
	eng, clk, opts := budgetEngine(t)
	ctx := context.Background()
	b := newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeAccount}, Limit: 3 * dollar / 2, Action: budget.Delete})
	s, err := eng.Create(ctx, sandbox.CreateRequest{Size: oneVCPU})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	clk.advance(2 * time.Hour)
	eng, err = harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	if st := state(t, eng, s.ID); st != sandbox.StateDeleted {
		t.Fatalf("after a restart past the limit the sandbox is %s", st)
	}
	got, _ := eng.Budgets().Get(ctx, b.ID)
	if got.Spent != 2*dollar || got.Pending || got.Reserved != 0 {
		t.Fatalf("budget: spent %s reserved %s pending %v", got.Spent, got.Reserved, got.Pending)
	}
	if l, _ := eng.Audit().List(ctx, store.AuditFilter{Action: "budgetDelete", Target: s.ID}); len(l) != 1 {
		t.Fatalf("audit of the budget's delete: %d entries", len(l))
	}
}

// Whatever creates, pauses, resumes, deletes and clock steps of at most
// one interval happen, the settled spend of a budget that pauses never
// passes its limit by more than one interval of what ran, and it equals
// the usage recorded for its scope.
func TestBudgetNeverOverspends(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			eng, clk, _ := budgetEngine(t)
			ctx := context.Background()
			r := rand.New(rand.NewPCG(seed, 7))
			limit := money.USD(3+r.IntN(10)) * dollar / 2
			b := newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeLabel, Labels: map[string]string{"team": "a"}}, Limit: limit, Action: budget.Pause})
			var ids []string
			running := func() money.USD { // one interval (an hour) of the labelled running set
				var sum money.USD
				for _, id := range ids {
					s, _ := eng.Get(ctx, id)
					if s.State == sandbox.StateRunning && s.Labels["team"] == "a" {
						sum += money.USD(s.Size.VCPUs) * dollar
					}
				}
				return sum
			}
			for step := range 60 {
				switch op := r.IntN(6); {
				case op <= 1:
					team := []string{"a", "b"}[r.IntN(2)]
					s, err := eng.Create(ctx, sandbox.CreateRequest{Size: sandbox.Size{VCPUs: 1 + r.IntN(3), MemoryMB: 256, DiskGB: 1}, Labels: map[string]string{"team": team}})
					if err == nil {
						ids = append(ids, s.ID)
					} else if !errors.Is(err, sandbox.ErrBudget) {
						t.Fatal(err)
					}
				case op == 2 && len(ids) > 0:
					eng.Pause(ctx, ids[r.IntN(len(ids))])
				case op == 3 && len(ids) > 0:
					if _, err := eng.Resume(ctx, ids[r.IntN(len(ids))]); err != nil && !errors.Is(err, sandbox.ErrBudget) && !errors.Is(err, sandbox.ErrState) && !errors.Is(err, sandbox.ErrNotFound) {
						t.Fatal(err)
					}
				case op == 4 && len(ids) > 0:
					eng.Delete(ctx, ids[r.IntN(len(ids))])
				default:
					slack := running()
					clk.advance(time.Duration(1+r.IntN(60)) * time.Minute)
					if err := eng.Meter().Settle(ctx); err != nil {
						t.Fatal(err)
					}
					got, _ := eng.Budgets().Get(ctx, b.ID)
					if got.Spent > limit+slack {
						t.Fatalf("step %d: spent %s of %s with %s running", step, got.Spent, limit, slack)
					}
				}
			}
			eng.Meter().Settle(ctx)
			got, _ := eng.Budgets().Get(ctx, b.ID)
			groups, err := eng.Budgets().Usage(ctx, budget.UsageQuery{GroupBy: "label:team"})
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range groups {
				if g.Group == "a" && g.Cost != got.Spent {
					t.Fatalf("usage of team a is %s, the budget's spend %s", g.Cost, got.Spent)
				}
			}
			t.Logf("limit %s spent %s reserved %s reached %v", limit, got.Spent, got.Reserved, got.ReachedAt != nil)
		})
	}
}

// Budgets are checked: bad requests say what is wrong, and a key limited
// to a project cannot set a budget on the whole account (its action would
// fall on sandboxes the key cannot see).
func TestBudgetRequests(t *testing.T) {
	eng, _, _ := budgetEngine(t)
	ctx := context.Background()
	bad := map[string]budget.CreateRequest{
		"limit_usd":    {Scope: store.BudgetScope{Kind: "account"}, Period: "total", Action: "notify"},
		"action":       {Scope: store.BudgetScope{Kind: "account"}, Period: "total", Action: "explode", Limit: dollar},
		"scope.labels": {Scope: store.BudgetScope{Kind: "label"}, Period: "total", Action: "pause", Limit: dollar},
		"scope.ref":    {Scope: store.BudgetScope{Kind: "project", Ref: "nope"}, Period: "total", Action: "pause", Limit: dollar},
		"period":       {Scope: store.BudgetScope{Kind: "account"}, Period: "weekly", Action: "pause", Limit: dollar},
	}
	for field, r := range bad {
		_, err := eng.Budgets().Create(ctx, "", r)
		if !errors.Is(err, sandbox.ErrInvalid) || sandbox.FieldOf(err) != field {
			t.Errorf("%s: %v (field %q)", field, err, sandbox.FieldOf(err))
		}
	}
	proj, err := eng.Tenants().CreateProject(ctx, "", tenant.CreateRequest{Name: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	k, err := eng.Keys().Create(ctx, apikey.CreateRequest{Scope: authz.Scope{Projects: []string{proj.ID}}})
	if err != nil {
		t.Fatal(err)
	}
	kctx := authz.WithPrincipal(ctx, authz.Principal{AccountID: k.AccountID, KeyID: k.ID, Scope: k.Scope})
	if _, err := eng.Budgets().Create(kctx, "", budget.CreateRequest{Scope: store.BudgetScope{Kind: "account"}, Period: "total", Action: "delete", Limit: dollar}); !errors.Is(err, sandbox.ErrForbidden) {
		t.Errorf("a project key's account budget: %v", err)
	}
	pb, err := eng.Budgets().Create(kctx, "", budget.CreateRequest{Scope: store.BudgetScope{Kind: "project", Ref: "p1"}, Period: "monthly", Action: "pause", Limit: dollar})
	if err != nil || pb.Scope.Ref != proj.ID {
		t.Fatalf("a project key's project budget: %+v %v", pb, err)
	}
	acct := newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: "account"}, Limit: dollar, Action: "notify"})
	// It may read the account's budget (which limits it too), not delete it.
	if _, err := eng.Budgets().Get(kctx, acct.ID); err != nil {
		t.Errorf("a project key reading the account budget: %v", err)
	}
	if err := eng.Budgets().Delete(kctx, acct.ID); !errors.Is(err, sandbox.ErrForbidden) {
		t.Errorf("a project key deleting the account budget: %v", err)
	}
	if err := eng.Budgets().Delete(ctx, acct.ID); err != nil {
		t.Errorf("the operator deleting it: %v", err)
	}
	// A key limited to labels neither sees nor deletes the budget of a key
	// it did not make (nor a project's), and may set one on itself.
	red, err := eng.Keys().Create(ctx, apikey.CreateRequest{Scope: authz.Scope{Labels: map[string]string{"team": "red"}}})
	if err != nil {
		t.Fatal(err)
	}
	rctx := authz.WithPrincipal(ctx, authz.Principal{AccountID: red.AccountID, KeyID: red.ID, Scope: red.Scope})
	stranger, err := eng.Keys().Create(ctx, apikey.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sb := newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: "key", Ref: stranger.ID}, Limit: dollar, Action: "pause"})
	if _, err := eng.Budgets().Get(rctx, sb.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a label key reading another key's budget: %v", err)
	}
	if err := eng.Budgets().Delete(rctx, sb.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a label key deleting another key's budget: %v", err)
	}
	if _, err := eng.Budgets().Get(rctx, pb.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a label key reading a project budget: %v", err)
	}
	if _, err := eng.Budgets().Create(rctx, "", budget.CreateRequest{Scope: store.BudgetScope{Kind: "key", Ref: red.ID}, Period: "total", Action: "pause", Limit: dollar}); err != nil {
		t.Errorf("a label key's budget on itself: %v", err)
	}
	if _, err := eng.Budgets().Create(rctx, "", budget.CreateRequest{Scope: store.BudgetScope{Kind: "label", Labels: map[string]string{"team": "blue"}}, Period: "total", Action: "pause", Limit: dollar}); !errors.Is(err, sandbox.ErrForbidden) {
		t.Errorf("a red key's budget on blue: %v", err)
	}
}

// BenchmarkBudgetAdmission: create (admission, placement, reservation)
// and delete on the fake hypervisor with 1,000 budgets in the account
// (one covers the sandbox; 999 label, project and fleet budgets do not),
// as a ratio to the same with no budgets, measured in the same run.
func BenchmarkBudgetAdmission(b *testing.B) {
	ctx := context.Background()
	open := func() *harebox.Engine {
		hv := memhv.New(memhv.Options{})
		b.Cleanup(func() { hv.Close() })
		opts := memhvOptions(b, hv)
		opts.HealthInterval = -1
		opts.MeterInterval = time.Hour
		eng, err := harebox.New(ctx, opts)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { eng.Close() })
		return eng
	}
	bare, budgeted := open(), open()
	mk := func(r budget.CreateRequest) {
		r.Period, r.Action = budget.Monthly, budget.Pause
		if r.Limit == 0 {
			r.Limit = 1000 * dollar
		}
		if _, err := budgeted.Budgets().Create(ctx, "", r); err != nil {
			b.Fatal(err)
		}
	}
	mk(budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeAccount}, Limit: money.MaxUSD})
	for i := range 333 {
		mk(budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeLabel, Labels: map[string]string{"team": fmt.Sprint("t", i)}}})
		p, err := budgeted.Tenants().CreateProject(ctx, "", tenant.CreateRequest{Name: fmt.Sprint("p", i)})
		if err != nil {
			b.Fatal(err)
		}
		mk(budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeProject, Ref: p.ID}})
		f, err := budgeted.Tenants().CreateFleet(ctx, "", p.ID, tenant.CreateRequest{Name: "f"})
		if err != nil {
			b.Fatal(err)
		}
		mk(budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeFleet, Ref: f.ID}})
	}
	cycle := func(eng *harebox.Engine) time.Duration {
		start := time.Now()
		s, err := eng.Create(ctx, sandbox.CreateRequest{Size: oneVCPU, Labels: map[string]string{"team": "mine"}})
		if err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		if err := eng.Delete(ctx, s.ID); err != nil {
			b.Fatal(err)
		}
		return d
	}
	cycle(bare)
	cycle(budgeted)
	var with, without time.Duration
	b.ResetTimer()
	for range b.N {
		without += cycle(bare)
		with += cycle(budgeted)
	}
	b.ReportMetric(float64(with.Microseconds())/float64(b.N), "budgets-us/op")
	b.ReportMetric(float64(without.Microseconds())/float64(b.N), "none-us/op")
	b.ReportMetric(float64(with)/float64(without), "budgets/none")
}

// Each action on each scope: a budget reached by one interval of the one
// sandbox it covers does what its action says to that sandbox, and only
// to it; creates in scope are refused unless it only notifies.
func TestBudgetEachActionEachScope(t *testing.T) {
	for _, kind := range []string{budget.ScopeAccount, budget.ScopeProject, budget.ScopeFleet, budget.ScopeLabel, budget.ScopeKey} {
		for _, action := range []string{budget.Notify, budget.DenyNew, budget.Pause, budget.Delete} {
			t.Run(kind+"/"+action, func(t *testing.T) {
				eng, clk, _ := budgetEngine(t)
				ctx := context.Background()
				// In scope: a sandbox of project "in", fleet "f", label
				// team=in, made by key k. Out of scope: the same in
				// another account (for the account scope) or project.
				acc, err := eng.Tenants().CreateAccount(ctx, tenant.CreateRequest{Name: "acme"})
				if err != nil {
					t.Fatal(err)
				}
				in, err := eng.Tenants().CreateProject(ctx, acc.ID, tenant.CreateRequest{Name: "in"})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := eng.Tenants().CreateProject(ctx, acc.ID, tenant.CreateRequest{Name: "out"}); err != nil {
					t.Fatal(err)
				}
				fl, err := eng.Tenants().CreateFleet(ctx, acc.ID, in.ID, tenant.CreateRequest{Name: "f"})
				if err != nil {
					t.Fatal(err)
				}
				k, err := eng.Keys().Create(ctx, apikey.CreateRequest{AccountID: acc.ID})
				if err != nil {
					t.Fatal(err)
				}
				kctx := authz.WithPrincipal(ctx, authz.Principal{AccountID: k.AccountID, KeyID: k.ID, Scope: k.Scope})
				scope := store.BudgetScope{Kind: kind}
				switch kind {
				case budget.ScopeProject:
					scope.Ref = "in"
				case budget.ScopeFleet:
					scope.Ref = fl.ID
				case budget.ScopeLabel:
					scope.Labels = map[string]string{"team": "in"}
				case budget.ScopeKey:
					scope.Ref = k.ID
				}
				bg, err := eng.Budgets().Create(ctx, acc.ID, budget.CreateRequest{Scope: scope, Period: budget.Monthly, Limit: dollar + dollar/2, Action: action})
				if err != nil {
					t.Fatal(err)
				}
				inReq := sandbox.CreateRequest{AccountID: acc.ID, Project: "in", Fleet: "f", Size: oneVCPU, Labels: map[string]string{"team": "in"}}
				mine, err := eng.Create(kctx, inReq)
				if err != nil {
					t.Fatal(err)
				}
				outReq := sandbox.CreateRequest{AccountID: acc.ID, Project: "out", Size: oneVCPU}
				if kind == budget.ScopeAccount {
					outReq.AccountID, outReq.Project = "", "" // the default account
				}
				other, err := eng.Create(ctx, outReq)
				if err != nil {
					t.Fatal(err)
				}
				clk.advance(2 * time.Hour) // $2 spent: past $1.50, for notify too
				if err := eng.Meter().Settle(ctx); err != nil {
					t.Fatal(err)
				}
				want := map[string]sandbox.State{budget.Notify: sandbox.StateRunning, budget.DenyNew: sandbox.StateRunning,
					budget.Pause: sandbox.StatePaused, budget.Delete: sandbox.StateDeleted}[action]
				if s := state(t, eng, mine.ID); s != want {
					t.Errorf("the sandbox in scope is %s, want %s", s, want)
				}
				if s := state(t, eng, other.ID); s != sandbox.StateRunning {
					t.Errorf("the sandbox out of scope is %s", s)
				}
				_, err = eng.Create(kctx, inReq)
				if action == budget.Notify && err != nil {
					t.Errorf("a create under a notify budget: %v", err)
				}
				if action != budget.Notify && !errors.Is(err, sandbox.ErrBudget) {
					t.Errorf("a create in scope after the limit: %v", err)
				}
				if _, err := eng.Create(ctx, outReq); err != nil {
					t.Errorf("a create out of scope: %v", err)
				}
				if l, _ := eng.Audit().List(ctx, store.AuditFilter{Action: "budgetReached", Target: bg.ID}); len(l) != 1 {
					t.Errorf("budgetReached entries: %d", len(l))
				}
			})
		}
	}
}

// countingNet is no network with an egress counter the test sets.
type countingNet struct {
	network.None
	mu    sync.Mutex
	bytes map[string]uint64
}

func (n *countingNet) Traffic(id string) (uint64, uint64, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.bytes[id], n.bytes[id] / 2, nil
}

func (n *countingNet) set(id string, v uint64) {
	n.mu.Lock()
	n.bytes[id] = v
	n.mu.Unlock()
}

// Egress is charged as the link's counter grows (a counter that starts
// again counts from zero), shows in usage, and can reach a budget.
func TestBudgetEgress(t *testing.T) {
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	clk := &clock{now: time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC)}
	net := &countingNet{bytes: map[string]uint64{}}
	opts.Now, opts.Network, opts.MeterInterval, opts.HealthInterval = clk.Now, net, time.Hour, -1
	opts.Prices = &budget.Prices{EgressGB: dollar}
	eng, err := harebox.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	ctx := context.Background()
	b := newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeAccount}, Limit: 2 * dollar, Action: budget.Pause})
	s, err := eng.Create(ctx, sandbox.CreateRequest{Size: oneVCPU})
	if err != nil {
		t.Fatal(err)
	}
	step := func(counter uint64) {
		net.set(s.ID, counter)
		clk.advance(time.Minute)
		if err := eng.Meter().Settle(ctx); err != nil {
			t.Fatal(err)
		}
	}
	step(500_000_000)   // +0.5 GB
	step(1_250_000_000) // +0.75 GB
	step(250_000_001)   // the counter started again: +0.250000001 GB
	got, _ := eng.Budgets().Get(ctx, b.ID)
	if want := dollar + dollar/2 + 1; got.Spent != want {
		t.Fatalf("spent %s, want %s", got.Spent, want)
	}
	if st := state(t, eng, s.ID); st != sandbox.StateRunning {
		t.Fatalf("under the limit the sandbox is %s", st)
	}
	groups, err := eng.Budgets().Usage(ctx, budget.UsageQuery{GroupBy: "sandbox"})
	if err != nil || len(groups) != 1 || groups[0].EgressBytes != 1_500_000_001 {
		t.Fatalf("usage: %+v %v", groups, err)
	}
	step(750_000_001) // +0.5 GB: $2.000001 spent, past $2
	if st := state(t, eng, s.ID); st != sandbox.StatePaused {
		t.Fatalf("past the limit by egress the sandbox is %s", st)
	}
}

// Budgets go with what they are on: a fleet's with the fleet, a
// project's (and its fleets') with the project, all with the account.
func TestBudgetsGoWithTheirScope(t *testing.T) {
	eng, _, _ := budgetEngine(t)
	ctx := context.Background()
	acc, err := eng.Tenants().CreateAccount(ctx, tenant.CreateRequest{Name: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := eng.Tenants().CreateProject(ctx, acc.ID, tenant.CreateRequest{Name: "web"})
	f1, _ := eng.Tenants().CreateFleet(ctx, acc.ID, p.ID, tenant.CreateRequest{Name: "a"})
	f2, _ := eng.Tenants().CreateFleet(ctx, acc.ID, p.ID, tenant.CreateRequest{Name: "b"})
	mk := func(s store.BudgetScope) string {
		b, err := eng.Budgets().Create(ctx, acc.ID, budget.CreateRequest{Scope: s, Period: budget.Total, Limit: dollar, Action: budget.Notify})
		if err != nil {
			t.Fatal(err)
		}
		return b.ID
	}
	whole := mk(store.BudgetScope{Kind: budget.ScopeAccount})
	proj := mk(store.BudgetScope{Kind: budget.ScopeProject, Ref: p.ID})
	mk(store.BudgetScope{Kind: budget.ScopeFleet, Ref: f1.ID})
	fleet2 := mk(store.BudgetScope{Kind: budget.ScopeFleet, Ref: f2.ID})
	left := func() []string {
		l, err := eng.Budgets().List(ctx, acc.ID)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, b := range l {
			ids = append(ids, b.ID)
		}
		slices.Sort(ids)
		return ids
	}
	sorted := func(ids ...string) []string { slices.Sort(ids); return ids }
	if err := eng.Tenants().DeleteFleet(ctx, acc.ID, p.ID, f1.ID); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(left()); got != fmt.Sprint(sorted(whole, proj, fleet2)) {
		t.Fatalf("after deleting a fleet: %v", got)
	}
	if err := eng.Tenants().DeleteProject(ctx, acc.ID, p.ID); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(left()); got != fmt.Sprint([]string{whole}) {
		t.Fatalf("after deleting the project: %v", got)
	}
	if err := eng.Tenants().DeleteAccount(ctx, acc.ID); err != nil {
		t.Fatal(err)
	}
	if l, _ := eng.Budgets().List(ctx, ""); len(l) != 0 {
		t.Fatalf("the default account's budgets: %v", l)
	}
	if _, err := eng.Budgets().Get(ctx, whole); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("the deleted account's budget: %v", err)
	}
}

// A sandbox still booting when its budget is reached is charged as it
// boots, and paused once it runs: the action holds for the period.
func TestBudgetBootingSandbox(t *testing.T) {
	hv := memhv.New(memhv.Options{LaunchDelay: time.Second})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	clk := &clock{now: time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC)}
	opts.Now, opts.MeterInterval, opts.HealthInterval = clk.Now, time.Hour, -1
	opts.Prices = &budget.Prices{VCPUHour: dollar}
	eng, err := harebox.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	ctx := context.Background()
	b := newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeAccount}, Limit: 5 * dollar / 2, Action: budget.Pause})
	a, err := eng.Create(ctx, sandbox.CreateRequest{Size: oneVCPU})
	if err != nil {
		t.Fatal(err)
	}
	booted := make(chan *sandbox.Sandbox)
	go func() {
		s, err := eng.Create(ctx, sandbox.CreateRequest{Size: oneVCPU})
		if err != nil {
			t.Error(err)
		}
		booted <- s
	}()
	time.Sleep(300 * time.Millisecond) // B is booting
	clk.advance(2 * time.Hour)
	if err := eng.Meter().Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if st := state(t, eng, a.ID); st != sandbox.StatePaused {
		t.Fatalf("A is %s", st)
	}
	// B was charged for its boot too: 2 h each.
	if got, _ := eng.Budgets().Get(ctx, b.ID); got.Spent != 4*dollar {
		t.Fatalf("spent %s, want 4.00 (the booting one charged)", got.Spent)
	}
	bs := <-booted
	if bs == nil {
		t.FailNow()
	}
	if st := state(t, eng, bs.ID); st != sandbox.StateRunning {
		t.Fatalf("B after its boot is %s", st)
	}
	if err := eng.Meter().Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if st := state(t, eng, bs.ID); st != sandbox.StatePaused {
		t.Fatalf("B, running under a reached pause budget, is %s after the next round", st)
	}
	if l, _ := eng.Audit().List(ctx, store.AuditFilter{Action: "budgetPause", Target: bs.ID}); len(l) != 1 {
		t.Fatalf("budgetPause entries for B: %d", len(l))
	}
}

// A create refused after its admission (its name is taken) releases what
// it reserved; a clock stepped back charges nothing for the step and
// charges from there on.
func TestBudgetLeaksNothing(t *testing.T) {
	eng, clk, _ := budgetEngine(t)
	ctx := context.Background()
	b := newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeAccount}, Limit: 100 * dollar, Action: budget.Pause})
	x, err := eng.Create(ctx, sandbox.CreateRequest{Name: "x", Size: oneVCPU})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := eng.Create(ctx, sandbox.CreateRequest{Name: "x", Size: oneVCPU}); !errors.Is(err, sandbox.ErrExists) {
			t.Fatalf("a second x: %v", err)
		}
	}
	if got, _ := eng.Budgets().Get(ctx, b.ID); got.Reserved != dollar {
		t.Fatalf("reserved %s after refused creates, want 1.00", got.Reserved)
	}
	clk.advance(time.Hour)
	eng.Meter().Settle(ctx) // $1
	clk.advance(-3 * time.Hour)
	eng.Meter().Settle(ctx) // nothing
	clk.advance(time.Hour)
	eng.Meter().Settle(ctx) // $1 more, from the step back on
	if got, _ := eng.Budgets().Get(ctx, b.ID); got.Spent != 2*dollar {
		t.Fatalf("spent %s across a clock step back, want 2.00", got.Spent)
	}
	if err := eng.Delete(ctx, x.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := eng.Budgets().Get(ctx, b.ID); got.Reserved != 0 {
		t.Fatalf("reserved %s with nothing running", got.Reserved)
	}
}

// Snapshot storage is metered against the budgets of the snapshot's
// source, admitted like a create (a snapshot that does not fit is
// refused), and so is a hibernated sandbox's; usage reports it.
func TestBudgetSnapshotStorage(t *testing.T) {
	prices := budget.Prices{SnapshotGBHour: 1_000_000 * dollar} // so that a few KiB count
	eng, clk, _ := budgetEngine(t, prices)
	ctx := context.Background()
	s, err := eng.Create(ctx, sandbox.CreateRequest{Size: oneVCPU})
	if err != nil {
		t.Fatal(err)
	}
	tight := newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeAccount}, Limit: 1, Action: budget.DenyNew})
	if _, err := eng.Snapshots().Take(ctx, s.ID, sandbox.SnapshotRequest{}); !errors.Is(err, sandbox.ErrBudget) {
		t.Fatalf("a snapshot past the budget: %v", err)
	}
	if l, _ := eng.Snapshots().List(ctx, ""); len(l) != 0 {
		t.Fatalf("a refused snapshot was kept: %+v", l)
	}
	if err := eng.Budgets().Delete(ctx, tight.ID); err != nil {
		t.Fatal(err)
	}
	b := newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeAccount}, Limit: 1_000_000 * dollar, Action: budget.Notify})
	snap, err := eng.Snapshots().Take(ctx, s.ID, sandbox.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	perHour := prices.Cost(budget.Resources{SnapshotBytes: snap.Bytes}, time.Hour)
	clk.advance(time.Hour)
	if err := eng.Meter().Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := eng.Budgets().Get(ctx, b.ID); got.Spent != perHour {
		t.Errorf("after an hour of a %d-byte snapshot: spent %s, want %s", snap.Bytes, got.Spent, perHour)
	}
	if err := eng.Snapshots().Delete(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Hour)
	eng.Meter().Settle(ctx)
	if got, _ := eng.Budgets().Get(ctx, b.ID); got.Spent != perHour || got.Reserved != 0 {
		t.Errorf("a deleted snapshot is still charged: spent %s, reserved %s", got.Spent, got.Reserved)
	}
	groups, err := eng.Budgets().Usage(ctx, budget.UsageQuery{GroupBy: "sandbox"})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, g := range groups {
		if g.Group == snap.ID {
			found = g.Cost == perHour
		}
	}
	if !found {
		t.Errorf("usage has no row for the snapshot: %+v", groups)
	}

	// Hibernated: the disk is free here, the files are not.
	before, _ := eng.Budgets().Get(ctx, b.ID)
	if _, err := eng.Hibernate(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Hour)
	eng.Meter().Settle(ctx)
	after, _ := eng.Budgets().Get(ctx, b.ID)
	if after.Spent <= before.Spent {
		t.Errorf("an hour hibernated cost nothing: %s then %s", before.Spent, after.Spent)
	}
	if _, err := eng.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	resumed, _ := eng.Budgets().Get(ctx, b.ID)
	clk.advance(time.Hour)
	eng.Meter().Settle(ctx)
	if got, _ := eng.Budgets().Get(ctx, b.ID); got.Spent != resumed.Spent {
		t.Errorf("running again, it is still charged for its hibernation files: %s then %s", resumed.Spent, got.Spent)
	}
}

// A monthly key budget made mid-month starts from what the key and the
// keys it made already spent this month.
func TestBudgetKeyStartsWithChildSpend(t *testing.T) {
	eng, clk, _ := budgetEngine(t)
	ctx := context.Background()
	parent, err := eng.Keys().Create(ctx, apikey.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	pctx := authz.WithPrincipal(ctx, authz.Principal{AccountID: parent.AccountID, KeyID: parent.ID, Scope: parent.Scope})
	child, err := eng.Keys().Create(pctx, apikey.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cctx := authz.WithPrincipal(ctx, authz.Principal{AccountID: child.AccountID, KeyID: child.ID, Scope: child.Scope})
	s, err := eng.Create(cctx, sandbox.CreateRequest{Size: oneVCPU})
	if err != nil {
		t.Fatal(err)
	}
	clk.advance(time.Hour)
	if err := eng.Delete(ctx, s.ID); err != nil { // settled: one vCPU-hour, $1
		t.Fatal(err)
	}
	b := newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeKey, Ref: parent.ID}, Period: budget.Monthly, Limit: 10 * dollar, Action: budget.Notify})
	if b.Spent != dollar {
		t.Errorf("a parent key's new monthly budget starts at %s, want the child's $1", b.Spent)
	}
}
