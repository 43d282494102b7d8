package api_test

import (
	"encoding/base64"
	"testing"

	"github.com/harebox/harebox/api"
)

// A background process started with keep_stdin and a tag takes input
// over REST (stdin, then its end) and is listed with its tag; one
// started without it refuses input; an unknown field is refused.
func TestProcessInput(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	box := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{}), "id")
	procs := "/v1/sandboxes/" + box + "/processes"
	p := f.must(t, 201, "POST", procs, f.root, map[string]any{"argv": []string{"cat"}, "keep_stdin": true, "tag": "reader"})
	id := str(p, "id")
	if p.body["running"] != true || p.body["tag"] != "reader" {
		t.Fatalf("started: %v", p.body)
	}
	f.must(t, 204, "POST", procs+"/"+id+"/input", f.root, map[string]any{"stdin": base64.StdEncoding.EncodeToString([]byte("ping\n"))})
	f.must(t, 204, "POST", procs+"/"+id+"/input", f.root, map[string]any{"eof": true})
	done := f.must(t, 200, "GET", procs+"/"+id+"?wait=true&timeout_seconds=30", f.root, nil)
	res, _ := done.body["result"].(map[string]any)
	if done.body["running"] != false || res["stdout"] != "ping\n" {
		t.Fatalf("after its input: %v", done.body)
	}

	other := str(f.must(t, 201, "POST", procs, f.root, map[string]any{"argv": []string{"cat"}}), "id")
	if r := f.do(t, "POST", procs+"/"+other+"/input", f.root, map[string]any{"stdin": "eA=="}); r.status != 409 {
		t.Errorf("input to a process without its stdin kept: %d %v", r.status, r.body)
	}
	if r := f.do(t, "POST", procs, f.root, map[string]any{"argv": []string{"cat"}, "keep_stdn": true}); r.status != 400 {
		t.Errorf("an unknown field: %d %v", r.status, r.body)
	}
}
