package api_test

import (
	"encoding/json"
	"testing"

	"github.com/harebox/harebox/api"
	"github.com/harebox/harebox/store"
)

// Listing a sandbox's commands (the API calls the history service through
// the engine's OnSandbox) is authorized and audited as the engine's own
// calls are: the list, and a refused one, each leave one entry.
func TestListCommandsAudited(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	w := buildWorld(t, f)
	f.must(t, 200, "GET", "/v1/sandboxes/"+w.boxA1+"/commands", w.fullA, nil)
	f.must(t, 404, "GET", "/v1/sandboxes/"+w.boxB1+"/commands", w.fullA, nil)
	f.must(t, 404, "GET", "/v1/sandboxes/sbx_nosuchsandbox/commands", f.root, nil)
	var entries []store.AuditEntry
	b, _ := json.Marshal(f.must(t, 200, "GET", "/v1/audit?limit=1000", f.root, nil).body["entries"])
	json.Unmarshal(b, &entries)
	var got []store.AuditEntry
	for _, e := range entries {
		if e.Action == "listCommands" {
			got = append(got, e)
		}
	}
	if len(got) != 3 {
		t.Fatalf("listCommands entries: %+v", got)
	}
	byTarget := map[string]store.AuditEntry{}
	for _, e := range got {
		byTarget[e.Target] = e
	}
	if e := byTarget[w.boxA1]; e.Outcome != "ok" || e.AccountID != w.accA {
		t.Errorf("the list: %+v", e)
	}
	if e := byTarget[w.boxB1]; e.Outcome != "denied" || e.Error != "not_found" {
		t.Errorf("the refused list: %+v", e)
	}
	if e := byTarget["sbx_nosuchsandbox"]; e.Outcome == "ok" || e.Error != "not_found" {
		t.Errorf("the list of a missing sandbox: %+v", e)
	}
}
