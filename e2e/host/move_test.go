package host

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	mathrand "math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/internal/testpg"
	"github.com/harebox/harebox/internal/testserver"
	"github.com/harebox/harebox/sandbox"
)

// testMove moves sandbox id, running on host a, to host b through a's
// API while a process of it runs, then back through b's: each time it
// runs on as it was (its process, its files, its kernel), and the
// host it left holds nothing of it.
func testMove(t *testing.T, s testserver.Setup, srvA *testserver.Server, viaA, viaB func(...string) string, id, dirA, dirB, ingressA, ingressB string) {
	t.Helper()
	// A URL of it, published on a, served by a web server in it.
	u := publishGuestWeb(t, viaA, id)
	throughA, throughB := newIngressClient(t, ingressA, dirA, dirB).http(false), newIngressClient(t, ingressB, dirA, dirB).http(false)
	awaitURL(t, throughA, u, "the URL before the move")
	// A counter that writes a line every 100 ms, started before the move.
	viaA("exec", id, "--background", "--", "sh", "-c", "i=0; while [ ! -e /tmp/stop ]; do i=$((i+1)); echo $i >> /tmp/count; sleep 0.1; done")
	nonce := make([]byte, 12)
	rand.Read(nonce)
	canary := "canary-" + hex.EncodeToString(nonce)
	viaA("exec", id, "--", "sh", "-c", "echo "+canary+" > $HOME/canary; sync")
	bootID := viaA("exec", id, "--", "cat", "/proc/sys/kernel/random/boot_id") // (the same kernel: not booted again)
	count := func(via func(...string) string) int {
		t.Helper()
		lines := strings.Fields(via("exec", id, "--", "cat", "/tmp/count"))
		// Every line is the next number: the counter never missed a beat
		// nor started again.
		for i, l := range lines {
			if l != strconv.Itoa(i+1) {
				t.Fatalf("the counter's line %d is %q", i+1, l)
			}
		}
		return len(lines)
	}
	before := count(viaA)
	user := viaA("exec", id, "--", "id")

	// Refused before anything happens: no such host, this host.
	for _, c := range []struct{ to, want string }{{"zz", `no host "zz"`}, {"a", "is this one"}} {
		if o, e, code := testserver.RunCLI(t, s, srvA, "", "move", id, "--to", c.to); code == 0 || !strings.Contains(e, c.want) {
			t.Fatalf("move to %s: exit %d\n%s%s", c.to, code, o, e)
		}
	}

	moveTo := func(via func(...string) string, to, from, leftDir string) {
		t.Helper()
		var res struct {
			From, To string
			PausedMS int64 `json:"paused_ms"`
			Sandbox  struct{ ID, State, Host string }
		}
		if err := json.Unmarshal([]byte(via("move", id, "--to", to)), &res); err != nil {
			t.Fatal(err)
		}
		if res.From != from || res.To != to || res.Sandbox.Host != to || res.Sandbox.State != "running" || res.PausedMS <= 0 {
			t.Fatalf("move to %s: %+v", to, res)
		}
		t.Logf("moved from %s to %s: it did not run for %d ms", from, to, res.PausedMS)
		// The host it left holds nothing of it: no file named after it, no
		// byte of what it wrote.
		filepath.WalkDir(leftDir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if strings.Contains(d.Name(), id) {
				t.Errorf("host %s still has %s", from, p)
			}
			if d.Type().IsRegular() {
				if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), canary) {
					t.Errorf("host %s's %s holds the sandbox's canary in plain", from, p)
				}
			}
			return nil
		})
	}
	// A client writes through a's API all along the move: every write
	// acknowledged (before, during, after) is there afterwards.
	stop, acked := make(chan struct{}), make(chan []int, 1)
	go func() {
		var ok []int
		for i := 1; ; i++ {
			select {
			case <-stop:
				acked <- ok
				return
			default:
			}
			if _, _, code := testserver.RunCLI(t, s, srvA, "", "exec", id, "--", "sh", "-c", "echo "+strconv.Itoa(i)+" >> $HOME/acked"); code == 0 {
				ok = append(ok, i)
			}
		}
	}()
	time.Sleep(300 * time.Millisecond)
	moveTo(viaA, "b", "a", dirA)
	time.Sleep(300 * time.Millisecond)
	close(stop)
	ok := <-acked // (the last write answered first)
	written := map[string]bool{}
	for _, l := range strings.Fields(viaB("exec", id, "--", "sh", "-c", "cat $HOME/acked")) {
		written[l] = true
	}
	for _, i := range ok {
		if !written[strconv.Itoa(i)] {
			t.Fatalf("write %d was acknowledged during the move, and is not there after it (acknowledged %v; there: %v)", i, ok, slices.Sorted(maps.Keys(written)))
		}
	}
	t.Logf("%d writes through a acknowledged around the move, all there after it", len(ok))
	// Through a (which forwards to b) and through b: the same machine,
	// its files, its process counting on.
	if got := viaA("exec", id, "--", "cat", "/proc/sys/kernel/random/boot_id"); got != bootID {
		t.Fatalf("boot_id after the move: %q, was %q", got, bootID)
	}
	if got := strings.TrimSpace(viaB("exec", id, "--", "sh", "-c", "cat $HOME/canary")); got != canary {
		t.Fatalf("the canary after the move: %q", got)
	}
	if got := viaB("exec", id, "--", "id"); got != user {
		t.Fatalf("commands run as %q after the move, %q before", got, user)
	}
	after := count(viaB)
	time.Sleep(time.Second)
	if later := count(viaA); after <= before || later <= after {
		t.Fatalf("the counter: %d lines before the move, %d after, %d a second later", before, after, later)
	}
	if ps := viaA("ps", id); !strings.Contains(ps, "running") {
		t.Fatalf("the background process after the move: %s", ps)
	}
	// Its URL, through both hosts' ingresses, served by b (the server in
	// it ran on); rotated there, the old token is refused through both.
	for name, cl := range map[string]*http.Client{"a": throughA, "b": throughB} {
		if code, _ := get(cl, u.URL, u.Token); code != 200 {
			t.Fatalf("the URL through %s's ingress after the move: %d", name, code)
		}
	}
	var nu sandbox.URL
	if err := json.Unmarshal([]byte(viaA("url", "rotate", id, u.ID)), &nu); err != nil || nu.Token == "" {
		t.Fatalf("url rotate after the move: %v", err)
	}
	for name, cl := range map[string]*http.Client{"a": throughA, "b": throughB} {
		if old, _ := get(cl, u.URL, u.Token); old != 401 {
			t.Fatalf("the old token through %s's ingress after a rotate on b: %d", name, old)
		}
		if code, _ := get(cl, u.URL, nu.Token); code != 200 {
			t.Fatalf("the new token through %s's ingress: %d", name, code)
		}
	}

	// And back, through b.
	moveTo(viaB, "a", "b", dirB)
	if got := strings.TrimSpace(viaA("exec", id, "--", "sh", "-c", "cat $HOME/canary")); got != canary {
		t.Fatalf("the canary after the move back: %q", got)
	}
	last := count(viaA)
	time.Sleep(time.Second)
	if later := count(viaA); later <= last {
		t.Fatalf("the counter after the move back: %d, then %d", last, later)
	}
	viaA("exec", id, "--", "touch", "/tmp/stop")
}

// BenchmarkMove: how long a sandbox does not run when it moves to another
// host (two hareboxd on this machine, one PostgreSQL), idle (1 vCPU,
// 1 GiB), then with 256 MiB of its memory written (a file in its tmpfs), against a hibernate and a
// resume of the same sandbox on its own host, in one run. A move is
// timed by what it reports (paused_ms: from the hibernate on the source
// to the resume on the target), a hibernate and resume by the two calls.
// (b.N is ignored: one pass each.)
func BenchmarkMove(b *testing.B) {
	s := testserver.Prepare(b)
	startHost := deployment(b, s, testpg.ForTest(b), "3s")
	ha := startHost("a")
	defer testserver.Finish(b, ha.srv, ha.dir)
	hb := startHost("b")
	defer testserver.Finish(b, hb.srv, hb.dir)
	via := map[string]func(...string) string{
		"a": func(args ...string) string {
			return testserver.Run(b, ha.srv, s, s.Root, 5*time.Minute, "harebox", args...)
		},
		"b": func(args ...string) string {
			return testserver.Run(b, hb.srv, s, s.Root, 5*time.Minute, "harebox", args...)
		},
	}
	var sb sandbox.Sandbox
	if err := json.Unmarshal([]byte(via["a"]("new", "--image", "minimal", "--vcpus", "1", "--memory", "1024")), &sb); err != nil || sb.Host != "a" {
		b.Fatalf("new: %v %+v", err, sb)
	}
	defer via["a"]("delete", sb.ID)
	at := "a"
	measure := func(name string) {
		b.Helper()
		start := time.Now()
		via[at]("hibernate", sb.ID)
		via[at]("resume", sb.ID)
		hibernate := time.Since(start)
		to := map[string]string{"a": "b", "b": "a"}[at]
		var res struct {
			PausedMS int64 `json:"paused_ms"`
		}
		if err := json.Unmarshal([]byte(via[at]("move", sb.ID, "--to", to)), &res); err != nil || res.PausedMS <= 0 {
			b.Fatalf("move: %v %+v", err, res)
		}
		at = to
		b.ReportMetric(float64(res.PausedMS), name+"-move-paused-ms")
		b.ReportMetric(float64(hibernate.Milliseconds()), name+"-hibernate+resume-ms")
		b.ReportMetric(float64(res.PausedMS)/float64(hibernate.Milliseconds()), name+"-move/hibernate+resume")
	}
	measure("idle")
	via[at]("exec", sb.ID, "--", "dd", "if=/dev/urandom", "of=/tmp/dirty", "bs=1M", "count=256")
	measure("dirty-256MiB")
}

// testMoveStopped: a stopped sandbox of the Debian image (its root on its
// disk) moves from a to b with its disk, starts there on it, and a holds
// nothing of it.
func testMoveStopped(t *testing.T, viaA, viaB func(...string) string, dirA string) {
	t.Helper()
	var sb sandbox.Sandbox
	if err := json.Unmarshal([]byte(viaA("new", "--image", "default", "--label", "e2e=stopped-move")), &sb); err != nil || sb.Host != "a" {
		t.Fatalf("new on a: %v %+v", err, sb)
	}
	defer viaA("delete", sb.ID)
	viaA("exec", sb.ID, "--user", "root", "--", "sh", "-c", "echo on-its-disk > /root/kept; sync")
	viaA("stop", sb.ID)
	var res struct {
		To      string
		Sandbox struct{ State, Host string }
	}
	if err := json.Unmarshal([]byte(viaA("move", sb.ID, "--to", "b")), &res); err != nil || res.Sandbox.State != "stopped" || res.Sandbox.Host != "b" {
		t.Fatalf("a stopped sandbox's move: %v %+v", err, res)
	}
	if _, err := os.Stat(filepath.Join(dirA, "m", sb.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a keeps the stopped sandbox's machine directory: %v", err)
	}
	viaA("start", sb.ID) // (served by b)
	if got := viaB("exec", sb.ID, "--user", "root", "--", "cat", "/root/kept"); got != "on-its-disk\n" {
		t.Fatalf("its disk on b: %q", got)
	}
}

// testMoveVolume moves a running sandbox of a with its volume to b: what
// it wrote to the volume is there, mounted again, and the volume lives on
// b now (its files gone from a).
func testMoveVolume(t *testing.T, viaA, viaB func(...string) string, dirA, dirB string) {
	t.Helper()
	var v struct{ ID, Host string }
	if err := json.Unmarshal([]byte(viaA("volume", "create", "moving", "--size", "1")), &v); err != nil || v.Host != "a" {
		t.Fatalf("a volume on a: %v %+v", err, v)
	}
	var sb sandbox.Sandbox
	if err := json.Unmarshal([]byte(viaA("new", "--image", "minimal", "--volume", "moving:/mnt/v", "--label", "e2e=volume-move")), &sb); err != nil || sb.Host != "a" {
		t.Fatalf("new with the volume on a: %v %+v", err, sb)
	}
	viaA("exec", sb.ID, "--user", "root", "--", "sh", "-c", "echo on-the-volume > /mnt/v/f")
	var res struct {
		Sandbox struct{ State, Host string }
	}
	if err := json.Unmarshal([]byte(viaA("move", sb.ID, "--to", "b")), &res); err != nil || res.Sandbox.State != "running" || res.Sandbox.Host != "b" {
		t.Fatalf("a move with a volume: %v %+v", err, res)
	}
	if got := viaB("exec", sb.ID, "--user", "root", "--", "cat", "/mnt/v/f"); got != "on-the-volume\n" {
		t.Fatalf("the volume's file on b: %q", got)
	}
	if err := json.Unmarshal([]byte(viaA("volume", "get", "moving")), &v); err != nil || v.Host != "b" {
		t.Fatalf("the volume after the move: %v %+v", err, v)
	}
	for dir, want := range map[string]bool{dirA: false, dirB: true} {
		if _, err := os.Stat(filepath.Join(dir, "volumes", v.ID+".qcow2")); (err == nil) != want {
			t.Fatalf("the volume's file in %s: %v, want it there: %v", dir, err, want)
		}
	}
	viaA("delete", sb.ID)
	viaA("volume", "delete", "moving") // (served by b)
}

// testDrainStopping stops host a (SIGTERM, as systemctl stop does) while
// it drains: the move under way finishes, the drain moves nothing more
// (its answer says why), hareboxd exits cleanly, and each sandbox runs
// on exactly one host, on a again once a is back. The sandboxes end on
// a, undrained, as the rest of the test wants them.
func testDrainStopping(t *testing.T, s testserver.Setup, a *clusterHost, viaA, viaB func(...string) string) {
	t.Helper()
	var ids []string
	for range 2 {
		var sb sandbox.Sandbox
		if err := json.Unmarshal([]byte(viaA("new", "--image", "minimal", "--label", "e2e=drain-stop")), &sb); err != nil {
			t.Fatal(err)
		}
		if sb.Host != "a" {
			viaA("move", sb.ID, "--to", "a")
		}
		defer viaA("delete", sb.ID)
		ids = append(ids, sb.ID)
	}
	var all struct{ Sandboxes []sandbox.Sandbox }
	if err := json.Unmarshal([]byte(viaA("list")), &all); err != nil {
		t.Fatal(err)
	}
	var onA []string // (every sandbox of a, those before these too)
	for _, sb := range all.Sandboxes {
		if sb.Host == "a" && sb.State == sandbox.StateRunning {
			onA = append(onA, sb.ID)
		}
	}
	// A move under way: the sandbox is hibernated on a (its files on
	// their way) or on b (not resumed there yet).
	moving := func(id string) bool {
		var sb sandbox.Sandbox
		json.Unmarshal([]byte(viaB("get", id)), &sb)
		return sb.State == sandbox.StateHibernated
	}
	type drained struct {
		out, errOut string
		code        int
	}
	done := make(chan drained, 1)
	go func() {
		o, e, code := testserver.RunCLI(t, s, a.srv, "", "hosts", "drain", "a")
		done <- drained{o, e, code}
	}()
	// a is asked to stop while a move is under way.
	for deadline := time.Now().Add(2 * time.Minute); !slices.ContainsFunc(onA, moving); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the drain moved nothing in 2 minutes")
		}
	}
	stopped := time.Now()
	a.srv.Cmd.Process.Signal(syscall.SIGTERM)
	if err := a.srv.Cmd.Wait(); err != nil {
		t.Fatalf("hareboxd stopped while draining: %v", err)
	}
	t.Logf("a stopped %v after SIGTERM, during its drain", time.Since(stopped).Round(time.Millisecond))
	d := <-done
	var rep struct {
		Moved  []struct{ ID, To string }
		Stayed []struct{ ID, Error string }
	}
	if d.code != 0 || json.Unmarshal([]byte(d.out), &rep) != nil || len(rep.Moved) == 0 || len(rep.Stayed) == 0 || len(rep.Moved)+len(rep.Stayed) != len(onA) {
		t.Fatalf("the drain's answer: exit %d %+v\n%s%s", d.code, rep, d.out, d.errOut)
	}
	for _, st := range rep.Stayed {
		if !strings.Contains(st.Error, "shutting down") {
			t.Fatalf("a sandbox the drain did not move: %+v", st)
		}
	}
	testserver.Relaunch(t, a.srv)
	// Each runs where the store says, and nowhere else.
	moved := map[string]bool{}
	for _, m := range rep.Moved {
		moved[m.ID] = true
	}
	for _, id := range onA {
		want := map[bool]string{true: "b", false: "a"}[moved[id]]
		var sb sandbox.Sandbox
		if err := json.Unmarshal([]byte(viaA("get", id)), &sb); err != nil || sb.Host != want || sb.State != sandbox.StateRunning {
			t.Fatalf("sandbox %s after a's stop: %+v %v, want running on %s", id, sb, err, want)
		}
		viaA("exec", id, "--", "true")
		if _, err := os.Stat(filepath.Join(a.dir, "m", id)); (err == nil) != (want == "a") {
			t.Fatalf("sandbox %s's machine directory on a: %v (it runs on %s)", id, err, want)
		}
	}
	viaB("hosts", "undrain", "a")
	for id := range moved {
		viaB("move", id, "--to", "a")
	}
}

// TestMoveKilled kills a host with -9 at a random point of a move (the
// source, then the target, in turn, HAREBOX_TEST_MOVE_KILLS rounds, make
// test 4 and make reliability 20; the seed is logged), starts it again,
// and checks after each round that the sandbox is on exactly one host,
// running there, with what it wrote before the first move. The host that
// comes back finishes or rolls back the move at once: a source that had
// handed the sandbox over has its target take it up, a target takes up
// what was handed to it (and resumes what it was resuming), a source
// that was sending takes the sandbox back.
func TestMoveKilled(t *testing.T) {
	s := testserver.Prepare(t)
	dsn := testpg.ForTest(t)
	startHost := deployment(t, s, dsn, "3s")
	hosts := map[string]*clusterHost{"a": startHost("a"), "b": startHost("b")}
	for _, h := range hosts {
		defer testserver.Finish(t, h.srv, h.dir)
	}
	via := func(h *clusterHost, args ...string) string {
		t.Helper()
		return testserver.Run(t, h.srv, s, s.Root, 3*time.Minute, "harebox", args...)
	}
	var sb sandbox.Sandbox
	if err := json.Unmarshal([]byte(via(hosts["a"], "new", "--image", "minimal", "--label", "e2e=killed")), &sb); err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	defer func() { via(hosts["a"], "delete", id) }()
	via(hosts[sb.Host], "exec", id, "--", "sh", "-c", "echo before-the-moves > /tmp/kept; sync")
	// vmms are sandbox id's VMMs on host h.
	vmms := func(h *clusterHost) int {
		n := 0
		for _, p := range procs.Naming(filepath.Join(h.dir, "m", id) + "/") {
			if strings.HasPrefix(filepath.Base(p.Exe), "qemu-system") {
				n++
			}
		}
		return n
	}
	// One move unharmed, to time one: the kills land anywhere in the
	// next ones, and a little after.
	at := map[string]string{"a": "b", "b": "a"}[sb.Host]
	began := time.Now()
	via(hosts[sb.Host], "move", id, "--to", at)
	took := time.Since(began)
	seed := time.Now().UnixNano()
	t.Logf("a move took %v; seed %d", took.Round(time.Millisecond), seed)
	rnd := mathrand.New(mathrand.NewPCG(uint64(seed), 0))
	for round := range testserver.EnvCount(t, "HAREBOX_TEST_MOVE_KILLS", 4) {
		from, to := hosts[at], hosts[map[string]string{"a": "b", "b": "a"}[at]]
		victim := map[bool]*clusterHost{true: from, false: to}[round%2 == 0]
		delay := time.Duration(rnd.Int64N(int64(took + took/4)))
		done := make(chan string, 1)
		go func() {
			o, e, code := testserver.RunCLI(t, s, from.srv, "", "move", id, "--to", to.name)
			done <- fmt.Sprintf("exit %d %s%s", code, o, e)
		}()
		time.Sleep(delay)
		victim.srv.Cmd.Process.Kill()
		victim.srv.Cmd.Wait()
		moved := <-done
		testserver.Relaunch(t, victim.srv)
		// Settled within 30 s: running on one host (a target killed as
		// it resumed the sandbox resumes it when it is back).
		other := map[*clusterHost]*clusterHost{from: to, to: from}[victim]
		var cur sandbox.Sandbox
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			if err := json.Unmarshal([]byte(via(other, "get", id)), &cur); err != nil {
				t.Fatal(err)
			}
			if cur.State == sandbox.StateRunning && cur.Error == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d (killed %s %v into a move from %s; the move said %s): the sandbox is %s on %s: %s", round, victim.name, delay, from.name, moved, cur.State, cur.Host, cur.Error)
			}
		}
		t.Logf("round %d: killed %s %v into a move from %s to %s: running on %s (the move said %s)", round, victim.name, delay.Round(time.Millisecond), from.name, to.name, cur.Host, strings.TrimSpace(strings.SplitN(moved, "\n", 2)[0]))
		on := hosts[cur.Host]
		if n, m := vmms(on), vmms(map[*clusterHost]*clusterHost{from: to, to: from}[on]); n != 1 || m != 0 {
			t.Fatalf("round %d: its VMMs: %d on %s, %d on the other host", round, n, cur.Host, m)
		}
		if got := via(on, "exec", id, "--", "cat", "/tmp/kept"); got != "before-the-moves\n" {
			t.Fatalf("round %d: its file: %q", round, got)
		}
		at = cur.Host
	}
}
