package api_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/api"
)

// openStream GETs a followed stream with key; it is closed at the
// test's end.
func openStream(t *testing.T, url, key string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("follow: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp
}

// Events over REST: a budget reached shows on a followed stream as it
// happens, and in pages; a key limited to other labels does not see it.
func TestEventsREST(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	f.must(t, 201, "POST", "/v1/budgets", f.root, map[string]any{
		"scope": map[string]any{"kind": "label", "labels": map[string]string{"team": "red"}}, "period": "monthly", "limit_usd": "0.000001", "action": "notify",
	})
	_, blue := f.key(t, f.root, map[string]any{"scope": map[string]any{"labels": map[string]string{"team": "blue"}}})
	allID, all := f.key(t, f.root, map[string]any{"scope": map[string]any{"actions": []string{"events:read"}}})

	resp := openStream(t, f.url+"/v1/events?follow=true", all)
	got := make(chan map[string]any, 10)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var ev map[string]any
				json.Unmarshal([]byte(d), &ev)
				got <- ev
			}
		}
		close(got)
	}()
	// A red sandbox's delete settles it: the notify budget is reached.
	box := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"labels": map[string]string{"team": "red"}}), "id")
	f.must(t, 200, "DELETE", "/v1/sandboxes/"+box, f.root, nil)
	select {
	case ev := <-got:
		if ev["action"] != "budgetReached" || !strings.HasPrefix(ev["principal"].(string), "budget:") {
			t.Fatalf("the first event: %v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event on the followed stream")
	}
	page := f.must(t, 200, "GET", "/v1/events", f.root, nil)
	evs, _ := page.body["events"].([]any)
	if len(evs) != 1 || str(page, "next") == "0" {
		t.Fatalf("events: %s", page.raw)
	}
	if r := f.must(t, 200, "GET", "/v1/events?after="+str(page, "next"), f.root, nil); len(r.body["events"].([]any)) != 0 {
		t.Fatalf("after the cursor: %s", r.raw)
	}
	if r := f.must(t, 200, "GET", "/v1/events", blue, nil); len(r.body["events"].([]any)) != 0 {
		t.Fatalf("a blue key sees: %s", r.raw)
	}
	for _, q := range []string{"after=-1", "limit=0", "limit=1001", "follow=maybe", "account=nope"} {
		if r := f.do(t, "GET", "/v1/events?"+q, f.root, nil); r.status != 400 {
			t.Errorf("events?%s: %d %s", q, r.status, r.raw)
		}
	}
	// The key's revoke ends its stream, with an error.
	f.must(t, 200, "DELETE", "/v1/keys/"+allID, f.root, nil)
	select {
	case ev := <-got:
		if e, _ := ev["error"].(map[string]any); e["code"] != "unauthorized" {
			t.Fatalf("after the key's revoke: %v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream went on after its key's revoke")
	}
	if _, open := <-got; open {
		t.Fatal("the stream went on after its error")
	}
}

// A followed list of sandboxes: the list at once, then again as it
// changes (a create, a pause), only what the key may see (a key limited
// to red sees no blue sandbox), and an end with an error event once the
// key is revoked.
func TestFollowSandboxes(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	redID, red := f.key(t, f.root, map[string]any{"scope": map[string]any{"labels": map[string]string{"team": "red"}}})

	got := readEvents(openStream(t, f.url+"/v1/sandboxes?follow=true", red))
	// states reads "sandboxes" events until one satisfies ok; it fails on
	// a sandbox of another team.
	blue := ""
	next := func(what string, ok func(states map[string]string) bool) {
		t.Helper()
		timeout := time.After(15 * time.Second)
		for {
			ev := nextEvent(t, got, what, timeout)
			if ev.name != "sandboxes" {
				t.Fatalf("waiting for %s: %s %v", what, ev.name, ev.data)
			}
			states := map[string]string{}
			boxes, _ := ev.data["sandboxes"].([]any)
			for _, b := range boxes {
				m := b.(map[string]any)
				states[m["id"].(string)] = m["state"].(string)
			}
			if _, seen := states[blue]; seen && blue != "" {
				t.Fatalf("a red key's stream shows the blue sandbox %s", blue)
			}
			if ok(states) {
				return
			}
		}
	}
	next("the empty list", func(s map[string]string) bool { return len(s) == 0 })
	blue = str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"labels": map[string]string{"team": "blue"}}), "id")
	box := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"labels": map[string]string{"team": "red"}}), "id")
	next("the red sandbox running", func(s map[string]string) bool { return s[box] == "running" })
	f.must(t, 200, "POST", "/v1/sandboxes/"+box+"/pause", f.root, nil)
	next("the red sandbox paused", func(s map[string]string) bool { return s[box] == "paused" })

	f.must(t, 200, "DELETE", "/v1/keys/"+redID, f.root, nil)
	select {
	case ev := <-got:
		if e, _ := ev.data["error"].(map[string]any); ev.name != "error" || e["code"] != "unauthorized" {
			t.Fatalf("after the revoke: %s %v", ev.name, ev.data)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the stream of a revoked key goes on")
	}
	if _, open := <-got; open {
		t.Error("the stream goes on after its error")
	}

	for _, q := range []string{"follow=maybe", "follow=true&state=bogus", "follow=true&label=nokv"} {
		if r := f.do(t, "GET", "/v1/sandboxes?"+q, f.root, nil); r.status != 400 {
			t.Errorf("sandboxes?%s: %d %s", q, r.status, r.raw)
		}
	}
}

// Every followed stream ends, without an error, after Timeouts.Follow:
// the client opens it again, and is authenticated again.
func TestFollowedStreamsEnd(t *testing.T) {
	f := newFastAPI(t, api.Options{Timeouts: api.Timeouts{Follow: time.Second}})
	box := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{}), "id")
	for path, first := range map[string]string{
		"/v1/sandboxes?follow=true":             "event: sandboxes\n",
		"/v1/sandboxes/" + box + "?follow=true": "event: sandbox\n",
		"/v1/audit?follow=true":                 "event: entry\n",
		"/v1/events?follow=true":                "", // (none yet)
	} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			resp := openStream(t, f.url+path, f.root)
			start := time.Now()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("the stream ended after %s", d)
			}
			if !strings.HasPrefix(string(b), first) || strings.Contains(string(b), "event: error") {
				t.Fatalf("the stream: %q", b)
			}
		})
	}
}

// streamEvent is one server-sent event, its data decoded.
type streamEvent struct {
	name string
	data map[string]any
}

// readEvents sends each event of resp's stream on the channel it returns,
// which closes when the stream ends.
func readEvents(resp *http.Response) <-chan streamEvent {
	got := make(chan streamEvent, 1000)
	go func() {
		defer close(got)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		name := ""
		for sc.Scan() {
			l := sc.Text()
			if n, ok := strings.CutPrefix(l, "event: "); ok {
				name = n
			} else if d, ok := strings.CutPrefix(l, "data: "); ok {
				var v map[string]any
				json.Unmarshal([]byte(d), &v)
				got <- streamEvent{name, v}
			}
		}
	}()
	return got
}

// nextEvent is the stream's next event; the test fails when the stream
// ends first, or timeout fires.
func nextEvent(t *testing.T, got <-chan streamEvent, what string, timeout <-chan time.Time) streamEvent {
	t.Helper()
	select {
	case ev, open := <-got:
		if !open {
			t.Fatalf("the stream ended waiting for %s", what)
		}
		return ev
	case <-timeout:
		t.Fatalf("no event with %s", what)
	}
	return streamEvent{}
}

// The audit log's tail: newest=true reads the last entries; a followed
// log sends what the list would, then each entry of the key's account as
// it is appended (never another account's), and ends when the key is
// revoked.
func TestFollowAudit(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	w := buildWorld(t, f)
	seqs := func(entries any) []int {
		var out []int
		for _, e := range entries.([]any) {
			out = append(out, int(e.(map[string]any)["seq"].(float64)))
		}
		return out
	}
	all := seqs(f.must(t, 200, "GET", "/v1/audit?limit=1000", f.root, nil).body["entries"])
	if r := f.must(t, 200, "GET", "/v1/audit?newest=true&limit=3", f.root, nil); fmt.Sprint(seqs(r.body["entries"])) != fmt.Sprint(all[len(all)-3:]) || r.body["next"] != nil {
		t.Errorf("the newest 3 of %v: %s", all, r.raw)
	}

	// From a cursor, in pages of one: every entry after it, in order.
	resp := openStream(t, f.url+"/v1/audit?follow=true&limit=1&after="+fmt.Sprint(all[len(all)-4]), f.root)
	got := readEvents(resp)
	next := func(what string) streamEvent {
		t.Helper()
		return nextEvent(t, got, what, time.After(15*time.Second))
	}
	for _, want := range all[len(all)-3:] {
		if ev := next("an entry after the cursor"); ev.name != "entry" || int(ev.data["seq"].(float64)) != want {
			t.Fatalf("want entry %d: %s %v", want, ev.name, ev.data)
		}
	}
	resp.Body.Close()

	// Account alpha's key follows its own tail.
	resp = openStream(t, f.url+"/v1/audit?follow=true&newest=true&limit=2", w.fullA)
	got = readEvents(resp)
	mine := seqs(f.must(t, 200, "GET", "/v1/audit?limit=1000", w.fullA, nil).body["entries"])
	for _, want := range mine[len(mine)-2:] {
		if ev := next("alpha's newest"); ev.name != "entry" || int(ev.data["seq"].(float64)) != want {
			t.Fatalf("want entry %d: %s %v", want, ev.name, ev.data)
		}
	}
	f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"account_id": "beta"})
	f.must(t, 200, "POST", "/v1/sandboxes/"+w.boxA1+"/pause", f.root, nil)
	if ev := next("the pause"); ev.name != "entry" || ev.data["action"] != "pauseSandbox" || ev.data["target"] != w.boxA1 {
		t.Fatalf("after alpha's pause (beta's create before it): %s %v", ev.name, ev.data)
	}
	f.must(t, 200, "DELETE", "/v1/keys/"+w.fullKeyID, f.root, nil)
	for {
		ev := next("the end of a revoked key's stream")
		if ev.name == "entry" && ev.data["account_id"] != w.accA {
			t.Fatalf("alpha's stream shows %v", ev.data)
		}
		if ev.name == "error" {
			if e, _ := ev.data["error"].(map[string]any); e["code"] != "unauthorized" {
				t.Fatalf("after the revoke: %v", ev.data)
			}
			break
		}
	}
	if _, open := <-got; open {
		t.Error("the stream goes on after its error")
	}

	for _, q := range []string{"newest=maybe", "newest=true&format=jsonl", "follow=true&format=jsonl", "follow=yes"} {
		if r := f.do(t, "GET", "/v1/audit?"+q, f.root, nil); r.status != 400 {
			t.Errorf("audit?%s: %d %s", q, r.status, r.raw)
		}
	}
}

// One sandbox followed: its record at once and at each change; another
// scope's key cannot open it; its delete shows on the stream.
func TestFollowSandbox(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	_, blue := f.key(t, f.root, map[string]any{"scope": map[string]any{"labels": map[string]string{"team": "blue"}}})
	box := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"labels": map[string]string{"team": "red"}}), "id")
	if r := f.do(t, "GET", "/v1/sandboxes/"+box+"?follow=true", blue, nil); r.status != 404 {
		t.Errorf("another scope's key follows it: %d %s", r.status, r.raw)
	}
	if r := f.do(t, "GET", "/v1/sandboxes/"+box+"?follow=maybe", f.root, nil); r.status != 400 {
		t.Errorf("follow=maybe: %d %s", r.status, r.raw)
	}
	got := readEvents(openStream(t, f.url+"/v1/sandboxes/"+box+"?follow=true", f.root))
	next := func(what string, ok func(ev streamEvent) bool) {
		t.Helper()
		timeout := time.After(15 * time.Second)
		for {
			ev := nextEvent(t, got, what, timeout)
			if ev.name == "sandbox" && ev.data["id"] != box {
				t.Fatalf("another sandbox on the stream: %v", ev.data)
			}
			if ok(ev) {
				return
			}
		}
	}
	state := func(s string) func(streamEvent) bool {
		return func(ev streamEvent) bool { return ev.name == "sandbox" && ev.data["state"] == s }
	}
	next("it running", state("running"))
	f.must(t, 200, "POST", "/v1/sandboxes/"+box+"/pause", f.root, nil)
	next("it paused", state("paused"))
	f.must(t, 200, "DELETE", "/v1/sandboxes/"+box, f.root, nil)
	next("its delete", func(ev streamEvent) bool {
		e, _ := ev.data["error"].(map[string]any)
		return state("deleted")(ev) || ev.name == "error" && e["code"] == "not_found"
	})
}
