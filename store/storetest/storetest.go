// Package storetest is the conformance suite every store.Store passes,
// as hypervisortest is for hypervisor backends: package store runs it on
// SQLite and on a real PostgreSQL server, and another implementation runs
// it in its own tests.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Open makes a new, empty store for one test, closed when the test ends;
// reopen opens the same database again (a restart).
type Open func(t *testing.T) (s store.Store, reopen func() store.Store)

// Run runs every test of the suite, each on a new store.
func Run(t *testing.T, open Open) {
	for _, c := range []struct {
		name string
		test func(t *testing.T, s store.Store, reopen func() store.Store)
	}{
		{"RoundTripAndReopen", roundTripAndReopen},
		{"UpdateAndTenancy", updateAndTenancy},
		{"ConcurrentUpdates", concurrentUpdates},
		{"Scrub", scrub},
		{"RawText", rawText},
		{"AuditTail", auditTail},
		{"CandidateBudgets", candidateBudgets},
		{"URLs", urls},
		{"Settings", settings},
		{"Sessions", sessions},
		{"Volumes", volumes},
		{"Mesh", mesh},
		{"Hosts", hosts},
		{"Notify", notify},
		{"TokenBucket", tokenBucket},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, reopen := open(t)
			c.test(t, s, reopen)
		})
	}
}

// Records come back as written, after a reopen too; deleting one twice
// is ErrNotFound.
func roundTripAndReopen(t *testing.T, s store.Store, reopen func() store.Store) {
	ctx := context.Background()
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	a := &store.Sandbox{
		Sandbox:  sandbox.Sandbox{ID: sandbox.NewID(), State: sandbox.StateRunning, CreatedAt: time.Now().UTC(), ExpiresAt: &exp, Labels: map[string]string{"k": "v"}},
		Handle:   &hypervisor.Handle{Backend: "qemu", ID: "m", Data: []byte(`{"pid":1}`)},
		StateDir: "/x",
	}
	b := &store.Sandbox{Sandbox: sandbox.Sandbox{ID: sandbox.NewID(), State: sandbox.StateCreating, CreatedAt: time.Now().UTC().Add(time.Second)}}
	for _, sb := range []*store.Sandbox{a, b} {
		if err := s.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	a.State = sandbox.StatePaused
	if err := s.PutSandbox(ctx, a); err != nil {
		t.Fatal(err)
	}
	s.Close()

	// A reopened database keeps everything and does not re-run migrations.
	s = reopen()
	got, err := s.GetSandbox(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != sandbox.StatePaused || got.Handle == nil || string(got.Handle.Data) != `{"pid":1}` || !got.ExpiresAt.Equal(exp) || got.Labels["k"] != "v" {
		t.Fatalf("round trip lost data: %+v", got)
	}
	all, err := s.ListSandboxes(ctx)
	if err != nil || len(all) != 2 || all[0].ID != a.ID || all[1].ID != b.ID {
		t.Fatalf("list: %v %v", all, err)
	}
	if err := s.DeleteSandbox(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSandbox(ctx, a.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get deleted: %v", err)
	} else if model.Code(err) != "not_found" {
		// A miss no caller words otherwise is a 404, not an internal error.
		t.Fatalf("a miss is of kind %q, want not_found", model.Code(err))
	}
	if err := s.DeleteSandbox(ctx, a.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
}

// Update commits all of fn's writes or none; names are unique in their
// parent; live sandboxes are counted per account, project and fleet.
func updateAndTenancy(t *testing.T, s store.Store, _ func() store.Store) {
	ctx := context.Background()
	now := time.Now().UTC()
	boom := errors.New("boom")
	err := s.Update(ctx, func(tx store.Tx) error {
		if err := tx.PutAccount(ctx, &store.Account{ID: "acc_1", Name: "a", CreatedAt: now}); err != nil {
			return err
		}
		if err := tx.PutProject(ctx, &store.Project{ID: "prj_1", AccountID: "acc_1", Name: "web", CreatedAt: now}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if _, err := s.GetAccount(ctx, "acc_1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a rolled-back account exists: %v", err)
	}
	if _, err := s.GetProject(ctx, "prj_1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a rolled-back project exists: %v", err)
	}
	err = s.Update(ctx, func(tx store.Tx) error {
		if err := tx.PutAccount(ctx, &store.Account{ID: "acc_1", Name: "a", CreatedAt: now}); err != nil {
			return err
		}
		return tx.PutProject(ctx, &store.Project{ID: "prj_1", AccountID: "acc_1", Name: "web", CreatedAt: now})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutAccount(ctx, &store.Account{ID: "acc_2", Name: "a", CreatedAt: now}); !errors.Is(err, store.ErrConflict) || !errors.Is(err, model.ErrExists) {
		t.Fatalf("a second account named a: %v", err)
	}
	if err := s.PutProject(ctx, &store.Project{ID: "prj_2", AccountID: "acc_1", Name: "web", CreatedAt: now}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second project named web: %v", err)
	}
	if p, err := s.ProjectByName(ctx, "acc_1", "web"); err != nil || p.ID != "prj_1" {
		t.Fatalf("project by name: %+v %v", p, err)
	}
	for i, st := range []sandbox.State{sandbox.StateRunning, sandbox.StatePaused, sandbox.StateDeleted} {
		sb := &store.Sandbox{Sandbox: sandbox.Sandbox{ID: sandbox.NewID(), State: st, AccountID: "acc_1", ProjectID: "prj_1", FleetID: map[bool]string{true: "flt_1"}[i == 0], CreatedAt: now}}
		if err := s.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		acc, prj, flt string
		want          int
	}{{"acc_1", "", "", 2}, {"acc_1", "prj_1", "", 2}, {"acc_1", "prj_1", "flt_1", 1}, {"acc_2", "", "", 0}} {
		if n, err := s.CountLive(ctx, c.acc, c.prj, c.flt); err != nil || n != c.want {
			t.Errorf("CountLive(%q, %q, %q) = %d %v, want %d", c.acc, c.prj, c.flt, n, err, c.want)
		}
	}
	// A key keeps its hash, which its JSON never shows.
	k := &store.Key{ID: "key_1", AccountID: "acc_1", Scope: authz.Scope{Actions: []string{"exec"}}, CreatedAt: now, Hash: []byte{1, 2, 3}}
	if err := s.PutKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetKey(ctx, "key_1")
	if err != nil || string(got.Hash) != "\x01\x02\x03" || got.Scope.Actions[0] != "exec" {
		t.Fatalf("key: %+v %v", got, err)
	}
	if l, err := s.ListKeys(ctx, "acc_2"); err != nil || len(l) != 0 {
		t.Fatalf("another account's keys: %v %v", l, err)
	}
}

// Updates that read and write the same row at once all count: SQLite runs
// them one at a time, PostgreSQL aborts the conflicting ones and Update
// runs them again.
func concurrentUpdates(t *testing.T, s store.Store, _ func() store.Store) {
	ctx := context.Background()
	if err := s.PutSecret(ctx, "c", "n", []byte("0")); err != nil {
		t.Fatal(err)
	}
	const workers, each = 4, 25
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func() {
			for i := 0; i < each; i++ {
				err := s.Update(ctx, func(tx store.Tx) error {
					v, err := tx.GetSecret(ctx, "c", "n")
					if err != nil {
						return err
					}
					n, _ := strconv.Atoi(string(v))
					return tx.PutSecret(ctx, "c", "n", []byte(strconv.Itoa(n+1)))
				})
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for w := 0; w < workers; w++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	v, err := s.GetSecret(ctx, "c", "n")
	if err != nil || string(v) != strconv.Itoa(workers*each) {
		t.Fatalf("counter %s %v, want %d", v, err, workers*each)
	}
}

// Scrub runs once secrets were deleted.
func scrub(t *testing.T, s store.Store, _ func() store.Store) {
	ctx := context.Background()
	if err := s.PutSecret(ctx, "sandbox/x", "key", []byte("k")); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSecret(ctx, "sandbox/x", "key"); err != nil {
		t.Fatal(err)
	}
	if err := s.Scrub(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSecret(ctx, "sandbox/x", "key"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after scrub: %v", err)
	}
}

// Text any request can carry (invalid UTF-8, NUL) is stored: PostgreSQL
// refuses it in TEXT columns as sent, SQLite keeps it.
func rawText(t *testing.T, s store.Store, _ func() store.Store) {
	ctx := context.Background()
	e := &store.AuditEntry{Seq: 1, Time: time.Now().UTC(), Principal: "key_x", Action: "getSandbox", Target: "sbx_\xff\x00../x", Outcome: "denied"}
	if err := s.AppendAudit(ctx, e); err != nil {
		t.Fatal(err)
	}
	l, err := s.ListAudit(ctx, store.AuditFilter{Limit: 10})
	if err != nil || len(l) != 1 || l[0].Action != "getSandbox" {
		t.Fatalf("ListAudit: %+v %v", l, err)
	}
	// The columns it is found by agree with the record, as each database
	// keeps such text.
	if len(l[0].Mismatch) != 0 {
		t.Fatalf("ListAudit: columns %v disagree with the record", l[0].Mismatch)
	}
	if _, err := s.GetAccount(ctx, "acc_\xff\x00"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a lookup by a raw name: %v", err)
	}
}

// AuditTail: a filter's Newest reads the last entries that match, oldest
// first, after its cursor; without it the first.
func auditTail(t *testing.T, s store.Store, _ func() store.Store) {
	ctx := context.Background()
	now := time.Now().UTC()
	for seq := int64(1); seq <= 9; seq++ {
		outcome := "ok"
		if seq%3 == 0 {
			outcome = "denied"
		}
		if err := s.AppendAudit(ctx, &store.AuditEntry{Seq: seq, Time: now, Principal: "key_x", Action: "getSandbox", Outcome: outcome}); err != nil {
			t.Fatal(err)
		}
	}
	seqs := func(f store.AuditFilter) []int64 {
		t.Helper()
		l, err := s.ListAudit(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []int64
		for _, e := range l {
			out = append(out, e.Seq)
		}
		return out
	}
	for _, c := range []struct {
		f    store.AuditFilter
		want []int64
	}{
		{store.AuditFilter{Limit: 3}, []int64{1, 2, 3}},
		{store.AuditFilter{Limit: 3, Newest: true}, []int64{7, 8, 9}},
		{store.AuditFilter{Limit: 2, Newest: true, Outcome: "denied"}, []int64{6, 9}},
		{store.AuditFilter{Limit: 5, Newest: true, After: 6}, []int64{7, 8, 9}},
		{store.AuditFilter{Limit: 2, Newest: true, Through: 5}, []int64{4, 5}},
	} {
		if got := seqs(c.f); !slices.Equal(got, c.want) {
			t.Errorf("ListAudit(%+v): %v, want %v", c.f, got, c.want)
		}
	}
}

// CandidateBudgets reads what may cover a sandbox through the indexed
// columns: the account's budgets, its project's, fleet's and keys', and the
// label budgets one of its labels indexes; never another account's.
func candidateBudgets(t *testing.T, s store.Store, _ func() store.Store) {
	ctx := context.Background()
	now := time.Now().UTC()
	put := func(id, account, kind, ref string, labels map[string]string) {
		t.Helper()
		if err := s.PutBudget(ctx, &store.Budget{ID: id, AccountID: account, Scope: store.BudgetScope{Kind: kind, Ref: ref, Labels: labels}, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	put("acct", "a", "account", "", nil)
	put("other-acct", "b", "account", "", nil)
	put("proj", "a", "project", "p1", nil)
	put("proj2", "a", "project", "p2", nil)
	put("fleet", "a", "fleet", "f1", nil)
	put("key", "a", "key", "k1", nil)
	put("parent-key", "a", "key", "k0", nil)
	put("red", "a", "label", "", map[string]string{"team": "red"})
	put("red-web", "a", "label", "", map[string]string{"tier": "web", "team": "red"})
	put("blue", "a", "label", "", map[string]string{"team": "blue"})
	ids := func(bs []*store.Budget) []string {
		var out []string
		for _, b := range bs {
			out = append(out, b.ID)
		}
		sort.Strings(out)
		return out
	}
	got, err := s.CandidateBudgets(ctx, "a", "p1", "f1", []string{"k1", "k0"}, map[string]string{"team": "red", "tier": "web"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"acct", "fleet", "key", "parent-key", "proj", "red", "red-web"}
	if g := ids(got); fmt.Sprint(g) != fmt.Sprint(want) {
		t.Fatalf("candidates: %v, want %v", g, want)
	}
	got, _ = s.CandidateBudgets(ctx, "a", "p2", "", nil, nil)
	if g := ids(got); len(g) != 2 || g[0] != "acct" || g[1] != "proj2" {
		t.Fatalf("candidates without fleet, keys or labels: %v", g)
	}
	// Reservations and usage round-trip.
	if err := s.PutReservation(ctx, &store.Reservation{SandboxID: "sbx", Amount: 5, Budgets: []string{"acct"}, From: now}); err != nil {
		t.Fatal(err)
	}
	if r, err := s.GetReservation(ctx, "sbx"); err != nil || r.Amount != 5 || !r.From.Equal(now) {
		t.Fatalf("reservation: %+v %v", r, err)
	}
	s.DeleteReservation(ctx, "sbx")
	if _, err := s.GetReservation(ctx, "sbx"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleted reservation: %v", err)
	}
	u := store.Usage{SandboxID: "sbx", AccountID: "a", Labels: map[string]string{"team": "red"}, Start: now.Add(-time.Minute), End: now, VCPUs: 2, Paused: true, Cost: 42}
	if err := s.AddUsage(ctx, u); err != nil {
		t.Fatal(err)
	}
	for f, n := range map[store.UsageFilter]int{{AccountID: "a"}: 1, {AccountID: "b"}: 0, {From: now}: 0, {To: now.Add(-time.Minute)}: 0, {From: now.Add(-time.Second)}: 1} {
		l, err := s.QueryUsage(ctx, f)
		if err != nil || len(l) != n {
			t.Errorf("QueryUsage(%+v): %d rows, want %d (%v)", f, len(l), n, err)
		}
	}
	l, _ := s.ListUsage(ctx, "sbx")
	if len(l) != 1 || l[0].Cost != 42 || !l[0].Paused || l[0].Labels["team"] != "red" || !l[0].End.Equal(now) {
		t.Fatalf("usage: %+v", l)
	}
}

// A setting comes back as set, after a reopen too, and replaced by the
// next; a transaction that fails sets nothing; a missing one and a
// second delete are ErrNotFound; a value that is not JSON is refused.
func settings(t *testing.T, s store.Store, reopen func() store.Store) {
	ctx := context.Background()
	if _, err := s.GetSetting(ctx, "pool"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an unset setting: %v", err)
	}
	if err := s.PutSetting(ctx, "pool", json.RawMessage(`{"pool":{"default:small":2}}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSetting(ctx, "pool", json.RawMessage(`{"pool":{"default:small":3}}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSetting(ctx, "other", json.RawMessage(`"x"`)); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSetting(ctx, "bad", json.RawMessage(`{`)); err == nil {
		t.Fatal("a value that is not JSON was stored")
	}
	boom := errors.New("boom")
	if err := s.Update(ctx, func(tx store.Tx) error {
		if err := tx.PutSetting(ctx, "pool", json.RawMessage(`{}`)); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	s.Close()
	s = reopen()
	var got struct {
		Pool map[string]int `json:"pool"`
	}
	if v, err := s.GetSetting(ctx, "pool"); err != nil || json.Unmarshal(v, &got) != nil || got.Pool["default:small"] != 3 || len(got.Pool) != 1 {
		t.Fatalf("the setting read back: %s %v", v, err)
	}
	if v, err := s.GetSetting(ctx, "other"); err != nil || string(v) != `"x"` {
		t.Fatalf("another setting: %s %v", v, err)
	}
	if err := s.DeleteSetting(ctx, "pool"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSetting(ctx, "pool"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if _, err := s.GetSetting(ctx, "pool"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a deleted setting: %v", err)
	}
}

// Sessions come back as written, after a reopen too; a touch moves a
// session's times but never brings back one deleted; a prune deletes the
// ended ones, and of a key's all but those that end last.
func sessions(t *testing.T, s store.Store, reopen func() store.Store) {
	ctx := context.Background()
	at := time.Unix(1_800_000_000, 0)
	sess := func(id, key string, ends time.Duration) *store.Session {
		return &store.Session{IDHash: id, KeyID: key, Expires: at.Add(8 * time.Hour), Used: at, Ends: at.Add(ends), Sealed: []byte("sealed " + id + "\x00\xff")}
	}
	a := sess("a", "k1", 30*time.Minute)
	for _, ss := range []*store.Session{a, sess("b", "k1", 20*time.Minute), sess("c", "k1", 10*time.Minute), sess("d", "k2", time.Minute)} {
		if err := s.PutSession(ctx, ss); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutSession(ctx, &store.Session{IDHash: "e", KeyID: "k1"}); err == nil {
		t.Fatal("a session without a payload was stored")
	}
	s.Close()
	s = reopen()
	got, err := s.GetSession(ctx, "a")
	if err != nil || got.KeyID != "k1" || !got.Expires.Equal(a.Expires) || !got.Used.Equal(at) || !got.Ends.Equal(a.Ends) || string(got.Sealed) != string(a.Sealed) {
		t.Fatalf("read back: %+v %v", got, err)
	}
	if _, err := s.GetSession(ctx, "nothing"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an unknown session: %v", err)
	}
	if err := s.TouchSession(ctx, "a", at.Add(time.Minute), at.Add(31*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetSession(ctx, "a"); err != nil || !got.Used.Equal(at.Add(time.Minute)) || !got.Ends.Equal(at.Add(31*time.Minute)) {
		t.Fatalf("touched: %+v %v", got, err)
	}
	// Ended by now: d (a minute); k1 keeps the two that end last (a, b).
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.PruneSessions(ctx, at.Add(time.Minute), "k1", 2) }); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{"a": true, "b": true, "c": false, "d": false} {
		if _, err := s.GetSession(ctx, id); (err == nil) != want || (err != nil && !errors.Is(err, store.ErrNotFound)) {
			t.Errorf("after the prune, session %s: %v (want kept: %v)", id, err, want)
		}
	}
	if err := s.DeleteSession(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSession(ctx, "b"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
	if err := s.TouchSession(ctx, "b", at, at.Add(time.Hour)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a touch of a deleted session: %v", err)
	}
	if _, err := s.GetSession(ctx, "b"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a deleted session came back: %v", err)
	}
	// A key's sessions go with it; another key's stay.
	if err := s.PutSession(ctx, sess("e", "k2", time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteKeySessions(ctx, "k1"); err != nil || s.DeleteKeySessions(ctx, "k9") != nil {
		t.Fatalf("delete a key's sessions: %v", err)
	}
	if _, err := s.GetSession(ctx, "a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a session of a key whose sessions were deleted: %v", err)
	}
	if _, err := s.GetSession(ctx, "e"); err != nil {
		t.Fatalf("another key's session: %v", err)
	}
}

// A URL per sandbox port (ErrConflict for a second), read back by ID
// and by sandbox.
func urls(t *testing.T, s store.Store, _ func() store.Store) {
	ctx := context.Background()
	u := &store.URL{URL: sandbox.URL{ID: sandbox.NewURLID(), SandboxID: "sbx_a", Port: 8080, Auth: "token", CreatedAt: time.Now()}, TokenHash: "ab"}
	if err := s.PutURL(ctx, u); err != nil {
		t.Fatal(err)
	}
	dup := *u
	dup.ID = sandbox.NewURLID()
	if err := s.PutURL(ctx, &dup); !errors.Is(err, store.ErrConflict) {
		t.Errorf("second URL for the port: %v, want ErrConflict", err)
	}
	u.TokenHash = "cd" // a rotation replaces the record
	if err := s.PutURL(ctx, u); err != nil {
		t.Fatal(err)
	}
	other := &store.URL{URL: sandbox.URL{ID: sandbox.NewURLID(), SandboxID: "sbx_b", Port: 8080, CreatedAt: time.Now()}, TokenHash: "ef"}
	if err := s.PutURL(ctx, other); err != nil {
		t.Fatal(err)
	}
	if l, err := s.ListURLs(ctx, "sbx_a"); err != nil || len(l) != 1 || l[0].TokenHash != "cd" {
		t.Errorf("ListURLs(sbx_a) = %v, %v", l, err)
	}
	if l, _ := s.ListURLs(ctx, ""); len(l) != 2 {
		t.Errorf("ListURLs() = %d records", len(l))
	}
	if err := s.DeleteURL(ctx, u.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteURL(ctx, u.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
	if _, err := s.GetURL(ctx, u.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("get deleted: %v", err)
	}
}

// Volumes are unique by name in their project, found by ID and by name,
// listed by project, and their attachments come back as written.
func volumes(t *testing.T, s store.Store, _ func() store.Store) {
	ctx := context.Background()
	now := time.Now().UTC()
	v := &store.Volume{ID: "vol_a", AccountID: "acc", ProjectID: "prj_1", Name: "data", SizeGB: 1, CreatedAt: now,
		Attachments: []model.VolumeAttachment{{SandboxID: "sbx_a", Path: "/mnt/data"}}}
	if err := s.PutVolume(ctx, v); err != nil {
		t.Fatal(err)
	}
	dup := *v
	dup.ID = "vol_b"
	if err := s.PutVolume(ctx, &dup); !errors.Is(err, store.ErrConflict) {
		t.Errorf("a second %q in the project: %v, want ErrConflict", v.Name, err)
	}
	dup.ProjectID = "prj_2"
	dup.CreatedAt = now.Add(time.Second)
	if err := s.PutVolume(ctx, &dup); err != nil {
		t.Errorf("the same name in another project: %v", err)
	}
	if got, err := s.VolumeByName(ctx, "prj_1", "data"); err != nil || got.ID != "vol_a" || len(got.Attachments) != 1 || got.Attachments[0].Path != "/mnt/data" {
		t.Errorf("VolumeByName = %+v, %v", got, err)
	}
	if l, err := s.ListVolumes(ctx, "prj_2"); err != nil || len(l) != 1 || l[0].ID != "vol_b" {
		t.Errorf("ListVolumes(prj_2) = %v, %v", l, err)
	}
	if l, _ := s.ListVolumes(ctx, ""); len(l) != 2 || l[0].ID != "vol_a" {
		t.Errorf("ListVolumes() = %v", l)
	}
	if err := s.DeleteVolume(ctx, "vol_a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetVolume(ctx, "vol_a"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("get deleted: %v", err)
	}
	if err := s.DeleteVolume(ctx, "vol_a"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
}

// Mesh ranges and addresses are unique in the store; an address is found
// by its project and name, and goes with its sandbox.
func mesh(t *testing.T, s store.Store, _ func() store.Store) {
	ctx := context.Background()
	if err := s.AddMeshRange(ctx, "prj_a", "10.240.0.0/22"); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][2]string{{"prj_b", "10.240.0.0/22"}, {"prj_a", "10.240.4.0/22"}} {
		if err := s.AddMeshRange(ctx, c[0], c[1]); !errors.Is(err, store.ErrConflict) {
			t.Errorf("AddMeshRange(%s, %s): %v, want ErrConflict", c[0], c[1], err)
		}
	}
	if r, err := s.MeshRanges(ctx); err != nil || len(r) != 1 || r["prj_a"] != "10.240.0.0/22" {
		t.Errorf("MeshRanges = %v, %v", r, err)
	}
	a1 := &store.MeshAddress{Addr: "10.240.0.1", ProjectID: "prj_a", SandboxID: "sbx_1", Name: "web"}
	if err := s.AddMeshAddress(ctx, a1); err != nil {
		t.Fatal(err)
	}
	for _, dup := range []*store.MeshAddress{
		{Addr: "10.240.0.1", ProjectID: "prj_a", SandboxID: "sbx_2", Name: "db"},
		{Addr: "10.240.0.2", ProjectID: "prj_a", SandboxID: "sbx_1", Name: "web"},
	} {
		if err := s.AddMeshAddress(ctx, dup); !errors.Is(err, store.ErrConflict) {
			t.Errorf("AddMeshAddress(%+v): %v, want ErrConflict", dup, err)
		}
	}
	if err := s.AddMeshAddress(ctx, &store.MeshAddress{Addr: "10.240.0.2", ProjectID: "prj_a", SandboxID: "sbx_2", Name: "db"}); err != nil {
		t.Fatal(err)
	}
	if l, err := s.MeshAddresses(ctx, "prj_a"); err != nil || len(l) != 2 || *l[0] != *a1 {
		t.Errorf("MeshAddresses = %v, %v", l, err)
	}
	// By host: a sandbox's address under its host's name; one without a
	// host (or a record) is under none.
	for _, sb := range []sandbox.Sandbox{{ID: "sbx_1", Host: "h1"}, {ID: "sbx_2", Host: "h2"}, {ID: "sbx_3"}} {
		sb.State, sb.CreatedAt = sandbox.StateRunning, time.Now().UTC()
		if err := s.PutSandbox(ctx, &store.Sandbox{Sandbox: sb}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddMeshAddress(ctx, &store.MeshAddress{Addr: "10.240.0.3", ProjectID: "prj_a", SandboxID: "sbx_3", Name: "c"}); err != nil {
		t.Fatal(err)
	}
	if m, err := s.MeshAddressesByHost(ctx); err != nil || len(m) != 2 || len(m["h1"]) != 1 || m["h1"][0] != "10.240.0.1" || len(m["h2"]) != 1 || m["h2"][0] != "10.240.0.2" {
		t.Errorf("MeshAddressesByHost = %v, %v", m, err)
	}
	if a, err := s.MeshAddressByName(ctx, "prj_a", "web"); err != nil || *a != *a1 {
		t.Errorf("by name: %v, %v", a, err)
	}
	if _, err := s.MeshAddressByName(ctx, "prj_b", "web"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("another project's name: %v, want ErrNotFound", err)
	}
	if err := s.DeleteMeshAddress(ctx, "sbx_1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MeshAddressByName(ctx, "prj_a", "web"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("after delete: %v, want ErrNotFound", err)
	}
	if err := s.DeleteMeshAddress(ctx, "sbx_1"); err != nil {
		t.Errorf("second delete: %v", err)
	}
	if m, err := s.MeshAddressesByHost(ctx); err != nil || len(m) != 1 || len(m["h2"]) != 1 {
		t.Errorf("MeshAddressesByHost after a delete = %v, %v", m, err)
	}
}

// Hosts' rows (a renewal replaces one) and sandboxes by host and state.
func hosts(t *testing.T, s store.Store, reopen func() store.Store) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	if _, err := s.GetHost(ctx, "a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetHost of none: %v", err)
	}
	a := &store.Host{Name: "a", Site: "local", Address: "https://127.0.0.1:9000", Capacity: sandbox.Resources{VCPUs: 8, MemoryMB: 8192, DiskGB: 100},
		Up: true, StartedAt: now, RenewedAt: now, LeaseUntil: now.Add(10 * time.Second)}
	b := *a
	b.Name, b.Up = "b", false
	for _, h := range []*store.Host{a, &b} {
		if err := s.PutHost(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	a.Used = sandbox.Resources{VCPUs: 2}
	if err := s.PutHost(ctx, a); err != nil { // (a renewal replaces the row)
		t.Fatal(err)
	}
	s = reopen()
	l, err := s.ListHosts(ctx)
	if err != nil || len(l) != 2 || l[0].Name != "a" || l[1].Name != "b" || l[0].Used.VCPUs != 2 || !l[0].LeaseUntil.Equal(a.LeaseUntil) || l[1].Up {
		t.Fatalf("ListHosts: %+v %v", l, err)
	}
	// Sandboxes by host and state.
	for i, r := range []struct {
		host  string
		state sandbox.State
	}{{"a", sandbox.StateRunning}, {"a", sandbox.StateDeleted}, {"b", sandbox.StateRunning}, {"a", sandbox.StatePaused}} {
		sb := &store.Sandbox{Sandbox: sandbox.Sandbox{ID: sandbox.NewID(), State: r.state, Host: r.host, CreatedAt: now.Add(time.Duration(i) * time.Second)}}
		if err := s.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	on, err := s.SandboxesOn(ctx, "a", sandbox.StateRunning, sandbox.StatePaused)
	if err != nil || len(on) != 2 || on[0].State != sandbox.StateRunning || on[1].State != sandbox.StatePaused || on[0].Host != "a" {
		t.Fatalf("SandboxesOn(a, running, paused): %+v %v", on, err)
	}
	if all, err := s.SandboxesOn(ctx, "a"); err != nil || len(all) != 3 {
		t.Fatalf("SandboxesOn(a): %d %v", len(all), err)
	}
	if err := s.DeleteHost(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteHost(ctx, "b"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("DeleteHost twice: %v", err)
	}
	if l, _ := s.ListHosts(ctx); len(l) != 1 || l[0].Name != "a" {
		t.Fatalf("after DeleteHost: %+v", l)
	}
	// A sandbox moves with its record.
	on[0].Host = "b"
	s.PutSandbox(ctx, on[0])
	if l, _ := s.SandboxesOn(ctx, "b"); len(l) != 2 {
		t.Fatalf("after a move: %d on b", len(l))
	}
}

// A notice reaches the store's listeners once its transaction commits,
// never when it rolls back; a notice outside a transaction at once; bad
// topics and oversized notices are refused.
func notify(t *testing.T, s store.Store, _ func() store.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type got struct{ topic, payload string }
	c := make(chan got, 16)
	s.Listen(ctx, func(topic, payload string) { c <- got{topic, payload} })
	if err := s.Update(ctx, func(tx store.Tx) error { return tx.Notify(ctx, "key", "committed") }); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := s.Update(ctx, func(tx store.Tx) error {
		if err := tx.Notify(ctx, "key", "never"); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("a rolled back update: %v", err)
	}
	if err := s.Notify(ctx, "key", "direct"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"committed", "direct"} {
		select {
		case g := <-c:
			if g.topic != "key" || g.payload != want {
				t.Fatalf("notice %q %q, want key %q", g.topic, g.payload, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no notice %q", want)
		}
	}
	if err := s.Notify(ctx, "a topic", "x"); err == nil {
		t.Fatal("a topic with a space was taken")
	}
	if err := s.Notify(ctx, "key", strings.Repeat("x", 4000)); err == nil { // (the bound is 4000 bytes, topic and payload)
		t.Fatal("an oversized notice was taken")
	}
	select {
	case g := <-c:
		t.Fatalf("unexpected notice %+v", g)
	case <-time.After(100 * time.Millisecond):
	}
}

// A shared token bucket: burst requests at once, then one per 1/rate;
// a clock that went back adds nothing; buckets are per key.
func tokenBucket(t *testing.T, s store.Store, reopen func() store.Store) {
	ctx := context.Background()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	take := func(st store.Store, key string, at time.Time) time.Duration {
		t.Helper()
		wait, err := st.TakeToken(ctx, key, 2, 3, at) // (2 a second, 3 at once)
		if err != nil {
			t.Fatal(err)
		}
		return wait
	}
	for i := range 3 {
		if w := take(s, "k", t0); w != 0 {
			t.Fatalf("take %d of the burst: wait %v", i+1, w)
		}
	}
	if w := take(s, "k", t0); w < 490*time.Millisecond || w > 500*time.Millisecond {
		t.Fatalf("the 4th at once: wait %v, want 500ms", w)
	}
	if w := take(s, "other", t0); w != 0 {
		t.Fatalf("another key's bucket: wait %v", w)
	}
	if w := take(s, "k", t0.Add(-time.Hour)); w == 0 {
		t.Fatal("a clock that went back filled the bucket")
	}
	// Half a second on: one more; then none. The bucket is the store's
	// (a second store on the database sees it).
	if w := take(reopen(), "k", t0.Add(500*time.Millisecond)); w != 0 {
		t.Fatalf("half a second on: wait %v", w)
	}
	if w := take(s, "k", t0.Add(500*time.Millisecond)); w == 0 {
		t.Fatal("two taken from one token")
	}
	// Long idle: full again, never more than the burst.
	for i := range 3 {
		if w := take(s, "k", t0.Add(time.Hour)); w != 0 {
			t.Fatalf("after an hour, take %d: wait %v", i+1, w)
		}
	}
	if w := take(s, "k", t0.Add(time.Hour)); w == 0 {
		t.Fatal("the bucket held more than its burst")
	}
}
