package host

import (
	"bytes"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/harebox/harebox/hypervisor/plugin"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/internal/testserver"
	"github.com/harebox/harebox/network/linuxnet"

	_ "modernc.org/sqlite" // (the data directory's database, read by the checks)
)

// TestCrashLoop: two clients create sandboxes, run commands, write
// files, change firewalls and delete sandboxes while hareboxd is killed
// with -9 at random points, HAREBOX_CRASH_LOOP_N times (2 by default;
// make reliability runs more). After each restart:
//   - every sandbox the API reports running answers an exec;
//   - every file whose write was acknowledged is there with its bytes;
//   - every sandbox whose delete was acknowledged has no VMM, tap, nftables
//     chain or state directory;
//   - one hypervisor plugin runs for the data directory, no orphan;
//   - no request sent after the restart completed gets a 5xx, other than
//     an admission refusal (503 over_capacity) on a full host.
//
// At the end everything is deleted and nothing is left on the host.
func TestCrashLoop(t *testing.T) {
	s := testserver.Prepare(t)
	rounds := testserver.EnvCount(t, "HAREBOX_CRASH_LOOP_N", 2)
	dataDir, err := os.MkdirTemp("", "hbc")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	// (A firewall table, address pool and mesh pool of this data
	// directory's own: a server on the host's defaults would drop, in
	// its table, what other test processes' sandboxes send on their
	// meshes, as it drops anything bound for its mesh pool but from its
	// own sandboxes.)
	startCrash := func() *testserver.Server { return testserver.Start(t, s, dataDir) }
	var cur atomic.Pointer[testserver.Server]
	cur.Store(startCrash())
	table := cur.Load().Table
	defer func() {
		if srv := cur.Load(); srv != nil && srv.Cmd.ProcessState == nil {
			srv.Cmd.Process.Kill()
			srv.Cmd.Wait()
		}
		// A server that could not come back leaves its sandboxes' taps:
		// they go too (noLeftovers reports the machines).
		ents, _ := os.ReadDir(filepath.Join(dataDir, "m"))
		for _, e := range ents {
			exec.Command("ip", "link", "del", linuxnet.TapName(e.Name())).Run()
		}
		testserver.NoLeftovers(t, dataDir)
		exec.Command("nft", "delete", "table", "inet", table).Run()
	}()

	c := &crashClients{cur: &cur}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.work(w, stop)
		}()
	}
	for round := 1; round <= rounds; round++ {
		// Long enough for a create (7 to 15 s here with two at once) to
		// finish now and then, short enough to land in the middle of many.
		time.Sleep(time.Duration(10000+randN(15000)) * time.Millisecond)
		srv := cur.Load()
		srv.Cmd.Process.Kill() // -9
		srv.Cmd.Wait()
		t.Logf("round %d: hareboxd killed with -9", round)
		next := startCrash()
		cur.Store(next)
		c.restarted.Store(time.Now().UnixNano())
		t.Logf("round %d: hareboxd back", round)
		c.check(t, next, dataDir, table)
	}
	// A last stretch without a kill, so the final check sees work done.
	time.Sleep(20 * time.Second)
	close(stop)
	wg.Wait()
	srv := cur.Load()
	c.check(t, srv, dataDir, table)

	// Everything goes; nothing is left.
	for _, state := range []string{"running", "paused", "stopped"} {
		for _, b := range srv.Sandboxes(t, state) {
			if code, out, err := c.do(srv, "DELETE", "/v1/sandboxes/"+b["id"].(string), nil); err != nil || code != 200 {
				t.Errorf("delete %s: %d %s %v", b["id"], code, out, err)
			}
		}
	}
	srv.Stop(t)
	cur.Store(nil)
	if out, _ := exec.Command("nft", "list", "table", "inet", table).CombinedOutput(); bytes.Contains(out, []byte("chain o-hb")) {
		t.Errorf("sandbox chains left in %s:\n%s", table, out)
	}
	if c.creates.Load() == 0 {
		t.Errorf("no create succeeded in %d rounds (last refusal: %v): nothing was tested", rounds, c.refused.Load())
	}
	t.Logf("%d rounds: %d creates, %d acknowledged writes, %d deletes, %d execs, %d admission refusals; %d 5xx after restarts",
		rounds, c.creates.Load(), c.writes.Load(), c.deletes.Load(), c.execs.Load(), c.refusals.Load(), c.late5xx.Load())
}

// crashClients are the clients of the crash loop and what the server
// acknowledged to them.
type crashClients struct {
	cur       *atomic.Pointer[testserver.Server]
	restarted atomic.Int64 // when the last restart completed (unix ns)

	mu      sync.Mutex
	files   map[string]map[string][]byte // sandbox -> path -> bytes (acknowledged)
	deleted []string                     // acknowledged deletes

	creates, writes, deletes, execs, late5xx, refusals atomic.Int64
	last5xx                                            atomic.Value // string
	refused                                            atomic.Value // string: the last create refused
}

// do sends one request to whichever server runs now. A 5xx answered for a
// request sent after the last restart completed is counted.
func (c *crashClients) do(srv *testserver.Server, method, path string, body []byte) (int, []byte, error) {
	sent := time.Now().UnixNano()
	req, err := http.NewRequest(method, srv.URL+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+srv.Key)
	if strings.Contains(path, "/files") {
		req.Header.Set("Content-Type", "application/octet-stream")
	} else if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	cl := http.Client{Timeout: 3 * time.Minute}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode == 503 && bytes.Contains(b, []byte(`"code":"over_capacity"`)) {
		// An admission refusal: immediate, clear and expected on a full
		// host; not a failure.
		c.refusals.Add(1)
	} else if resp.StatusCode >= 500 && sent > c.restarted.Load() && c.cur.Load() == srv {
		// Sent to the server that still runs: not a casualty of a kill.
		if !serverGone(srv) {
			c.late5xx.Add(1)
			c.last5xx.Store(fmt.Sprintf("%s %s: %d %s", method, path, resp.StatusCode, b))
		}
	}
	return resp.StatusCode, b, nil
}

// gone reports whether the sandbox is no longer running (deleted by a
// client meanwhile).
func (c *crashClients) gone(srv *testserver.Server, id string) bool {
	code, b, err := c.do(srv, "GET", "/v1/sandboxes/"+id, nil)
	return err == nil && (code == 404 || code == 200 && !bytes.Contains(b, []byte(`"state":"running"`)))
}

// lastMatch is the last line of log that contains s.
func lastMatch(log, s string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return lines[i]
		}
	}
	return "(none)"
}

// serverGone reports a server that was killed meanwhile.
func serverGone(srv *testserver.Server) bool {
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(srv.URL, "http://"), time.Second)
	if err != nil {
		return true
	}
	conn.Close()
	return false
}

func (c *crashClients) work(w int, stop chan struct{}) {
	made := 0
	var kept []string // this client's sandboxes left running
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		srv := c.cur.Load()
		code, b, err := c.do(srv, "POST", "/v1/sandboxes", []byte(`{"image": "minimal", "ttl_seconds": 900}`))
		if err != nil || code != 201 {
			if err == nil && code < 500 {
				c.refused.Store(fmt.Sprintf("create: %d %s", code, b))
			}
			if code == 503 && len(kept) > 0 {
				// The host is full: make room, and keep the churn going.
				c.remove(kept[0])
				kept = kept[1:]
			}
			time.Sleep(500 * time.Millisecond)
			continue
		}
		c.creates.Add(1)
		made++
		var box struct{ ID string }
		json.Unmarshal(b, &box)
		for j := range 3 {
			data := make([]byte, 1000+randN(5000))
			rand.Read(data)
			p := fmt.Sprintf("/tmp/w%d-%d-%d", w, i, j)
			srv = c.cur.Load()
			if code, _, err := c.do(srv, "PUT", "/v1/sandboxes/"+box.ID+"/files?path="+p, data); err == nil && code == 200 {
				c.writes.Add(1)
				c.mu.Lock()
				if c.files == nil {
					c.files = map[string]map[string][]byte{}
				}
				if c.files[box.ID] == nil {
					c.files[box.ID] = map[string][]byte{}
				}
				c.files[box.ID][p] = data
				c.mu.Unlock()
			}
			if code, _, err := c.do(c.cur.Load(), "POST", "/v1/sandboxes/"+box.ID+"/exec", []byte(`{"cmd": "echo ok", "timeout_seconds": 60}`)); err == nil && code == 200 {
				c.execs.Add(1)
			}
			c.do(c.cur.Load(), "PUT", "/v1/sandboxes/"+box.ID+"/firewall", []byte(`{"default_outbound": "deny"}`))
		}
		// Every other sandbox stays, so restarts find some running.
		if made%2 == 0 {
			c.remove(box.ID)
		} else {
			kept = append(kept, box.ID)
		}
	}
}

// remove deletes a sandbox and notes an acknowledged delete.
func (c *crashClients) remove(id string) {
	if code, _, err := c.do(c.cur.Load(), "DELETE", "/v1/sandboxes/"+id, nil); err == nil && code == 200 {
		c.deletes.Add(1)
		c.mu.Lock()
		c.deleted = append(c.deleted, id)
		delete(c.files, id)
		c.mu.Unlock()
	}
}

// check asserts the invariants against a freshly restarted server.
func (c *crashClients) check(t *testing.T, srv *testserver.Server, dataDir, table string) {
	t.Helper()
	running := srv.Sandboxes(t, "running")
	for _, b := range running {
		id := b["id"].(string)
		code, out, err := c.do(srv, "POST", "/v1/sandboxes/"+id+"/exec", []byte(`{"cmd": "echo alive", "timeout_seconds": 60}`))
		if code == 409 && c.gone(srv, id) {
			// A client deleted it after the list was read (a delete that
			// cuts the exec short says so: 409 too).
			continue
		}
		if code == 503 {
			t.Logf("the server's log of it: %s; and of its agent: %s", lastMatch(srv.Log.String(), "request failed"), lastMatch(srv.Log.String(), "agent session ended"))
		}
		if err != nil || code != 200 || !bytes.Contains(out, []byte(`"stdout":"alive\n"`)) {
			t.Errorf("running sandbox %s does not answer: %d %s %v", id, code, out, err)
		}
	}
	c.mu.Lock()
	files := map[string]map[string][]byte{}
	for id, m := range c.files {
		files[id] = m
	}
	deleted := append([]string(nil), c.deleted...)
	c.mu.Unlock()
	isRunning := map[string]bool{}
	for _, b := range running {
		isRunning[b["id"].(string)] = true
	}
	for id, m := range files {
		if !isRunning[id] {
			continue // deleted meanwhile, or expired
		}
		for p, want := range m {
			code, got, err := c.do(srv, "GET", "/v1/sandboxes/"+id+"/files?path="+p, nil)
			if code == 409 && c.gone(srv, id) {
				break // a client deleted it after the list was read
			}
			if err != nil || code != 200 || !bytes.Equal(got, want) {
				t.Errorf("acknowledged write %s:%s lost: %d, %d bytes (want %d), %v", id, p, code, len(got), len(want), err)
			}
		}
	}
	nft, _ := exec.Command("nft", "list", "table", "inet", table).CombinedOutput()
	secrets := sealedSecrets(t, dataDir)
	sealed := func(id string) int {
		n := 0
		for _, s := range secrets {
			if s.scope == "sandbox/"+id || strings.HasPrefix(s.scope, "sandbox/"+id+"/") || s.scope == "history/"+id {
				n++
			}
		}
		return n
	}
	for _, b := range running {
		// (Which also shows the check reads the server's database.)
		id := b["id"].(string)
		if !slices.Contains(secrets, sealedSecret{"sandbox/" + id, "data-key"}) && !c.gone(srv, id) {
			t.Errorf("running sandbox %s has no sealed data key", id)
		}
	}
	for _, id := range deleted {
		if n := sealed(id); n > 0 {
			t.Errorf("deleted sandbox %s: %d sealed secrets (its data key among them) still there", id, n)
		}
		dir := filepath.Join(dataDir, "m", id)
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("deleted sandbox %s: state directory still there (%v)", id, err)
		}
		for _, p := range procs.Naming(dir + "/") {
			if p.IsVMM() {
				t.Errorf("deleted sandbox %s: VMM %d still runs", id, p.PID)
			}
		}
		tap := linuxnet.TapName(id)
		if _, err := net.InterfaceByName(tap); err == nil {
			t.Errorf("deleted sandbox %s: tap %s still there", id, tap)
		}
		if bytes.Contains(nft, []byte("chain o-"+tap)) {
			t.Errorf("deleted sandbox %s: nftables chain o-%s still there", id, tap)
		}
	}
	// No VMM runs for a sandbox that is not live. The processes are read
	// before the list, so a VMM of a create in flight is in it; one whose
	// sandbox a client deleted meanwhile gets a moment to go.
	var vmms []procs.Proc
	for _, p := range procs.Naming(filepath.Join(dataDir, "m") + "/") {
		if p.IsVMM() {
			vmms = append(vmms, p)
		}
	}
	owner := func(p procs.Proc) bool {
		for _, b := range srv.Sandboxes(t, "") {
			switch b["state"] {
			case "creating", "running", "paused":
				if strings.Contains(p.Cmdline, filepath.Join(dataDir, "m", b["id"].(string))+"/") {
					return true
				}
			}
		}
		return false
	}
	for _, p := range vmms {
		for end := time.Now().Add(15 * time.Second); !owner(p); time.Sleep(500 * time.Millisecond) {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", p.PID)); err != nil {
				break // gone
			}
			if time.Now().After(end) {
				t.Errorf("VMM %s runs for no live sandbox", p)
				break
			}
		}
	}
	plugins := 0
	for _, p := range procs.WithEnv(plugin.OwnerEnv + "=" + dataDir) {
		if p.IsPlugin() {
			plugins++
		}
	}
	if plugins != 1 {
		t.Errorf("%d hypervisor plugins run for the data directory, want 1", plugins)
	}
	if n := c.late5xx.Load(); n > 0 {
		t.Errorf("%d 5xx answers after a restart completed; the last: %v", n, c.last5xx.Load())
	}
	t.Logf("checked %d running sandboxes, %d sandboxes with acknowledged files, %d deleted", len(running), len(files), len(deleted))
}

type sealedSecret struct{ scope, name string }

// sealedSecrets lists the sealed secrets in the data directory's database
// ("sandbox/ID" holds a sandbox's data key as "data-key", "history/ID"
// its command history's), read while the server runs (the database
// allows readers beside it).
func sealedSecrets(t *testing.T, dataDir string) []sealedSecret {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dataDir, "harebox.db")+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT scope, name FROM secrets`)
	if err != nil {
		t.Fatalf("secrets: %v", err)
	}
	defer rows.Close()
	var out []sealedSecret
	for rows.Next() {
		var s sealedSecret
		if err := rows.Scan(&s.scope, &s.name); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func randN(n int64) int64 {
	v, _ := rand.Int(rand.Reader, big.NewInt(n))
	return v.Int64()
}
