package store

import (
	"github.com/harebox/harebox/internal/testpg"

	"context"
	"database/sql"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
)

// Update commits all of fn's writes or none; names are unique in their
// parent; live sandboxes are counted per account, project and fleet.
func TestUpdateAndTenancy(t *testing.T) { forEachStore(t, testUpdateAndTenancy) }

func testUpdateAndTenancy(t *testing.T, s *DB, _ func() *DB) {
	ctx := context.Background()
	now := time.Now().UTC()
	boom := errors.New("boom")
	err := s.Update(ctx, func(tx Tx) error {
		if err := tx.PutAccount(ctx, &Account{ID: "acc_1", Name: "a", CreatedAt: now}); err != nil {
			return err
		}
		if err := tx.PutProject(ctx, &Project{ID: "prj_1", AccountID: "acc_1", Name: "web", CreatedAt: now}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if _, err := s.GetAccount(ctx, "acc_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a rolled-back account exists: %v", err)
	}
	if _, err := s.GetProject(ctx, "prj_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a rolled-back project exists: %v", err)
	}
	err = s.Update(ctx, func(tx Tx) error {
		if err := tx.PutAccount(ctx, &Account{ID: "acc_1", Name: "a", CreatedAt: now}); err != nil {
			return err
		}
		return tx.PutProject(ctx, &Project{ID: "prj_1", AccountID: "acc_1", Name: "web", CreatedAt: now})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutAccount(ctx, &Account{ID: "acc_2", Name: "a", CreatedAt: now}); !errors.Is(err, ErrConflict) {
		t.Fatalf("a second account named a: %v", err)
	}
	if err := s.PutProject(ctx, &Project{ID: "prj_2", AccountID: "acc_1", Name: "web", CreatedAt: now}); !errors.Is(err, ErrConflict) {
		t.Fatalf("a second project named web: %v", err)
	}
	if p, err := s.ProjectByName(ctx, "acc_1", "web"); err != nil || p.ID != "prj_1" {
		t.Fatalf("project by name: %+v %v", p, err)
	}
	for i, st := range []sandbox.State{sandbox.StateRunning, sandbox.StatePaused, sandbox.StateDeleted} {
		sb := &Sandbox{Sandbox: sandbox.Sandbox{ID: sandbox.NewID(), State: st, AccountID: "acc_1", ProjectID: "prj_1", FleetID: map[bool]string{true: "flt_1"}[i == 0], CreatedAt: now}}
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
	k := &Key{ID: "key_1", AccountID: "acc_1", Scope: authz.Scope{Actions: []string{"exec"}}, CreatedAt: now, Hash: []byte{1, 2, 3}}
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
func TestConcurrentUpdates(t *testing.T) { forEachStore(t, testConcurrentUpdates) }

func testConcurrentUpdates(t *testing.T, s *DB, _ func() *DB) {
	ctx := context.Background()
	if err := s.PutSecret(ctx, "c", "n", []byte("0")); err != nil {
		t.Fatal(err)
	}
	const workers, each = 4, 25
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func() {
			for i := 0; i < each; i++ {
				err := s.Update(ctx, func(tx Tx) error {
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

// Scrub runs on both stores once secrets were deleted.
func TestScrub(t *testing.T) { forEachStore(t, testScrub) }

func testScrub(t *testing.T, s *DB, _ func() *DB) {
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
	if _, err := s.GetSecret(ctx, "sandbox/x", "key"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after scrub: %v", err)
	}
}

// One store holds a host's name on a PostgreSQL database until it closes;
// other hosts share the database.
func TestPostgresHostHeldByOne(t *testing.T) {
	ctx := context.Background()
	dsn := testpg.Database(t, pg, pgErr)
	open := func() *DB {
		s, err := OpenPostgres(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b, other := open(), open(), open()
	defer other.Close()
	if err := a.Claim(ctx, "host-a"); err != nil {
		t.Fatal(err)
	}
	if err := b.Claim(ctx, "host-a"); !errors.Is(err, ErrInUse) {
		t.Fatalf("a second store as the same host: %v", err)
	}
	if err := other.Claim(ctx, "host-b"); err != nil {
		t.Fatalf("another host on the database: %v", err)
	}
	a.Close()
	if err := b.Claim(ctx, "host-a"); err != nil {
		t.Fatalf("after the first closed: %v", err)
	}
	b.Close()
}

// Text any request can carry (invalid UTF-8, NUL) is stored: PostgreSQL
// refuses it in TEXT columns as sent, SQLite keeps it.
func TestRawText(t *testing.T) { forEachStore(t, testRawText) }

func testRawText(t *testing.T, s *DB, _ func() *DB) {
	ctx := context.Background()
	e := &AuditEntry{Seq: 1, Time: time.Now().UTC(), Principal: "key_x", Action: "getSandbox", Target: "sbx_\xff\x00../x", Outcome: "denied"}
	if err := s.AppendAudit(ctx, e); err != nil {
		t.Fatal(err)
	}
	l, err := s.ListAudit(ctx, AuditFilter{Limit: 10})
	if err != nil || len(l) != 1 || l[0].Action != "getSandbox" {
		t.Fatalf("ListAudit: %+v %v", l, err)
	}
	if _, err := s.GetAccount(ctx, "acc_\xff\x00"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a lookup by a raw name: %v", err)
	}
}

// A store whose owner connection dies takes the lock again; if another
// store took it meanwhile, Lost says so.
func TestPostgresOwnerKept(t *testing.T) {
	dsn := testpg.Database(t, pg, pgErr)
	defer func(d time.Duration) { pgHeartbeat = d }(pgHeartbeat)
	pgHeartbeat = 20 * time.Millisecond
	ctx := context.Background()
	claim := func() (*DB, error) {
		s, err := OpenPostgres(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Claim(ctx, "host-a"); err != nil {
			s.Close()
			return nil, err
		}
		return s, nil
	}
	s, err := claim()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	holder := func() int {
		var pid int
		admin.QueryRowContext(ctx, `SELECT COALESCE(MAX(pid), 0) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2 AND granted`, pgHostLock, hostLockID("host-a")).Scan(&pid)
		return pid
	}
	first := holder()
	if first == 0 {
		t.Fatal("nobody holds the lock")
	}
	if _, err := admin.ExecContext(ctx, `SELECT pg_terminate_backend($1)`, first); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for holder() == 0 || holder() == first {
		if time.Now().After(deadline) {
			t.Fatal("the store did not take its lock again")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-s.Lost():
		t.Fatal("lost after taking the lock again")
	default:
	}
	// Its connection killed again, and another store quicker to take it.
	var other *DB
	for try := 0; other == nil && try < 50; try++ {
		admin.ExecContext(ctx, `SELECT pg_terminate_backend($1)`, holder())
		other, err = claim()
		if err != nil && !errors.Is(err, ErrInUse) {
			t.Fatal(err)
		}
	}
	if other == nil {
		t.Fatal("no other store got the lock")
	}
	defer other.Close()
	select {
	case <-s.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the first store did not notice it lost the database")
	}
}
