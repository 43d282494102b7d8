package audit_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/internal/testpg"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// tamperDB is a log of ten entries, both checkpointed (at 6, and at 10
// by Close) in the database and in a file anchor, with the database
// opened raw beside the store.
type tamperDB struct {
	st      store.Store
	raw     *sql.DB
	pg      bool
	keyFile string
	anchor  *audit.FileAnchor
	pub     []byte
}

// denied is the seq of the entry the tampering hides: a denied request.
const denied = 3

// backends opens an empty database of each store, and the same database
// raw: SQLite, and PostgreSQL (one server for the test t, a database per
// case).
func backends(t *testing.T) map[string]func(t *testing.T) (store.Store, *sql.DB, bool) {
	var pg *testpg.Server
	var pgErr error
	return map[string]func(t *testing.T) (store.Store, *sql.DB, bool){
		"sqlite": func(t *testing.T) (store.Store, *sql.DB, bool) {
			path := filepath.Join(t.TempDir(), "h.db")
			st, err := store.OpenSQLite(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			raw, err := sql.Open("sqlite", path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { raw.Close() })
			return st, raw, false
		},
		"postgres": func(tt *testing.T) (store.Store, *sql.DB, bool) {
			if pg == nil && pgErr == nil {
				if pg, pgErr = testpg.Start(); pg != nil {
					t.Cleanup(func() { pg.Stop() })
				}
			}
			dsn := testpg.Database(tt, pg, pgErr)
			st, err := store.OpenPostgres(context.Background(), dsn)
			if err != nil {
				tt.Fatal(err)
			}
			tt.Cleanup(func() { st.Close() })
			raw, err := sql.Open("pgx", dsn)
			if err != nil {
				tt.Fatal(err)
			}
			tt.Cleanup(func() { raw.Close() })
			return st, raw, true
		},
	}
}

func newTamperDB(t *testing.T, open func(t *testing.T) (store.Store, *sql.DB, bool)) *tamperDB {
	t.Helper()
	ctx := context.Background()
	st, raw, pg := open(t)
	dir := t.TempDir()
	a, err := audit.OpenFileAnchor(filepath.Join(dir, "audit.anchor"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	d := &tamperDB{st: st, raw: raw, pg: pg, keyFile: filepath.Join(dir, "audit.key"), anchor: a}
	l := d.log(t)
	d.pub = l.PublicKey()
	key := authz.WithPrincipal(ctx, authz.Principal{AccountID: "acc_a", KeyID: "key_a"})
	key = authz.WithSource(audit.WithRequestID(key, "req_1"), netip.MustParseAddr("192.0.2.7"))
	op := authz.WithPrincipal(ctx, authz.Operator)
	for i := 1; i <= 10; i++ {
		switch i {
		case denied:
			l.Record(key, "exec", "", "sbx_other", sandbox.Errorf(sandbox.ErrForbidden, "", "no"))
		case 6:
			l.RecordEvent("engine", "acc_a", "vmExited", "sbx_a")
			if err := l.Checkpoint(ctx); err != nil {
				t.Fatal(err)
			}
		case 8:
			l.Record(op, "deleteKey", "acc_b", "key_b", nil)
		default:
			l.Record(key, "exec", "", "sbx_a", nil)
		}
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *tamperDB) log(t *testing.T) *audit.Log {
	t.Helper()
	l, err := audit.Open(context.Background(), d.st, audit.Options{KeyFile: d.keyFile, Log: slog.New(slog.DiscardHandler), Anchor: d.anchor})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (d *tamperDB) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := d.raw.Exec(numbered(d, q), args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// numbered makes ? placeholders PostgreSQL's $N.
func numbered(d *tamperDB, q string) string {
	if !d.pg {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// verify is what verify says with the anchor (and, as before anchors,
// without).
func (d *tamperDB) verify(t *testing.T) (anchored, dbOnly *audit.Report) {
	t.Helper()
	ctx := context.Background()
	a, err := audit.VerifyAnchored(ctx, d.st, d.pub, d.anchor)
	if err != nil {
		t.Fatal(err)
	}
	b, err := audit.Verify(ctx, d.st, d.pub)
	if err != nil {
		t.Fatal(err)
	}
	return a, b
}

// columns are the audit table's columns, as the database has them.
func columns(t *testing.T, d *tamperDB) []string {
	t.Helper()
	q := `SELECT name FROM pragma_table_info('audit_log')`
	if d.pg {
		q = `SELECT column_name FROM information_schema.columns WHERE table_name = 'audit_log'`
	}
	rows, err := d.raw.Query(q)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var c string
		rows.Scan(&c)
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// A change to any column of an entry, the ones that filters match
// included, is reported with the entry's seq, and a read that meets the
// entry refuses it; so are a removed row, two rows swapped, and a tail
// cut with or without its checkpoints (the anchor still has them). Both
// stores, through raw SQL on the real database.
func TestTamperEveryColumn(t *testing.T) {
	t.Parallel()
	// Each column of audit_log, changed in the denied entry.
	byColumn := map[string]string{
		"seq":        `UPDATE audit_log SET seq = 1000 WHERE seq = 3`,
		"time":       `UPDATE audit_log SET time = time + 1 WHERE seq = 3`,
		"account_id": `UPDATE audit_log SET account_id = 'acc_b' WHERE seq = 3`,
		"principal":  `UPDATE audit_log SET principal = 'operator' WHERE seq = 3`,
		"action":     `UPDATE audit_log SET action = 'getSandbox' WHERE seq = 3`,
		"target":     `UPDATE audit_log SET target = 'sbx_a' WHERE seq = 3`,
		"outcome":    `UPDATE audit_log SET outcome = 'ok' WHERE seq = 3`,
		"record":     `UPDATE audit_log SET record = replace(record, '"source":"192.0.2.7"', '"source":"198.51.100.1"') WHERE seq = 3`,
	}
	for name, open := range backends(t) {
		t.Run(name, func(t *testing.T) {
			ctx := authz.WithPrincipal(context.Background(), authz.Operator)
			d := newTamperDB(t, open)
			if cols, want := columns(t, d), slices.Sorted(maps.Keys(byColumn)); !slices.Equal(cols, want) {
				t.Fatalf("audit_log has columns %v; this test tampers with %v: add the new ones", cols, want)
			}
			if r, _ := d.verify(t); !r.OK || r.Entries != 10 || r.Anchored != 10 || r.Unanchored != 0 || r.Anchor != d.anchor.String() {
				t.Fatalf("untouched: %+v", r)
			}
			// One database, the entry put back after each change.
			var orig []any
			for range 8 {
				orig = append(orig, new(any))
			}
			if err := d.raw.QueryRow(`SELECT seq, time, account_id, principal, action, target, outcome, record FROM audit_log WHERE seq = 3`).Scan(orig...); err != nil {
				t.Fatal(err)
			}
			for col, q := range byColumn {
				t.Run(col, func(t *testing.T) {
					d.exec(t, q)
					defer func() {
						d.exec(t, `DELETE FROM audit_log WHERE seq IN (3, 1000)`)
						var vals []any
						for _, v := range orig {
							vals = append(vals, *v.(*any))
						}
						d.exec(t, `INSERT INTO audit_log (seq, time, account_id, principal, action, target, outcome, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, vals...)
						if r, _ := d.verify(t); !r.OK {
							t.Fatalf("put back: %+v", r)
						}
					}()
					r, _ := d.verify(t)
					if r.OK || r.FirstBad != denied {
						t.Fatalf("%s changed: %+v, want entry %d reported", col, r, denied)
					}
					t.Logf("%s: %s", col, r.Reason)
					// A read that meets the row refuses it.
					if l, err := d.log(t).List(ctx, store.AuditFilter{}); !errors.Is(err, audit.ErrAltered) {
						t.Fatalf("%s changed: a list read %d entries, %v", col, len(l), err)
					}
				})
			}
			// The attack itself: the denied entry drops out of
			// outcome=denied; verify, which reads every row, says so.
			t.Run("hidden from a filter", func(t *testing.T) {
				d := newTamperDB(t, open)
				l := d.log(t)
				if got, err := l.List(ctx, store.AuditFilter{Outcome: audit.Denied}); err != nil || len(got) != 1 || got[0].Seq != denied {
					t.Fatalf("denied before: %+v %v", got, err)
				}
				d.exec(t, byColumn["outcome"])
				if got, err := l.List(ctx, store.AuditFilter{Outcome: audit.Denied}); err != nil || len(got) != 0 {
					t.Fatalf("denied after: %+v %v", got, err)
				}
				r, _ := d.verify(t)
				if r.OK || r.FirstBad != denied || !strings.Contains(r.Reason, "outcome") {
					t.Fatalf("%+v", r)
				}
			})
			if name == "postgres" {
				return // (the rest reads no column: as on SQLite)
			}
			t.Run("an unreadable record", func(t *testing.T) {
				d := newTamperDB(t, open)
				d.exec(t, `UPDATE audit_log SET record = '{' WHERE seq = 3`)
				if r, _ := d.verify(t); r.OK || r.FirstBad != denied {
					t.Fatalf("%+v", r)
				}
			})
			t.Run("a row removed", func(t *testing.T) {
				d := newTamperDB(t, open)
				d.exec(t, `DELETE FROM audit_log WHERE seq = 4`)
				if r, _ := d.verify(t); r.OK || r.FirstBad != 4 {
					t.Fatalf("%+v", r)
				}
			})
			t.Run("two rows swapped", func(t *testing.T) {
				// Every column and the record, each record's seq set
				// to its new place: each row agrees with itself.
				d := newTamperDB(t, open)
				type row struct {
					at                                               int64
					account, principal, action, target, outcome, rec string
				}
				rows := map[int64]*row{}
				for _, seq := range []int64{4, 5} {
					r := &row{}
					if err := d.raw.QueryRow(numbered(d, `SELECT time, account_id, principal, action, target, outcome, record FROM audit_log WHERE seq = ?`), seq).
						Scan(&r.at, &r.account, &r.principal, &r.action, &r.target, &r.outcome, &r.rec); err != nil {
						t.Fatal(err)
					}
					rows[seq] = r
				}
				for seq, from := range map[int64]int64{4: 5, 5: 4} {
					r := rows[from]
					var e store.AuditEntry
					json.Unmarshal([]byte(r.rec), &e)
					e.Seq = seq
					b, _ := json.Marshal(&e)
					d.exec(t, `UPDATE audit_log SET time = ?, account_id = ?, principal = ?, action = ?, target = ?, outcome = ?, record = ? WHERE seq = ?`,
						r.at, r.account, r.principal, r.action, r.target, r.outcome, string(b), seq)
				}
				if r, _ := d.verify(t); r.OK || r.FirstBad != 4 {
					t.Fatalf("%+v", r)
				}
			})
			t.Run("the tail cut", func(t *testing.T) {
				d := newTamperDB(t, open)
				d.exec(t, `DELETE FROM audit_log WHERE seq > 8`)
				a, b := d.verify(t)
				if a.OK || a.FirstBad != 9 || b.OK || b.FirstBad != 9 {
					t.Fatalf("%+v; without the anchor %+v", a, b)
				}
			})
			t.Run("the tail cut with its checkpoints", func(t *testing.T) {
				d := newTamperDB(t, open)
				d.exec(t, `DELETE FROM audit_log WHERE seq > 8`)
				d.exec(t, `DELETE FROM audit_checkpoints WHERE seq > 8`)
				a, b := d.verify(t)
				if !b.OK {
					t.Fatalf("without the anchor: %+v (the database alone cannot tell)", b)
				}
				if a.OK || a.FirstBad != 9 || !strings.Contains(a.Reason, "anchor") {
					t.Fatalf("%+v", a)
				}
				t.Log(a.Reason)
			})
			t.Run("the anchor forged", func(t *testing.T) {
				d := newTamperDB(t, open)
				d.exec(t, `DELETE FROM audit_log WHERE seq > 8`)
				d.exec(t, `DELETE FROM audit_checkpoints WHERE seq > 8`)
				cps, err := d.anchor.Checkpoints(context.Background())
				if err != nil || len(cps) != 2 {
					t.Fatal(cps, err)
				}
				// A line for the new end, unsigned: refused.
				forged := *cps[0]
				forged.Seq, forged.Hash = 8, strings.Repeat("0", 64)
				if err := d.anchor.Put(context.Background(), &forged); err != nil {
					t.Fatal(err)
				}
				if r, _ := d.verify(t); r.OK {
					t.Fatalf("%+v", r)
				}
			})
		})
	}
}
