package store

import (
	"github.com/harebox/harebox/internal/testpg"

	"context"
	"database/sql"
	"errors"
	"testing"
	"time"
)

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
	// A hareboxd from before several hosts held a database alone, by an
	// exclusive lock on pgHostLock: it does not start beside hosts, and no
	// host starts beside it.
	old, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	conn, err := old.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tryOld := func() (ok bool) {
		if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, pgHostLock).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if tryOld() {
		t.Fatal("an older hareboxd took the database beside host-b")
	}
	other.Close()
	// (Close lets its locks go before it ends its session; on a loaded
	// machine that unlock may time out, and the server lets them go when
	// it sees the session end.)
	for deadline := time.Now().Add(10 * time.Second); !tryOld(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("an older hareboxd could not take the database once the hosts stopped")
		}
	}
	c := open()
	defer c.Close()
	if err := c.Claim(ctx, "host-c"); !errors.Is(err, ErrOlderHost) {
		t.Fatalf("beside an older hareboxd: %v", err)
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
