package e2e

import (
	"os"
	"strings"
	"testing"

	"github.com/harebox/harebox/internal/testserver"
)

// inGuest calls the API from inside the guest, as a program there would:
// python3's urllib to http://api.harebox.internal, with the key from the
// environment. It prints one line per call: the status and the body.
const inGuest = `
import json, os, sys, urllib.request, urllib.error
key, me, other = os.environ["KEY"], os.environ["ME"], os.environ["OTHER"]
def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request("http://api.harebox.internal" + path, data=data, method=method,
        headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
for name, method, path, body in [
    ("exec-own", "POST", "/v1/sandboxes/%s/exec" % me, {"cmd": "echo from inside"}),
    ("get-own", "GET", "/v1/sandboxes/%s" % me, None),
    ("exec-other", "POST", "/v1/sandboxes/%s/exec" % other, {"cmd": "echo escaped"}),
    ("create", "POST", "/v1/sandboxes", {"image": "minimal"}),
    ("firewall", "PUT", "/v1/sandboxes/%s/firewall" % me, {"default_outbound": "allow"}),
    ("key", "POST", "/v1/keys", {"scope": {"sandboxes": [me]}}),
]:
    status, reply = call(method, path, body)
    print(name, status, json.dumps(reply))
`

// A key limited to one sandbox, given to the code inside it, runs exec on
// that sandbox through api.harebox.internal, and nothing else.
func TestKeyInsideSandbox(t *testing.T) {
	s := testserver.Prepare(t)
	dataDir, err := os.MkdirTemp("", "hbk")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.Start(t, s, dataDir)
	defer func() {
		srv.Stop(t)
		testserver.NoLeftovers(t, dataDir)
		srv.DropTable(t)
	}()
	status, me := srv.Call(t, "POST", "/v1/sandboxes", srv.Key, map[string]any{"name": "me", "ttl_seconds": 600})
	if status != 201 {
		t.Fatalf("create: %d %v", status, me)
	}
	meID := me["id"].(string)
	defer srv.Call(t, "DELETE", "/v1/sandboxes/"+meID, srv.Key, nil)
	status, other := srv.Call(t, "POST", "/v1/sandboxes", srv.Key, map[string]any{"name": "other", "image": "minimal", "ttl_seconds": 600})
	if status != 201 {
		t.Fatalf("create: %d %v", status, other)
	}
	otherID := other["id"].(string)
	defer srv.Call(t, "DELETE", "/v1/sandboxes/"+otherID, srv.Key, nil)
	policy := map[string]any{"default_outbound": "deny", "outbound": []any{
		map[string]any{"action": "allow", "protocol": "tcp", "ports": "80", "hosts": []string{"api.harebox.internal"}}}}
	if status, body := srv.Call(t, "PUT", "/v1/sandboxes/"+meID+"/firewall", srv.Key, policy); status != 200 {
		t.Fatalf("firewall: %d %v", status, body)
	}
	status, key := srv.Call(t, "POST", "/v1/keys", srv.Key, map[string]any{
		"description": "for the code inside " + meID,
		"scope":       map[string]any{"sandboxes": []string{meID}, "actions": []string{"exec", "sandboxes:read"}},
	})
	if status != 201 {
		t.Fatalf("key: %d %v", status, key)
	}
	status, res := srv.Call(t, "POST", "/v1/sandboxes/"+meID+"/exec", srv.Key, map[string]any{
		"argv": []string{"python3", "-c", inGuest}, "timeout_seconds": 240,
		"env": map[string]string{"KEY": key["secret"].(string), "ME": meID, "OTHER": otherID},
	})
	if status != 200 || res["exit_code"] != float64(0) {
		t.Fatalf("in-guest program: %d %v", status, res)
	}
	out := res["stdout"].(string)
	t.Logf("from inside the sandbox:\n%s", out)
	want := map[string]string{
		"exec-own":   `200 {"exit_code": 0, "stdout": "from inside\n"`,
		"get-own":    `200 {"id": "` + meID,
		"exec-other": `404 `,
		"create":     `403 `,
		"firewall":   `403 `,
		"key":        `403 `,
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		name, rest, _ := strings.Cut(line, " ")
		if w, ok := want[name]; ok {
			if !strings.HasPrefix(rest, w) {
				t.Errorf("%s: %s, want %s...", name, rest, w)
			}
			delete(want, name)
		}
	}
	for name := range want {
		t.Errorf("no answer for %s", name)
	}
	// The other sandbox ran nothing, and the firewall is as it was.
	if status, body := srv.Call(t, "GET", "/v1/sandboxes/"+meID+"/firewall", srv.Key, nil); status != 200 || body["default_outbound"] != "deny" {
		t.Errorf("firewall after the attempts: %d %v", status, body)
	}
	if l := srv.Sandboxes(t, ""); len(l) != 2 {
		t.Errorf("sandboxes after the attempts: %d", len(l))
	}
}
