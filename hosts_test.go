package harebox_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/apikey"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/testpg"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Two hosts share a PostgreSQL store (the in-memory hypervisor stands for
// their VMs): each runs its own sandboxes and sees the other's, a key
// revoked through one is refused by the other at once, a host whose
// lease lapses is down and its sandboxes lost until it is back, and
// creates go to the least loaded host.
// engineHost is one host of a test deployment: its engine, store and
// (in-memory) hypervisor; start starts it (again, on its directory).
type engineHost struct {
	eng *harebox.Engine
	db  *store.DB
	hv  *memhv.Hypervisor
	dir string
}

// hostsOn returns start and stop for hosts on the PostgreSQL database
// dsn; tweak, if set, changes every host's options.
func hostsOn(t *testing.T, dsn string, lease time.Duration, tweak func(*harebox.Options)) (start func(name string, h *engineHost), stop func(h *engineHost)) {
	ctx := context.Background()
	start = func(name string, h *engineHost) {
		t.Helper()
		if h.hv == nil {
			h.hv = memhv.New(memhv.Options{})
			t.Cleanup(func() { h.hv.Close() })
		}
		opts := memhvOptions(t, h.hv)
		if h.dir != "" {
			os.RemoveAll(opts.DataDir)
			opts.DataDir = h.dir
			opts.Images = map[string]images.Image{sandbox.DefaultImage: memhv.Image(h.dir)}
		}
		h.dir = opts.DataDir
		db, err := store.OpenPostgres(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		opts.Store = db
		opts.Host = harebox.HostOptions{Name: name, Address: "https://" + name + ".hosts.invalid:7443", Lease: lease}
		if tweak != nil {
			tweak(&opts)
		}
		eng, err := harebox.New(ctx, opts)
		if err != nil {
			db.Close()
			t.Fatal(err)
		}
		h.eng, h.db = eng, db
	}
	stop = func(h *engineHost) {
		h.eng.Close()
		h.db.Close()
	}
	return start, stop
}

func TestHostsShareAStore(t *testing.T) {
	dsn := testpg.ForTest(t)
	ctx := context.Background()
	const lease = 900 * time.Millisecond
	start, stop := hostsOn(t, dsn, lease, nil)
	a, b := &engineHost{}, &engineHost{}
	start("a", a)
	defer func() { stop(a) }()
	start("b", b)
	defer func() { stop(b) }()

	// A second engine by a name in use is refused.
	db, err := store.OpenPostgres(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	opts := memhvOptions(t, memhv.New(memhv.Options{}))
	opts.Store, opts.Host = db, harebox.HostOptions{Name: "b"}
	if _, err := harebox.New(ctx, opts); !errors.Is(err, store.ErrInUse) {
		t.Fatalf("a second host b: %v", err)
	}
	db.Close()

	box, err := b.eng.Create(ctx, sandbox.CreateRequest{Name: "on-b"})
	if err != nil {
		t.Fatal(err)
	}
	if box.Host != "b" {
		t.Fatalf("created on b: host %q", box.Host)
	}
	l, err := a.eng.List(ctx, sandbox.ListFilter{})
	if err != nil || len(l) != 1 || l[0].ID != box.ID || l[0].Host != "b" || l[0].State != sandbox.StateRunning {
		t.Fatalf("a lists %+v %v", l, err)
	}
	if h, err := a.eng.Cluster().Elsewhere(ctx, box.ID); err != nil || h == nil || h.Name != "b" || !h.Up || h.Address != "https://b.hosts.invalid:7443" {
		t.Fatalf("a: where is it? %+v %v", h, err)
	}
	if h, err := b.eng.Cluster().Elsewhere(ctx, box.ID); err != nil || h != nil {
		t.Fatalf("b: where is it? %+v %v", h, err)
	}
	// a never acts on it (its VM, disk and key are b's): only reads.
	if err := a.eng.Delete(ctx, box.ID); !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "host b") {
		t.Fatalf("a deletes b's sandbox: %v", err)
	}
	if _, err := a.eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "true"}); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("a runs a command in b's sandbox: %v", err)
	}
	if s, err := a.eng.Get(ctx, box.ID); err != nil || s.State != sandbox.StateRunning {
		t.Fatalf("a reads b's sandbox: %+v %v", s, err)
	}

	// A key revoked through a is refused by b at once (b had it in its
	// cache, which only the notice clears; the bound is loose for a
	// loaded machine, not a measure).
	ctxOp := authz.WithPrincipal(ctx, authz.Operator)
	k, err := a.eng.Keys().Create(ctxOp, apikey.CreateRequest{Scope: authz.Scope{Actions: []string{"getSandbox"}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.eng.Keys().Authenticate(ctx, k.Secret); err != nil {
		t.Fatal(err)
	}
	if _, err := a.eng.Keys().Revoke(ctxOp, k.ID); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	for {
		if _, err := b.eng.Keys().Authenticate(ctx, k.Secret); errors.Is(err, sandbox.ErrUnauthenticated) {
			break
		}
		if time.Since(revoked) > 20*time.Second {
			t.Fatal("b still takes a key revoked through a 20 s ago")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// A key's rate is the deployment's, not each host's: two requests at
	// once through a, and the third, through b, is refused.
	rk, err := a.eng.Keys().Create(ctxOp, apikey.CreateRequest{Scope: authz.Scope{Rate: &authz.Rate{PerSecond: 0.001, Burst: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := a.eng.Keys().Authenticate(ctx, rk.Secret); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.eng.Keys().Authenticate(ctx, rk.Secret); !errors.Is(err, sandbox.ErrRateLimited) {
		t.Fatalf("the third request, through b: %v, want ErrRateLimited", err)
	}

	// b dies (its engine and its connection to the store go; its VM runs
	// on): within its lease and a renewal, a marks it down and the
	// sandbox lost.
	stop(b)
	died := time.Now()
	for {
		s, err := a.eng.Get(ctx, box.ID)
		if err != nil {
			t.Fatal(err)
		}
		if s.State == sandbox.StateLost {
			t.Logf("lost %v after b died (lease %v): %s", time.Since(died).Round(time.Millisecond), lease, s.Error)
			break
		}
		if time.Since(died) > lease+lease/3+2*time.Second {
			t.Fatalf("b's sandbox is %s %v after b died", s.State, time.Since(died))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if hs, _ := a.eng.Cluster().Hosts(ctx); len(hs) != 2 || hs[1].Name != "b" || hs[1].Up {
		t.Fatalf("hosts after b died: %+v", hs)
	}
	// (Nothing is placed on a host that is down.)
	if h, err := a.eng.Cluster().Place(ctx, sandbox.Presets["small"], sandbox.Site{}); err != nil || h.Name != "a" {
		t.Fatalf("placed on %+v %v with b down", h, err)
	}

	// A record from before hosts whose machine is not on b (another
	// host's, not started yet): b leaves it alone when it starts.
	orphan := &store.Sandbox{Sandbox: sandbox.Sandbox{ID: sandbox.NewID(), State: sandbox.StateRunning, AccountID: box.AccountID, ProjectID: box.ProjectID, CreatedAt: time.Now()},
		StateDir: "/nonexistent/m/x"}
	if err := a.db.PutSandbox(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	// b is back: it takes its sandbox again.
	start("b", b)
	if got, err := a.db.GetSandbox(ctx, orphan.ID); err != nil || got.Host != "" || got.State != sandbox.StateRunning {
		t.Fatalf("b took a record from before hosts whose machine is elsewhere: %+v %v", got, err)
	}
	a.db.DeleteSandbox(ctx, orphan.ID)
	if s, err := a.eng.Get(ctx, box.ID); err != nil || s.State != sandbox.StateRunning || s.Error != "" {
		t.Fatalf("after b is back, a sees %+v %v", s, err)
	}
	if res, err := b.eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "echo back"}); err != nil || res.Stdout != "back\n" {
		t.Fatalf("exec on b after it is back: %+v %v", res, err)
	}

	// Placement: b runs one small sandbox, a none: a goes first; with two
	// on a, b is the least loaded (as its next renewal tells).
	if h, err := a.eng.Cluster().Place(ctx, sandbox.Presets["small"], sandbox.Site{}); err != nil || h.Name != "a" {
		t.Fatalf("placed on %+v %v, want a", h, err)
	}
	for range 2 {
		if _, err := a.eng.Create(ctx, sandbox.CreateRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(2 * lease)
	for {
		h, err := a.eng.Cluster().Place(ctx, sandbox.Presets["small"], sandbox.Site{})
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "b" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("placed on %s with 2 sandboxes there and 1 on b", h.Name)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := a.eng.Cluster().Place(ctx, sandbox.Resources{VCPUs: 64, MemoryMB: 512, DiskGB: 1}, sandbox.Site{}); !errors.Is(err, sandbox.ErrCapacity) {
		t.Fatalf("placing what no host has room for: %v", err)
	}
}

// A budget reached through the sandboxes of one host acts at once on
// those of the other (which meters only once an hour here).
func TestBudgetReachedOnEveryHost(t *testing.T) {
	dsn := testpg.ForTest(t)
	ctx := context.Background()
	clk := &clock{now: time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC)}
	start, stop := hostsOn(t, dsn, time.Minute, func(o *harebox.Options) {
		o.Now, o.Prices, o.MeterInterval, o.HealthInterval = clk.Now, &budget.Prices{VCPUHour: dollar}, time.Hour, -1
	})
	a, b := &engineHost{}, &engineHost{}
	start("a", a)
	defer func() { stop(a) }()
	start("b", b)
	defer func() { stop(b) }()
	newBudget(t, a.eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: "account"}, Action: budget.Pause, Limit: 5 * dollar / 2})
	onB, err := b.eng.Create(ctx, sandbox.CreateRequest{Size: oneVCPU})
	if err != nil {
		t.Fatal(err)
	}
	onA, err := a.eng.Create(ctx, sandbox.CreateRequest{Size: oneVCPU})
	if err != nil {
		t.Fatal(err)
	}
	// An hour on: a's sandbox spent $1, and both reserve $1 for the next
	// hour: $3 of $2.50.
	clk.advance(time.Hour)
	if err := a.eng.Meter().Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if got := state(t, a.eng, onA.ID); got != sandbox.StatePaused {
		t.Fatalf("a's sandbox is %s", got)
	}
	// (b meters once an hour: a pause within the minute is the notice's.
	// The bound is loose for a loaded machine, not a measure.)
	settled := time.Now()
	for state(t, b.eng, onB.ID) != sandbox.StatePaused {
		if time.Since(settled) > 30*time.Second {
			t.Fatal("b's sandbox still runs 30 s after the budget was reached through a")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("b paused its sandbox %v after a reached the budget", time.Since(settled).Round(time.Millisecond))
}

// Creates at once on two hosts: each one's record, reservation and audit
// entry commit together, and the hosts' entries make one unbroken chain.
func TestConcurrentCreatesOnTwoHosts(t *testing.T) {
	dsn := testpg.ForTest(t)
	ctx := context.Background()
	start, stop := hostsOn(t, dsn, time.Minute, nil)
	a, b := &engineHost{}, &engineHost{}
	start("a", a)
	defer func() { stop(a) }()
	start("b", b)
	defer func() { stop(b) }()
	const each = 4
	errs := make(chan error, 2*each*2)
	for _, h := range []*engineHost{a, b} {
		for range each {
			go func() {
				for range 2 {
					_, err := h.eng.Create(ctx, sandbox.CreateRequest{Size: sandbox.Size{VCPUs: 1, MemoryMB: 128, DiskGB: 1}})
					errs <- err
				}
			}()
		}
	}
	for range 2 * each * 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	r, err := a.eng.Audit().Verify(ctx)
	if err != nil || !r.OK {
		t.Fatalf("verify: %+v %v", r, err)
	}
	l, err := a.eng.Audit().List(ctx, store.AuditFilter{Action: "createSandbox", Limit: 100})
	if err != nil || len(l) != 2*each*2 {
		t.Fatalf("%d createSandbox entries, want %d: %v", len(l), 2*each*2, err)
	}
}

// TestPoolSetting: the warm pool's setting is the deployment's. Set
// through one host, every host keeps it (a host started later too);
// shrunk, each stops its extra members; reset, each keeps its own
// --pool again. Bad settings and keys other than the operator's are
// refused and change nothing.
func TestPoolSetting(t *testing.T) {
	dsn := testpg.ForTest(t)
	ctx := context.Background()
	start, stop := hostsOn(t, dsn, 5*time.Second, func(o *harebox.Options) {
		if o.Host.Name == "a" {
			o.Pool = map[string]int{"default:small": 1} // a's own --pool
		}
		o.GoldenSnapshots = true
	})
	a, b := &engineHost{}, &engineHost{}
	start("a", a)
	defer func() { stop(a) }()
	start("b", b)
	defer func() { stop(b) }()
	idle := func(h *engineHost) int {
		st, err := h.eng.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.Pool
	}
	wait := func(h *engineHost, n int) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); idle(h) != n; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the pool holds %d, want %d", idle(h), n)
			}
		}
	}
	check := func(h *engineHost, source string, want map[string]int) {
		t.Helper()
		p, err := h.eng.Pool().Get(ctx)
		if err != nil || p.Source != source || !maps.Equal(p.Pool, want) || !p.Kept || (source == "deployment") != (p.SetAt != nil) {
			t.Fatalf("the pool as a host keeps it: %+v %v; want %s %v", p, err, source, want)
		}
	}
	wait(a, 1)
	check(a, "host", map[string]int{"default:small": 1})
	check(b, "host", map[string]int{})

	p, err := b.eng.Pool().Set(ctx, map[string]int{"default:small": 2})
	if err != nil || p.Source != "deployment" || p.Host != "b" {
		t.Fatalf("set through b: %+v %v", p, err)
	}
	wait(a, 2)
	wait(b, 2)
	check(a, "deployment", map[string]int{"default:small": 2})
	if l, _ := b.eng.Audit().List(ctx, store.AuditFilter{Action: "setPool"}); len(l) != 1 || l[0].Error != "" {
		t.Errorf("setPool's audit entries: %+v", l)
	}

	// Refused, and nothing changes.
	for _, bad := range []map[string]int{{"nope:small": 1}, {"default:huge": 1}, {"default:small": 65}, {"default": 1}, {"default:small": -1}} {
		if _, err := a.eng.Pool().Set(ctx, bad); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("set %v: %v", bad, err)
		}
	}
	k, err := a.eng.Keys().Create(ctx, apikey.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	keyCtx := authz.WithPrincipal(ctx, authz.Principal{AccountID: k.AccountID, KeyID: k.ID, Scope: k.Scope})
	if _, err := a.eng.Pool().Set(keyCtx, map[string]int{}); !errors.Is(err, sandbox.ErrForbidden) {
		t.Errorf("a key sets the pool: %v", err)
	}
	if _, err := a.eng.Pool().Get(keyCtx); !errors.Is(err, sandbox.ErrForbidden) {
		t.Errorf("a key reads the pool: %v", err)
	}
	if _, err := a.eng.Pool().Reset(keyCtx); !errors.Is(err, sandbox.ErrForbidden) {
		t.Errorf("a key resets the pool: %v", err)
	}
	check(a, "deployment", map[string]int{"default:small": 2})
	check(b, "deployment", map[string]int{"default:small": 2})

	// A host that starts later keeps the deployment's pool.
	stop(b)
	start("b", b)
	wait(b, 2)
	check(b, "deployment", map[string]int{"default:small": 2})

	// Shrunk through a: each host stops its extra member at once.
	if _, err := a.eng.Pool().Set(ctx, map[string]int{"default:small": 1}); err != nil {
		t.Fatal(err)
	}
	if n := idle(a); n != 1 {
		t.Errorf("a holds %d right after its pool shrank to 1", n)
	}
	wait(b, 1)
	// Reset through b: a keeps its own --pool (1), b none.
	if p, err := b.eng.Pool().Reset(ctx); err != nil || p.Source != "host" || len(p.Pool) != 0 {
		t.Fatalf("reset through b: %+v %v", p, err)
	}
	wait(b, 0)
	check(b, "host", map[string]int{})
	// (a hears of the reset a moment later: its pool is the same size
	// either way, so only its setting's source tells.)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if p, err := a.eng.Pool().Get(ctx); err == nil && p.Source == "host" || time.Now().After(deadline) {
			break
		}
	}
	check(a, "host", map[string]int{"default:small": 1})
	wait(a, 1)
}
