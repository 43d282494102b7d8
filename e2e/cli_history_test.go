package e2e

import (
	"os"
	"strings"
	"testing"

	"github.com/harebox/harebox/internal/testserver"
)

// TestCLIHistory is the CLI's contract for an account's command-history
// retention (harebox account update) and for what of harebox history and
// harebox new --no-monitoring/--no-snapshots needs no VM (usage, help, a
// missing sandbox), against a real hareboxd that boots no VM. The history
// itself is read on real VMs by the SDK suites.
func TestCLIHistory(t *testing.T) {
	s := testserver.PrepareNoVM(t)
	dataDir, err := os.MkdirTemp("", "hbh")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.StartNoVM(t, s, dataDir)
	defer func() {
		srv.Stop(t)
		testserver.NoLeftovers(t, dataDir)
	}()

	c := &testserver.CLI{T: t, S: s, Srv: srv}
	cli, ok, fails := c.Run, c.OK, c.Fails
	type account struct {
		ID        string         `json:"id"`
		Name      string         `json:"name"`
		Retention map[string]int `json:"retention"`
	}
	// retention runs harebox with args, which prints an account, and wants
	// it named name with this retention.
	retention := func(key, name string, want map[string]int, args ...string) account {
		t.Helper()
		var a account
		ok(key, &a, args...)
		if a.Name != name || a.Retention == nil || len(a.Retention) != len(want) {
			t.Fatalf("harebox %s: %+v, want %s with retention %v", strings.Join(args, " "), a, name, want)
		}
		for k, v := range want {
			if got, found := a.Retention[k]; !found || got != v {
				t.Fatalf("harebox %s: retention %v, want %v", strings.Join(args, " "), a.Retention, want)
			}
		}
		return a
	}

	// days is the last two columns (HISTORY-DAYS OUTPUT-DAYS) of id's row
	// in a table, under its header.
	days := func(o, id string) string {
		t.Helper()
		lines := strings.Split(o, "\n")
		if h := strings.Fields(lines[0]); len(h) < 2 || h[len(h)-2] != "HISTORY-DAYS" || h[len(h)-1] != "OUTPUT-DAYS" {
			t.Errorf("table header %q", lines[0])
		}
		for _, l := range lines[1:] {
			if f := strings.Fields(l); len(f) > 2 && f[0] == id {
				return strings.Join(f[len(f)-2:], " ")
			}
		}
		t.Errorf("no row of %s in the table:\n%s", id, o)
		return ""
	}

	// The default account keeps everything forever until told otherwise.
	def := retention("", "default", map[string]int{}, "account", "get", "default")
	if o := ok("", nil, "--output", "table", "account", "get", "default"); days(o, def.ID) != "forever forever" {
		t.Errorf("account get table:\n%s", o)
	}
	retention("", "default", map[string]int{"output_days": 0}, "account", "update", "default", "--output-days", "0")
	retention("", "default", map[string]int{"output_days": 0}, "account", "get", def.ID)

	// Both parts, in a table; a new retention replaces the old one whole.
	var acme account
	ok("", &acme, "account", "create", "acme")
	retention("", "acme", map[string]int{"history_days": 30, "output_days": 7}, "account", "update", "acme", "--history-days", "30", "--output-days=7")
	if o := ok("", nil, "--output", "table", "account", "list"); days(o, acme.ID) != "30 7" || days(o, def.ID) != "forever 0" {
		t.Errorf("account list table:\n%s", o)
	}
	retention("", "acme", map[string]int{"history_days": 1}, "account", "update", acme.ID, "--history-days", "1")
	if o := ok("", nil, "--output", "table", "account", "update", "acme", "--history-days", "0", "--output-days", "0"); days(o, acme.ID) != "0 0" {
		t.Errorf("account update table:\n%s", o)
	}
	retention("", "acme", map[string]int{}, "account", "update", "acme", "--keep-forever")
	retention("", "default", map[string]int{}, "account", "update", "default", "--keep-forever")

	// The server's refusals: too many days, no such account; a key needs
	// accounts:write, and updates only its own account.
	fails("", 1, "36500", "account", "update", "acme", "--history-days", "36501")
	retention("", "acme", map[string]int{}, "account", "get", "acme")
	fails("", 1, "no account", "account", "update", "nobody", "--keep-forever")
	var reader, writer struct {
		Secret string `json:"secret"`
	}
	ok("", &reader, "key", "create", "--account", "acme", "--actions", "accounts:read")
	ok("", &writer, "key", "create", "--account", "acme", "--actions", "accounts:read,accounts:write")
	fails(reader.Secret, 1, "updateAccount", "account", "update", "acme", "--output-days", "1")
	retention(writer.Secret, "acme", map[string]int{"output_days": 1}, "account", "update", "acme", "--output-days", "1")
	fails(writer.Secret, 1, "no account", "account", "update", "default", "--output-days", "1") // not its own: not found
	retention("", "default", map[string]int{}, "account", "get", "default")

	// harebox history: a sandbox that does not exist, or is no ID.
	fails("", 1, "no sandbox", "history", "sbx_00000000000000000000000000")
	fails("", 1, "no sandbox", "history", "nope", "--limit", "5")

	// Usage errors are one line and exit 2.
	for _, args := range [][]string{
		{"account", "update"}, {"account", "update", "acme"}, {"account", "update", "acme", "extra", "--keep-forever"},
		{"account", "update", "acme", "--keep-forever", "--output-days", "1"}, {"account", "update", "acme", "--keep-forever", "--history-days", "0"},
		{"account", "update", "acme", "--output-days", "-1"}, {"account", "update", "acme", "--history-days", "ten"},
		{"account", "update", "acme", "--history-days"}, {"account", "update", "acme", "--retention", "1"},
		{"history"}, {"history", "a", "b"}, {"history", "sbx_x", "--limit", "0"}, {"history", "sbx_x", "--limit", "10001"},
		{"history", "sbx_x", "--limit", "-3"}, {"history", "sbx_x", "--limit", "x"}, {"history", "sbx_x", "--bogus"},
		{"new", "--no-monitoring=maybe"},
	} {
		fails("", 2, "usage: harebox", args...)
	}
	fails("", 2, "nothing to change", "account", "update", "acme")
	fails("", 2, "--keep-forever", "account", "update", "acme", "--keep-forever", "--output-days", "1")
	fails("", 2, "want 1 to 10000", "history", "sbx_x", "--limit", "0")

	// --help on the new commands, and the new flags.
	for _, args := range [][]string{{"account", "update", "--help"}, {"account", "--help"}, {"history", "--help"}, {"new", "--help"}, {"--help"}} {
		o, e, code := cli("", args...)
		if code != 0 || o != "" || !strings.HasPrefix(e, "usage: harebox") {
			t.Errorf("harebox %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, o, e)
		}
		var want []string
		switch strings.Join(args, " ") {
		case "account update --help":
			want = []string{"-history-days N", "-output-days N", "-keep-forever"}
		case "account --help":
			want = []string{"update REF"}
		case "history --help":
			want = []string{"usage: harebox history ID", "-limit"}
		case "new --help":
			want = []string{"-no-monitoring", "-no-snapshots"}
		case "--help":
			want = []string{"\n  history ", "update REF"}
		}
		for _, w := range want {
			if !strings.Contains(e, w) {
				t.Errorf("harebox %s lacks %q:\n%s", strings.Join(args, " "), w, e)
			}
		}
	}
	ok("", nil, "account", "delete", "acme")
}
