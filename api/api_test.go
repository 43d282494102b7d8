package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/api"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/testimage"
)

// TestDocumentMatchesRouter: every route is in the OpenAPI document and
// every documented operation is routed, with the same operation IDs, and
// the document is valid OpenAPI 3.
func TestDocumentMatchesRouter(t *testing.T) {
	doc, err := api.Document()
	if err != nil {
		t.Fatal("the document does not validate:", err)
	}
	documented := map[string]string{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			documented[method+" "+path] = op.OperationID
			if op.OperationID == "" {
				t.Errorf("%s %s has no operationId", method, path)
			}
		}
	}
	routed := map[string]string{}
	for _, r := range api.Routes() {
		routed[r.Method+" "+r.Path] = r.OperationID
		// Public routes are exactly those the document marks security: [].
		op := doc.Paths.Find(r.Path).GetOperation(r.Method)
		if op == nil {
			continue
		}
		public := op.Security != nil && len(*op.Security) == 0
		if public != r.Public {
			t.Errorf("%s %s: router public=%v, document public=%v", r.Method, r.Path, r.Public, public)
		}
	}
	for k, id := range routed {
		if documented[k] != id {
			t.Errorf("routed %s (%s) is documented as %q", k, id, documented[k])
		}
	}
	for k := range documented {
		if _, ok := routed[k]; !ok {
			t.Errorf("documented %s is not routed", k)
		}
	}
}

type apiEnv struct {
	url, key string
	eng      *harebox.Engine
}

func newAPI(t *testing.T) *apiEnv {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps installs it)")
	}
	dir, err := os.MkdirTemp("", "hba")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	img := testimage.Image(t, "minimal")
	eng, err := harebox.New(context.Background(), harebox.Options{
		DataDir: dir, PluginPath: testimage.Binary(t, "harebox-plugin-qemu"),
		Images: map[string]images.Image{"minimal": img}, MaxFileBytes: 1 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	key, path, created, err := api.LoadOrCreateRootKey(dir)
	if err != nil || !created {
		t.Fatal(err, created)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("root.key mode %v", fi.Mode().Perm())
	}
	b, _ := os.ReadFile(path)
	srv, err := api.New(api.Options{Engine: eng, Auth: key})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &apiEnv{url: hs.URL, key: strings.TrimSpace(string(b)), eng: eng}
}

type reply struct {
	status int
	body   map[string]any
	raw    []byte
	header http.Header
}

func (e *apiEnv) call(t *testing.T, method, path, key string, body []byte) reply {
	t.Helper()
	req, _ := http.NewRequest(method, e.url+path, bytes.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, raw: raw}
	json.Unmarshal(raw, &r.body)
	return r
}

func errField(r reply) (code, field, msg string) {
	e, _ := r.body["error"].(map[string]any)
	code, _ = e["code"].(string)
	field, _ = e["field"].(string)
	msg, _ = e["message"].(string)
	return
}

func TestBadInput(t *testing.T) {
	e := newAPI(t)
	// One real sandbox, to show bad requests against it change nothing.
	r := e.call(t, "POST", "/v1/sandboxes", e.key, []byte(`{"image": "minimal", "labels": {"t": "bad-input"}}`))
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.raw)
	}
	id := r.body["id"].(string)
	defer e.call(t, "DELETE", "/v1/sandboxes/"+id, e.key, nil)
	good := `{"default_outbound": "deny", "outbound": [{"action": "allow", "protocol": "tcp", "ports": "443", "hosts": ["pypi.org"]}]}`
	if r := e.call(t, "PUT", "/v1/sandboxes/"+id+"/firewall", e.key, []byte(good)); r.status != 200 {
		t.Fatalf("set firewall: %d %s", r.status, r.raw)
	}

	big := bytes.Repeat([]byte("x"), api.MaxJSONBody+10)
	cases := []struct {
		name, method, path, key, body string
		status                        int
		code, field                   string
	}{
		{"invalid JSON", "POST", "/v1/sandboxes", e.key, `{"name": `, 400, "invalid", ""},
		{"trailing data", "POST", "/v1/sandboxes", e.key, `{} {}`, 400, "invalid", ""},
		{"empty body", "POST", "/v1/sandboxes", e.key, ``, 400, "invalid", ""},
		{"unknown field", "POST", "/v1/sandboxes", e.key, `{"nmae": "x"}`, 400, "invalid", "nmae"},
		{"wrong type", "POST", "/v1/sandboxes", e.key, `{"ttl_seconds": "soon"}`, 400, "invalid", "ttl_seconds"},
		{"invalid size", "POST", "/v1/sandboxes", e.key, `{"size": {"preset": "huge"}}`, 400, "invalid", "size.preset"},
		{"negative ttl", "POST", "/v1/sandboxes", e.key, `{"ttl_seconds": -1}`, 400, "invalid", "ttl_seconds"},
		{"unknown image", "POST", "/v1/sandboxes", e.key, `{"image": "nope"}`, 400, "invalid", "image"},
		{"oversized body", "POST", "/v1/sandboxes", e.key, `{"name": "` + string(big) + `"}`, 413, "too_large", ""},
		{"missing key", "GET", "/v1/sandboxes", "", ``, 401, "unauthorized", ""},
		{"wrong key", "GET", "/v1/sandboxes", "hbk_" + strings.Repeat("0", 64), ``, 401, "unauthorized", ""},
		{"missing sandbox", "GET", "/v1/sandboxes/sbx_01m8ka6npde8xkm1x1xncdtwqe", e.key, ``, 404, "not_found", ""},
		{"malformed id", "DELETE", "/v1/sandboxes/..%2f..%2fetc", e.key, ``, 404, "not_found", ""},
		{"unknown route", "GET", "/v1/nope", e.key, ``, 404, "not_found", ""},
		{"bad ports", "PUT", "/v1/sandboxes/" + id + "/firewall", e.key, `{"default_outbound": "deny", "outbound": [{"action": "allow", "protocol": "tcp", "ports": "99999", "hosts": ["pypi.org"]}]}`, 400, "invalid", "outbound[0].ports"},
		{"bad range", "PUT", "/v1/sandboxes/" + id + "/firewall", e.key, `{"default_outbound": "deny", "outbound": [{"action": "allow", "ports": "9000-8000", "cidrs": ["10.0.0.0/8"]}]}`, 400, "invalid", "outbound[0].ports"},
		{"bad name", "PUT", "/v1/sandboxes/" + id + "/firewall", e.key, `{"default_outbound": "deny", "outbound": [{"action": "allow", "protocol": "tcp", "ports": "443", "hosts": ["pypi..org"]}]}`, 400, "invalid", "outbound[0].hosts[0]"},
		{"unknown policy field", "PUT", "/v1/sandboxes/" + id + "/firewall", e.key, `{"default_outbound": "deny", "inbound": []}`, 400, "invalid", "inbound"},
		{"relative file path", "GET", "/v1/sandboxes/" + id + "/files?path=etc/passwd", e.key, ``, 400, "invalid", "path"},
		{"bad mode", "PUT", "/v1/sandboxes/" + id + "/files?path=/tmp/x&mode=999", e.key, `x`, 400, "invalid", "mode"},
		{"oversized file", "PUT", "/v1/sandboxes/" + id + "/files?path=/tmp/big", e.key, string(big), 413, "too_large", ""},
		{"relative move source", "POST", "/v1/sandboxes/" + id + "/files/move?from=tmp/x&to=/tmp/y", e.key, ``, 400, "invalid", "from"},
		{"move without a destination", "POST", "/v1/sandboxes/" + id + "/files/move?from=/tmp/x", e.key, ``, 400, "invalid", "to"},
		{"depth not a number", "GET", "/v1/sandboxes/" + id + "/files/list?path=/tmp&depth=all", e.key, ``, 400, "invalid", "depth"},
		{"too deep", "GET", "/v1/sandboxes/" + id + "/files/list?path=/tmp&depth=65", e.key, ``, 400, "invalid", "depth"},
		{"exec without command", "POST", "/v1/sandboxes/" + id + "/exec", e.key, `{}`, 400, "invalid", "cmd"},
	}
	for _, c := range cases {
		r := e.call(t, c.method, c.path, c.key, []byte(c.body))
		code, field, msg := errField(r)
		if r.status != c.status || code != c.code || field != c.field || msg == "" {
			t.Errorf("%s: got %d %s field %q (%s), want %d %s field %q", c.name, r.status, code, field, r.raw, c.status, c.code, c.field)
		}
	}
	// Nothing changed: one sandbox, still running, with the good policy, and
	// no half-written files.
	r = e.call(t, "GET", "/v1/sandboxes?state=deleted", e.key, nil)
	if n := len(r.body["sandboxes"].([]any)); n != 0 {
		t.Errorf("bad requests left %d deleted records", n)
	}
	r = e.call(t, "GET", "/v1/sandboxes", e.key, nil)
	if l := r.body["sandboxes"].([]any); len(l) != 1 || l[0].(map[string]any)["state"] != "running" {
		t.Errorf("sandboxes after bad requests: %s", r.raw)
	}
	r = e.call(t, "GET", "/v1/sandboxes/"+id+"/firewall", e.key, nil)
	var got, want any
	json.Unmarshal(r.raw, &got)
	json.Unmarshal([]byte(good), &want)
	if !jsonEqual(got, want) {
		t.Errorf("policy after refused updates: %s, want %s", r.raw, good)
	}
	if r := e.call(t, "GET", "/v1/sandboxes/"+id+"/files/stat?path=/tmp/big", e.key, nil); r.status != 404 {
		t.Errorf("an oversized upload left a file: %d %s", r.status, r.raw)
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// Operation IDs are unique: the SDKs name their methods after them.
func TestOperationIDsUnique(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range api.Routes() {
		if seen[r.OperationID] {
			t.Errorf("duplicate operationId %s", r.OperationID)
		}
		seen[r.OperationID] = true
	}
}
