package host

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testserver"
)

// TestFork, on real VMs through the CLI: a running sandbox with a file and
// a background process is forked twice; each clone has the file and the
// process still counting, and its own machine-id, kernel entropy, address
// and MAC. A named snapshot outlives the use it is put to: a sandbox made
// from it after it is taken keeps running once it is deleted. With golden
// snapshots on, later creates are restored, each with its own identity.
func TestFork(t *testing.T) {
	s := testserver.Prepare(t)
	dataDir, err := os.MkdirTemp("", "hbf")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.Start(t, s, dataDir, "--golden-snapshots")
	defer func() { testserver.Finish(t, srv, dataDir) }()
	hb := func(args ...string) string {
		t.Helper()
		return testserver.Run(t, srv, s, s.Root, 3*time.Minute, "harebox", args...)
	}
	var src struct{ ID string }
	if err := json.Unmarshal([]byte(hb("new", "--image", "minimal", "--label", "e2e=fork")), &src); err != nil || src.ID == "" {
		t.Fatalf("new: %v", err)
	}
	defer srv.Call(t, "DELETE", "/v1/sandboxes/"+src.ID, srv.Key, nil)
	hb("exec", src.ID, "-c", "echo forked > /tmp/mark")
	hb("exec", src.ID, "-c", "setsid sh -c 'n=0; while :; do n=$((n+1)); echo $n > /tmp/counter; sleep 0.2; done' >/dev/null 2>&1 &")
	ident := func(id string) map[string]string {
		t.Helper()
		out := hb("exec", id, "-c", "printf '%s\\n' \"$(cat /etc/machine-id 2>/dev/null)\"; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; ip -4 -o addr show eth0 | awk '{print $4}'; cat /sys/class/net/eth0/address")
		l := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if len(l) != 4 {
			t.Fatalf("identity of %s: %q", id, out)
		}
		return map[string]string{"machine-id": l[0], "urandom": l[1], "address": l[2], "mac": l[3]}
	}
	srcID := ident(src.ID)

	start := time.Now()
	var clones []struct{ ID, Name, State string }
	if err := json.Unmarshal([]byte(hb("fork", src.ID, "--count", "2", "--name", "kid")), &clones); err != nil || len(clones) != 2 {
		t.Fatalf("fork: %v %+v", err, clones)
	}
	t.Logf("fork of 2 took %v", time.Since(start).Round(100*time.Millisecond))
	for _, c := range clones {
		defer srv.Call(t, "DELETE", "/v1/sandboxes/"+c.ID, srv.Key, nil)
	}
	seen := map[string]map[string]string{src.ID: srcID}
	for _, c := range clones {
		if c.State != "running" || !strings.HasPrefix(c.Name, "kid-") {
			t.Errorf("clone %+v", c)
		}
		if got := hb("exec", c.ID, "--", "cat", "/tmp/mark"); got != "forked\n" {
			t.Errorf("clone %s: /tmp/mark %q", c.ID, got)
		}
		// The background process came along, and still runs.
		n1, _ := strconv.Atoi(strings.TrimSpace(hb("exec", c.ID, "--", "cat", "/tmp/counter")))
		time.Sleep(1500 * time.Millisecond)
		n2, _ := strconv.Atoi(strings.TrimSpace(hb("exec", c.ID, "--", "cat", "/tmp/counter")))
		if n1 == 0 || n2 <= n1 {
			t.Errorf("clone %s: the counter went %d then %d", c.ID, n1, n2)
		}
		id := ident(c.ID)
		if len(id["machine-id"]) != 32 || !strings.HasPrefix(id["address"], srv.Pool) {
			t.Errorf("clone %s identity %v", c.ID, id)
		}
		for other, oid := range seen {
			for k, v := range id {
				if oid[k] == v {
					t.Errorf("clone %s has the same %s as %s: %s", c.ID, k, other, v)
				}
			}
		}
		seen[c.ID] = id
	}
	// The source ran on all along.
	if got := hb("exec", src.ID, "--", "cat", "/tmp/mark"); got != "forked\n" {
		t.Errorf("source after the fork: %q", got)
	}

	// A named snapshot, a sandbox from it, and the snapshot's delete.
	var snap struct{ ID, Name string }
	if err := json.Unmarshal([]byte(hb("snapshot", "create", src.ID, "--name", "base")), &snap); err != nil || snap.Name != "base" {
		t.Fatalf("snapshot create: %v %+v", err, snap)
	}
	if out := hb("--output", "table", "snapshot", "list", "--sandbox", src.ID); !strings.Contains(out, snap.ID) {
		t.Fatalf("snapshot list: %s", out)
	}
	var late struct{ ID string }
	if err := json.Unmarshal([]byte(hb("new", "--snapshot", snap.ID)), &late); err != nil || late.ID == "" {
		t.Fatalf("new --snapshot: %v", err)
	}
	defer srv.Call(t, "DELETE", "/v1/sandboxes/"+late.ID, srv.Key, nil)
	hb("snapshot", "delete", snap.ID)
	if got := hb("exec", late.ID, "--", "cat", "/tmp/mark"); got != "forked\n" {
		t.Errorf("made from the deleted snapshot: %q", got)
	}
	if code, _ := srv.Call(t, "GET", "/v1/snapshots/"+snap.ID, srv.Key, nil); code != 404 {
		t.Errorf("the deleted snapshot: %d", code)
	}
	if ents, _ := os.ReadDir(dataDir + "/snapshots"); len(ents) != 0 {
		t.Errorf("snapshot files left: %v", ents)
	}

	// The first create (src) started the golden snapshot of the minimal
	// image at its size; once it is ready, creates are restored from it.
	for deadline := time.Now().Add(3 * time.Minute); !strings.Contains(srv.Log.String(), "golden snapshot ready"); time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no golden snapshot:\n%s", testserver.Tail(srv.Log.String()))
		}
	}
	golden := map[string]map[string]string{}
	for range 2 {
		began := time.Now()
		var g struct{ ID, Served string }
		if err := json.Unmarshal([]byte(hb("new", "--image", "minimal", "--label", "e2e=fork")), &g); err != nil || g.Served != "snapshot" {
			t.Fatalf("new with a golden snapshot: %v %+v", err, g)
		}
		defer srv.Call(t, "DELETE", "/v1/sandboxes/"+g.ID, srv.Key, nil)
		id := ident(g.ID)
		t.Logf("golden create to first exec: %v", time.Since(began).Round(10*time.Millisecond))
		if len(id["machine-id"]) != 32 || !strings.HasPrefix(id["address"], srv.Pool) {
			t.Errorf("golden clone %s identity %v", g.ID, id)
		}
		if got := hb("exec", g.ID, "-c", "cat /tmp/mark 2>/dev/null || echo none"); got != "none\n" {
			t.Errorf("a golden clone has another sandbox's file: %q", got)
		}
		for other, oid := range golden {
			for k, v := range id {
				if oid[k] == v {
					t.Errorf("golden clone %s has the same %s as %s: %s", g.ID, k, other, v)
				}
			}
		}
		golden[g.ID] = id
	}
}
