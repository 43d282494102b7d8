package store

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

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

// TestSetExtra: a record without Extra gets one; a key set is kept as
// JSON, set again replaces it, and the other parts' keys stay.
func TestSetExtra(t *testing.T) {
	var rec Sandbox
	rec.SetExtra("environment_version", 3)
	rec.SetExtra("firewall", json.RawMessage(`{"default_outbound":"deny"}`))
	rec.SetExtra("environment_version", 4)
	if got := string(rec.Extra["environment_version"]); got != "4" {
		t.Fatalf("environment_version: %s", got)
	}
	if got := string(rec.Extra["firewall"]); got != `{"default_outbound":"deny"}` {
		t.Fatalf("firewall: %s", got)
	}
	if len(rec.Extra) != 2 {
		t.Fatalf("extra: %v", rec.Extra)
	}
}
