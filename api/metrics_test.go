package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/harebox/harebox/api"
)

// Sandbox metrics and the server's /metrics over REST (the fake
// hypervisor has no VMM process: what is measured of one is in the
// real-VM test; here the samples, their access and retention).
func TestMetricsREST(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	on := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"labels": map[string]string{"team": "red"}}), "id")
	off := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"monitoring": false}), "id")
	f.eng.Monitor().Sample(context.Background())
	f.eng.Monitor().Sample(context.Background())
	samples := func(id, key string) []any {
		t.Helper()
		l, _ := f.must(t, 200, "GET", "/v1/sandboxes/"+id+"/metrics", key, nil).body["samples"].([]any)
		return l
	}
	if l := samples(on, f.root); len(l) != 2 || l[0].(map[string]any)["sandbox_id"] != on {
		t.Fatalf("samples of the monitored sandbox: %v", l)
	}
	if l := samples(off, f.root); len(l) != 0 {
		t.Fatalf("samples of a sandbox with monitoring off: %v", l)
	}
	_, blue := f.key(t, f.root, map[string]any{"scope": map[string]any{"labels": map[string]string{"team": "blue"}}})
	f.must(t, 404, "GET", "/v1/sandboxes/"+on+"/metrics", blue, nil)
	for _, q := range []string{"from=yesterday", "limit=0", "limit=10001"} {
		if r := f.do(t, "GET", "/v1/sandboxes/"+on+"/metrics?"+q, f.root, nil); r.status != 400 {
			t.Errorf("metrics?%s: %d %s", q, r.status, r.raw)
		}
	}
	// Samples go with the account's history retention.
	f.must(t, 200, "PATCH", "/v1/accounts/default", f.root, map[string]any{"retention": map[string]any{"history_days": 0}})
	if l := samples(on, f.root); len(l) != 0 {
		t.Fatalf("samples after retention 0: %v", l)
	}

	// The server's metrics: the Prometheus text format, for the root key
	// and a key that names them; not for a full key of one account.
	r := f.must(t, 200, "GET", "/metrics", f.root, nil)
	if !strings.Contains(string(r.raw), `harebox_sandboxes{state="running"} 2`) || !strings.Contains(string(r.raw), "go_goroutines") {
		t.Fatalf("/metrics: %.2000s", r.raw)
	}
	// The creates so far, and their steps.
	for _, want := range []string{`harebox_create_seconds_count{served="boot"} 2`, `harebox_create_phase_seconds_total{phase="launch",served="boot"}`, "harebox_pool_idle 0"} {
		if !strings.Contains(string(r.raw), want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
	_, reader := f.key(t, f.root, map[string]any{"scope": map[string]any{"actions": []string{"metrics:read"}}})
	f.must(t, 200, "GET", "/metrics", reader, nil)
	_, full := f.key(t, f.root, map[string]any{})
	f.must(t, 403, "GET", "/metrics", full, nil)
	f.must(t, 401, "GET", "/metrics", "", nil)
}
