package api_test

import (
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/api"
)

// TestSetTimeout: a TTL set after create replaces the old one (longer,
// cleared, shorter) and the reaper deletes the sandbox when it passes.
func TestSetTimeout(t *testing.T) {
	t.Parallel()
	f := newFastAPI(t, api.Options{})
	id := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"ttl_seconds": 3600}), "id")
	path := "/v1/sandboxes/" + id + "/timeout"

	// Longer: expires_at moves to about a day from now.
	r := f.must(t, 200, "POST", path, f.root, map[string]any{"ttl_seconds": 86400})
	exp, err := time.Parse(time.RFC3339Nano, str(r, "expires_at"))
	if err != nil {
		t.Fatalf("expires_at: %v in %s", err, r.raw)
	}
	if d := time.Until(exp); d < 23*time.Hour || d > 25*time.Hour {
		t.Errorf("expires in %v, want about 24h", d)
	}
	// 0: no TTL at all, kept so (the stored record too).
	r = f.must(t, 200, "POST", path, f.root, map[string]any{"ttl_seconds": 0})
	if _, ok := r.body["expires_at"]; ok {
		t.Errorf("ttl 0 kept an expiry: %s", r.raw)
	}
	if r := f.must(t, 200, "GET", "/v1/sandboxes/"+id, f.root, nil); r.body["expires_at"] != nil {
		t.Errorf("get after ttl 0: %s", r.raw)
	}
	// Shorter: the reaper (every second) deletes it.
	f.must(t, 200, "POST", path, f.root, map[string]any{"ttl_seconds": 1})
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := f.must(t, 200, "GET", "/v1/sandboxes/"+id, f.root, nil)
		if str(r, "state") == "deleted" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox did not expire: %s", r.raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A deleted sandbox's timeout cannot be set.
	f.must(t, 409, "POST", path, f.root, map[string]any{"ttl_seconds": 60})
}

// TestSetTimeoutRefused: bad input is a 400 naming the field; a key
// without the scope is refused; another project's sandbox is not found;
// none of them changes the TTL.
func TestSetTimeoutRefused(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	otherProject := str(f.must(t, 201, "POST", "/v1/projects", f.root, map[string]any{"name": "other"}), "id")
	id := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"ttl_seconds": 3600}), "id")
	path := "/v1/sandboxes/" + id + "/timeout"
	before := str(f.must(t, 200, "GET", "/v1/sandboxes/"+id, f.root, nil), "expires_at")

	for name, body := range map[string]any{
		"negative":  map[string]any{"ttl_seconds": -1},
		"too large": map[string]any{"ttl_seconds": 2592001},
		"missing":   map[string]any{},
		"not a int": `{"ttl_seconds": "10m"}`,
		"unknown":   map[string]any{"ttl_seconds": 5, "ttl": 5},
	} {
		r := f.do(t, "POST", path, f.root, body)
		if r.status != 400 || !strings.Contains(string(r.raw), "ttl") {
			t.Errorf("%s: %d %s, want a 400 naming ttl", name, r.status, r.raw)
		}
	}

	_, readOnly := f.key(t, f.root, map[string]any{"scope": map[string]any{"actions": []string{"sandboxes:read"}}})
	if r := f.do(t, "POST", path, readOnly, map[string]any{"ttl_seconds": 1}); r.status != 403 {
		t.Errorf("a key without sandboxes:write: %d %s, want 403", r.status, r.raw)
	}
	_, other := f.key(t, f.root, map[string]any{"scope": map[string]any{"projects": []string{otherProject}}})
	if r := f.do(t, "POST", path, other, map[string]any{"ttl_seconds": 1}); r.status != 404 {
		t.Errorf("another project's key: %d %s, want 404", r.status, r.raw)
	}
	if now := str(f.must(t, 200, "GET", "/v1/sandboxes/"+id, f.root, nil), "expires_at"); now != before {
		t.Errorf("refused calls changed expires_at from %s to %s", before, now)
	}
	_, writer := f.key(t, f.root, map[string]any{"scope": map[string]any{"actions": []string{"sandboxes:write"}}})
	f.must(t, 200, "POST", path, writer, map[string]any{"ttl_seconds": 7200})
	if after := str(f.must(t, 200, "GET", "/v1/sandboxes/"+id, f.root, nil), "expires_at"); after == before {
		t.Errorf("a key with sandboxes:write did not change the TTL (%s)", after)
	}
}
