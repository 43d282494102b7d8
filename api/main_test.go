package api_test

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/harebox/harebox/internal/testpg"
)

// A PostgreSQL server, started by the first test that needs one and
// stopped when the tests end.
var (
	pgOnce sync.Once
	pg     *testpg.Server
	pgErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if pg != nil {
		if err := pg.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	os.Exit(code)
}

// postgresDatabase returns the DSN of a new, empty database.
func postgresDatabase(t *testing.T) string {
	t.Helper()
	pgOnce.Do(func() { pg, pgErr = testpg.Start() })
	return testpg.Database(t, pg, pgErr)
}
