package host

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testpg"
	"github.com/harebox/harebox/internal/testserver"
)

// TestSeveralHosts: two hareboxd on this machine (their own data
// directories, address pools and nftables tables) share one real
// PostgreSQL server (--store), each with its internal endpoint (mutual
// TLS, certificates from hareboxd cluster-cert). Through host a, the CLI
// walkthrough runs on a sandbox that placement puts on host b (a runs one
// already); then another such sandbox gets commands (streamed, with
// stdin), a terminal and file transfers through a; list and get agree on
// both hosts. Sandboxes move between the hosts (running, stopped, with
// a volume), a drains, and a stopped (SIGTERM) during a drain finishes
// the move under way and no other. A key revoked through a is
// refused by b within a second. b killed with -9: its sandbox is lost
// within b's lease, and running again when b restarts and takes it back.
// A third hareboxd by b's name is refused.
// clusterHost is one hareboxd of a test deployment.
type clusterHost struct {
	name, dir, ingress string
	srv                *testserver.Server
}

// deployment returns what starts the hosts of a deployment on the
// PostgreSQL database dsn: each with its internal endpoint (certificates
// from hareboxd cluster-cert) and ingress, the keys the hosts share copied
// from the first, and its log printed if the test fails.
func deployment(tb testing.TB, s testserver.Setup, dsn, lease string) func(name string) *clusterHost {
	certs := tb.TempDir()
	var hosts []*clusterHost
	return func(name string) *clusterHost {
		tb.Helper()
		dir, err := os.MkdirTemp("", "hbh"+name)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { os.RemoveAll(dir) })
		if out, err := exec.Command(s.Hareboxd, "cluster-cert", "--dir", certs, "--host", name, "--addr", "127.0.0.1").CombinedOutput(); err != nil {
			tb.Fatalf("cluster-cert: %v %s", err, out)
		}
		if len(hosts) > 0 {
			// The deployment's hosts share the root key, the master key and
			// the audit signing key (docs/several-hosts.md).
			for _, f := range []string{"root.key", "master.key", "audit.key"} {
				testserver.CopyFile(tb, filepath.Join(hosts[0].dir, f), filepath.Join(dir, f))
			}
		}
		internal := testserver.FreeAddr(tb)
		h := &clusterHost{name: name, dir: dir, ingress: testserver.FreeAddr(tb)}
		h.srv = testserver.Start(tb, s, dir, "--store", dsn, "--host-name", name, "--host-lease", lease, "--internal-listen", internal,
			"--ingress-listen", h.ingress,
			"--cluster-ca", filepath.Join(certs, "ca.pem"), "--cluster-cert", filepath.Join(certs, name+".pem"), "--cluster-key", filepath.Join(certs, name+".key"))
		hosts = append(hosts, h)
		// (A call through one host may fail on the other: run's failure
		// shows only the first's log.)
		tb.Cleanup(func() {
			if tb.Failed() {
				tb.Logf("host %s's log:\n%s", name, testserver.Tail(h.srv.Log.String()))
			}
		})
		return h
	}
}

func TestSeveralHosts(t *testing.T) {
	s := testserver.Prepare(t)
	dsn := testpg.ForTest(t)
	const lease = "3s"
	startHost := deployment(t, s, dsn, lease)
	a := startHost("a")
	defer testserver.Finish(t, a.srv, a.dir)
	b := startHost("b")
	defer testserver.Finish(t, b.srv, b.dir)
	if a.srv.Key != b.srv.Key {
		t.Fatal("the hosts do not share the root key")
	}
	viaA := func(args ...string) string {
		t.Helper()
		return testserver.Run(t, a.srv, s, s.Root, 3*time.Minute, "harebox", args...)
	}
	viaB := func(args ...string) string {
		t.Helper()
		return testserver.Run(t, b.srv, s, s.Root, 3*time.Minute, "harebox", args...)
	}
	type box struct{ ID, State, Host, Error string }
	decode := func(out string) box {
		t.Helper()
		var x box
		if err := json.Unmarshal([]byte(out), &x); err != nil || x.ID == "" {
			t.Fatalf("not a sandbox: %v\n%s", err, out)
		}
		return x
	}
	// a runs one: the next create through a goes to b. The walkthrough
	// through a runs on b (its firewall set in b's nftables table), and
	// deletes its sandbox; then one more for the rest of the test.
	onA := decode(viaA("new", "--image", "minimal", "--label", "e2e=hosts"))
	defer viaA("delete", onA.ID)
	walk := testserver.Run(t, a.srv, s, filepath.Join(s.Root, "examples", "untrusted"), 5*time.Minute, "bash", "walkthrough.sh")
	if !strings.Contains(walk, testserver.JobOutput) || !strings.Contains(walk, `"state": "deleted"`) || !strings.Contains(walk, `"host": "b"`) {
		t.Fatalf("the walkthrough through a, on b:\n%s", walk)
	}
	// The walkthrough's create on b may have started b's golden boot of
	// its image (the run's golden snapshots are shared): it holds b's
	// capacity until it ends. (Then b's row says what it runs as of its
	// last write: at once after a change, and every second with a 3 s
	// lease.)
	for deadline := time.Now().Add(3 * time.Minute); strings.Contains(viaB("image", "list"), `"making"`); time.Sleep(time.Second) {
		if time.Now().After(deadline) {
			t.Fatal("b's golden boot did not end in 3 minutes")
		}
	}
	time.Sleep(1200 * time.Millisecond)
	onB := decode(viaA("new", "--image", "minimal", "--label", "e2e=hosts"))
	removed := false // (then b's sandbox went with b)
	defer func() {
		if !removed {
			viaA("delete", onB.ID)
		}
	}()
	if onA.Host != "a" || onB.Host != "b" {
		t.Fatalf("placed on %q and %q, want a then b", onA.Host, onB.Host)
	}
	// Both hosts are in fr-par-1, FR: a create that asks for another site
	// or country is refused, naming it, with nothing made.
	for _, where := range [][]string{{"--site", "nl-ams-1"}, {"--country", "NL"}} {
		o, e, code := testserver.RunCLI(t, s, a.srv, "", append([]string{"new", "--image", "minimal", "--label", "e2e=where"}, where...)...)
		if code == 0 || !strings.Contains(e, "no host of") || !strings.Contains(e, where[1]) {
			t.Fatalf("a create asking for %v: exit %d\n%s%s", where, code, o, e)
		}
	}
	if l := viaA("list", "--label", "e2e=where"); strings.Contains(l, "sbx_") {
		t.Fatalf("refused creates left sandboxes: %s", l)
	}
	// A volume lives on the host that made it (b: made through b). A
	// create through a that attaches it is placed on b, and its resize
	// through a is served by b.
	viaB("volume", "create", "shared", "--size", "1")
	withVol := decode(viaA("new", "--image", "minimal", "--volume", "shared:/mnt/shared"))
	if withVol.Host != "b" {
		t.Fatalf("a create with b's volume, through a: placed on %q", withVol.Host)
	}
	viaA("exec", withVol.ID, "--user", "root", "--", "sh", "-c", "echo made-on-b > /mnt/shared/f")
	viaA("delete", withVol.ID)
	if out := viaA("volume", "resize", "shared", "--size", "2"); !strings.Contains(out, `"size_gb": 2`) {
		t.Fatalf("a resize through a: %s", out)
	}

	// Through a, in b's sandbox: a streamed exec with stdin, a terminal,
	// files both ways.
	cmd := exec.Command(filepath.Join(s.Bin, "harebox"), "exec", onB.ID, "--", "sh", "-c", "cat; hostname")
	cmd.Env, cmd.Stdin = a.srv.Env(s), strings.NewReader("through a\n")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "through a\n") {
		t.Fatalf("exec with stdin through a: %v %s", err, out)
	}
	if out := viaA("shell", onB.ID, "-c", "echo from-the-terminal"); !strings.Contains(out, "from-the-terminal") {
		t.Fatalf("terminal through a: %q", out)
	}
	up := filepath.Join(t.TempDir(), "up")
	os.WriteFile(up, []byte("uploaded through a\n"), 0o644)
	viaA("file", "write", onB.ID, "--path", "/tmp/up", "--from", up)
	if out := viaB("exec", onB.ID, "--", "cat", "/tmp/up"); out != "uploaded through a\n" {
		t.Fatalf("the file b's guest has: %q", out)
	}
	if out := viaA("file", "read", onB.ID, "--path", "/tmp/up"); out != "uploaded through a\n" {
		t.Fatalf("read through a: %q", out)
	}
	// list and get agree.
	for _, id := range []string{onA.ID, onB.ID} {
		if ga, gb := decode(viaA("get", id)), decode(viaB("get", id)); ga != gb || ga.State != "running" {
			t.Fatalf("get %s: %+v through a, %+v through b", id, ga, gb)
		}
	}
	for _, hb := range []func(...string) string{viaA, viaB} {
		l := hb("list", "--label", "e2e=hosts")
		if !strings.Contains(l, onA.ID) || !strings.Contains(l, onB.ID) {
			t.Fatalf("list: %s", l)
		}
	}

	// b's URL through a's ingress.
	testURLThroughAnyHost(t, viaA, onB.ID, a.ingress, b.ingress, a.dir, b.dir)

	// a's sandbox moved to b and back, running on.
	testMove(t, s, a.srv, viaA, viaB, onA.ID, a.dir, b.dir, a.ingress, b.ingress)
	// a drained (asked through b, served by a): its sandbox moves to b, a
	// create through a goes to b; undrained, a takes creates again.
	var rep struct {
		Moved  []struct{ ID, To string }
		Stayed []struct{ ID, Error string }
	}
	if err := json.Unmarshal([]byte(viaB("hosts", "drain", "a")), &rep); err != nil || len(rep.Moved) != 1 || rep.Moved[0].ID != onA.ID || rep.Moved[0].To != "b" || len(rep.Stayed) != 0 {
		t.Fatalf("drain a: %+v %v", rep, err)
	}
	if g := decode(viaA("get", onA.ID)); g.Host != "b" || g.State != "running" {
		t.Fatalf("a's sandbox after a's drain: %+v", g)
	}
	drained := decode(viaA("new", "--image", "minimal", "--label", "e2e=drained"))
	viaA("delete", drained.ID)
	if drained.Host != "b" {
		t.Fatalf("a create through a drained a: placed on %s", drained.Host)
	}
	viaB("hosts", "undrain", "a")
	viaB("move", onA.ID, "--to", "a") // (back where the rest of the test wants it)
	testMoveStopped(t, viaA, viaB, a.dir)
	testMoveVolume(t, viaA, viaB, a.dir, b.dir)
	testDrainStopping(t, s, a, viaA, viaB)

	// A key revoked through a is refused by b within a second.
	var k struct{ ID, Secret string }
	if err := json.Unmarshal([]byte(viaA("key", "create", "--actions", "sandboxes:read")), &k); err != nil || k.Secret == "" {
		t.Fatalf("key create: %v", err)
	}
	status := func(srv *testserver.Server, key string) int {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/sandboxes", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := srv.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := status(b.srv, k.Secret); st != 200 {
		t.Fatalf("the new key on b: %d", st)
	}
	viaA("key", "revoke", k.ID)
	revoked := time.Now()
	for status(b.srv, k.Secret) != 401 {
		if time.Since(revoked) > 20*time.Second { // (loose for a loaded machine)
			t.Fatal("b takes a key revoked through a 20 s ago")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("b refused the revoked key %v after the revoke returned", time.Since(revoked).Round(time.Millisecond))

	// A third hareboxd by b's name is refused.
	other, err := os.MkdirTemp("", "hbh")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(other)
	out, err := exec.Command(s.Hareboxd, "--data-dir", other, "--listen", "127.0.0.1:0", "--network", "none",
		"--image-dir", s.ImageDir, "--plugin", s.Plugin, "--store", dsn, "--host-name", "b").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another hareboxd runs as this host") {
		t.Errorf("a second hareboxd as b: %v\n%s", err, out)
	}

	// b killed: its sandbox is lost within its lease (and a renewal).
	b.srv.Cmd.Process.Signal(syscall.SIGKILL)
	b.srv.Cmd.Wait()
	killed := time.Now()
	for {
		g := decode(viaA("get", onB.ID))
		if g.State == "lost" {
			t.Logf("lost %v after b was killed (lease %s): %s", time.Since(killed).Round(time.Millisecond), lease, g.Error)
			break
		}
		if time.Since(killed) > 10*time.Second {
			t.Fatalf("b's sandbox is %s %v after b was killed", g.State, time.Since(killed))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A create that attaches b's volume is refused while b is down,
	// naming it.
	if o, e, code := testserver.RunCLI(t, s, a.srv, "", "new", "--image", "minimal", "--volume", "shared:/mnt/shared"); code == 0 || !strings.Contains(e, "lives on host b, which is down") {
		t.Fatalf("a create with the volume of b, down: exit %d\n%s%s", code, o, e)
	}
	var listed struct {
		Hosts []struct {
			Name string
			Up   bool
		}
	}
	if err := json.Unmarshal([]byte(viaA("hosts")), &listed); err != nil || len(listed.Hosts) != 2 || listed.Hosts[1].Name != "b" || listed.Hosts[1].Up || !listed.Hosts[0].Up {
		t.Fatalf("harebox hosts with b down: %+v %v", listed, err)
	}
	// b is back: its sandbox runs again, through a too.
	testserver.Relaunch(t, b.srv)
	if g := decode(viaA("get", onB.ID)); g.State != "running" || g.Error != "" {
		t.Fatalf("after b is back: %+v", g)
	}
	if out := viaA("exec", onB.ID, "--", "cat", "/tmp/up"); out != "uploaded through a\n" {
		t.Fatalf("exec through a after b is back: %q", out)
	}
	// b's volume, deleted through a (served by b).
	viaA("volume", "delete", "shared")
	if _, e, code := testserver.RunCLI(t, s, a.srv, "", "volume", "get", "shared"); code == 0 || !strings.Contains(e, "no volume") {
		t.Fatalf("the volume after its delete through a: exit %d %s", code, e)
	}

	// b gone for good: killed again, then removed through a once it is
	// down; its sandbox is deleted. When b starts again after all, it
	// finds it deleted and removes its VM (finish checks none is left).
	b.srv.Cmd.Process.Signal(syscall.SIGKILL)
	b.srv.Cmd.Wait()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if g := decode(viaA("get", onB.ID)); g.State == "lost" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b's sandbox never became lost")
		}
	}
	var rm struct {
		Deleted []string `json:"deleted_sandboxes"`
	}
	if err := json.Unmarshal([]byte(viaA("hosts", "remove", "b")), &rm); err != nil || len(rm.Deleted) != 1 || rm.Deleted[0] != onB.ID {
		t.Fatalf("harebox hosts remove b: %+v %v", rm, err)
	}
	removed = true
	if g := decode(viaA("get", onB.ID)); g.State != "deleted" {
		t.Fatalf("b's sandbox after b was removed: %+v", g)
	}
	testserver.Relaunch(t, b.srv)
}
