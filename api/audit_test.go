package api_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/harebox/harebox/api"
	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/store"
)

// The audit log records who did what to what, denied attempts too, and
// nothing secret; a key sees its own account's entries.
func TestAuditLog(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	w := buildWorld(t, f)
	req := func(method, path, key, body, rid string) reply {
		t.Helper()
		r, _ := http.NewRequest(method, f.url+path, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+key)
		if rid != "" {
			r.Header.Set("X-Request-ID", rid)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		out := reply{status: resp.StatusCode, raw: raw, header: resp.Header}
		json.Unmarshal(raw, &out.body)
		return out
	}
	var keyID string // the full key's, the only one it sees
	for _, k := range ids(f.must(t, 200, "GET", "/v1/keys", w.fullA, nil).body["keys"]) {
		keyID = k
	}
	if r := req("POST", "/v1/sandboxes/"+w.boxA1+"/exec", w.fullA, `{"cmd": "echo audit-canary-output"}`, "req-exec-1"); r.status != 200 || r.header.Get("X-Request-ID") != "req-exec-1" {
		t.Fatalf("exec: %d %s %v", r.status, r.raw, r.header)
	}
	req("POST", "/v1/sandboxes/"+w.boxB1+"/exec", w.fullA, `{"cmd": "echo x"}`, "req-denied")
	req("PUT", "/v1/sandboxes/"+w.boxA1+"/files?path=/tmp/f", f.root, "audit-canary-content", "")
	if r := req("GET", "/v1/sandboxes", w.fullA, "", "bad id with spaces"); strings.Contains(r.header.Get("X-Request-ID"), " ") {
		t.Errorf("a malformed request ID was kept: %q", r.header.Get("X-Request-ID"))
	}

	all := f.must(t, 200, "GET", "/v1/audit?limit=1000", f.root, nil)
	if strings.Contains(string(all.raw), "canary") {
		t.Fatalf("the audit log holds request data: %s", all.raw)
	}
	var entries []store.AuditEntry
	b, _ := json.Marshal(all.body["entries"])
	json.Unmarshal(b, &entries)
	find := func(rid string) *store.AuditEntry {
		for i := range entries {
			if entries[i].RequestID == rid {
				return &entries[i]
			}
		}
		return nil
	}
	if e := find("req-exec-1"); e == nil || e.Action != "exec" || e.Principal != keyID || e.AccountID != w.accA ||
		e.Target != w.boxA1 || e.Outcome != "ok" || e.Source != "127.0.0.1" {
		t.Errorf("the exec entry: %+v", e)
	}
	if e := find("req-denied"); e == nil || e.Outcome != "denied" || e.Error != "not_found" || e.AccountID != w.accA || e.Principal != keyID {
		t.Errorf("the denied entry: %+v", e)
	}
	// buildWorld's creates, by the operator, are there too.
	n := 0
	for _, e := range entries {
		if e.Action == "createSandbox" && e.Principal == "operator" && e.Outcome == "ok" {
			n++
		}
	}
	if n != 3 {
		t.Errorf("%d createSandbox entries by the operator, want 3", n)
	}

	// A key sees its account's entries only; filters and pages.
	mine := f.must(t, 200, "GET", "/v1/audit?limit=1000", w.fullA, nil)
	for _, e := range mine.body["entries"].([]any) {
		if e.(map[string]any)["account_id"] != w.accA {
			t.Errorf("alpha's key sees %v", e)
		}
	}
	if r := f.must(t, 200, "GET", "/v1/audit?outcome=denied&principal="+keyID, f.root, nil); len(r.body["entries"].([]any)) != 1 {
		t.Errorf("filter by outcome and principal: %s", r.raw)
	}
	page := f.must(t, 200, "GET", "/v1/audit?limit=2", f.root, nil)
	next := str(page, "next")
	page2 := f.must(t, 200, "GET", "/v1/audit?limit=2&after="+next, f.root, nil)
	if len(page.body["entries"].([]any)) != 2 || page2.body["entries"].([]any)[0].(map[string]any)["seq"] != float64(3) {
		t.Errorf("pages: %s then %s", page.raw, page2.raw)
	}
	jl := f.must(t, 200, "GET", "/v1/audit?format=jsonl", f.root, nil)
	if lines := strings.Count(string(jl.raw), "\n"); lines != len(entries) || jl.header.Get("Content-Type") != "application/x-ndjson" {
		t.Errorf("JSON Lines export: %d lines for %d entries", lines, len(entries))
	}
	f.must(t, 400, "GET", "/v1/audit?from=yesterday", f.root, nil)
	if r := f.must(t, 200, "GET", "/v1/audit?from=2999-01-01T00:00:00Z", f.root, nil); len(r.body["entries"].([]any)) != 0 {
		t.Errorf("entries from the year 2999: %s", r.raw)
	}
	if r := f.must(t, 200, "GET", "/v1/audit?from=1000-01-01T00:00:00Z&limit=1", f.root, nil); len(r.body["entries"].([]any)) != 1 {
		t.Errorf("entries from the year 1000: %s", r.raw)
	}
	f.must(t, 200, "GET", "/v1/audit?format=jsonl&limit=5000", f.root, nil)
	// The operator's changes in an account are that account's, with the
	// objects' IDs as targets; the filter takes a name.
	prj := f.must(t, 201, "POST", "/v1/projects?account=beta", f.root, map[string]any{"name": "audited"})
	r := f.must(t, 200, "GET", "/v1/audit?account=beta&action=createProject", f.root, nil)
	if l := r.body["entries"].([]any); len(l) != 1 || l[0].(map[string]any)["target"] != str(prj, "id") || l[0].(map[string]any)["account_id"] != w.accB {
		t.Errorf("the operator's createProject in beta: %s", r.raw)
	}
	if r := f.must(t, 200, "GET", "/v1/audit/verify", f.root, nil); r.body["ok"] != true {
		t.Errorf("verify: %s", r.raw)
	}
	f.must(t, 403, "GET", "/v1/audit/verify", w.fullA, nil)
	f.must(t, 200, "GET", "/v1/audit/key", w.fullA, nil)
}

// Verify names the first entry that was edited, removed, reordered, or
// rewritten with a recomputed chain, in the database itself.
func TestAuditTampering(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	buildWorld(t, f)
	for i := range 5 {
		f.must(t, 201, "POST", "/v1/projects", f.root, map[string]any{"name": fmt.Sprintf("p%d", i)})
	}
	pub := f.eng.Audit().PublicKey()
	f.eng.Close() // signs the last entries
	src := filepath.Join(f.dir, "harebox.db")
	ctx := context.Background()

	check := func(name string, tamper func(db *sql.DB), wantBad int64) {
		t.Helper()
		dir := t.TempDir()
		copyFile(t, src, filepath.Join(dir, "h.db"))
		db, err := sql.Open("sqlite", filepath.Join(dir, "h.db"))
		if err != nil {
			t.Fatal(err)
		}
		tamper(db)
		db.Close()
		st, err := store.OpenSQLite(ctx, filepath.Join(dir, "h.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		rep, err := audit.Verify(ctx, st, pub)
		if err != nil {
			t.Fatal(err)
		}
		if wantBad == 0 && !rep.OK || wantBad != 0 && (rep.OK || rep.FirstBad != wantBad) {
			t.Errorf("%s: %+v, want first bad %d", name, rep, wantBad)
		}
		t.Logf("%s: %+v", name, rep)
	}
	exec := func(db *sql.DB, q string, args ...any) {
		if _, err := db.Exec(q, args...); err != nil {
			t.Fatal(err)
		}
	}
	check("untouched", func(*sql.DB) {}, 0)
	check("edited", func(db *sql.DB) {
		exec(db, `UPDATE audit_log SET record = replace(record, '"outcome":"ok"', '"outcome":"error"') WHERE seq = 3`)
	}, 3)
	check("removed", func(db *sql.DB) { exec(db, `DELETE FROM audit_log WHERE seq = 4`) }, 4)
	check("reordered", func(db *sql.DB) {
		var r5, r6 string
		db.QueryRow(`SELECT record FROM audit_log WHERE seq = 5`).Scan(&r5)
		db.QueryRow(`SELECT record FROM audit_log WHERE seq = 6`).Scan(&r6)
		var e5, e6 store.AuditEntry
		json.Unmarshal([]byte(r5), &e5)
		json.Unmarshal([]byte(r6), &e6)
		e5.Seq, e6.Seq = 6, 5
		b5, _ := json.Marshal(e5)
		b6, _ := json.Marshal(e6)
		exec(db, `UPDATE audit_log SET record = ? WHERE seq = 5`, string(b6))
		exec(db, `UPDATE audit_log SET record = ? WHERE seq = 6`, string(b5))
	}, 5)
	// The last entries are signed when the log closes: a cut tail shows.
	check("the tail cut", func(db *sql.DB) { exec(db, `DELETE FROM audit_log WHERE seq > 6`) }, 7)
	// A consistent rewrite (the columns too) shows against the signed
	// checkpoint; it is placed after the last checkpoint that agrees
	// (here, none).
	check("rewritten with a recomputed chain", func(db *sql.DB) {
		rows, _ := db.Query(`SELECT record FROM audit_log ORDER BY seq`)
		var es []store.AuditEntry
		for rows.Next() {
			var rec string
			rows.Scan(&rec)
			var e store.AuditEntry
			json.Unmarshal([]byte(rec), &e)
			es = append(es, e)
		}
		rows.Close()
		prev := ""
		for i := range es {
			if es[i].Seq == 2 {
				es[i].Principal = "someone-else"
			}
			es[i].Prev = prev
			es[i].Hash = audit.Hash(&es[i])
			prev = es[i].Hash
			b, _ := json.Marshal(es[i])
			exec(db, `UPDATE audit_log SET record = ?, principal = ? WHERE seq = ?`, string(b), es[i].Principal, es[i].Seq)
		}
	}, 1)
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	for _, suffix := range []string{"", "-wal", "-shm"} {
		b, err := os.ReadFile(from + suffix)
		if err != nil {
			continue
		}
		if err := os.WriteFile(to+suffix, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
