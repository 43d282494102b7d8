package code

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/internal/testserver"
	"github.com/harebox/harebox/sandbox"
)

// BenchmarkCodeInterpreter measures, through hareboxd's REST API on real
// VMs, each against its baseline in the same run: a cell's round trip
// (run_code "1+1") against an exec's ("true"), both on one sandbox once
// it has settled after its restore, and a create from the
// golden snapshot until its first cell's result against a create until
// its first exec's. Ratios: runcode/exec (goal at most 1.5) and
// create-runcode/create-exec.
func BenchmarkCodeInterpreter(b *testing.B) {
	s := testserver.Prepare(b)
	testimage.Image(b, "code-interpreter")
	dataDir, err := os.MkdirTemp("", "hbcb")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.Start(b, s, dataDir, "--golden-snapshots")
	defer func() { testserver.Finish(b, srv, dataDir) }()
	call := func(method, path string, body, out any) {
		b.Helper()
		raw, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, srv.URL+path, bytes.NewReader(raw))
		req.Header.Set("Authorization", "Bearer "+srv.Key)
		resp, err := srv.HTTP.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			var e map[string]any
			json.NewDecoder(resp.Body).Decode(&e)
			b.Fatalf("%s %s: %d %v", method, path, resp.StatusCode, e)
		}
		if out != nil {
			if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
				b.Fatal(err)
			}
		}
	}
	create := func() sandbox.Sandbox {
		var box sandbox.Sandbox
		call("POST", "/v1/sandboxes", map[string]any{"image": "code-interpreter", "ttl_seconds": 900}, &box)
		return box
	}
	del := func(id string) { call("DELETE", "/v1/sandboxes/"+id, nil, nil) }
	exec := func(id string) {
		var r sandbox.ExecResult
		call("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": "true"}, &r)
		if r.ExitCode != 0 {
			b.Fatalf("exec: %+v", r)
		}
	}
	cell := func(id string) {
		var x sandbox.CodeExecution
		call("POST", "/v1/sandboxes/"+id+"/code", map[string]any{"code": "1+1"}, &x)
		if x.Status != "ok" || len(x.Results) != 1 || x.Results[0].Text != "2" {
			b.Fatalf("run_code: %+v", x)
		}
	}
	// Until a create is served from the golden snapshot: not measured.
	for deadline := time.Now().Add(10 * time.Minute); ; {
		box := create()
		cell(box.ID) // (a cold boot's server is warm only once it answers)
		del(box.ID)
		if box.Served == "snapshot" {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("no create served from the golden snapshot in 10 minutes")
		}
		time.Sleep(5 * time.Second)
	}
	m := map[string][]float64{}
	since := func(k string, t time.Time) { m[k] = append(m[k], float64(time.Since(t).Microseconds())/1000) }
	b.ResetTimer()
	for range b.N {
		t := time.Now()
		a := create()
		exec(a.ID)
		since("create-exec", t)
		del(a.ID)
		t = time.Now()
		c := create()
		cell(c.ID)
		since("create-runcode", t)
		// The round trips in the steady state: one sandbox, past what a
		// restore leaves to do in its first moments.
		for range 3 {
			exec(c.ID)
			cell(c.ID)
		}
		for range 10 {
			t = time.Now()
			exec(c.ID)
			since("exec", t)
			t = time.Now()
			cell(c.ID)
			since("runcode", t)
		}
		del(c.ID)
	}
	b.StopTimer()
	med := func(k string) float64 {
		v := slices.Clone(m[k])
		slices.Sort(v)
		return v[len(v)/2]
	}
	for _, k := range []string{"exec", "runcode", "create-exec", "create-runcode"} {
		b.ReportMetric(med(k), k+"-ms")
	}
	b.ReportMetric(med("runcode")/med("exec"), "runcode/exec")
	b.ReportMetric(med("create-runcode")/med("create-exec"), "create-runcode/create-exec")
	fmt.Fprintf(os.Stderr, "code interpreter: run_code %.1f ms, exec %.1f ms (%.2fx); create to first cell %.0f ms, to first exec %.0f ms (%.2fx)\n",
		med("runcode"), med("exec"), med("runcode")/med("exec"), med("create-runcode"), med("create-exec"), med("create-runcode")/med("create-exec"))
}
