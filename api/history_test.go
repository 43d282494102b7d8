package api_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/api"
)

// Every exec (synchronous, streaming, background) is kept in the
// sandbox's history, sealed and erased with it; monitoring off keeps
// nothing; the account's retention drops output and entries, at once when
// lowered and across a restart.
func TestCommandHistory(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	box := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{}), "id")
	f.must(t, 200, "POST", "/v1/sandboxes/"+box+"/exec", f.root, map[string]any{"cmd": "echo history-canary-one", "user": "root", "cwd": "/tmp"})
	f.must(t, 200, "POST", "/v1/sandboxes/"+box+"/exec/stream", f.root, map[string]any{"cmd": "echo streamed"})
	p := f.must(t, 201, "POST", "/v1/sandboxes/"+box+"/processes", f.root, map[string]any{"argv": []string{"echo", "in", "background"}})
	f.must(t, 200, "GET", "/v1/sandboxes/"+box+"/processes/"+str(p, "id")+"?wait=true", f.root, nil)
	history := func(id string, atLeast int) []map[string]any {
		t.Helper()
		var out []map[string]any
		deadline := time.Now().Add(5 * time.Second)
		for {
			out = nil
			for _, c := range f.must(t, 200, "GET", "/v1/sandboxes/"+id+"/commands", f.root, nil).body["commands"].([]any) {
				out = append(out, c.(map[string]any))
			}
			// The background entry is written when the process ends.
			if len(out) >= atLeast || time.Now().After(deadline) {
				return out
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	h := history(box, 3)
	if len(h) != 3 {
		t.Fatalf("history: %v", h)
	}
	out := func(c map[string]any) string {
		r, _ := c["result"].(map[string]any)
		s, _ := r["stdout"].(string)
		return s
	}
	if h[0]["kind"] != "exec" || h[0]["cmd"] != "echo history-canary-one" || h[0]["user"] != "root" || h[0]["cwd"] != "/tmp" || out(h[0]) != "history-canary-one\n" ||
		h[1]["kind"] != "stream" || out(h[1]) != "streamed\n" || h[2]["kind"] != "background" || out(h[2]) != "in background\n" {
		t.Fatalf("history: %v", h)
	}
	noPlaintext(t, f.dir, "history-canary-one")

	quiet := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"monitoring": false}), "id")
	f.must(t, 200, "POST", "/v1/sandboxes/"+quiet+"/exec", f.root, map[string]any{"cmd": "echo unseen"})
	if h := history(quiet, 0); len(h) != 0 {
		t.Errorf("monitoring off kept %v", h)
	}

	// Output kept for 0 days: entries without output.
	f.must(t, 200, "PATCH", "/v1/accounts/default", f.root, map[string]any{"retention": map[string]any{"output_days": 0}})
	f.must(t, 200, "POST", "/v1/sandboxes/"+box+"/exec", f.root, map[string]any{"cmd": "echo later"})
	h = history(box, 4)
	if len(h) != 4 || out(h[0]) != "" || h[0]["output_purged"] != true || out(h[3]) != "" || h[3]["cmd"] != "echo later" {
		t.Errorf("output_days 0 (lowered: the old output goes too): %v", h)
	}
	// A day of history, across a restart two days later: gone at start.
	f.must(t, 200, "PATCH", "/v1/accounts/default", f.root, map[string]any{"retention": map[string]any{"history_days": 1, "output_days": 1}})
	f.must(t, 200, "POST", "/v1/sandboxes/"+box+"/exec", f.root, map[string]any{"cmd": "echo kept"})
	if h := history(box, 5); len(h) != 5 || out(h[4]) != "kept\n" {
		t.Errorf("history_days 1, today: %v", h)
	}
	f.eng.Close()
	f.skew.Store(int64(49 * time.Hour))
	f.open(t, api.Options{})
	if h := history(box, 0); len(h) != 0 {
		t.Errorf("two days later, after a restart: %v", h)
	}
	f.must(t, 400, "PATCH", "/v1/accounts/default", f.root, map[string]any{"retention": map[string]any{"history_days": -1}})
	ret := func(r reply) string { b, _ := json.Marshal(r.body["retention"]); return string(b) }
	if r := f.must(t, 200, "GET", "/v1/accounts/default", f.root, nil); ret(r) != `{"history_days":1,"output_days":1}` {
		t.Errorf("a refused update changed the retention: %s", ret(r))
	}
	// An update replaces the whole retention: output_days left out is forever.
	if r := f.must(t, 200, "PATCH", "/v1/accounts/default", f.root, map[string]any{"retention": map[string]any{"history_days": 2}}); ret(r) != `{"history_days":2}` {
		t.Errorf("retention after {history_days: 2}: %s", ret(r))
	}
	// History 0 days: nothing is kept, and a delete erases what was.
	f.must(t, 200, "PATCH", "/v1/accounts/default", f.root, map[string]any{"retention": map[string]any{}})
	f.must(t, 200, "POST", "/v1/sandboxes/"+box+"/exec", f.root, map[string]any{"cmd": "echo again"})
	if n := countSecrets(t, f.dir, "history/"+box); n != 1 {
		t.Errorf("%d sealed entries, want 1", n)
	}
	f.must(t, 200, "DELETE", "/v1/sandboxes/"+box, f.root, nil)
	if n := countSecrets(t, f.dir, "history/"); n != 0 {
		t.Errorf("%d sealed history entries after the delete", n)
	}
	if r := f.must(t, 200, "GET", "/v1/sandboxes/"+box+"/commands", f.root, nil); len(r.body["commands"].([]any)) != 0 || strings.Contains(string(r.raw), "again") {
		t.Errorf("a deleted sandbox's history: %s", r.raw)
	}
}
