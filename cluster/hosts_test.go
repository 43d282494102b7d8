package cluster_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/internal/testpg"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
)

// engine is the engine's side of the registry (cluster.Sandboxes) over
// the real store and secret store: its live sandboxes, and what goes with
// a removed host's sandboxes (their data keys) and snapshots (their
// records).
type engine struct {
	db  store.Store
	sec secrets.Store

	mu      sync.Mutex
	live    map[string]bool
	forgot  []string
	dropped []*store.Snapshot
	// volumesOf are the hosts whose volumes it was asked to drop.
	volumesOf []string
}

func (e *engine) Live(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.live[id]
}

func (e *engine) Forget(ctx context.Context, rec *store.Sandbox) error {
	e.mu.Lock()
	e.forgot = append(e.forgot, rec.ID)
	e.mu.Unlock()
	return sandboxkeys.Erase(ctx, e.sec, rec.ID)
}

func (e *engine) DropSnapshot(ctx context.Context, s *store.Snapshot) error {
	e.mu.Lock()
	e.dropped = append(e.dropped, s)
	e.mu.Unlock()
	return e.db.DeleteSnapshot(ctx, s.ID)
}

func (e *engine) DropVolumes(ctx context.Context, host string) error {
	e.mu.Lock()
	e.volumesOf = append(e.volumesOf, host)
	e.mu.Unlock()
	return nil
}

// clock is a time the test moves.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func register(t *testing.T, db store.Store, name string, lease time.Duration, eng *engine, al cluster.Recorder, now func() time.Time) *cluster.Registry {
	t.Helper()
	r, err := cluster.Register(context.Background(), cluster.Options{
		HostOptions: cluster.HostOptions{Name: name, Address: "https://" + name + ".hosts.invalid:7443", Lease: lease},
		Store:       db, Capacity: sandbox.Resources{VCPUs: 8, MemoryMB: 8192, DiskGB: 100},
		Sandboxes: eng, Audit: al, Now: now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func putSandbox(t *testing.T, db store.Store, host string, st sandbox.State) *store.Sandbox {
	t.Helper()
	rec := &store.Sandbox{Sandbox: sandbox.Sandbox{ID: sandbox.NewID(), State: st, Host: host, CreatedAt: time.Now()}}
	if err := db.PutSandbox(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

func putSnapshot(t *testing.T, db store.Store, of *store.Sandbox) *store.Snapshot {
	t.Helper()
	s := &store.Snapshot{Snapshot: sandbox.Snapshot{ID: "snap_" + sandbox.NewID()[4:], SandboxID: of.ID, CreatedAt: time.Now()}, Dir: "/snapshots/" + of.ID}
	if err := db.PutSnapshot(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRemove: a host that is down is taken out for good, by the operator
// only: its sandboxes that are not deleted become deleted with their data
// keys erased, the snapshots of its sandboxes are dropped as not on this
// host, its row goes, and every try is in the audit log. A host that is
// up, this host and one that does not exist are refused.
func TestRemove(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db, err := store.OpenSQLite(ctx, filepath.Join(dir, "harebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	sec, err := secrets.NewSealed(db, filepath.Join(dir, "master.key"))
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(ctx, db, audit.Options{KeyFile: filepath.Join(dir, "audit.key")})
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close(ctx)
	c := &clock{now: time.Now()}
	eng := &engine{db: db, sec: sec, live: map[string]bool{}}
	a := register(t, db, "a", time.Hour, eng, al, c.Now)
	register(t, db, "b", time.Second, &engine{db: db, sec: sec}, al, c.Now)
	if a.Shared() {
		t.Fatal("a SQLite store is shared")
	}

	onB := putSandbox(t, db, "b", sandbox.StateRunning)
	goneB := putSandbox(t, db, "b", sandbox.StateDeleted)
	onA := putSandbox(t, db, "a", sandbox.StateRunning)
	for _, rec := range []*store.Sandbox{onB, onA} {
		keys, err := sandboxkeys.New()
		if err != nil {
			t.Fatal(err)
		}
		if err := sandboxkeys.Keep(ctx, sec, rec.ID, keys); err != nil {
			t.Fatal(err)
		}
	}
	snapB, snapA := putSnapshot(t, db, onB), putSnapshot(t, db, onA)
	// (On a store that is not shared, every record is this host's.)
	if a.Foreign(onB) {
		t.Fatal("a record of b is foreign on a store that is not shared")
	}

	key := authz.WithPrincipal(ctx, authz.Principal{AccountID: "acc_1", KeyID: "key_1", Scope: authz.Scope{}})
	if _, err := a.Remove(key, "b"); !errors.Is(err, sandbox.ErrForbidden) {
		t.Fatalf("a key removes a host: %v", err)
	}
	if _, err := a.Hosts(key); !errors.Is(err, sandbox.ErrForbidden) {
		t.Fatalf("a key lists the hosts: %v", err)
	}
	if _, err := a.Remove(ctx, "a"); !errors.Is(err, sandbox.ErrState) {
		t.Fatalf("remove this host: %v", err)
	}
	if _, err := a.Remove(ctx, "nope"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("remove a host that does not exist: %v", err)
	}
	if _, err := a.Remove(ctx, "b"); !errors.Is(err, sandbox.ErrState) || !strings.Contains(err.Error(), "stop it first") {
		t.Fatalf("remove a host that is up: %v", err)
	}

	// b's lease lapses: a marks it down, its sandbox lost.
	c.add(2 * time.Second)
	if err := a.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if h, err := a.Get(ctx, "b"); err != nil || h.Up {
		t.Fatalf("b after its lease lapsed: %+v %v", h, err)
	}
	deleted, err := a.Remove(ctx, "b")
	if err != nil || len(deleted) != 1 || deleted[0] != onB.ID {
		t.Fatalf("remove b: %v %v", deleted, err)
	}
	if len(eng.forgot) != 1 || eng.forgot[0] != onB.ID {
		t.Fatalf("forgotten: %v, want %s alone (%s was deleted already)", eng.forgot, onB.ID, goneB.ID)
	}
	rec, err := db.GetSandbox(ctx, onB.ID)
	if err != nil || rec.State != sandbox.StateDeleted || rec.Error != "its host b was removed from the deployment" || rec.Handle != nil {
		t.Fatalf("b's sandbox after b was removed: %+v %v", rec, err)
	}
	if k, err := sandboxkeys.DataKey(ctx, sec, onB.ID); err != nil || k != nil {
		t.Fatalf("b's sandbox's data key after b was removed: %x %v", k, err)
	}
	if k, err := sandboxkeys.DataKey(ctx, sec, onA.ID); err != nil || k == nil {
		t.Fatalf("a's sandbox's data key after b was removed: %v", err)
	}
	if len(eng.volumesOf) != 1 || eng.volumesOf[0] != "b" {
		t.Errorf("volumes dropped of hosts %v, want b's", eng.volumesOf)
	}
	if len(eng.dropped) != 1 || eng.dropped[0].ID != snapB.ID || eng.dropped[0].Dir != "" {
		t.Fatalf("dropped snapshots: %+v, want %s without its directory", eng.dropped, snapB.ID)
	}
	if _, err := db.GetSnapshot(ctx, snapA.ID); err != nil {
		t.Fatalf("a's snapshot after b was removed: %v", err)
	}
	if _, err := a.Get(ctx, "b"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("b's row after b was removed: %v", err)
	}
	if hs, err := a.Hosts(ctx); err != nil || len(hs) != 1 || hs[0].Name != "a" {
		t.Fatalf("hosts after b was removed: %v %v", hs, err)
	}
	if _, err := a.Remove(ctx, "b"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("remove b again: %v", err)
	}

	entries, err := al.List(ctx, store.AuditFilter{Action: "deleteHost"})
	if err != nil {
		t.Fatal(err)
	}
	var outcomes []string
	for _, e := range entries {
		outcomes = append(outcomes, e.Target+":"+e.Outcome)
	}
	want := "b:denied a:error nope:denied b:error b:ok b:denied" // (not found is denied)
	if got := strings.Join(outcomes, " "); got != want {
		t.Fatalf("audit of deleteHost: %s, want %s", got, want)
	}
}

// TestElsewhere: on a shared store, a sandbox or snapshot of another host
// is that host's (one that never registered is down); this host's, a live
// one, a record from before hosts and IDs that are not found are this
// host's to answer.
func TestElsewhere(t *testing.T) {
	ctx := context.Background()
	dsn := testpg.ForTest(t)
	open := func() *store.DB {
		db, err := store.OpenPostgres(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	dbA, dbB := open(), open()
	engA := &engine{db: dbA, live: map[string]bool{}}
	a := register(t, dbA, "a", time.Hour, engA, nil, time.Now)
	b := register(t, dbB, "b", time.Hour, &engine{db: dbB, live: map[string]bool{}}, nil, time.Now)
	if !a.Shared() {
		t.Fatal("a PostgreSQL store is not shared")
	}
	onB := putSandbox(t, dbA, "b", sandbox.StateRunning)
	onA := putSandbox(t, dbA, "a", sandbox.StateRunning)
	old := putSandbox(t, dbA, "", sandbox.StateRunning)
	onC := putSandbox(t, dbA, "c", sandbox.StateRunning)

	if h, err := a.Elsewhere(ctx, onB.ID); err != nil || h == nil || h.Name != "b" || !h.Up || h.Address != "https://b.hosts.invalid:7443" {
		t.Fatalf("b's sandbox seen from a: %+v %v", h, err)
	}
	if !a.Foreign(onB) || a.Foreign(onA) || a.Foreign(old) {
		t.Fatal("Foreign: want b's record alone")
	}
	if h, err := b.Elsewhere(ctx, onB.ID); err != nil || h != nil {
		t.Fatalf("b's sandbox seen from b: %+v %v", h, err)
	}
	for _, id := range []string{onA.ID, old.ID, sandbox.NewID(), "not an id"} {
		if h, err := a.Elsewhere(ctx, id); err != nil || h != nil {
			t.Fatalf("%s seen from a: %+v %v", id, h, err)
		}
	}
	if h, err := a.Elsewhere(ctx, onC.ID); err != nil || h == nil || h.Name != "c" || h.Up {
		t.Fatalf("a sandbox of a host that never registered: %+v %v", h, err)
	}
	// A sandbox live here is answered here (whatever its record says).
	engA.mu.Lock()
	engA.live[onB.ID] = true
	engA.mu.Unlock()
	if h, err := a.Elsewhere(ctx, onB.ID); err != nil || h != nil {
		t.Fatalf("a live sandbox: %+v %v", h, err)
	}
	engA.mu.Lock()
	delete(engA.live, onB.ID)
	engA.mu.Unlock()

	snapB, snapA := putSnapshot(t, dbA, onB), putSnapshot(t, dbA, onA)
	if h, err := a.SnapshotElsewhere(ctx, snapB.ID); err != nil || h == nil || h.Name != "b" {
		t.Fatalf("a snapshot of b's sandbox: %+v %v", h, err)
	}
	for _, id := range []string{snapA.ID, "snap_nope"} {
		if h, err := a.SnapshotElsewhere(ctx, id); err != nil || h != nil {
			t.Fatalf("snapshot %s seen from a: %+v %v", id, h, err)
		}
	}
}

// TestPlaceBySite: a create that asks for a site goes to that site's
// hosts only, one that asks for a country to any site of it, one that
// asks for neither to this host's site; none up with room there is a
// clear refusal naming where.
func TestPlaceBySite(t *testing.T) {
	db, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	now := (&clock{now: time.Now()}).Now
	reg := func(name, site, country string) *cluster.Registry {
		t.Helper()
		r, err := cluster.Register(ctx, cluster.Options{
			HostOptions: cluster.HostOptions{Name: name, Address: "https://" + name + ".hosts.invalid:7443", Lease: time.Hour},
			Store:       db, Site: site, Country: country, Capacity: sandbox.Resources{VCPUs: 8, MemoryMB: 8192, DiskGB: 100},
			Used: func() sandbox.Resources { return sandbox.Resources{} }, Sandboxes: &engine{db: db}, Now: now,
		})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	par := reg("par1", "fr-par-1", "FR")
	reg("par2", "fr-par-2", "FR")
	reg("ams", "nl-ams-1", "NL")
	small := sandbox.Presets["small"]
	for _, c := range []struct {
		where sandbox.Site
		want  []string // any of
	}{
		{sandbox.Site{}, []string{"par1"}},
		{sandbox.Site{Name: "nl-ams-1"}, []string{"ams"}},
		{sandbox.Site{Name: "fr-par-2", Country: "FR"}, []string{"par2"}},
		{sandbox.Site{Country: "FR"}, []string{"par1", "par2"}},
		{sandbox.Site{Country: "NL"}, []string{"ams"}},
	} {
		h, err := par.Place(ctx, small, c.where)
		if err != nil || !slices.Contains(c.want, h.Name) {
			t.Errorf("Place(%+v) = %+v %v, want one of %v", c.where, h, err, c.want)
		}
	}
	for _, c := range []struct {
		where sandbox.Site
		says  string
	}{
		{sandbox.Site{Name: "us-nyc-1"}, "no host of site us-nyc-1"},
		{sandbox.Site{Country: "DE"}, "no host of country DE"},
		{sandbox.Site{Name: "nl-ams-1", Country: "FR"}, "no host of site nl-ams-1 in FR"},
	} {
		if _, err := par.Place(ctx, small, c.where); !errors.Is(err, sandbox.ErrCapacity) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Place(%+v): %v, want ErrCapacity saying %q", c.where, err, c.says)
		}
	}
	if _, err := par.Place(ctx, sandbox.Resources{VCPUs: 64, MemoryMB: 512, DiskGB: 1}, sandbox.Site{Name: "nl-ams-1"}); !errors.Is(err, sandbox.ErrCapacity) {
		t.Errorf("too large for the site's host: %v", err)
	}
	if hs, _ := par.Hosts(authz.WithPrincipal(ctx, authz.Operator)); len(hs) != 3 || hs[0].Country != "NL" {
		t.Errorf("the hosts' rows: %+v", hs)
	}
}
