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

// An entry appended in the caller's transaction (RecordIn) is signed like
// any other: within the interval, and at close, in the database and in
// the anchor. (The log learns of it from the database, as far as it
// chains from the end the log knows.)
func TestCheckpointCoversRecordIn(t *testing.T) {
	dir := t.TempDir()
	ctx := authz.WithPrincipal(context.Background(), authz.Operator)
	db, err := store.OpenSQLite(ctx, filepath.Join(dir, "h.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a, err := audit.OpenFileAnchor(filepath.Join(dir, "audit.anchor"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	l, err := audit.Open(ctx, db, audit.Options{KeyFile: filepath.Join(dir, "audit.key"), Anchor: a, Interval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	in := func() {
		t.Helper()
		if err := db.Update(ctx, func(tx store.Tx) error { return l.RecordIn(ctx, tx, "createSandbox", "acc_a", "sbx_a", nil) }); err != nil {
			t.Fatal(err)
		}
	}
	anchored := func() int64 {
		cps, err := a.Checkpoints(ctx)
		if err != nil || len(cps) == 0 {
			return 0
		}
		return cps[len(cps)-1].Seq
	}
	in()
	for deadline := time.Now().Add(5 * time.Second); anchored() != 1; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("entry 1 (RecordIn) not anchored within the interval: %d", anchored())
		}
	}
	l.Record(ctx, "exec", "", "sbx_a", nil)
	in()
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := anchored(); got != 3 {
		t.Fatalf("anchored at close: %d, want 3", got)
	}
	if r, err := l.Verify(ctx); err != nil || !r.OK || r.Anchored != 3 || r.Unanchored != 0 || r.Checkpoints != 2 {
		t.Fatalf("verify: %+v %v", r, err)
	}
}
