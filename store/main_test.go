package store

import (
	"fmt"
	"os"
	"testing"

	"github.com/harebox/harebox/internal/testpg"
)

// A real PostgreSQL server (Debian's) in a temporary directory, for the
// conformance suite (conformance_test.go) and PostgreSQL's own tests.
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

// PostgresForTests is the test PostgreSQL server (for the conformance suite,
// in package store_test).
func PostgresForTests() (*testpg.Server, error) { return pg, pgErr }
