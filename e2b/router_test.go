package e2b_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/harebox/harebox/e2b"
	"github.com/harebox/harebox/e2b/envd"
)

// TestRouter: one listener serves the control plane and each sandbox's
// envd, by the SDK's headers or by host name, over a real engine.
func TestRouter(t *testing.T) {
	f := newFixture(t)
	ev := envd.New(envd.Options{Files: f.eng, Access: f.h})
	srv := httptest.NewServer(&e2b.Router{API: f.h, Envd: ev.Handler, Domain: "e2b.test"})
	t.Cleanup(srv.Close)
	sb := f.create(t, f.key, map[string]any{})
	other := f.create(t, f.key, map[string]any{})

	do := func(method, path, host string, hdr map[string]string, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		}
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
	byHeader := func(id, token string) map[string]string {
		return map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": token,
			"Content-Type": "application/octet-stream"}
	}

	// envd by the SDK's headers: health, an upload, and a download.
	if st, b := do("GET", "/health", "", byHeader(sb.SandboxID, ""), ""); st != http.StatusNoContent {
		t.Fatalf("health by header: %d %s", st, b)
	}
	if st, b := do("POST", "/files?path=/tmp/routed", "", byHeader(sb.SandboxID, sb.EnvdAccessToken), "by header"); st != 200 {
		t.Fatalf("upload by header: %d %s", st, b)
	}
	// By host name, in any case, with a port in the Host header.
	host := "49983-" + strings.ToUpper(sb.SandboxID) + ".E2B.test:443"
	if st, b := do("GET", "/files?path=/tmp/routed", host, map[string]string{"X-Access-Token": sb.EnvdAccessToken}, ""); st != 200 || b != "by header" {
		t.Fatalf("download by host name: %d %q", st, b)
	}
	// Another sandbox's token does not open this one, by either route.
	if st, b := do("GET", "/files?path=/tmp/routed", "", byHeader(sb.SandboxID, other.EnvdAccessToken), ""); st != http.StatusUnauthorized {
		t.Errorf("another sandbox's token: %d %s", st, b)
	}
	if st, b := do("GET", "/files?path=/tmp/routed", "49983-"+other.SandboxID+".e2b.test", map[string]string{"X-Access-Token": sb.EnvdAccessToken}, ""); st != http.StatusUnauthorized {
		t.Errorf("a token sent to another sandbox's host: %d %s", st, b)
	}

	// A sandbox that is not running answers 502 to everything (the SDK's
	// isRunning reads that): paused, then killed.
	f.must(t, 204, "POST", "/sandboxes/"+other.SandboxID+"/pause", f.key, nil)
	for _, state := range []string{"paused", "killed"} {
		if st, b := do("GET", "/health", "", byHeader(other.SandboxID, other.EnvdAccessToken), ""); st != http.StatusBadGateway {
			t.Errorf("health of a %s sandbox: %d %s", state, st, b)
		}
		if st, b := do("GET", "/files?path=/tmp/x", "", byHeader(other.SandboxID, other.EnvdAccessToken), ""); st != http.StatusBadGateway {
			t.Errorf("a file of a %s sandbox: %d %s", state, st, b)
		}
		if state == "paused" {
			f.must(t, 204, "DELETE", "/sandboxes/"+other.SandboxID, f.key, nil)
		}
	}

	// The control plane: no sandbox header, and the domain itself or
	// another name.
	for _, h := range []string{"", "e2b.test", "api.e2b.test", "x.49983-" + sb.SandboxID + ".e2b.test", "other.example"} {
		if st, b := do("GET", "/sandboxes/"+sb.SandboxID, h, map[string]string{"X-API-KEY": f.key}, ""); st != 200 || !strings.Contains(b, sb.SandboxID) {
			t.Errorf("control plane at host %q: %d %s", h, st, b)
		}
	}

	// Refused, each in E2B's error shape: another port, a bad port or
	// sandbox ID (nothing is looked up for them).
	for _, c := range []struct {
		name string
		host string
		hdr  map[string]string
		want int
	}{
		{"another port by header", "", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "8080"}, http.StatusBadGateway},
		{"another port by host", "8080-" + sb.SandboxID + ".e2b.test", nil, http.StatusBadGateway},
		{"bad port", "", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "99999"}, http.StatusBadRequest},
		{"bad port by host", "0-" + sb.SandboxID + ".e2b.test", nil, http.StatusBadRequest},
		{"bad ID", "", map[string]string{"E2b-Sandbox-Id": "../../etc"}, http.StatusBadRequest},
		{"bad ID by host", "49983-notanid.e2b.test", nil, http.StatusBadRequest},
	} {
		st, b := do("GET", "/health", c.host, c.hdr, "")
		var e e2b.Error
		if st != c.want || json.Unmarshal([]byte(b), &e) != nil || e.Code != c.want || e.Message == "" {
			t.Errorf("%s: %d %s, want E2B's error %d", c.name, st, b, c.want)
		}
	}
}
