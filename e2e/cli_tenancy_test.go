package e2e

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/harebox/harebox/internal/testserver"
)

// TestCLITenancy is the CLI's contract for accounts, projects, fleets and
// scoped keys, against a real hareboxd that boots no VM.
func TestCLITenancy(t *testing.T) {
	s := testserver.PrepareNoVM(t)
	dataDir, err := os.MkdirTemp("", "hbt")
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
	type named struct {
		ID        string `json:"id"`
		Name      string `json:"name"`
		AccountID string `json:"account_id"`
		ProjectID string `json:"project_id"`
	}
	type key struct {
		ID        string  `json:"id"`
		AccountID string  `json:"account_id"`
		ParentID  string  `json:"parent_id"`
		Secret    string  `json:"secret"`
		Hint      string  `json:"hint"`
		ExpiresAt *string `json:"expires_at"`
		RevokedAt *string `json:"revoked_at"`
		RotatedAt *string `json:"rotated_at"`
		Scope     struct {
			Actions  []string          `json:"actions"`
			Projects []string          `json:"projects"`
			Labels   map[string]string `json:"labels"`
			CIDRs    []string          `json:"cidrs"`
			Rate     *struct {
				PerSecond float64 `json:"per_second"`
				Burst     int     `json:"burst"`
			} `json:"rate"`
			Budget string `json:"budget_usd"`
		} `json:"scope"`
	}

	// Accounts.
	var acc named
	ok("", &acc, "account", "create", "acme")
	if !strings.HasPrefix(acc.ID, "acc_") || acc.Name != "acme" {
		t.Fatalf("account create: %+v", acc)
	}
	var accs struct{ Accounts []named }
	ok("", &accs, "account", "list")
	if len(accs.Accounts) != 2 || accs.Accounts[1].ID != acc.ID {
		t.Errorf("account list: %+v, want default and acme", accs)
	}
	if o := ok("", nil, "--output", "table", "account", "list"); !strings.HasPrefix(o, "ID ") || !strings.Contains(o, "CREATED") || !strings.Contains(o, acc.ID+"  acme") {
		t.Errorf("account list table:\n%s", o)
	}
	for _, ref := range []string{"acme", acc.ID} {
		var a named
		if ok("", &a, "account", "get", ref); a != acc {
			t.Errorf("account get %s: %+v, want %+v", ref, a, acc)
		}
	}
	fails("", 1, "exists", "account", "create", "acme")
	fails("", 1, "no account", "account", "get", "nobody")

	// A project in that account, and a fleet in the project.
	var prj named
	ok("", &prj, "project", "create", "web", "--account", "acme")
	if !strings.HasPrefix(prj.ID, "prj_") || prj.AccountID != acc.ID || prj.Name != "web" {
		t.Fatalf("project create: %+v", prj)
	}
	var prjs struct{ Projects []named }
	ok("", &prjs, "project", "list", "--account", acc.ID)
	if len(prjs.Projects) != 2 || prjs.Projects[0].Name != "default" || prjs.Projects[1] != prj {
		t.Errorf("project list: %+v", prjs)
	}
	var p named
	if ok("", &p, "project", "get", "web", "--account", "acme"); p != prj {
		t.Errorf("project get: %+v", p)
	}
	fails("", 1, "no project", "project", "get", "web") // not in the default account
	var flt named
	ok("", &flt, "fleet", "create", "workers", "--project", "web", "--account", "acme")
	if !strings.HasPrefix(flt.ID, "flt_") || flt.ProjectID != prj.ID || flt.AccountID != acc.ID {
		t.Fatalf("fleet create: %+v", flt)
	}
	var flts struct{ Fleets []named }
	ok("", &flts, "fleet", "list", "--project", prj.ID, "--account", "acme")
	if len(flts.Fleets) != 1 || flts.Fleets[0] != flt {
		t.Errorf("fleet list: %+v", flts)
	}
	if o := ok("", nil, "--output", "table", "fleet", "get", "workers", "--project", "web", "--account", "acme"); !strings.Contains(o, flt.ID+"  workers") {
		t.Errorf("fleet get table:\n%s", o)
	}
	var other named
	ok("", &other, "fleet", "create", "spare") // the default project of the default account
	if other.AccountID == acc.ID {
		t.Errorf("fleet create without --project/--account: %+v", other)
	}

	// A scoped key, made by the operator.
	var k key
	ok("", &k, "key", "create", "--account", "acme", "--description", "ci runner",
		"--actions", "sandboxes:read,keys:read,keys:write", "--projects", "web",
		"--label", "team=ci", "--cidr", "127.0.0.0/8", "--rate", "100:200", "--budget", "5", "--ttl", "3600")
	if !strings.HasPrefix(k.ID, "key_") || !strings.HasPrefix(k.Secret, "hbk_") || k.AccountID != acc.ID ||
		!strings.HasPrefix(k.Hint, "hbk_...") || !strings.HasSuffix(k.Secret, strings.TrimPrefix(k.Hint, "hbk_...")) || k.ExpiresAt == nil ||
		len(k.Scope.Actions) != 3 || len(k.Scope.Projects) != 1 || k.Scope.Projects[0] != prj.ID ||
		k.Scope.Labels["team"] != "ci" || len(k.Scope.CIDRs) != 1 || k.Scope.Rate == nil ||
		k.Scope.Rate.PerSecond != 100 || k.Scope.Rate.Burst != 200 || k.Scope.Budget != "5.00" {
		t.Fatalf("key create: %+v", k)
	}
	var got key
	if ok("", &got, "key", "get", k.ID); got.Secret != "" || got.ID != k.ID {
		t.Errorf("key get shows %+v", got)
	}

	// What the scoped key may and may not do.
	var boxes struct {
		Sandboxes []json.RawMessage `json:"sandboxes"`
	}
	ok(k.Secret, &boxes, "list")
	if boxes.Sandboxes == nil || len(boxes.Sandboxes) != 0 {
		t.Errorf("list with the scoped key: %+v", boxes)
	}
	ok(k.Secret, &boxes, "list", "--project", "web", "--fleet", "workers")
	ok("", &boxes, "list", "--fleet", "spare")
	fails(k.Secret, 1, "", "list", "--project", "default") // outside the key's projects
	// Refused; this server has no image, and it checks the image before
	// the key's actions, so the line names the image rather than the action.
	t.Logf("new with a key without createSandbox: %s", fails(k.Secret, 1, "", "new", "--project", "web", "--fleet", "workers"))
	fails(k.Secret, 1, "narrower", "key", "create", "--actions", "*")
	fails(k.Secret, 1, "narrower", "key", "create", "--actions", "listSandboxes") // no project, label, CIDR, rate, budget, expiry
	fails(k.Secret, 1, "operator", "account", "create", "evil")
	fails(k.Secret, 1, "", "project", "list")
	var child key
	ok(k.Secret, &child, "key", "create", "--actions", "listSandboxes", "--projects", "web", "--label", "team=ci",
		"--cidr", "127.0.0.1/32", "--rate", "1:1", "--budget", "1.50", "--ttl", "60")
	if child.ParentID != k.ID || child.AccountID != acc.ID || !strings.HasPrefix(child.Secret, "hbk_") {
		t.Errorf("child key: %+v", child)
	}
	var keys struct{ Keys []key }
	ok(k.Secret, &keys, "key", "list")
	if len(keys.Keys) != 2 || keys.Keys[0].ID != k.ID || keys.Keys[1].ID != child.ID {
		t.Errorf("key list with the scoped key: %+v", keys)
	}

	// Revoked by the operator: the key and the one it made stop working.
	var revoked key
	if ok("", &revoked, "key", "revoke", k.ID); revoked.RevokedAt == nil {
		t.Errorf("key revoke: %+v", revoked)
	}
	if ok("", &got, "key", "get", child.ID); got.RevokedAt == nil {
		t.Errorf("the child of a revoked key: %+v", got)
	}
	fails(k.Secret, 1, "revoked", "list")
	fails(child.Secret, 1, "revoked", "list")
	fails("", 1, "revoked", "key", "rotate", k.ID)

	// Rotation: the old secret stops, the new one works; in a table the
	// secret is shown with a note.
	var k2, rot key
	ok("", &k2, "key", "create", "--account", "acme", "--actions", "sandboxes:read")
	ok(k2.Secret, &boxes, "list")
	ok("", &rot, "key", "rotate", k2.ID)
	if rot.ID != k2.ID || rot.Secret == k2.Secret || !strings.HasPrefix(rot.Secret, "hbk_") || rot.RotatedAt == nil {
		t.Errorf("key rotate: %+v", rot)
	}
	fails(k2.Secret, 1, "invalid", "list")
	ok(rot.Secret, &boxes, "list")
	o := ok("", nil, "--output", "table", "key", "rotate", k2.ID)
	if !strings.HasPrefix(o, "ID ") || !strings.Contains(o, "HINT") || !strings.Contains(o, "shown only once") {
		t.Errorf("key rotate table:\n%s", o)
	}
	var secret string
	for _, line := range strings.Split(o, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "SECRET" {
			secret = f[1]
		}
	}
	fails(rot.Secret, 1, "invalid", "list")
	ok(secret, &boxes, "list")
	o = ok("", nil, "--output", "table", "key", "list", "--account", "acme")
	if !strings.HasPrefix(o, "ID ") || !strings.Contains(o, "DESCRIPTION") || !strings.Contains(o, "ci runner") ||
		!strings.Contains(o, "sandboxes:read,keys:read,keys:write") || strings.Contains(o, secret) {
		t.Errorf("key list table:\n%s", o)
	}

	// Deletes clean up.
	fails("", 1, "", "project", "delete", "default", "--account", "acme")
	if o := ok("", nil, "fleet", "delete", "workers", "--project", "web", "--account", "acme"); !strings.Contains(o, `"deleted": "workers"`) {
		t.Errorf("fleet delete: %s", o)
	}
	fails("", 1, "no fleet", "fleet", "get", "workers", "--project", "web", "--account", "acme")
	ok("", nil, "fleet", "delete", other.ID)
	ok("", nil, "project", "delete", "web", "--account", "acme")
	fails("", 1, "no project", "project", "get", prj.ID, "--account", "acme")
	ok("", nil, "account", "delete", "acme")
	fails("", 1, "no account", "account", "get", acc.ID)
	if ok("", &got, "key", "get", k2.ID); got.RevokedAt == nil {
		t.Errorf("a key of a deleted account: %+v", got)
	}
	// Deleting the account revoked its keys: they must stop working now.
	fails(secret, 1, "revoked", "list")
	ok("", &accs, "account", "list")
	if len(accs.Accounts) != 1 || accs.Accounts[0].Name != "default" {
		t.Errorf("accounts left: %+v", accs)
	}

	// Usage errors are one line and exit 2.
	for _, args := range [][]string{
		{"account"}, {"account", "frobnicate"}, {"account", "create"}, {"account", "get", "a", "b"},
		{"project", "list", "extra"}, {"fleet", "get"}, {"fleet", "create", "x", "--project", ""},
		{"key", "create", "--rate", "0"}, {"key", "create", "--rate", "1:x"}, {"key", "create", "--budget", "ten"},
		{"key", "get"}, {"key", "create", "--bogus"},
	} {
		fails("", 2, "usage: harebox", args...)
	}

	// --help on every new command and subcommand, and the new flags.
	for _, args := range [][]string{
		{"account", "--help"}, {"account", "create", "--help"}, {"account", "list", "--help"}, {"account", "get", "--help"}, {"account", "delete", "--help"},
		{"project", "--help"}, {"project", "create", "--help"}, {"project", "list", "--help"}, {"project", "get", "--help"}, {"project", "delete", "--help"},
		{"fleet", "--help"}, {"fleet", "create", "--help"}, {"fleet", "list", "--help"}, {"fleet", "get", "--help"}, {"fleet", "delete", "--help"},
		{"key", "--help"}, {"key", "create", "--help"}, {"key", "list", "--help"}, {"key", "get", "--help"}, {"key", "revoke", "--help"}, {"key", "rotate", "--help"},
		{"new", "--help"}, {"list", "--help"}, {"--help"},
	} {
		o, e, code := cli("", args...)
		if code != 0 || o != "" || !strings.HasPrefix(e, "usage: harebox") {
			t.Errorf("harebox %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, o, e)
		}
		switch strings.Join(args, " ") {
		case "new --help":
			if !strings.Contains(e, "-project") || !strings.Contains(e, "-fleet") || !strings.Contains(e, "-account") {
				t.Errorf("new --help: %s", e)
			}
		case "list --help":
			if !strings.Contains(e, "-project") || !strings.Contains(e, "-fleet") {
				t.Errorf("list --help: %s", e)
			}
		case "--help":
			for _, c := range []string{"account", "project", "fleet", "key"} {
				if !strings.Contains(e, "\n  "+c+" ") {
					t.Errorf("harebox --help lacks %s:\n%s", c, e)
				}
			}
		}
	}
}
