package audit_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"

	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/internal/testpg"
	"github.com/harebox/harebox/store"
)

// Hosts that share a PostgreSQL store append to one chain: entries
// written at once through two of them make one unbroken, verified chain
// (each append reads the chain's end in its transaction; two that take
// the same place conflict and the loser goes again).
func TestHostsAppendToOneChain(t *testing.T) {
	t.Parallel()
	dsn := testpg.ForTest(t)
	ctx := authz.WithPrincipal(context.Background(), authz.Operator)
	keyFile := filepath.Join(t.TempDir(), "audit.key") // (the hosts share it)
	var logs []*audit.Log
	for range 2 {
		db, err := store.OpenPostgres(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		l, err := audit.Open(ctx, db, audit.Options{KeyFile: keyFile, Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		logs = append(logs, l)
	}
	const each = 40
	var wg sync.WaitGroup
	for i, l := range logs {
		for j := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range each {
					l.Record(ctx, "createSandbox", "", fmt.Sprintf("host%d-%d-%d", i, j, k), nil)
				}
			}()
		}
	}
	wg.Wait()
	if err := logs[0].Checkpoint(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := logs[1].Verify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK || r.Entries != 4*each {
		t.Fatalf("verify: %+v, want %d entries in one chain", r, 4*each)
	}
}
