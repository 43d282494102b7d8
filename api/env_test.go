package api_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/harebox/harebox/api"
)

const secretValue = "sk-live-0123456789abcdef-canary"

func envBody(name string) map[string]any {
	return map[string]any{
		"name": name,
		"variables": map[string]any{
			"MODE":  map[string]any{"value": "prod"},
			"TOKEN": map[string]any{"value": secretValue, "secret": true},
		},
		"files": []any{map[string]any{"path": "/etc/app.conf", "template": true, "content": "mode={{MODE}} token={{ TOKEN }}\n"}},
		"credentials": []any{map[string]any{"secret": "TOKEN", "hosts": []string{"api.example.test"}, "ports": "443",
			"header": "Authorization", "format": "Bearer {value}"}},
	}
}

// countSecrets counts sealed rows under a scope prefix, reading the
// database as it is on disk.
func countSecrets(t *testing.T, dir, prefix string) int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "harebox.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM secrets WHERE scope LIKE ?`, prefix+"%").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// noPlaintext fails if s appears anywhere under dir (the database, its
// write-ahead log, machine state).
func noPlaintext(t *testing.T, dir, s string) {
	t.Helper()
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return nil
		}
		if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(s)) {
			t.Errorf("%q is in plain text in %s", s, p)
		}
		return nil
	})
}

// Environments: versions pinned by sandboxes, secrets sealed and seen by
// sandboxes only as their own placeholders, the third-party switch.
func TestEnvironments(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	r := f.must(t, 201, "POST", "/v1/environments", f.root, envBody("prod"))
	envID := str(r, "id")
	if strings.Contains(string(r.raw), secretValue) || strings.Contains(string(r.raw), "secret_ref") {
		t.Fatalf("the create answer shows the secret: %s", r.raw)
	}
	for _, p := range []string{"/v1/environments/prod", "/v1/environments", "/v1/environments/prod/versions", "/v1/environments/" + envID + "/versions/1"} {
		if r := f.must(t, 200, "GET", p, f.root, nil); strings.Contains(string(r.raw), secretValue) || !strings.Contains(string(r.raw), `"TOKEN":{"secret":true}`) {
			t.Errorf("GET %s: %s", p, r.raw)
		}
	}
	readConf := func(id string) string {
		return string(f.must(t, 200, "GET", "/v1/sandboxes/"+id+"/files?path=/etc/app.conf", f.root, nil).raw)
	}

	a := f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"environment": "prod", "env": map[string]string{"OWN": "own-canary-value"}})
	b := f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"environment": envID + "@1"})
	if str(a, "environment") != "prod@1" || str(b, "environment") != "prod@1" {
		t.Fatalf("pinned: %s %s", a.raw, b.raw)
	}
	confA, confB := readConf(str(a, "id")), readConf(str(b, "id"))
	if !strings.HasPrefix(confA, "mode=prod token=hbph_") || strings.Contains(confA, secretValue) || confA == confB {
		t.Fatalf("delivered files: %q and %q (each sandbox its own placeholder, never the value)", confA, confB)
	}

	// A new version does not touch running sandboxes; new ones get it; an
	// old one can be pinned.
	r = f.must(t, 200, "PATCH", "/v1/environments/prod", f.root, map[string]any{"set": map[string]any{"MODE": map[string]any{"value": "staging"}}})
	if r.body["latest"] != float64(2) {
		t.Fatalf("update: %s", r.raw)
	}
	if got := readConf(str(a, "id")); got != confA {
		t.Errorf("a running sandbox changed with the environment: %q", got)
	}
	c := f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"environment": "prod"})
	if !strings.HasPrefix(readConf(str(c, "id")), "mode=staging token=hbph_") || str(c, "environment") != "prod@2" {
		t.Errorf("a new sandbox: %s %q", c.raw, readConf(str(c, "id")))
	}
	old := f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"environment": "prod@1"})
	if !strings.HasPrefix(readConf(str(old, "id")), "mode=prod ") {
		t.Errorf("pinning version 1: %q", readConf(str(old, "id")))
	}

	// Third party: only environments marked safe, by any route a create has.
	f.must(t, 403, "POST", "/v1/sandboxes", f.root, map[string]any{"environment": "prod", "third_party": true})
	f.must(t, 200, "PATCH", "/v1/environments/prod", f.root, map[string]any{"third_party_safe": true})
	f.must(t, 403, "POST", "/v1/sandboxes", f.root, map[string]any{"environment": "prod@2", "third_party": true})
	tp := f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"environment": "prod", "third_party": true})
	if tp.body["third_party"] != true || str(tp, "environment") != "prod@3" {
		t.Errorf("third-party sandbox: %s", tp.raw)
	}
	f.must(t, 200, "PATCH", "/v1/projects/default", f.root, map[string]any{"third_party_default": true})
	f.must(t, 403, "POST", "/v1/sandboxes", f.root, map[string]any{"environment": "prod@1"})
	if r := f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{}); r.body["third_party"] != true {
		t.Errorf("the project's default did not apply: %s", r.raw)
	}
	f.must(t, 200, "PATCH", "/v1/projects/default", f.root, map[string]any{"third_party_default": false})
	f.must(t, 400, "POST", "/v1/sandboxes", f.root, map[string]any{"environment": "prod", "no_env": true})
	f.must(t, 400, "POST", "/v1/sandboxes", f.root, map[string]any{"environment": "prod@9"})
	f.must(t, 400, "POST", "/v1/sandboxes", f.root, map[string]any{"environment": "nope"})
	f.must(t, 400, "POST", "/v1/environments", f.root, map[string]any{"name": "bad", "files": []any{map[string]any{"path": "/x", "template": true, "content": "{{MISSING}}"}}})
	f.must(t, 400, "POST", "/v1/environments", f.root, map[string]any{"name": "bad", "credentials": []any{map[string]any{"secret": "NOPE", "hosts": []string{"x.test"}}}})
	f.must(t, 409, "POST", "/v1/environments", f.root, envBody("prod"))
	f.must(t, 400, "PATCH", "/v1/environments/prod", f.root, map[string]any{})
	// A project (or account) holding environments is not deleted under
	// them: their sealed values would be left behind.
	f.must(t, 201, "POST", "/v1/projects", f.root, map[string]any{"name": "side"})
	f.must(t, 201, "POST", "/v1/environments?project=side", f.root, map[string]any{"name": "e", "variables": map[string]any{"S": map[string]any{"value": "x", "secret": true}}})
	f.must(t, 409, "DELETE", "/v1/projects/side", f.root, nil)
	f.must(t, 204, "DELETE", "/v1/environments/e?project=side", f.root, nil)
	f.must(t, 204, "DELETE", "/v1/projects/side", f.root, nil)

	// Nothing secret is stored in plain text, the sandbox's own env
	// included; it is erased with the sandbox.
	noPlaintext(t, f.dir, secretValue)
	noPlaintext(t, f.dir, "own-canary-value")
	if n := countSecrets(t, f.dir, "sandbox/"+str(a, "id")); n != 4 {
		t.Errorf("the sandbox's data key, console key, own env and CA key: %d sealed rows, want 4", n)
	}
	// An environment pinned by live sandboxes stays; once they are gone it
	// goes, with every sealed value.
	f.must(t, 409, "DELETE", "/v1/environments/prod", f.root, nil)
	for _, id := range ids(f.must(t, 200, "GET", "/v1/sandboxes", f.root, nil).body["sandboxes"]) {
		f.must(t, 200, "DELETE", "/v1/sandboxes/"+id, f.root, nil)
	}
	if n := countSecrets(t, f.dir, "sandbox/"); n != 0 {
		t.Errorf("%d sealed sandbox rows after every delete", n)
	}
	if n := countSecrets(t, f.dir, "env/"+envID); n != 1 {
		t.Errorf("%d sealed values of the environment, want 1 (shared by its versions)", n)
	}
	f.must(t, 204, "DELETE", "/v1/environments/prod", f.root, nil)
	if n := countSecrets(t, f.dir, "env/"+envID); n != 0 {
		t.Errorf("%d sealed values left after the environment's delete", n)
	}
	f.must(t, 404, "GET", "/v1/environments/prod", f.root, nil)
}

// A sandbox whose environment has credential rules gets its own CA,
// installed in the guest and pointed at by the TLS variables; the CA key
// is sealed and erased with the sandbox.
func TestSandboxCA(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	f.must(t, 201, "POST", "/v1/environments", f.root, envBody("prod"))
	box := f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"environment": "prod"})
	id := str(box, "id")
	ca := string(f.must(t, 200, "GET", "/v1/sandboxes/"+id+"/files?path=/etc/harebox/ca.pem", f.root, nil).raw)
	bundle := string(f.must(t, 200, "GET", "/v1/sandboxes/"+id+"/files?path=/etc/harebox/ca-bundle.pem", f.root, nil).raw)
	if !strings.HasPrefix(ca, "-----BEGIN CERTIFICATE-----") || !strings.Contains(bundle, ca) {
		t.Fatalf("CA in the guest: %q, bundle %q", ca, bundle)
	}
	// In the guest's trust store too (this fake guest has none: the CA is
	// all of it), and where update-ca-certificates finds it.
	store := func(id string) string {
		return string(f.must(t, 200, "GET", "/v1/sandboxes/"+id+"/files?path=/etc/ssl/certs/ca-certificates.crt", f.root, nil).raw)
	}
	if got := store(id); got != bundle || strings.Count(got, "BEGIN CERTIFICATE") != 1 {
		t.Fatalf("trust store %q, want the bundle %q", got, bundle)
	}
	if got := string(f.must(t, 200, "GET", "/v1/sandboxes/"+id+"/files?path=/usr/local/share/ca-certificates/harebox-sandbox.crt", f.root, nil).raw); got != ca {
		t.Fatalf("local CA %q", got)
	}
	// A fork's clone trusts its own CA instead of its source's, and keeps
	// the rest of the store.
	other := "# another CA\n-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	f.must(t, 200, "PUT", "/v1/sandboxes/"+id+"/files?path=/etc/ssl/certs/ca-certificates.crt", f.root, other+bundle)
	clones := f.must(t, 201, "POST", "/v1/sandboxes/"+id+"/fork", f.root, map[string]any{"count": 1}).body["sandboxes"].([]any)
	clone := clones[0].(map[string]any)["id"].(string)
	cloneCA := string(f.must(t, 200, "GET", "/v1/sandboxes/"+clone+"/files?path=/etc/harebox/ca.pem", f.root, nil).raw)
	if got := store(clone); cloneCA == ca || strings.Contains(got, ca) || !strings.HasPrefix(got, other) || !strings.HasSuffix(got, cloneCA) ||
		strings.Count(got, "BEGIN CERTIFICATE") != 2 {
		t.Fatalf("the clone's trust store %q (its CA %q, the source's %q)", got, cloneCA, ca)
	}
	// And its own placeholder: the source's is worth nothing in it.
	token := func(id string) string {
		return str(f.must(t, 200, "POST", "/v1/sandboxes/"+id+"/exec", f.root, map[string]any{"cmd": "printenv TOKEN"}), "stdout")
	}
	if a, c := token(id), token(clone); !strings.HasPrefix(a, "hbph_") || !strings.HasPrefix(c, "hbph_") || a == c {
		t.Errorf("placeholders: the source's %q, the clone's %q", a, c)
	}
	f.must(t, 200, "DELETE", "/v1/sandboxes/"+clone, f.root, nil)
	if n := countSecrets(t, f.dir, "sandbox/"+id); n != 3 {
		t.Errorf("the sandbox's data key, console key and CA key: %d sealed rows, want 3", n)
	}
	noPlaintext(t, f.dir, "PRIVATE KEY")
	// A sandbox without credential rules gets no CA.
	plain := f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{})
	f.must(t, 404, "GET", "/v1/sandboxes/"+str(plain, "id")+"/files/stat?path=/etc/harebox/ca.pem", f.root, nil)
	f.must(t, 200, "DELETE", "/v1/sandboxes/"+id, f.root, nil)
	if n := countSecrets(t, f.dir, "sandbox/"+id); n != 0 {
		t.Errorf("the CA key outlived the sandbox: %d rows", n)
	}
}

// A policy given at create is the sandbox's from the start; a bad one is
// refused naming its field, with nothing made; without one, the engine's
// default applies.
func TestFirewallAtCreate(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	launched := f.hv.Launched()
	r := f.do(t, "POST", "/v1/sandboxes", f.root, `{"firewall": {"default_outbound": "deny", "outbound": [{"action": "allow", "protocol": "tcp", "ports": "99999", "hosts": ["pypi.org"]}]}}`)
	if code, field, _ := errField(r); r.status != 400 || code != "invalid" || field != "firewall.outbound[0].ports" {
		t.Fatalf("a bad policy at create: %d %s", r.status, r.raw)
	}
	f.must(t, 400, "POST", "/v1/sandboxes", f.root, `{"firewall": {"default_outbound": "maybe"}}`)
	if f.hv.Launched() != launched || len(ids(f.must(t, 200, "GET", "/v1/sandboxes?state=deleted", f.root, nil).body["sandboxes"])) != 0 {
		t.Fatal("a refused policy made something")
	}
	policy := `{"default_outbound":"deny","outbound":[{"action":"allow","protocol":"tcp","ports":"443","hosts":["pypi.org"]}]}`
	box := f.must(t, 201, "POST", "/v1/sandboxes", f.root, `{"firewall": `+policy+`}`)
	if got := f.must(t, 200, "GET", "/v1/sandboxes/"+str(box, "id")+"/firewall", f.root, nil); !jsonEqualRaw(got.raw, policy) {
		t.Errorf("the sandbox's policy: %s, want %s", got.raw, policy)
	}
	plain := f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{})
	if got := f.must(t, 200, "GET", "/v1/sandboxes/"+str(plain, "id")+"/firewall", f.root, nil); !jsonEqualRaw(got.raw, `{"default_outbound":"allow","outbound":[]}`) {
		t.Errorf("the default policy: %s", got.raw)
	}
}

func jsonEqualRaw(a []byte, b string) bool {
	var x, y any
	json.Unmarshal(a, &x)
	json.Unmarshal([]byte(b), &y)
	return jsonEqual(x, y)
}

// A secret set by an update is sealed like one set at create, and the
// update returns (it hung the store once: the secret store writes through
// the store, which the update's transaction held).
func TestEnvironmentSecretUpdate(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	f.must(t, 201, "POST", "/v1/environments", f.root, map[string]any{"name": "app", "variables": map[string]any{"MODE": map[string]any{"value": "x"}}})
	const canary = "sekrit-canary-4411"
	done := make(chan reply, 1)
	go func() {
		done <- f.do(t, "PATCH", "/v1/environments/app", f.root, map[string]any{"set": map[string]any{"TOKEN": map[string]any{"value": canary, "secret": true}}})
	}()
	select {
	case r := <-done:
		if r.status != 200 || r.body["latest"] != float64(2) || strings.Contains(string(r.raw), canary) {
			t.Fatalf("update with a secret: %d %s", r.status, r.raw)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("an update with a secret hangs")
	}
	noPlaintext(t, f.dir, canary)
	if n := countSecrets(t, f.dir, "env/"); n != 1 {
		t.Errorf("%d sealed values, want 1", n)
	}
}
