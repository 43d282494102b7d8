package store

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/sandbox"
)

func TestRoundTripAndReopen(t *testing.T) { forEachStore(t, testRoundTripAndReopen) }

func testRoundTripAndReopen(t *testing.T, s *DB, reopen func() *DB) {
	ctx := context.Background()
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	a := &Sandbox{
		Sandbox:  sandbox.Sandbox{ID: sandbox.NewID(), State: sandbox.StateRunning, CreatedAt: time.Now().UTC(), ExpiresAt: &exp, Labels: map[string]string{"k": "v"}},
		Handle:   &hypervisor.Handle{Backend: "qemu", ID: "m", Data: []byte(`{"pid":1}`)},
		StateDir: "/x",
	}
	b := &Sandbox{Sandbox: sandbox.Sandbox{ID: sandbox.NewID(), State: sandbox.StateCreating, CreatedAt: time.Now().UTC().Add(time.Second)}}
	for _, sb := range []*Sandbox{a, b} {
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
	if _, err := s.GetSandbox(ctx, a.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get deleted: %v", err)
	}
	if err := s.DeleteSandbox(ctx, a.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
}

func TestSQLiteRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	s.db.Exec(`INSERT INTO schema_migrations (version, applied_at) VALUES (999, 0)`)
	s.Close()
	if _, err := OpenSQLite(ctx, path); err == nil {
		t.Fatal("opened a database from a newer binary")
	}
}

// TestScrubNotFooledByAReader: while another connection reads from an old
// snapshot, a checkpoint cannot copy the scrubbed pages back; Scrub says so
// instead of passing, and succeeds once the reader is gone.
func TestScrubNotFooledByAReader(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.PutSecret(ctx, "sandbox/x", "data-key", []byte("sealed")); err != nil {
		t.Fatal(err)
	}
	reader, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	tx, err := reader.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow(`SELECT count(*) FROM secrets`).Scan(&n); err != nil || n != 1 {
		t.Fatal(n, err)
	}
	if err := s.DeleteSecret(ctx, "sandbox/x", "data-key"); err != nil {
		t.Fatal(err)
	}
	// (The store's one connection waits 5 s for a reader; not here.)
	if _, err := s.db.ExecContext(ctx, `PRAGMA busy_timeout = 50`); err != nil {
		t.Fatal(err)
	}
	if err := s.Scrub(ctx); err == nil || !strings.Contains(err.Error(), "blocked") {
		t.Fatal("a scrub blocked by a reader:", err)
	}
	tx.Rollback()
	if err := s.Scrub(ctx); err != nil {
		t.Fatal("scrub after the reader left:", err)
	}
}
