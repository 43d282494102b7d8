package api_test

import (
	"testing"

	"github.com/harebox/harebox/api"
)

// Budgets over REST: a create a budget has no room for is a 402 with the
// budget_exceeded code, and nothing is made; usage reports what ran.
func TestBudgetsREST(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	box := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"size": map[string]any{"vcpus": 1, "memory_mb": 256, "disk_gb": 1}}), "id")
	// The running sandbox holds its next interval: a budget smaller than
	// what one more needs refuses it.
	b := f.must(t, 201, "POST", "/v1/budgets", f.root, map[string]any{
		"name": "tight", "scope": map[string]any{"kind": "project", "ref": "default"}, "period": "monthly", "limit_usd": "0.000001", "action": "deny_new",
	})
	if str(b, "limit_usd") != "0.000001" || b.body["scope"].(map[string]any)["ref"] == "default" {
		t.Fatalf("budget: %s", b.raw)
	}
	launched := f.hv.Launched()
	r := f.do(t, "POST", "/v1/sandboxes", f.root, map[string]any{})
	if code, _, msg := errField(r); r.status != 402 || code != "budget_exceeded" || msg == "" {
		t.Fatalf("create over the budget: %d %s", r.status, r.raw)
	}
	if f.hv.Launched() != launched {
		t.Fatal("a refused create launched a machine")
	}
	for _, c := range []struct {
		body  any
		field string
	}{
		{map[string]any{"scope": map[string]any{"kind": "account"}, "period": "monthly", "limit_usd": "-1", "action": "pause"}, "limit_usd"},
		{map[string]any{"scope": map[string]any{"kind": "account"}, "period": "monthly", "limit_usd": "ten", "action": "pause"}, "limit_usd"},
		{map[string]any{"scope": map[string]any{"kind": "account"}, "period": "monthly", "limit_usd": "1.0000001", "action": "pause"}, "limit_usd"},
		{map[string]any{"scope": map[string]any{"kind": "account"}, "period": "monthly", "limit_usd": "1", "action": "explode"}, "action"},
		{map[string]any{"scope": map[string]any{"kind": "fleet", "ref": "flt_nope"}, "period": "monthly", "limit_usd": "1", "action": "pause"}, "scope.ref"},
		{map[string]any{"scope": map[string]any{"kind": "account"}, "period": "monthly", "limit_usd": "1", "action": "pause", "extra": 1}, ""},
	} {
		r := f.do(t, "POST", "/v1/budgets", f.root, c.body)
		if code, field, _ := errField(r); r.status != 400 || code != "invalid" || (c.field != "" && field != c.field) {
			t.Errorf("%v: %d %s", c.body, r.status, r.raw)
		}
	}
	if l := ids(f.must(t, 200, "GET", "/v1/budgets", f.root, nil).body["budgets"]); len(l) != 1 || l[0] != str(b, "id") {
		t.Fatalf("budgets: %v", l)
	}
	f.must(t, 200, "GET", "/v1/budgets/"+str(b, "id"), f.root, nil)
	f.must(t, 404, "GET", "/v1/budgets/bgt_01j8z3k5m6n7p8q9r0s1t2v3w4", f.root, nil)
	for _, q := range []string{"group_by=colour", "from=yesterday", "from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z"} {
		if r := f.do(t, "GET", "/v1/usage?"+q, f.root, nil); r.status != 400 {
			t.Errorf("usage?%s: %d %s", q, r.status, r.raw)
		}
	}
	// Deleting the sandbox settles it: its usage is there, by sandbox.
	f.must(t, 200, "DELETE", "/v1/sandboxes/"+box, f.root, nil)
	u := f.must(t, 200, "GET", "/v1/usage?group_by=sandbox", f.root, nil)
	rows, _ := u.body["usage"].([]any)
	if len(rows) != 1 || rows[0].(map[string]any)["group"] != box {
		t.Fatalf("usage: %s", u.raw)
	}
	f.must(t, 204, "DELETE", "/v1/budgets/"+str(b, "id"), f.root, nil)
	f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{})
}
