package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/harebox/harebox/internal/testpg"
)

// The store suite runs on both stores: SQLite in a temporary file, and a
// real PostgreSQL server (Debian's) in a temporary directory, one
// database per test.
var (
	pg    *testpg.Server
	pgErr error
)

func TestMain(m *testing.M) {
	pg, pgErr = testpg.Start()
	code := m.Run()
	if pg != nil {
		if err := pg.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	os.Exit(code)
}

// forEachStore runs test on a new SQLite store and a new PostgreSQL one;
// reopen opens the same database again (a restart).
func forEachStore(t *testing.T, test func(t *testing.T, s *DB, reopen func() *DB)) {
	ctx := context.Background()
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state.db")
		open := func() *DB {
			t.Helper()
			s, err := OpenSQLite(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
		test(t, open(), open)
	})
	t.Run("postgres", func(t *testing.T) {
		dsn := testpg.Database(t, pg, pgErr)
		open := func() *DB {
			t.Helper()
			s, err := OpenPostgres(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
		test(t, open(), open)
	})
}
