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

// TestPool, on real VMs through the CLI: hareboxd keeps two minimal
// sandboxes restored and idle; two creates claim them, each with its own
// machine-id, kernel entropy and address, its labels and env, the host's
// time, and the firewall policy it asked for in force.
func TestPool(t *testing.T) {
	s := testserver.Prepare(t)
	dataDir, err := os.MkdirTemp("", "hbp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.Start(t, s, dataDir, "--pool", "minimal:small=2")
	defer func() { testserver.Finish(t, srv, dataDir) }()
	hb := func(args ...string) string {
		t.Helper()
		return testserver.Run(t, srv, s, s.Root, 3*time.Minute, "harebox", args...)
	}
	for deadline := time.Now().Add(4 * time.Minute); strings.Count(srv.Log.String(), "pool member ready") < 2; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not fill:\n%s", testserver.Tail(srv.Log.String()))
		}
	}
	seen := map[string]string{}
	for i := range 2 {
		began := time.Now()
		var box struct {
			ID, Served string
			Labels     map[string]string
		}
		out := hb("new", "--image", "minimal", "--label", "e2e=pool", "--env", "WHO=claimer",
			"--firewall", `{"default_outbound":"deny"}`)
		if err := json.Unmarshal([]byte(out), &box); err != nil || box.Served != "pool" || box.Labels["e2e"] != "pool" {
			t.Fatalf("new %d: %v %s", i, err, out)
		}
		defer srv.Call(t, "DELETE", "/v1/sandboxes/"+box.ID, srv.Key, nil)
		asked := time.Now()
		got := hb("exec", box.ID, "-c", `printf '%s\n' "$WHO" "$(cat /etc/machine-id)" "$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')" "$(ip -4 -o addr show eth0 | awk '{print $4}')" "$(date +%s)"`)
		answered := time.Now()
		t.Logf("pool create to first exec: %v", time.Since(began).Round(10*time.Millisecond))
		l := strings.Split(strings.TrimRight(got, "\n"), "\n")
		if len(l) != 5 || l[0] != "claimer" || len(l[1]) != 32 || !strings.HasPrefix(l[3], srv.Pool) {
			t.Fatalf("claimed sandbox %s: %q", box.ID, got)
		}
		// Its clock is the host's (set when the pool restored it, which
		// was after the golden snapshot was taken).
		// (In whole seconds: busybox's date has no %N.)
		if sec, err := strconv.ParseInt(l[4], 10, 64); err != nil {
			t.Errorf("claimed sandbox %s: date %q", box.ID, l[4])
		} else if guest := time.Unix(sec, 0); guest.Before(asked.Add(-1500*time.Millisecond)) || guest.After(answered.Add(500*time.Millisecond)) {
			t.Errorf("claimed sandbox %s: its clock says %v, asked between %v and %v", box.ID, guest, asked, answered)
		}
		for _, v := range l[1:4] {
			if other, dup := seen[v]; dup {
				t.Errorf("sandbox %s shares %q with %s", box.ID, v, other)
			}
			seen[v] = box.ID
		}
		if out := hb("firewall", "get", box.ID); !strings.Contains(out, `"deny"`) {
			t.Errorf("the claimed sandbox's policy: %s", out)
		}
	}
}
