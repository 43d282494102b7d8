package host

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testserver"
)

// TestCLIBudget is the CLI's contract for budgets and usage, against a
// real hareboxd that boots no VM.
func TestCLIBudget(t *testing.T) {
	s := testserver.PrepareNoVM(t)
	dataDir, err := os.MkdirTemp("", "hbb")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.StartNoVM(t, s, dataDir)
	defer func() {
		srv.Stop(t)
		testserver.NoLeftovers(t, dataDir)
	}()
	c := &testserver.CLI{T: t, S: s, Srv: srv}
	cli, ok, fails := c.Run, c.OK, c.Fails
	type budget struct {
		ID     string `json:"id"`
		Name   string `json:"name"`
		Limit  string `json:"limit_usd"`
		Spent  string `json:"spent_usd"`
		Action string `json:"action"`
		Period string `json:"period"`
		Scope  struct {
			Kind   string            `json:"kind"`
			Ref    string            `json:"ref"`
			Labels map[string]string `json:"labels"`
		} `json:"scope"`
		WarnAt []int `json:"warn_at_percent"`
	}
	var acct, proj, lbl budget
	ok("", &acct, "budget", "create", "--scope", "account", "--limit", "$25", "--action", "notify", "--warn", "50,80", "--name", "whole")
	if acct.Limit != "25.00" || acct.Spent != "0.00" || acct.Period != "monthly" || len(acct.WarnAt) != 2 || acct.Name != "whole" {
		t.Fatalf("account budget: %+v", acct)
	}
	ok("", &proj, "budget", "create", "--scope", "project:default", "--limit", "10.5", "--action", "pause", "--period", "total")
	if !strings.HasPrefix(proj.Scope.Ref, "prj_") || proj.Limit != "10.50" || proj.Period != "total" {
		t.Fatalf("project budget: %+v", proj)
	}
	ok("", &lbl, "budget", "create", "--scope", "label:team=red,tier=web", "--limit", "1", "--action", "delete")
	if len(lbl.Scope.Labels) != 2 || lbl.Scope.Labels["tier"] != "web" {
		t.Fatalf("label budget: %+v", lbl)
	}
	var got budget
	ok("", &got, "budget", "get", proj.ID)
	if got.ID != proj.ID || got.Action != "pause" {
		t.Fatalf("get: %+v", got)
	}
	var l struct {
		Budgets []budget `json:"budgets"`
	}
	ok("", &l, "budget", "list")
	if len(l.Budgets) != 3 {
		t.Fatalf("list: %+v", l)
	}
	table, _, code := cli("", "--output", "table", "budget", "list")
	if code != 0 || !strings.Contains(table, "SPENT") || !strings.Contains(table, "label:") || strings.Count(table, "\n") != 4 {
		t.Fatalf("table: %s", table)
	}
	// Bad input: said by the CLI (exit 2) or the server (exit 1), nothing made.
	fails("", 2, "--scope", "budget", "create", "--scope", "galaxy", "--limit", "1", "--action", "pause")
	fails("", 2, "--limit", "budget", "create", "--scope", "account", "--limit", "1.0000001", "--action", "pause")
	fails("", 2, "required", "budget", "create", "--scope", "account")
	fails("", 1, "action", "budget", "create", "--scope", "account", "--limit", "1", "--action", "explode")
	fails("", 1, "scope.ref", "budget", "create", "--scope", "fleet:flt_nope", "--limit", "1", "--action", "pause")
	// A key limited to a project cannot set an account-wide budget.
	var k struct {
		Secret string `json:"secret"`
	}
	ok("", &k, "key", "create", "--projects", "default")
	fails(k.Secret, 1, "limited to some projects", "budget", "create", "--scope", "account", "--limit", "1", "--action", "delete")
	ok("", nil, "budget", "delete", lbl.ID)
	fails("", 1, "no budget", "budget", "get", lbl.ID)
	var u struct {
		Usage []map[string]any `json:"usage"`
	}
	ok("", &u, "usage", "--group-by", "project", "--from", "2026-01-01T00:00:00Z")
	if u.Usage == nil {
		t.Fatal("usage: no usage array")
	}
	fails("", 2, "--from", "usage", "--from", "yesterday")
	fails("", 1, "group_by", "usage", "--group-by", "colour")
}

// TestBudgetPausesVM is the end-to-end path on a real VM: with vCPUs
// priced at a dollar a second and metering every second, a budget pauses
// the sandbox it covers for real; resuming it is refused with 402 until
// the budget goes, and then it runs again.
func TestBudgetPausesVM(t *testing.T) {
	t.Parallel() // (it waits on the meter most of its time)
	s := testserver.Prepare(t)
	dataDir, err := os.MkdirTemp("", "hbv")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	prices := filepath.Join(dataDir, "prices.json")
	os.WriteFile(prices, []byte(`{"vcpu_hour": "3600", "memory_gib_hour": "0", "paused_memory_gib_hour": "0", "disk_gb_hour": "0"}`), 0o600)
	srv := testserver.Launch(t, s, dataDir, "--image-dir", s.ImageDir, "--plugin", s.Plugin, "--network", "none",
		"--prices", prices, "--meter-interval", "1s", "--metrics-interval", "1s")
	defer func() {
		srv.Stop(t)
		testserver.NoLeftovers(t, dataDir)
	}()
	code, b := srv.Call(t, "POST", "/v1/budgets", srv.Key, map[string]any{
		"scope": map[string]any{"kind": "label", "labels": map[string]string{"job": "metered"}}, "period": "monthly", "limit_usd": "20", "action": "pause",
	})
	if code != 201 {
		t.Fatalf("budget: %d %v", code, b)
	}
	code, box := srv.Call(t, "POST", "/v1/sandboxes", srv.Key, map[string]any{"image": "minimal", "size": map[string]any{"vcpus": 1, "memory_mb": 256, "disk_gb": 1}, "labels": map[string]string{"job": "metered"}})
	if code != 201 {
		t.Fatalf("create: %d %v", code, box)
	}
	id := box["id"].(string)
	defer srv.Call(t, "DELETE", "/v1/sandboxes/"+id, srv.Key, nil)
	// harebox events --follow prints the budget's acts as they happen.
	var followed bytes.Buffer
	follow := exec.Command(filepath.Join(s.Bin, "harebox"), "events", "--follow")
	follow.Env, follow.Stdout, follow.Stderr = srv.Env(s), &followed, &followed
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { follow.Process.Kill(); follow.Wait() }()
	code, other := srv.Call(t, "POST", "/v1/sandboxes", srv.Key, map[string]any{"image": "minimal", "size": map[string]any{"vcpus": 1, "memory_mb": 256, "disk_gb": 1}})
	if code != 201 {
		t.Fatalf("create the unbudgeted one: %d %v", code, other)
	}
	defer srv.Call(t, "DELETE", "/v1/sandboxes/"+other["id"].(string), srv.Key, nil)
	start := time.Now()
	for {
		_, got := srv.Call(t, "GET", "/v1/sandboxes/"+id, srv.Key, nil)
		if got["state"] == "paused" {
			break
		}
		if time.Since(start) > 90*time.Second {
			t.Fatalf("the sandbox was not paused: %v\n%s", got, testserver.Tail(srv.Log.String()))
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("paused %v after it was created", time.Since(start).Round(100*time.Millisecond))
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(followed.String(), `"budgetPause"`); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("harebox events --follow printed: %s", followed.String())
		}
	}
	follow.Process.Kill()
	follow.Wait()
	var line struct {
		Principal string `json:"principal"`
		Target    string `json:"target"`
	}
	for _, l := range strings.Split(strings.TrimSpace(followed.String()), "\n") {
		if strings.Contains(l, `"budgetPause"`) {
			if err := json.Unmarshal([]byte(l), &line); err != nil || line.Target != id || !strings.HasPrefix(line.Principal, "budget:") {
				t.Fatalf("the pause event: %s (%v)", l, err)
			}
		}
	}
	if out := testserver.Run(t, srv, s, s.Root, time.Minute, "harebox", "--output", "table", "events"); !strings.Contains(out, "budgetReached") || !strings.Contains(out, id) {
		t.Fatalf("harebox events: %s", out)
	}
	_, bud := srv.Call(t, "GET", "/v1/budgets/"+b["id"].(string), srv.Key, nil)
	if bud["reached_at"] == nil {
		t.Fatalf("budget: %v", bud)
	}
	// A paused VM runs nothing: exec is refused, and so is resume.
	if code, r := srv.Call(t, "POST", "/v1/sandboxes/"+id+"/exec", srv.Key, map[string]any{"cmd": "true"}); code != 409 {
		t.Fatalf("exec in the paused sandbox: %d %v", code, r)
	}
	if code, r := srv.Call(t, "POST", "/v1/sandboxes/"+id+"/resume", srv.Key, nil); code != 402 {
		t.Fatalf("resume over the budget: %d %v", code, r)
	}
	// The other one ran on.
	if code, r := srv.Call(t, "POST", "/v1/sandboxes/"+other["id"].(string)+"/exec", srv.Key, map[string]any{"cmd": "echo on"}); code != 200 || r["stdout"] != "on\n" {
		t.Fatalf("exec in the unbudgeted sandbox: %d %v", code, r)
	}
	// (The same server samples every second: harebox metrics shows the
	// unbudgeted sandbox's VMM, and the server's Prometheus text.)
	var samples struct {
		Samples []struct {
			CPUSeconds  float64 `json:"cpu_seconds"`
			MemoryBytes int64   `json:"memory_bytes"`
		} `json:"samples"`
	}
	// (Its first sample can take a few rounds on a loaded host.)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		err := json.Unmarshal([]byte(testserver.Run(t, srv, s, s.Root, time.Minute, "harebox", "metrics", other["id"].(string))), &samples)
		if err == nil && len(samples.Samples) > 0 && samples.Samples[len(samples.Samples)-1].CPUSeconds > 0 && samples.Samples[len(samples.Samples)-1].MemoryBytes > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("harebox metrics: %+v %v", samples, err)
		}
	}
	if out := testserver.Run(t, srv, s, s.Root, time.Minute, "harebox", "metrics", "--server"); !strings.Contains(out, `harebox_sandboxes{state="paused"} 1`) {
		t.Fatalf("harebox metrics --server: %.3000s", out)
	}
	if code, _ := srv.Call(t, "DELETE", "/v1/budgets/"+b["id"].(string), srv.Key, nil); code != 204 {
		t.Fatalf("delete the budget: %d", code)
	}
	if code, r := srv.Call(t, "POST", "/v1/sandboxes/"+id+"/resume", srv.Key, nil); code != 200 {
		t.Fatalf("resume without the budget: %d %v", code, r)
	}
	if code, r := srv.Call(t, "POST", "/v1/sandboxes/"+id+"/exec", srv.Key, map[string]any{"cmd": "echo back"}); code != 200 || r["stdout"] != "back\n" {
		t.Fatalf("exec after the resume: %d %v", code, r)
	}
	// harebox stop and start: the sandbox boots again (a new boot: the
	// minimal image's uptime starts over).
	var st struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(testserver.Run(t, srv, s, s.Root, 2*time.Minute, "harebox", "stop", id)), &st); err != nil || st.State != "stopped" {
		t.Fatalf("harebox stop: %+v %v", st, err)
	}
	if code, _ := srv.Call(t, "POST", "/v1/sandboxes/"+id+"/exec", srv.Key, map[string]any{"cmd": "true"}); code != 409 {
		t.Fatalf("exec in the stopped sandbox: %d", code)
	}
	if err := json.Unmarshal([]byte(testserver.Run(t, srv, s, s.Root, 3*time.Minute, "harebox", "start", id)), &st); err != nil || st.State != "running" {
		t.Fatalf("harebox start: %+v %v", st, err)
	}
	if code, r := srv.Call(t, "POST", "/v1/sandboxes/"+id+"/exec", srv.Key, map[string]any{"cmd": "echo again"}); code != 200 || r["stdout"] != "again\n" {
		t.Fatalf("exec after the start: %d %v", code, r)
	}
}
