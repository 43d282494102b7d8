package e2b_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/harebox/harebox/e2b"
	"github.com/harebox/harebox/e2b/envd"
)

// TestInterpreterPort: who may reach the code interpreter's port through
// the listener (the cells themselves run on real VMs: e2e's E2B
// code-interpreter SDK test). Answers are plain text, as the SDK reads
// them.
func TestInterpreterPort(t *testing.T) {
	f := newFixture(t)
	ev := envd.New(envd.Options{Files: f.eng, Access: f.h})
	srv := httptest.NewServer(&e2b.Router{API: f.h, Envd: ev.Handler, Interpreter: f.h.Interpreter, Domain: "e2b.test"})
	t.Cleanup(srv.Close)
	call := func(method, path string, hdr map[string]string, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	pub := f.create(t, f.key, map[string]any{})
	to := map[string]string{"E2b-Sandbox-Id": pub.SandboxID, "E2b-Sandbox-Port": "49999"}
	with := func(k, v string) map[string]string {
		m := map[string]string{k: v}
		for a, b := range to {
			m[a] = b
		}
		return m
	}
	// Execute needs the sandbox's access token; a wrong one is refused.
	for _, tok := range []string{"", "x", pub.EnvdAccessToken + "0"} {
		if st, body := call("POST", "/execute", with("X-Access-Token", tok), `{"code": "1"}`); st != 401 || !strings.Contains(body, "access token") {
			t.Errorf("execute with token %q: %d %s", tok, st, body)
		}
	}
	// With it, the engine's answer: this sandbox's image has no
	// interpreter (409, plain text).
	if st, body := call("POST", "/execute", with("X-Access-Token", pub.EnvdAccessToken), `{"code": "1"}`); st != 409 || !strings.Contains(body, "no code interpreter") {
		t.Errorf("execute: %d %s", st, body)
	}
	if st, body := call("POST", "/execute", with("X-Access-Token", pub.EnvdAccessToken), `{"code": "1", "context_id": "a", "language": "python"}`); st != 400 || !strings.Contains(body, "Only one of") {
		t.Errorf("context and language: %d %s", st, body)
	}
	for _, l := range []string{"cobol", "java", "r"} {
		if st, body := call("POST", "/execute", with("X-Access-Token", pub.EnvdAccessToken), `{"code": "1", "language": "`+l+`"}`); st != 400 {
			t.Errorf("the language %s: %d %s", l, st, body)
		}
	}
	// The SDK's names of those served reach the engine.
	for _, l := range []string{"python", "javascript", "js", "typescript", "ts", "bash", "sh"} {
		if st, body := call("POST", "/execute", with("X-Access-Token", pub.EnvdAccessToken), `{"code": "1", "language": "`+l+`"}`); st != 409 {
			t.Errorf("the language %s: %d %s", l, st, body)
		}
	}
	if st, body := call("POST", "/execute", with("X-Access-Token", pub.EnvdAccessToken), `{"code": `+strings.Repeat(" ", 3<<20)+`"1"}`); st != 413 {
		t.Errorf("a huge body: %d %.200s", st, body)
	}
	// Contexts: as the sandbox's other ports, public here (the SDK sends
	// no token on them); a private sandbox's need its traffic token.
	if st, body := call("GET", "/contexts", to, ""); st != 409 || !strings.Contains(body, "no code interpreter") {
		t.Errorf("list contexts: %d %s", st, body)
	}
	if st, _ := call("GET", "/other", to, ""); st != 404 {
		t.Errorf("another path: %d", st)
	}
	priv := f.create(t, f.key, map[string]any{"network": map[string]any{"allowPublicTraffic": false}})
	pto := map[string]string{"E2b-Sandbox-Id": priv.SandboxID, "E2b-Sandbox-Port": "49999"}
	if st, body := call("POST", "/contexts", pto, `{}`); st != 403 || !strings.Contains(body, "traffic token") {
		t.Errorf("a private sandbox's contexts without its traffic token: %d %s", st, body)
	}
	pto["E2b-Traffic-Access-Token"] = *priv.TrafficAccessToken
	if st, body := call("POST", "/contexts", pto, `{}`); st != 409 {
		t.Errorf("with it: %d %s", st, body)
	}
	// A sandbox that is gone: 502 (the SDK's "timed out").
	f.must(t, 204, "DELETE", "/sandboxes/"+pub.SandboxID, f.key, nil)
	if st, _ := call("GET", "/contexts", to, ""); st != 502 {
		t.Errorf("a deleted sandbox: %d", st)
	}
}
