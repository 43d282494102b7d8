package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/api"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// These tests run a real server and real keys over the in-memory
// hypervisor: authorization needs no guest, so they take milliseconds.

type fastAPI struct {
	// skew moves the engine's clock (command history retention).
	skew      atomic.Int64
	url, root string
	eng       *harebox.Engine
	hv        *memhv.Hypervisor
	dir       string
	srv       *api.Server
	// store, if set, is the engine's (else SQLite in dir).
	store store.Store
	// tweak, if set, changes the engine's options.
	tweak func(*harebox.Options)
}

func newFastAPI(t testing.TB, opts api.Options) *fastAPI {
	return newFastAPIWith(t, opts, nil)
}

// newFastAPIWith is newFastAPI with engine options tweak changes.
func newFastAPIWith(t testing.TB, opts api.Options, tweak func(*harebox.Options)) *fastAPI {
	t.Helper()
	dir, err := os.MkdirTemp("", "hbz")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	f := &fastAPI{hv: hv, dir: dir, tweak: tweak}
	f.open(t, opts)
	return f
}

// open starts an engine and a server on the data directory (again, for a
// restart).
func (f *fastAPI) open(t testing.TB, opts api.Options) {
	t.Helper()
	eo := harebox.Options{
		DataDir: f.dir, Hypervisor: f.hv,
		Images: map[string]images.Image{sandbox.DefaultImage: memhv.Image(f.dir)}, Store: f.store,
		Capacity: harebox.Capacity{VCPUs: 64, MemoryMB: 65536, DiskGB: 1000},
		Now:      func() time.Time { return time.Now().Add(time.Duration(f.skew.Load())) },
	}
	if f.tweak != nil {
		f.tweak(&eo)
	}
	eng, err := harebox.New(context.Background(), eo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	key, _, _, err := api.LoadOrCreateRootKey(f.dir)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(f.dir + "/root.key")
	opts.Engine, opts.Auth = eng, key
	srv, err := api.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	// Served the way hareboxd serves, with its timeouts and limits.
	hs := httptest.NewUnstartedServer(srv)
	hs.Config = srv.HTTPServer()
	hs.Start()
	t.Cleanup(hs.Close)
	f.url, f.root, f.eng, f.srv = hs.URL, strings.TrimSpace(string(b)), eng, srv
}

func (f *fastAPI) do(t testing.TB, method, path, key string, body any) reply {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		raw, _ := json.Marshal(b)
		rd = bytes.NewReader(raw)
	}
	req, _ := http.NewRequest(method, f.url+path, rd)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, raw: raw, header: resp.Header}
	json.Unmarshal(raw, &r.body)
	return r
}

// must calls and fails the test unless the status is want.
func (f *fastAPI) must(t testing.TB, want int, method, path, key string, body any) reply {
	t.Helper()
	r := f.do(t, method, path, key, body)
	if r.status != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, r.status, r.raw, want)
	}
	return r
}

func str(r reply, k string) string { s, _ := r.body[k].(string); return s }

// key creates a key with the root key (or parent) and returns its secret.
func (f *fastAPI) key(t testing.TB, parent string, req map[string]any) (id, secret string) {
	t.Helper()
	r := f.must(t, 201, "POST", "/v1/keys", parent, req)
	return str(r, "id"), str(r, "secret")
}

// world is two accounts with projects, a fleet, sandboxes and files.
type world struct {
	accA, accB                    string
	web, fleet, env, budget, snap string // in A
	vol                           string // in A's web
	boxA1, boxA2, boxB1           string
	fullKeyID, fullA, fullB       string
}

func buildWorld(t testing.TB, f *fastAPI) world {
	var w world
	w.accA = str(f.must(t, 201, "POST", "/v1/accounts", f.root, map[string]string{"name": "alpha"}), "id")
	w.accB = str(f.must(t, 201, "POST", "/v1/accounts", f.root, map[string]string{"name": "beta"}), "id")
	w.web = str(f.must(t, 201, "POST", "/v1/projects?account=alpha", f.root, map[string]string{"name": "web"}), "id")
	w.fleet = str(f.must(t, 201, "POST", "/v1/projects/web/fleets?account=alpha", f.root, map[string]string{"name": "scrapers"}), "id")
	w.env = str(f.must(t, 201, "POST", "/v1/environments?account=alpha&project=web", f.root, map[string]any{
		"name": "prod", "variables": map[string]any{"MODE": map[string]any{"value": "prod"}, "TOKEN": map[string]any{"value": "s3cret-token", "secret": true}},
	}), "id")
	w.vol = str(f.must(t, 201, "POST", "/v1/volumes?account=alpha&project=web", f.root, map[string]any{"name": "data", "size_gb": 1}), "id")
	w.budget = str(f.must(t, 201, "POST", "/v1/budgets?account=alpha", f.root, map[string]any{
		"scope": map[string]any{"kind": "account"}, "period": "monthly", "limit_usd": "1000", "action": "notify",
	}), "id")
	w.boxA1 = str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"account_id": "alpha", "project": "web", "fleet": "scrapers", "labels": map[string]string{"team": "red"}}), "id")
	w.boxA2 = str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"account_id": "alpha", "labels": map[string]string{"team": "blue"}}), "id")
	w.boxB1 = str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"account_id": "beta"}), "id")
	f.must(t, 200, "PUT", "/v1/sandboxes/"+w.boxA1+"/files?path=/tmp/keep", f.root, "precious")
	w.snap = str(f.must(t, 201, "POST", "/v1/sandboxes/"+w.boxA1+"/snapshots", f.root, map[string]any{"name": "keep"}), "id")
	w.fullKeyID, w.fullA = f.key(t, f.root, map[string]any{"account_id": "alpha", "description": "full"})
	_, w.fullB = f.key(t, f.root, map[string]any{"account_id": "beta"})
	return w
}

// call is one route with a request aimed at account A's objects.
type call struct {
	op, method, path string
	body             any
	// target says which scope dimensions apply: "sandbox" (boxA1),
	// "project" (web), "fleet", "key", "account", or "" (none).
	target string
}

func calls(w world) []call {
	sb := "/v1/sandboxes/" + w.boxA1
	return []call{
		{"getInfo", "GET", "/v1/info", nil, ""},
		{"createSandbox", "POST", "/v1/sandboxes", map[string]any{"project": "web"}, "create"},
		{"listSandboxes", "GET", "/v1/sandboxes", nil, "list"},
		{"getSandbox", "GET", sb, nil, "sandbox"},
		{"deleteSandbox", "DELETE", sb, nil, "sandbox"},
		{"pauseSandbox", "POST", sb + "/pause", nil, "sandbox"},
		{"resumeSandbox", "POST", sb + "/resume", nil, "sandbox"},
		{"stopSandbox", "POST", sb + "/stop", nil, "sandbox"},
		{"startSandbox", "POST", sb + "/start", nil, "sandbox"},
		{"forkSandbox", "POST", sb + "/fork", nil, "sandbox"},
		{"hibernateSandbox", "POST", sb + "/hibernate", nil, "sandbox"},
		{"setSandboxTimeout", "POST", sb + "/timeout", map[string]any{"ttl_seconds": 3600}, "sandbox"},
		{"createSnapshot", "POST", sb + "/snapshots", nil, "sandbox"},
		{"listSnapshots", "GET", "/v1/snapshots", nil, "list"},
		{"createURL", "POST", sb + "/urls", map[string]any{"port": 8080}, "sandbox"},
		{"listURLs", "GET", sb + "/urls", nil, "sandbox"},
		{"getURL", "GET", sb + "/urls/url_01jx0000000000000000000000", nil, "sandbox"},
		{"rotateURL", "POST", sb + "/urls/url_01jx0000000000000000000000/rotate", nil, "sandbox"},
		{"deleteURL", "DELETE", sb + "/urls/url_01jx0000000000000000000000", nil, "sandbox"},
		{"getURLCA", "GET", "/v1/url-ca?project=" + w.web, nil, "project"},
		{"setURLCA", "PUT", "/v1/url-ca?project=" + w.web, map[string]any{}, "project"},
		{"deleteURLCA", "DELETE", "/v1/url-ca?project=" + w.web, nil, "project"},
		{"issueClientCert", "POST", "/v1/url-ca/certs?project=" + w.web, map[string]any{"name": "alice"}, "project"},
		{"listClientCerts", "GET", "/v1/url-ca/certs?project=" + w.web, nil, "project"},
		{"revokeClientCert", "POST", "/v1/url-ca/certs/1f/revoke?project=" + w.web, nil, "project"},
		{"getSnapshot", "GET", "/v1/snapshots/" + w.snap, nil, "sandbox"},
		{"deleteSnapshot", "DELETE", "/v1/snapshots/" + w.snap, nil, "sandbox"},
		{"exec", "POST", sb + "/exec", map[string]any{"cmd": "echo hi"}, "sandbox"},
		{"execStream", "POST", sb + "/exec/stream", map[string]any{"cmd": "echo hi"}, "sandbox"},
		{"runCode", "POST", sb + "/code", map[string]any{"code": "1 + 1"}, "sandbox"},
		{"listCodeContexts", "GET", sb + "/code/contexts", nil, "sandbox"},
		{"createCodeContext", "POST", sb + "/code/contexts", map[string]any{}, "sandbox"},
		{"restartCodeContext", "POST", sb + "/code/contexts/default/restart", nil, "sandbox"},
		{"deleteCodeContext", "DELETE", sb + "/code/contexts/default", nil, "sandbox"},
		{"startProcess", "POST", sb + "/processes", map[string]any{"cmd": "sleep 5"}, "sandbox"},
		{"listProcesses", "GET", sb + "/processes", nil, "sandbox"},
		{"getProcess", "GET", sb + "/processes/proc_x", nil, "sandbox"},
		{"getProcessOutput", "GET", sb + "/processes/proc_x/output", nil, "sandbox"},
		{"openPty", "GET", sb + "/pty", nil, "sandbox"},
		{"killProcess", "POST", sb + "/processes/proc_x/kill", nil, "sandbox"},
		{"sendProcessInput", "POST", sb + "/processes/proc_x/input", map[string]any{"stdin": "aGkK"}, "sandbox"},
		{"writeFile", "PUT", sb + "/files?path=/tmp/side-effect", "x", "sandbox"},
		{"readFile", "GET", sb + "/files?path=/tmp/keep", nil, "sandbox"},
		{"removeFile", "DELETE", sb + "/files?path=/tmp/keep", nil, "sandbox"},
		{"statFile", "GET", sb + "/files/stat?path=/tmp/keep", nil, "sandbox"},
		{"listFiles", "GET", sb + "/files/list?path=/tmp", nil, "sandbox"},
		{"mkdir", "POST", sb + "/files/mkdir?path=/tmp/side-dir", nil, "sandbox"},
		{"moveFile", "POST", sb + "/files/move?from=/tmp/keep&to=/tmp/moved", nil, "sandbox"},
		{"getFirewall", "GET", sb + "/firewall", nil, "sandbox"},
		{"setFirewall", "PUT", sb + "/firewall", map[string]any{"default_outbound": "deny"}, "sandbox"},
		{"createAccount", "POST", "/v1/accounts", map[string]any{"name": "gamma"}, "operator"},
		{"listAccounts", "GET", "/v1/accounts", nil, "list"},
		{"getAccount", "GET", "/v1/accounts/" + w.accA, nil, "account"},
		{"deleteAccount", "DELETE", "/v1/accounts/" + w.accA, nil, "operator"},
		{"createProject", "POST", "/v1/projects", map[string]any{"name": "new"}, "create"},
		{"listProjects", "GET", "/v1/projects", nil, "list"},
		{"getProject", "GET", "/v1/projects/" + w.web, nil, "project"},
		{"deleteProject", "DELETE", "/v1/projects/" + w.web, nil, "project"},
		{"createFleet", "POST", "/v1/projects/" + w.web + "/fleets", map[string]any{"name": "new"}, "project"},
		{"listFleets", "GET", "/v1/projects/" + w.web + "/fleets", nil, "project"},
		{"getFleet", "GET", "/v1/projects/" + w.web + "/fleets/" + w.fleet, nil, "project"},
		{"deleteFleet", "DELETE", "/v1/projects/" + w.web + "/fleets/" + w.fleet, nil, "project"},
		{"updateProject", "PATCH", "/v1/projects/" + w.web, map[string]any{"third_party_default": true}, "project"},
		{"createEnvironment", "POST", "/v1/environments?project=" + w.web, map[string]any{"name": "new"}, "create"},
		{"listEnvironments", "GET", "/v1/environments?project=" + w.web, nil, "project"},
		{"getEnvironment", "GET", "/v1/environments/" + w.env, nil, "project"},
		{"updateEnvironment", "PATCH", "/v1/environments/" + w.env, map[string]any{"set": map[string]any{"X": map[string]any{"value": "1"}}}, "project"},
		{"deleteEnvironment", "DELETE", "/v1/environments/" + w.env, nil, "project"},
		{"listEnvironmentVersions", "GET", "/v1/environments/" + w.env + "/versions", nil, "project"},
		{"getEnvironmentVersion", "GET", "/v1/environments/" + w.env + "/versions/1", nil, "project"},
		{"createVolume", "POST", "/v1/volumes?project=" + w.web, map[string]any{"name": "new", "size_gb": 1}, "create"},
		{"listVolumes", "GET", "/v1/volumes?project=" + w.web, nil, "project"},
		{"getVolume", "GET", "/v1/volumes/" + w.vol, nil, "project"},
		{"resizeVolume", "PATCH", "/v1/volumes/" + w.vol, map[string]any{"size_gb": 2}, "project"},
		{"deleteVolume", "DELETE", "/v1/volumes/" + w.vol, nil, "project"},
		{"listAudit", "GET", "/v1/audit", nil, "list"},
		{"verifyAudit", "GET", "/v1/audit/verify", nil, "operator"},
		{"getAuditKey", "GET", "/v1/audit/key", nil, ""},
		{"updateAccount", "PATCH", "/v1/accounts/" + w.accA, map[string]any{"retention": map[string]any{"history_days": 0}}, "account"},
		{"listCommands", "GET", "/v1/sandboxes/" + w.boxA1 + "/commands", nil, "sandbox"},
		{"createKey", "POST", "/v1/keys", map[string]any{"scope": map[string]any{"actions": []string{"getInfo"}}}, "create"},
		{"listKeys", "GET", "/v1/keys", nil, "list"},
		{"getKey", "GET", "/v1/keys/" + w.fullKeyID, nil, "key"},
		{"revokeKey", "DELETE", "/v1/keys/" + w.fullKeyID, nil, "key"},
		{"rotateKey", "POST", "/v1/keys/" + w.fullKeyID + "/rotate", nil, "key"},
		{"createBudget", "POST", "/v1/budgets", map[string]any{"scope": map[string]any{"kind": "account"}, "period": "total", "limit_usd": "0.01", "action": "delete"}, "create"},
		{"listBudgets", "GET", "/v1/budgets", nil, "list"},
		{"getBudget", "GET", "/v1/budgets/" + w.budget, nil, "account"},
		{"deleteBudget", "DELETE", "/v1/budgets/" + w.budget, nil, "budget"},
		{"getUsage", "GET", "/v1/usage", nil, "list"},
		{"listEvents", "GET", "/v1/events", nil, "list"},
		{"getSandboxMetrics", "GET", sb + "/metrics", nil, "sandbox"},
		{"getServerMetrics", "GET", "/metrics", nil, "server"},
		{"listImages", "GET", "/v1/images", nil, ""},
		{"buildImage", "POST", "/v1/images", map[string]any{"name": "mine", "from": "registry:127.0.0.1:9/mine:1"}, "operator"},
		{"deleteImage", "DELETE", "/v1/images/mine", nil, "operator"},
		{"listHosts", "GET", "/v1/hosts", nil, "operator"},
		{"deleteHost", "DELETE", "/v1/hosts/gone", nil, "operator"},
		{"rotateMeshKey", "POST", "/v1/hosts/gone/mesh-key", nil, "operator"},
		{"moveSandbox", "POST", sb + "/move", map[string]any{"to": "gone"}, "operator"},
		{"drainHost", "POST", "/v1/hosts/gone/drain", nil, "operator"},
		{"undrainHost", "POST", "/v1/hosts/gone/undrain", nil, "operator"},
		{"getPool", "GET", "/v1/pool", nil, "operator"},
		{"setPool", "PUT", "/v1/pool", map[string]any{"pool": map[string]int{}}, "operator"},
		{"resetPool", "DELETE", "/v1/pool", nil, "operator"},
	}
}

// Every route the server has is in the matrix below.
func TestMatrixCoversEveryRoute(t *testing.T) {
	have := map[string]bool{}
	for _, c := range calls(world{}) {
		have[c.op] = true
	}
	for _, r := range api.Routes() {
		if !r.Public && !have[r.OperationID] {
			t.Errorf("route %s (%s %s) is not in the authorization matrix", r.OperationID, r.Method, r.Path)
		}
	}
	for _, a := range authz.Actions {
		if !have[a] {
			t.Errorf("authz action %s is not a route", a)
		}
	}
}

// The authorization matrix: every route, with a key that lacks one thing
// each, gets the right status, and nothing changes.
func TestAuthorizationMatrix(t *testing.T) { authorizationMatrix(t, newFastAPI(t, api.Options{})) }

// The same on PostgreSQL: every domain's reads, writes and transactions
// (tenancy, keys, environments, budgets, audit, URLs) on a real server.
func TestAuthorizationMatrixPostgres(t *testing.T) {
	dsn := postgresDatabase(t)
	db, err := store.OpenPostgres(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	dir, err := os.MkdirTemp("", "hbz")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	f := &fastAPI{hv: hv, dir: dir, store: db}
	f.open(t, api.Options{})
	authorizationMatrix(t, f)
}

func authorizationMatrix(t *testing.T, f *fastAPI) {
	w := buildWorld(t, f)
	before := snapshot(t, f, w)
	launched := f.hv.Launched()
	made := 0 // keys this test makes
	countKeys := func() int {
		return len(ids(f.must(t, 200, "GET", "/v1/keys", f.root, nil).body["keys"]))
	}
	keysBefore := countKeys()

	alpha := func(scope map[string]any, extra ...any) string {
		req := map[string]any{"account_id": "alpha", "scope": scope}
		if len(extra) == 2 {
			req[extra[0].(string)] = extra[1]
		}
		_, s := f.key(t, f.root, req)
		made++
		return s
	}
	sandboxKey := alpha(map[string]any{"sandboxes": []string{w.boxA2}})
	projectKey := alpha(map[string]any{"projects": []string{"default"}})
	labelKey := alpha(map[string]any{"labels": map[string]string{"team": "blue"}})
	ipKey := alpha(map[string]any{"cidrs": []string{"192.0.2.0/24"}})
	expiredKey := alpha(map[string]any{}, "ttl_seconds", 1)
	revokedID, revokedKey := f.key(t, f.root, map[string]any{"account_id": "alpha"})
	made++
	f.must(t, 200, "DELETE", "/v1/keys/"+revokedID, f.root, nil)
	time.Sleep(1100 * time.Millisecond) // expiredKey expires

	for _, c := range calls(w) {
		all := []string{}
		for _, a := range authz.Actions {
			// "exec" in a scope is the group of every exec operation.
			if a != c.op && !(a == "exec" && slices.Contains(authz.Groups["exec"], c.op)) {
				all = append(all, a)
			}
		}
		lacking := alpha(map[string]any{"actions": all})
		rated := alpha(map[string]any{"rate": map[string]any{"per_second": 0.001, "burst": 1}})
		f.must(t, 200, "GET", "/v1/info", rated, nil) // spends its only token

		type tc struct {
			name, key string
			status    int
			code      string
		}
		cases := []tc{
			{"lacks the action", lacking, 403, "forbidden"},
			{"wrong address", ipKey, 403, "forbidden"},
			{"expired", expiredKey, 401, "unauthorized"},
			{"revoked", revokedKey, 401, "unauthorized"},
			{"no key", "", 401, "unauthorized"},
			{"rate spent", rated, 429, "rate_limited"},
		}
		switch c.target {
		case "sandbox":
			cases = append(cases, tc{"other sandbox", sandboxKey, 404, "not_found"},
				tc{"other project", projectKey, 404, "not_found"},
				tc{"other label", labelKey, 404, "not_found"},
				tc{"other account", w.fullB, 404, "not_found"})
		case "project":
			cases = append(cases, tc{"other project", projectKey, 404, "not_found"},
				tc{"other account", w.fullB, 404, "not_found"})
			switch c.op {
			case "setURLCA", "deleteURLCA", "issueClientCert", "revokeClientCert":
				// A project's CA opens all its mtls URLs.
				cases = append(cases, tc{"a key limited to sandboxes", sandboxKey, 403, "forbidden"},
					tc{"a key limited to labels", labelKey, 403, "forbidden"})
			}
		case "key":
			cases = append(cases, tc{"a key it did not create", sandboxKey, 404, "not_found"},
				tc{"other account", w.fullB, 404, "not_found"})
		case "account":
			cases = append(cases, tc{"other account", w.fullB, 404, "not_found"})
		case "budget":
			// An account-wide budget is out of reach of narrower keys.
			cases = append(cases, tc{"a key limited to a project", projectKey, 403, "forbidden"},
				tc{"a key limited to labels", labelKey, 403, "forbidden"},
				tc{"other account", w.fullB, 404, "not_found"})
		case "operator":
			cases = append(cases, tc{"a key, even a full one", w.fullA, 403, "forbidden"})
		case "server":
			cases = append(cases, tc{"a full key that does not name it", w.fullA, 403, "forbidden"})
		case "create":
			if c.op == "createEnvironment" || c.op == "createVolume" {
				// A project the key cannot see is a bad request field.
				cases = append(cases, tc{"a project outside its scope", projectKey, 400, "invalid"},
					tc{"other account", w.fullB, 400, "invalid"})
			}
			if c.op == "createBudget" {
				cases = append(cases, tc{"a key limited to sandboxes", sandboxKey, 403, "forbidden"},
					tc{"a key limited to a project", projectKey, 403, "forbidden"},
					tc{"a key limited to labels", labelKey, 403, "forbidden"})
			}
			if c.op == "createSandbox" {
				cases = append(cases, tc{"a key limited to sandboxes", sandboxKey, 403, "forbidden"},
					tc{"a project outside its scope", projectKey, 400, "invalid"})
			}
		}
		for _, k := range cases {
			r := f.do(t, c.method, c.path, k.key, c.body)
			code, _, msg := errField(r)
			if r.status != k.status || code != k.code || msg == "" {
				t.Errorf("%s with a key that %s: %d %s, want %d %s", c.op, k.name, r.status, r.raw, k.status, k.code)
			}
			if k.status == 429 && r.header.Get("Retry-After") == "" {
				t.Errorf("%s: 429 without Retry-After", c.op)
			}
		}
	}
	// Lists show only what the key sees.
	for _, k := range []struct {
		name, key string
		want      []string
	}{
		{"sandbox key", sandboxKey, []string{w.boxA2}},
		{"project key", projectKey, []string{w.boxA2}},
		{"label key", labelKey, []string{w.boxA2}},
		{"other account", w.fullB, []string{w.boxB1}},
		{"full", w.fullA, []string{w.boxA1, w.boxA2}},
	} {
		r := f.must(t, 200, "GET", "/v1/sandboxes", k.key, nil)
		if got := ids(r.body["sandboxes"]); fmt.Sprint(got) != fmt.Sprint(k.want) {
			t.Errorf("list with the %s: %v, want %v", k.name, got, k.want)
		}
	}
	if r := f.must(t, 200, "GET", "/v1/accounts", w.fullB, nil); fmt.Sprint(ids(r.body["accounts"])) != fmt.Sprint([]string{w.accB}) {
		t.Errorf("accounts seen by beta's key: %s", r.raw)
	}
	if r := f.must(t, 200, "GET", "/v1/projects", projectKey, nil); len(ids(r.body["projects"])) != 1 {
		t.Errorf("projects seen by a key limited to default: %s", r.raw)
	}

	// Every change and content read was recorded as denied in the audit
	// log, with the key that tried.
	denied := map[string]bool{}
	for _, e := range f.must(t, 200, "GET", "/v1/audit?outcome=denied&limit=1000", f.root, nil).body["entries"].([]any) {
		m := e.(map[string]any)
		if strings.HasPrefix(m["principal"].(string), "key_") {
			denied[m["action"].(string)] = true
		}
	}
	for _, a := range []string{"createSandbox", "deleteSandbox", "pauseSandbox", "resumeSandbox", "stopSandbox", "startSandbox", "forkSandbox", "hibernateSandbox", "setSandboxTimeout", "createSnapshot", "deleteSnapshot", "exec", "execStream", "startProcess",
		"getProcess", "getProcessOutput", "killProcess", "sendProcessInput", "openPty", "writeFile", "readFile", "removeFile", "listFiles", "mkdir", "moveFile", "setFirewall", "listCommands",
		"runCode", "createCodeContext", "restartCodeContext", "deleteCodeContext",
		"createAccount", "updateAccount", "deleteAccount", "createProject", "updateProject", "deleteProject", "createFleet", "deleteFleet",
		"createKey", "revokeKey", "rotateKey", "createEnvironment", "updateEnvironment", "deleteEnvironment", "createBudget", "deleteBudget",
		"createVolume", "resizeVolume", "deleteVolume",
		"createURL", "rotateURL", "deleteURL", "setURLCA", "deleteURLCA", "issueClientCert", "revokeClientCert",
		"buildImage", "deleteImage"} {
		if !denied[a] {
			t.Errorf("no denied %s in the audit log", a)
		}
	}

	// Nothing changed.
	if after := snapshot(t, f, w); after != before {
		t.Errorf("refused requests changed state:\nbefore %s\nafter  %s", before, after)
	}
	if n := countKeys(); n != keysBefore+made {
		t.Errorf("refused requests made %d keys", n-keysBefore-made)
	}
	if n := f.hv.Launched(); n != launched {
		t.Errorf("refused requests launched %d machines", n-launched)
	}
}

func ids(v any) []string {
	out := []string{}
	l, _ := v.([]any)
	for _, x := range l {
		if m, ok := x.(map[string]any); ok {
			out = append(out, m["id"].(string))
		}
	}
	return out
}

// snapshot summarises everything a refused request could have changed.
func snapshot(t testing.TB, f *fastAPI, w world) string {
	t.Helper()
	var b strings.Builder
	for _, path := range []string{"/v1/sandboxes?state=", "/v1/accounts", "/v1/projects?account=alpha", "/v1/projects/web/fleets?account=alpha", "/v1/keys/" + w.fullKeyID,
		"/v1/environments/" + w.env + "/versions"} {
		r := f.must(t, 200, "GET", path, f.root, nil)
		fmt.Fprintf(&b, "%s ", r.raw)
	}
	// (Budgets by ID: their spend moves as the sandboxes are metered.)
	fmt.Fprintf(&b, "budgets=%v ", ids(f.must(t, 200, "GET", "/v1/budgets?account=alpha", f.root, nil).body["budgets"]))
	for _, id := range []string{w.boxA1, w.boxA2, w.boxB1} {
		r := f.must(t, 200, "GET", "/v1/sandboxes/"+id, f.root, nil)
		fmt.Fprintf(&b, "%s=%s ", id, str(r, "state"))
	}
	r := f.must(t, 200, "GET", "/v1/sandboxes/"+w.boxA1+"/files/list?path=/tmp", f.root, nil)
	fmt.Fprintf(&b, "%s ", r.raw)
	r = f.must(t, 200, "GET", "/v1/sandboxes/"+w.boxA1+"/files?path=/tmp/keep", f.root, nil)
	fmt.Fprintf(&b, "keep=%s ", r.raw)
	r = f.must(t, 200, "GET", "/v1/sandboxes/"+w.boxA1+"/firewall", f.root, nil)
	fmt.Fprintf(&b, "%s", r.raw)
	return b.String()
}

// A key can create keys only narrower than or equal to itself, on every
// dimension; revoking a key revokes the keys it created.
func TestAttenuation(t *testing.T) {
	f := newFastAPI(t, api.Options{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	w := buildWorld(t, f)
	parentScope := map[string]any{
		"actions":    []string{"sandboxes:read", "keys:write", "keys:read", "exec"},
		"projects":   []string{"web"},
		"labels":     map[string]string{"team": "red"},
		"cidrs":      []string{"127.0.0.0/8"},
		"rate":       map[string]any{"per_second": 100, "burst": 100},
		"budget_usd": "10.00",
	}
	parentID, parent := f.key(t, f.root, map[string]any{"account_id": "alpha", "scope": parentScope, "ttl_seconds": 3600})
	narrow := func(change func(s map[string]any)) map[string]any {
		s := map[string]any{}
		for k, v := range parentScope {
			s[k] = v
		}
		change(s)
		return map[string]any{"scope": s, "ttl_seconds": 60}
	}
	wider := []struct {
		name, field string
		req         map[string]any
	}{
		{"more actions", "scope.actions", narrow(func(s map[string]any) { s["actions"] = []string{"sandboxes:read", "files:write"} })},
		{"all actions", "scope.actions", narrow(func(s map[string]any) { delete(s, "actions") })},
		// A project outside the key's scope is one it cannot see: invalid.
		{"another project", "scope.projects[0]", narrow(func(s map[string]any) { s["projects"] = []string{"default"} })},
		{"every project", "scope.projects", narrow(func(s map[string]any) { delete(s, "projects") })},
		{"without the label", "scope.labels", narrow(func(s map[string]any) { s["labels"] = map[string]string{"x": "y"} })},
		{"a wider network", "scope.cidrs", narrow(func(s map[string]any) { s["cidrs"] = []string{"0.0.0.0/0"} })},
		{"any address", "scope.cidrs", narrow(func(s map[string]any) { delete(s, "cidrs") })},
		{"a faster rate", "scope.rate", narrow(func(s map[string]any) { s["rate"] = map[string]any{"per_second": 1000, "burst": 1} })},
		{"no rate", "scope.rate", narrow(func(s map[string]any) { delete(s, "rate") })},
		{"a larger budget", "scope.budget_usd", narrow(func(s map[string]any) { s["budget_usd"] = "10.000001" })},
		{"no budget", "scope.budget_usd", narrow(func(s map[string]any) { delete(s, "budget_usd") })},
		{"a later expiry", "expires_at", func() map[string]any { r := narrow(func(map[string]any) {}); r["ttl_seconds"] = 7200; return r }()},
		{"no expiry", "expires_at", func() map[string]any { r := narrow(func(map[string]any) {}); delete(r, "ttl_seconds"); return r }()},
		{"another account", "account_id", func() map[string]any { r := narrow(func(map[string]any) {}); r["account_id"] = "beta"; return r }()},
	}
	for _, c := range wider {
		r := f.do(t, "POST", "/v1/keys", parent, c.req)
		code, field, _ := errField(r)
		if c.field == "account_id" {
			if r.status != 404 {
				t.Errorf("%s: %d %s, want 404", c.name, r.status, r.raw)
			}
			continue
		}
		if c.name == "another project" {
			if r.status != 400 || field != c.field {
				t.Errorf("%s: %d %s, want 400 on %s", c.name, r.status, r.raw, c.field)
			}
			continue
		}
		if r.status != 403 || code != "forbidden" || field != c.field {
			t.Errorf("%s: %d %s, want 403 forbidden on %s", c.name, r.status, r.raw, c.field)
		}
	}
	// Equal and narrower work; the child sees only what it should.
	childID, child := f.key(t, parent, narrow(func(map[string]any) {}))
	grandReq := narrow(func(s map[string]any) { s["actions"] = []string{"sandboxes:read"} })
	grandReq["ttl_seconds"] = 30 // within the child's
	grandID, grand := f.key(t, child, grandReq)
	r := f.must(t, 200, "GET", "/v1/sandboxes", grand, nil)
	if got := ids(r.body["sandboxes"]); len(got) != 1 || got[0] != w.boxA1 {
		t.Errorf("the grandchild sees %v", got)
	}
	if r := f.must(t, 200, "GET", "/v1/keys", child, nil); fmt.Sprint(ids(r.body["keys"])) != fmt.Sprint([]string{childID, grandID}) {
		t.Errorf("the child sees keys %s", r.raw)
	}
	// The parent's address scope holds for its descendants: from outside
	// it (through a trusted proxy) they are refused.
	req, _ := http.NewRequest("GET", f.url+"/v1/sandboxes", nil)
	req.Header.Set("Authorization", "Bearer "+grand)
	req.Header.Set("X-Forwarded-For", "198.51.100.7")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 403 {
		t.Errorf("from 198.51.100.7 via a trusted proxy: %v %v", resp.StatusCode, err)
	}
	// Revoking the parent revokes them all, at once.
	f.must(t, 200, "DELETE", "/v1/keys/"+parentID, f.root, nil)
	for _, k := range []string{parent, child, grand} {
		f.must(t, 401, "GET", "/v1/sandboxes", k, nil)
	}
	for _, id := range []string{childID, grandID} {
		if r := f.must(t, 200, "GET", "/v1/keys/"+id, f.root, nil); r.body["revoked_at"] == nil {
			t.Errorf("%s was not revoked with its parent", id)
		}
	}
}

// Keys survive a restart; a revoked key stays revoked; a rotated key's
// old secret is refused at once.
func TestKeysAcrossRestart(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	buildWorld(t, f)
	keepID, keep := f.key(t, f.root, map[string]any{"account_id": "alpha", "scope": map[string]any{"actions": []string{"sandboxes:read", "keys:write"}}})
	goneID, gone := f.key(t, f.root, map[string]any{"account_id": "alpha"})
	f.must(t, 200, "GET", "/v1/sandboxes", gone, nil)
	f.must(t, 200, "DELETE", "/v1/keys/"+goneID, f.root, nil)
	r := f.must(t, 200, "POST", "/v1/keys/"+keepID+"/rotate", keep, nil)
	old, keep := keep, str(r, "secret")
	f.must(t, 401, "GET", "/v1/sandboxes", old, nil)
	f.must(t, 200, "GET", "/v1/sandboxes", keep, nil)

	f.eng.Close()
	f.open(t, api.Options{})
	f.must(t, 200, "GET", "/v1/sandboxes", keep, nil)
	f.must(t, 403, "POST", "/v1/sandboxes", keep, map[string]any{})
	f.must(t, 401, "GET", "/v1/sandboxes", gone, nil)
	f.must(t, 401, "GET", "/v1/sandboxes", old, nil)
	r = f.must(t, 200, "GET", "/v1/keys/"+keepID, f.root, nil)
	if s, _ := r.body["secret"]; s != nil || !strings.HasPrefix(str(r, "hint"), "hbk_") {
		t.Errorf("a stored key shows %s", r.raw)
	}
}

// Tenancy: a key creates in its own account, gets its labels forced on its
// sandboxes, and names are per account; containers with live sandboxes
// cannot be deleted.
func TestTenancy(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	w := buildWorld(t, f)
	_, labelled := f.key(t, f.root, map[string]any{"account_id": "alpha", "scope": map[string]any{"labels": map[string]string{"team": "blue"}}})
	r := f.must(t, 201, "POST", "/v1/sandboxes", labelled, map[string]any{"name": "same", "labels": map[string]string{"x": "1"}})
	if l, _ := r.body["labels"].(map[string]any); l["team"] != "blue" || l["x"] != "1" || str(r, "account_id") != w.accA || str(r, "project") != "default" {
		t.Errorf("a labelled key's sandbox: %s", r.raw)
	}
	f.must(t, 400, "POST", "/v1/sandboxes", labelled, map[string]any{"labels": map[string]string{"team": "red"}})
	// The same name in another account is no conflict (and says nothing).
	f.must(t, 201, "POST", "/v1/sandboxes", w.fullB, map[string]any{"name": "same"})
	f.must(t, 409, "POST", "/v1/sandboxes", w.fullA, map[string]any{"name": "same"})
	// Live sandboxes keep their containers.
	for _, p := range []string{"/v1/projects/web?account=alpha", "/v1/projects/web/fleets/scrapers?account=alpha", "/v1/accounts/alpha"} {
		if r := f.do(t, "DELETE", p, f.root, nil); r.status != 409 {
			t.Errorf("DELETE %s with live sandboxes: %d %s", p, r.status, r.raw)
		}
	}
	f.must(t, 409, "DELETE", "/v1/projects/default?account=alpha", f.root, nil)
	r = f.must(t, 200, "GET", "/v1/sandboxes?project=web&fleet=scrapers", w.fullA, nil)
	if got := ids(r.body["sandboxes"]); len(got) != 1 || got[0] != w.boxA1 {
		t.Errorf("list by project and fleet: %v", got)
	}
	f.must(t, 200, "DELETE", "/v1/sandboxes/"+w.boxA1, w.fullA, nil)
	f.must(t, 204, "DELETE", "/v1/projects/web/fleets/scrapers?account=alpha", f.root, nil)
	f.must(t, 204, "DELETE", "/v1/environments/prod?account=alpha&project=web", f.root, nil)
	// A snapshot (a copy of its source's key) holds its project.
	if r := f.must(t, 409, "DELETE", "/v1/projects/web?account=alpha", f.root, nil); !strings.Contains(string(r.raw), "snapshots") {
		t.Errorf("delete of a project with a snapshot: %s", r.raw)
	}
	f.must(t, 204, "DELETE", "/v1/snapshots/"+w.snap, w.fullA, nil)
	f.must(t, 204, "DELETE", "/v1/projects/web?account=alpha", f.root, nil)
	f.must(t, 404, "GET", "/v1/projects/web?account=alpha", f.root, nil)
	// The operator lists another account's sandboxes, and finds its
	// projects by ID without naming the account.
	r = f.must(t, 200, "GET", "/v1/sandboxes?account=beta", f.root, nil)
	if got := ids(r.body["sandboxes"]); len(got) != 2 {
		t.Errorf("the operator's list of beta: %v", got)
	}
	betaDefault := str(f.must(t, 200, "GET", "/v1/projects/default?account=beta", f.root, nil), "id")
	f.must(t, 200, "GET", "/v1/projects/"+betaDefault, f.root, nil)
	if r := f.must(t, 200, "GET", "/v1/sandboxes?project="+betaDefault, f.root, nil); len(ids(r.body["sandboxes"])) != 2 {
		t.Errorf("the operator's list of beta's default project: %s", r.raw)
	}
	f.must(t, 404, "GET", "/v1/projects/"+betaDefault, w.fullA, nil)
	// A key that may not create learns nothing from a bad request.
	_, reader := f.key(t, f.root, map[string]any{"account_id": "beta", "scope": map[string]any{"actions": []string{"sandboxes:read"}}})
	f.must(t, 403, "POST", "/v1/sandboxes", reader, map[string]any{"image": "no-such-image", "size": map[string]string{"preset": "huge"}})
	// Deleting an account revokes its keys at once.
	for _, id := range ids(f.must(t, 200, "GET", "/v1/sandboxes?account=beta", f.root, nil).body["sandboxes"]) {
		f.must(t, 200, "DELETE", "/v1/sandboxes/"+id, f.root, nil)
	}
	f.must(t, 200, "GET", "/v1/sandboxes", reader, nil)
	f.must(t, 204, "DELETE", "/v1/accounts/beta", f.root, nil)
	f.must(t, 401, "GET", "/v1/sandboxes", reader, nil)
	f.must(t, 401, "GET", "/v1/sandboxes", w.fullB, nil)
	// The walkthrough's root key needs no tenancy at all.
	r = f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{})
	if str(r, "project") != "default" {
		t.Errorf("the root key's sandbox: %s", r.raw)
	}
}

// Hypervisor failures reach clients as the engine's kinds, never as 500.
func TestHypervisorErrorsTranslated(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	for _, c := range []struct {
		err    error
		status int
		code   string
	}{
		{hypervisor.Errorf(hypervisor.ErrUnavailable, "the plugin died"), 503, "unavailable"},
		{hypervisor.Errorf(hypervisor.ErrInvalid, "bad spec"), 400, "invalid"},
		{errors.New("something else"), 503, "unavailable"},
	} {
		f.hv.FailNextLaunch(c.err)
		r := f.do(t, "POST", "/v1/sandboxes", f.root, map[string]any{})
		if code, _, _ := errField(r); r.status != c.status || code != c.code {
			t.Errorf("launch failing with %v: %d %s, want %d %s", c.err, r.status, r.raw, c.status, c.code)
		}
	}
	if r := f.must(t, 200, "GET", "/v1/sandboxes?state=deleted", f.root, nil); len(ids(r.body["sandboxes"])) != 3 {
		t.Errorf("failed creates should be recorded as deleted: %s", r.raw)
	}
}
