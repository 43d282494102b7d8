package audit_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

func open(t testing.TB) (*audit.Log, store.Store) {
	t.Helper()
	dir := t.TempDir()
	db, err := store.OpenSQLite(context.Background(), filepath.Join(dir, "h.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	l, err := audit.Open(context.Background(), db, audit.Options{KeyFile: filepath.Join(dir, "audit.key"), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return l, db
}

// Entries chain, checkpoints sign every CheckpointEvery entries, and the
// outcome names the error's kind, never its message.
func TestRecordChainAndCheckpoints(t *testing.T) {
	l, db := open(t)
	ctx := authz.WithPrincipal(context.Background(), authz.Principal{AccountID: "acc_a", KeyID: "key_k"})
	for i := range audit.CheckpointEvery + 3 {
		var err error
		if i == 1 {
			err = sandbox.Errorf(sandbox.ErrForbidden, "", "secret-looking message %d", i)
		}
		if i == 2 {
			err = errors.New("an internal failure with /host/paths")
		}
		l.Record(ctx, "exec", "", "sbx_x", err)
	}
	es, err := db.ListAudit(context.Background(), store.AuditFilter{Limit: 3})
	if err != nil || len(es) != 3 {
		t.Fatal(es, err)
	}
	if es[0].Outcome != audit.OK || es[1].Outcome != audit.Denied || es[1].Error != "forbidden" || es[2].Outcome != audit.Failed || es[2].Error != "internal" ||
		es[1].Principal != "key_k" || es[1].AccountID != "acc_a" || es[1].Prev != es[0].Hash {
		t.Fatalf("entries: %+v", es)
	}
	cps, _ := db.ListAuditCheckpoints(context.Background())
	if len(cps) != 1 || cps[0].Seq != audit.CheckpointEvery {
		t.Fatalf("checkpoints: %+v", cps)
	}
	if err := l.Checkpoint(context.Background()); err != nil {
		t.Fatal(err)
	}
	rep, err := audit.Verify(context.Background(), db, l.PublicKey())
	if err != nil || !rep.OK || rep.Entries != audit.CheckpointEvery+3 || rep.Checkpoints != 2 {
		t.Fatalf("verify: %+v %v", rep, err)
	}
	// A checkpoint signed by another key does not verify.
	other, _ := open(t)
	if rep, _ := audit.Verify(context.Background(), db, other.PublicKey()); rep.OK {
		t.Fatal("checkpoints verified with another key")
	}
}

// BenchmarkRecord is the cost of one audit append (a recorded request
// pays it once; a get is not recorded), as the p50 of single appends.
func BenchmarkRecord(b *testing.B) {
	l, _ := open(b)
	ctx := authz.WithPrincipal(context.Background(), authz.Principal{AccountID: "acc_a", KeyID: "key_k"})
	d := make([]time.Duration, 0, b.N)
	for range b.N {
		start := time.Now()
		l.Record(ctx, "exec", "", "sbx_x", nil)
		d = append(d, time.Since(start))
	}
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Microseconds()), "append-p50-µs")
}

// A placeholder sent where it is not swapped is the guest's act, refused.
func TestRecordPlaceholder(t *testing.T) {
	l, db := open(t)
	l.RecordPlaceholder("acc_a", "sbx_s", "evil.example")
	es, err := db.ListAudit(context.Background(), store.AuditFilter{})
	if err != nil || len(es) != 1 || es[0].Principal != "sandbox:sbx_s" || es[0].Action != "usePlaceholder" ||
		es[0].Target != "evil.example" || es[0].Outcome != audit.Denied || es[0].AccountID != "acc_a" {
		t.Fatalf("%+v %v", es, err)
	}
}
