package store_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/harebox/harebox/internal/testpg"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/store/storetest"
)

// The conformance suite on both stores: SQLite in a temporary file, and a
// real PostgreSQL server (Debian's) in a temporary directory, a database
// per test.
func TestConformance(t *testing.T) {
	ctx := context.Background()
	t.Run("sqlite", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) (store.Store, func() store.Store) {
			path := filepath.Join(t.TempDir(), "state.db")
			open := func() store.Store {
				t.Helper()
				s, err := store.OpenSQLite(ctx, path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			}
			return open(), open
		})
	})
	t.Run("postgres", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) (store.Store, func() store.Store) {
			srv, err := store.PostgresForTests()
			dsn := testpg.Database(t, srv, err)
			open := func() store.Store {
				t.Helper()
				s, err := store.OpenPostgres(ctx, dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			}
			return open(), open
		})
	})
}
