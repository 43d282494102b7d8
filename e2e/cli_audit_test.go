package e2e

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testserver"
	_ "modernc.org/sqlite" // the "sqlite" driver, to tamper with the log
)

// TestCLIAudit is the CLI's contract for the audit log (harebox audit
// list, export, verify and key), against a real hareboxd that boots no VM:
// what the operator and a scoped key did, the key's refused attempt
// included, read back with filters, pages, a table and a JSON Lines
// export; then the log is edited in the database while the server is
// stopped, and verify names the entry.
func TestCLIAudit(t *testing.T) {
	t.Parallel() // (beside TestMesh)
	s := testserver.PrepareNoVM(t)
	dataDir, err := os.MkdirTemp("", "hba")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.StartNoVM(t, s, dataDir)
	running := true
	defer func() {
		if running {
			srv.Stop(t)
		}
		testserver.NoLeftovers(t, dataDir)
	}()

	c := &testserver.CLI{T: t, S: s, Srv: srv}
	cli, ok, fails := c.Run, c.OK, c.Fails
	type entry struct {
		Seq       int64  `json:"seq"`
		Time      string `json:"time"`
		AccountID string `json:"account_id"`
		Principal string `json:"principal"`
		Source    string `json:"source"`
		Action    string `json:"action"`
		Target    string `json:"target"`
		Outcome   string `json:"outcome"`
		Error     string `json:"error"`
		RequestID string `json:"request_id"`
		Prev      string `json:"prev"`
		Hash      string `json:"hash"`
	}
	type page struct {
		Entries []entry `json:"entries"`
		Next    *string `json:"next"`
	}
	list := func(key string, args ...string) page {
		t.Helper()
		var p page
		ok(key, &p, append([]string{"audit", "list"}, args...)...)
		if p.Entries == nil {
			t.Fatalf("harebox audit list %s: no entries array", strings.Join(args, " "))
		}
		return p
	}
	// only is the one entry of es that has want's non-zero fields.
	only := func(es []entry, want entry) entry {
		t.Helper()
		var found []entry
		for _, e := range es {
			if (want.Action == "" || e.Action == want.Action) && (want.Principal == "" || e.Principal == want.Principal) &&
				(want.Target == "" || e.Target == want.Target) && (want.Outcome == "" || e.Outcome == want.Outcome) {
				found = append(found, e)
			}
		}
		if len(found) != 1 {
			t.Fatalf("entries like %+v: %+v", want, found)
		}
		return found[0]
	}

	// A few actions: an account, a project and a key made by the
	// operator, and the key's attempt to make a project, refused.
	var acc, prj struct{ ID, Name string }
	ok("", &acc, "account", "create", "acme")
	ok("", &prj, "project", "create", "web", "--account", "acme")
	var k struct{ ID, Secret string }
	ok("", &k, "key", "create", "--account", "acme", "--description", "auditor", "--actions", "sandboxes:read,audit:read")
	fails(k.Secret, 1, "may not createProject", "project", "create", "nope")

	// list: JSON, oldest first, a hash chain; who did what.
	all := list("")
	es := all.Entries
	if len(es) < 4 || all.Next != nil {
		t.Fatalf("audit list: %+v", all)
	}
	for i, e := range es {
		if e.Seq != int64(i+1) || e.Time == "" || e.Hash == "" || (i > 0 && e.Prev != es[i-1].Hash) || e.RequestID == "" || e.Source == "" {
			t.Errorf("entry %d: %+v", i, e)
		}
	}
	if e := only(es, entry{Action: "createAccount"}); e.Principal != "operator" || e.Target != acc.ID || e.AccountID != acc.ID || e.Outcome != "ok" {
		t.Errorf("createAccount: %+v", e)
	}
	if e := only(es, entry{Action: "createProject", Principal: "operator"}); e.Outcome != "ok" || e.Target != prj.ID || e.AccountID != acc.ID {
		t.Errorf("createProject: %+v", e)
	}
	if e := only(es, entry{Action: "createKey", Target: k.ID}); e.Principal != "operator" || e.Outcome != "ok" {
		t.Errorf("createKey: %+v", e)
	}
	denied := only(es, entry{Action: "createProject", Principal: k.ID})
	if denied.Outcome != "denied" || denied.Error != "forbidden" || denied.AccountID != acc.ID {
		t.Errorf("the refused createProject: %+v", denied)
	}
	last := es[len(es)-1]

	// Filters.
	if p := list("", "--principal", k.ID, "--outcome", "denied"); len(p.Entries) != 1 || p.Entries[0] != denied {
		t.Errorf("--principal --outcome: %+v", p)
	}
	if p := list("", "--action", "createKey", "--target", k.ID); len(p.Entries) != 1 || p.Entries[0].Principal != "operator" {
		t.Errorf("--action --target: %+v", p)
	}
	only(list("", "--account", acc.ID).Entries, entry{Principal: k.ID})
	if p := list("", "--from", denied.Time); len(p.Entries) == 0 || p.Entries[0].Seq > denied.Seq {
		t.Errorf("--from %s: %+v", denied.Time, p)
	}
	for _, args := range [][]string{{"--from", "2100-01-01T00:00:00Z"}, {"--to", "2000-01-01T00:00:00Z"}, {"--outcome", "error"}, {"--after", fmt.Sprint(last.Seq)}} {
		if p := list("", args...); len(p.Entries) != 0 || p.Next != nil {
			t.Errorf("audit list %s: %+v", strings.Join(args, " "), p)
		}
	}

	// Pages of one follow next, to an empty last page.
	var paged []entry
	for after := ""; ; {
		args := []string{"--limit", "1"}
		if after != "" {
			args = append(args, "--after", after)
		}
		p := list("", args...)
		paged = append(paged, p.Entries...)
		if p.Next == nil {
			if len(p.Entries) != 0 {
				t.Errorf("a short page: %+v", p)
			}
			break
		}
		if len(p.Entries) != 1 || *p.Next != fmt.Sprint(p.Entries[0].Seq) || len(paged) > len(es) {
			t.Fatalf("page after %q: %+v", after, p)
		}
		after = *p.Next
	}
	if fmt.Sprint(paged) != fmt.Sprint(es) {
		t.Errorf("pages of one:\n%+v\nwant\n%+v", paged, es)
	}

	// A key sees its own account's entries, the refused one included.
	mine := list(k.Secret)
	for _, e := range mine.Entries {
		if e.AccountID != acc.ID {
			t.Errorf("the key sees %+v", e)
		}
	}
	only(mine.Entries, entry{Principal: k.ID, Outcome: "denied"})

	// The table.
	o := ok("", nil, "--output", "table", "audit", "list")
	lines := strings.Split(strings.TrimSpace(o), "\n")
	if strings.Join(strings.Fields(lines[0]), " ") != "SEQ TIME PRINCIPAL ACTION TARGET OUTCOME" || len(lines) != len(es)+1 {
		t.Errorf("audit list table:\n%s", o)
	}
	row := strings.Fields(lines[denied.Seq])
	if len(row) < 6 || row[0] != fmt.Sprint(denied.Seq) || row[2] != k.ID || row[3] != "createProject" || row[5] != "denied" {
		t.Errorf("the refused createProject's row: %q", lines[denied.Seq])
	}
	if o := ok("", nil, "--output", "table", "audit", "list", "--limit", "2"); !strings.HasSuffix(o, "\nmore: --after 2\n") {
		t.Errorf("a full page in a table:\n%s", o)
	}

	// export: JSON Lines, every entry, one a line; with filters.
	export := func(key string, args ...string) []entry {
		t.Helper()
		o := ok(key, nil, append([]string{"audit", "export"}, args...)...)
		if o != "" && !strings.HasSuffix(o, "\n") {
			t.Errorf("audit export %s: the last line is cut: %q", strings.Join(args, " "), o)
		}
		var out []entry
		for _, line := range strings.Split(strings.TrimSuffix(o, "\n"), "\n") {
			if line == "" && o == "" {
				break
			}
			var e entry
			if err := json.Unmarshal([]byte(line), &e); err != nil || strings.Contains(line, "\n") {
				t.Fatalf("audit export %s: a line that is not an entry: %q", strings.Join(args, " "), line)
			}
			out = append(out, e)
		}
		return out
	}
	if got := export(""); fmt.Sprint(got) != fmt.Sprint(es) {
		t.Errorf("audit export:\n%+v\nwant\n%+v", got, es)
	}
	if got := export("", "--outcome", "denied", "--principal", k.ID); len(got) != 1 || got[0] != denied {
		t.Errorf("audit export --outcome --principal: %+v", got)
	}
	if got := export("", "--after", fmt.Sprint(last.Seq-1)); len(got) != 1 || got[0] != last {
		t.Errorf("audit export --after: %+v", got)
	}
	if got := export("", "--from", "2100-01-01T00:00:00Z"); len(got) != 0 {
		t.Errorf("audit export --from the future: %+v", got)
	}
	if got := export(k.Secret); fmt.Sprint(got) != fmt.Sprint(mine.Entries) {
		t.Errorf("audit export with the key: %+v, want %+v", got, mine.Entries)
	}

	// --newest: the tail, and no cursor after it. --follow: then each new
	// entry as it is appended, a JSON line each, until interrupted.
	if p := list("", "--newest", "--limit", "2"); len(p.Entries) != 2 || p.Entries[1] != last || p.Entries[0] != es[len(es)-2] || p.Next != nil {
		t.Errorf("--newest --limit 2: %+v", p)
	}
	follow := exec.Command(filepath.Join(s.Bin, "harebox"), "audit", "list", "--newest", "--limit", "1", "--follow")
	follow.Env = srv.Env(s)
	stdout, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	tail := make(chan entry, 10)
	go func() {
		defer close(tail)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var e entry
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Errorf("audit list --follow: %q", sc.Text())
			}
			tail <- e
		}
	}()
	followed := func(what string) entry {
		t.Helper()
		select {
		case e, open := <-tail:
			if !open {
				t.Fatalf("audit list --follow ended waiting for %s", what)
			}
			return e
		case <-time.After(30 * time.Second):
			t.Fatalf("audit list --follow: no line for %s", what)
		}
		return entry{}
	}
	if e := followed("the newest entry"); e != last {
		t.Errorf("audit list --follow, first: %+v, want %+v", e, last)
	}
	var tailed struct{ ID string }
	ok("", &tailed, "project", "create", "tailed", "--account", "acme")
	if e := followed("the new project's entry"); e.Action != "createProject" || e.Target != tailed.ID || e.Seq != last.Seq+1 {
		t.Errorf("audit list --follow, next: %+v", e)
	}
	follow.Process.Kill()
	follow.Wait()
	last = list("", "--newest", "--limit", "1").Entries[0]

	// verify: the operator's; ok.
	type report struct {
		OK          bool   `json:"ok"`
		Entries     int64  `json:"entries"`
		Checkpoints int    `json:"checkpoints"`
		FirstBad    int64  `json:"first_bad"`
		Reason      string `json:"reason"`
		Anchor      string `json:"anchor"`
		Anchored    int64  `json:"anchored"`
		Unanchored  int64  `json:"unanchored"`
	}
	var rep report
	anchor := "file:" + filepath.Join(dataDir, "audit.anchor") // (hareboxd's default)
	if ok("", &rep, "audit", "verify"); !rep.OK || rep.Entries != last.Seq || rep.FirstBad != 0 || rep.Reason != "" ||
		rep.Anchor != anchor || rep.Anchored+rep.Unanchored != rep.Entries {
		t.Errorf("audit verify: %+v", rep)
	}
	if o := ok("", nil, "--output", "table", "audit", "verify"); !strings.HasPrefix(o, "OK ") || !strings.Contains(o, "\nyes ") {
		t.Errorf("audit verify table:\n%s", o)
	}
	fails(k.Secret, 1, "operator", "audit", "verify")

	// key: the public key of the key file in the data directory.
	var pub struct{ Algorithm, Public_Key string }
	ok("", &pub, "audit", "key")
	seed, err := os.ReadFile(filepath.Join(dataDir, "audit.key"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := base64.StdEncoding.DecodeString(pub.Public_Key)
	if pub.Algorithm != "ed25519" || err != nil || !bytes.Equal(b, ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)) {
		t.Errorf("audit key: %+v", pub)
	}
	var pub2 struct{ Algorithm, Public_Key string }
	if ok(k.Secret, &pub2, "audit", "key"); pub2 != pub {
		t.Errorf("audit key with the key: %+v", pub2)
	}
	if o := ok("", nil, "--output", "table", "audit", "key"); strings.Join(strings.Fields(o), " ") != "ALGORITHM PUBLIC-KEY ed25519 "+pub.Public_Key {
		t.Errorf("audit key table:\n%s", o)
	}

	// Usage errors are one line and exit 2.
	for _, args := range [][]string{
		{"audit"}, {"audit", "frobnicate"}, {"audit", "list", "extra"}, {"audit", "list", "--outcome", "maybe"},
		{"audit", "list", "--from", "yesterday"}, {"audit", "list", "--to", "2026-13-01T00:00:00Z"},
		{"audit", "list", "--limit", "0"}, {"audit", "list", "--limit", "1001"}, {"audit", "list", "--after", "-1"},
		{"audit", "list", "--after", "x"}, {"audit", "list", "--bogus"}, {"audit", "export", "--limit", "5"},
		{"audit", "export", "--outcome", "failed"}, {"audit", "export", "x"}, {"audit", "verify", "x"}, {"audit", "key", "x"},
	} {
		fails("", 2, "usage: harebox audit", args...)
	}
	for _, args := range [][]string{
		{"audit", "--help"}, {"audit", "list", "--help"}, {"audit", "export", "--help"}, {"audit", "verify", "--help"}, {"audit", "key", "--help"}, {"--help"},
	} {
		o, e, code := cli("", args...)
		if code != 0 || o != "" || !strings.HasPrefix(e, "usage: harebox") {
			t.Errorf("harebox %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, o, e)
		}
		if args[0] == "--help" && !strings.Contains(e, "\n  audit ") {
			t.Errorf("harebox --help lacks audit:\n%s", e)
		}
		if len(args) == 3 && (args[1] == "list" || args[1] == "export") && (!strings.Contains(e, "-outcome") || !strings.Contains(e, "-after")) {
			t.Errorf("harebox %s:\n%s", strings.Join(args, " "), e)
		}
	}

	// The tail cut while the server is stopped, its checkpoints with it:
	// the anchor (a file in the data directory) remembers where the log
	// ended, and verify exits 1. The data directory is put back after.
	srv.Stop(t)
	running = false
	saved := t.TempDir()
	keep := []string{"harebox.db", "harebox.db-wal", "harebox.db-shm", "audit.anchor"}
	copyFiles(t, dataDir, saved, keep)
	db, err := sql.Open("sqlite", filepath.Join(dataDir, "harebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	var end int64
	if err := db.QueryRow(`SELECT MAX(seq) FROM audit_log`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`DELETE FROM audit_log WHERE seq > ?`, `DELETE FROM audit_checkpoints WHERE seq > ?`} {
		if _, err := db.Exec(q, end-2); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	srv = testserver.StartNoVM(t, s, dataDir)
	c.Srv = srv
	running = true
	o, e, code := cli("", "audit", "verify")
	rep = report{}
	if err := json.Unmarshal([]byte(o), &rep); err != nil || rep.OK || !strings.Contains(rep.Reason, "anchor") || rep.Anchor != anchor || code != 1 ||
		!strings.Contains(e, "anchor") {
		t.Errorf("audit verify of a log cut with its checkpoints: exit %d %v %+v\n%s%s", code, err, rep, o, e)
	}
	srv.Stop(t)
	running = false
	copyFiles(t, saved, dataDir, keep)

	// An entry edited in the database while the server is stopped: verify
	// names it, prints the report and exits 1.
	db, err = sql.Open("sqlite", filepath.Join(dataDir, "harebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := db.Exec(`UPDATE audit_log SET record = replace(record, '"outcome":"ok"', '"outcome":"error"') WHERE seq = 2`)
	if n, _ := res.RowsAffected(); err != nil || n != 1 {
		t.Fatalf("tampering: %v (%d rows)", err, n)
	}
	db.Close()
	srv = testserver.StartNoVM(t, s, dataDir)
	c.Srv = srv
	running = true
	o, e, code = cli("", "audit", "verify")
	rep = report{}
	if err := json.Unmarshal([]byte(o), &rep); err != nil || rep.OK || rep.FirstBad != 2 || rep.Reason == "" {
		t.Errorf("audit verify of an edited log: %v %+v\n%s", err, rep, o)
	}
	if code != 1 || strings.Count(strings.TrimSpace(e), "\n") != 0 || !strings.HasPrefix(e, "harebox audit verify: ") ||
		!strings.Contains(e, "first bad entry 2") || !strings.Contains(e, rep.Reason) {
		t.Errorf("audit verify of an edited log: exit %d, stderr %q", code, e)
	}
	o, _, code = cli("", "--output", "table", "audit", "verify")
	if f := strings.Fields(strings.Split(o, "\n")[1]); code != 1 || len(f) < 4 || f[0] != "no" || f[3] != "2" {
		t.Errorf("audit verify table of an edited log: exit %d\n%s", code, o)
	}
}

// copyFiles copies the named files that exist from one directory to
// another (a file missing in from is removed from to).
func copyFiles(t *testing.T, from, to string, names []string) {
	t.Helper()
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(from, n))
		if os.IsNotExist(err) {
			os.Remove(filepath.Join(to, n))
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
