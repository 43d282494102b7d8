package api_test

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/api"
	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// twoHosts starts hosts a and b on one PostgreSQL database (the in-memory
// hypervisor stands for their VMs), each with its public API and its
// internal endpoint (mutual TLS with a deployment CA made here). They share
// the root key, as a deployment's hosts do.
// kill stops a host as a crash would for the others: its internal
// endpoint, its engine and its store go.
func twoHosts(t *testing.T, lease time.Duration) (a, b *fastAPI, kill func(*fastAPI)) {
	t.Helper()
	return twoHostsWith(t, lease, memhv.Options{}, api.Timeouts{})
}

// twoHostsWith is twoHosts with these hypervisor options and API timeouts.
func twoHostsWith(t *testing.T, lease time.Duration, hvo memhv.Options, to api.Timeouts) (a, b *fastAPI, kill func(*fastAPI)) {
	t.Helper()
	internal := map[*fastAPI]*http.Server{}
	dsn := postgresDatabase(t)
	caDir := t.TempDir()
	if _, err := cluster.MakeCA(caDir); err != nil {
		t.Fatal(err)
	}
	var root []byte
	host := func(name string) *fastAPI {
		if err := cluster.IssueHost(caDir, name, []string{"127.0.0.1"}); err != nil {
			t.Fatal(err)
		}
		ct, err := cluster.LoadTLS(filepath.Join(caDir, "ca.pem"), filepath.Join(caDir, name+".pem"), filepath.Join(caDir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dir, err := os.MkdirTemp("", "hbh")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if root != nil {
			os.WriteFile(filepath.Join(dir, "root.key"), root, 0o600)
		}
		db, err := store.OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		hv := memhv.New(hvo)
		t.Cleanup(func() { hv.Close() })
		f := &fastAPI{hv: hv, dir: dir, store: db, tweak: func(o *harebox.Options) {
			o.Host = harebox.HostOptions{Name: name, Address: "https://" + ln.Addr().String(), Lease: lease}
			o.Capacity = harebox.Capacity{VCPUs: 8, MemoryMB: 8192, DiskGB: 100}
		}}
		f.open(t, api.Options{Cluster: ct, Timeouts: to})
		root, _ = os.ReadFile(filepath.Join(dir, "root.key"))
		in := f.srv.HTTPServer()
		in.Handler = f.srv.Internal(nil)
		go in.Serve(tls.NewListener(ln, ct.Server))
		t.Cleanup(func() { in.Close() })
		internal[f] = in
		return f
	}
	return host("a"), host("b"), func(f *fastAPI) {
		internal[f].Close()
		f.eng.Close()
		f.store.Close()
	}
}

// Any host answers for every sandbox: requests for b's sandbox through a
// are served by b (streams and files included), creates go to the least
// loaded host, only hosts may say they forwarded, and a host that is down
// gets a clear 503.
func TestForwardToTheOwningHost(t *testing.T) {
	a, b, _ := twoHosts(t, 900*time.Millisecond)
	if a.root != b.root {
		t.Fatal("the hosts do not share the root key")
	}
	box := b.must(t, 201, "POST", "/v1/sandboxes", b.root, map[string]any{"name": "on-b"})
	id := str(box, "id")
	if str(box, "host") != "b" {
		t.Fatalf("created through b on %q", str(box, "host"))
	}
	// Through a: get (from the store), exec, a streamed exec, files, list.
	if g := a.must(t, 200, "GET", "/v1/sandboxes/"+id, a.root, nil); str(g, "host") != "b" || str(g, "state") != "running" {
		t.Fatalf("get through a: %s", g.raw)
	}
	if r := a.must(t, 200, "POST", "/v1/sandboxes/"+id+"/exec", a.root, map[string]any{"cmd": "echo via-a"}); str(r, "stdout") != "via-a\n" {
		t.Fatalf("exec through a: %s", r.raw)
	}
	if r := a.must(t, 200, "POST", "/v1/sandboxes/"+id+"/exec/stream", a.root, map[string]any{"cmd": "echo streamed"}); !strings.Contains(string(r.raw), base64.StdEncoding.EncodeToString([]byte("streamed\n"))) || !strings.Contains(string(r.raw), "event: exit") {
		t.Fatalf("streamed exec through a: %s", r.raw)
	}
	a.must(t, 200, "PUT", "/v1/sandboxes/"+id+"/files?path=/tmp/f", a.root, "written through a")
	if r := b.must(t, 200, "GET", "/v1/sandboxes/"+id+"/files?path=/tmp/f", b.root, nil); string(r.raw) != "written through a" {
		t.Fatalf("read on b: %q", r.raw)
	}
	hs := a.must(t, 200, "GET", "/v1/hosts", a.root, nil)
	if l, _ := hs.body["hosts"].([]any); len(l) != 2 || l[0].(map[string]any)["name"] != "a" || l[1].(map[string]any)["up"] != true ||
		l[1].(map[string]any)["address"] != hostAddress(t, b) {
		t.Fatalf("hosts: %s", hs.raw)
	}
	for _, f := range []*fastAPI{a, b} {
		l := f.must(t, 200, "GET", "/v1/sandboxes", f.root, nil)
		if got := ids(l.body["sandboxes"]); len(got) != 1 || got[0] != id {
			t.Fatalf("list: %s", l.raw)
		}
	}
	// The request ID is the caller's, end to end, once; a caller cannot
	// pass for a host (a says who forwarded and for whom, not the caller).
	fw := "/v1/sandboxes/" + id + "/firewall" // (forwarded; a get is not)
	req, _ := http.NewRequest("GET", a.url+fw, nil)
	req.Header.Set("Authorization", "Bearer "+a.root)
	req.Header.Set("X-Request-ID", "req_0123456789abcdef01234567")
	req.Header.Set(cluster.HeaderForwardedBy, "b")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(resp.Header.Values("X-Request-ID")) != 1 || resp.Header.Get("X-Request-ID") != "req_0123456789abcdef01234567" {
		t.Fatalf("forwarded request: %d, request IDs %q", resp.StatusCode, resp.Header.Values("X-Request-ID"))
	}
	// A key limited to an address: b checks the caller's address as a saw
	// it, whatever the caller claims.
	limited := func(cidr string) string {
		r := a.must(t, 201, "POST", "/v1/keys", a.root, map[string]any{"scope": map[string]any{"cidrs": []string{cidr}}})
		return str(r, "secret")
	}
	here, there := limited("127.0.0.1/32"), limited("10.9.9.9/32")
	a.must(t, 200, "GET", fw, here, nil)
	req, _ = http.NewRequest("GET", a.url+fw, nil)
	req.Header.Set("Authorization", "Bearer "+there)
	req.Header.Set(cluster.HeaderClient, "10.9.9.9")
	req.Header.Set("X-Forwarded-For", "10.9.9.9")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 403 {
		t.Fatalf("a key for 10.9.9.9 from 127.0.0.1, claiming 10.9.9.9, through a: %v %v", resp.StatusCode, err)
	}
	// Without a key, a refuses it itself; with a wrong one, b does (once).
	if r := a.do(t, "GET", fw, "", nil); r.status != 401 {
		t.Fatalf("no key, through a: %d %s", r.status, r.raw)
	}
	if r := a.do(t, "GET", fw, "hbk_wrong", nil); r.status != 401 {
		t.Fatalf("a wrong key, through a: %d %s", r.status, r.raw)
	}

	// The internal endpoint takes only the deployment's hosts.
	host := strings.TrimPrefix(hostAddress(t, b), "https://")
	if _, err := tls.Dial("tcp", host, &tls.Config{InsecureSkipVerify: true}); err == nil {
		// (TLS 1.3: the refusal may come with the first read.)
		c, _ := tls.Dial("tcp", host, &tls.Config{InsecureSkipVerify: true})
		c.Write([]byte("GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\n\r\n"))
		if n, err := c.Read(make([]byte, 64)); err == nil {
			t.Fatalf("the internal endpoint answered a client without a certificate (%d bytes)", n)
		}
		c.Close()
	}

	// Placement: b runs one sandbox, a none: a create through b goes to
	// a, and the next, through a, to b... once each has one, a tie stays
	// where it is asked.
	if r := b.must(t, 201, "POST", "/v1/sandboxes", b.root, map[string]any{}); str(r, "host") != "a" {
		t.Fatalf("a create through b, with one sandbox on b and none on a, went to %q", str(r, "host"))
	}
	// (a knows what b runs as of b's last renewal.)
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		hs, _ := a.eng.Cluster().Hosts(context.Background())
		if len(hs) == 2 && hs[1].Used.VCPUs == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b's row never showed its sandbox: %+v", hs)
		}
	}
	if r := a.must(t, 201, "POST", "/v1/sandboxes", a.root, map[string]any{}); str(r, "host") != "a" {
		t.Fatalf("a tie, through a, went to %q", str(r, "host"))
	}
	// A bad create is refused by whoever gets it, with the usual error.
	if r := a.do(t, "POST", "/v1/sandboxes", a.root, `{"size": {"preset": "huge"}}`); r.status != 400 {
		t.Fatalf("a bad create: %d %s", r.status, r.raw)
	}

	// Delete through a.
	a.must(t, 200, "DELETE", "/v1/sandboxes/"+id, a.root, nil)
	if g := b.must(t, 200, "GET", "/v1/sandboxes/"+id, b.root, nil); str(g, "state") != "deleted" {
		t.Fatalf("after a delete through a: %s", g.raw)
	}
}

// A host that is down: until its lease lapses requests for its sandboxes
// get a 502 (it cannot be reached), then their state is lost and requests
// get a 503 that says so.
func TestForwardToAHostThatIsDown(t *testing.T) {
	const lease = 600 * time.Millisecond
	a, b, kill := twoHosts(t, lease)
	id := str(b.must(t, 201, "POST", "/v1/sandboxes", b.root, map[string]any{}), "id")
	// (It has a data key, in the shared store.)
	if _, err := a.store.GetSecret(context.Background(), "sandbox/"+id, secrets.DataKeyName); err != nil {
		t.Fatalf("its data key: %v", err)
	}
	// A host that is up is not removed; neither is this one, nor one that
	// does not exist.
	for _, c := range []struct {
		name string
		want int
	}{{"b", 409}, {"a", 409}, {"nope", 404}} {
		if r := a.do(t, "DELETE", "/v1/hosts/"+c.name, a.root, nil); r.status != c.want {
			t.Fatalf("remove host %s: %d %s, want %d", c.name, r.status, r.raw, c.want)
		}
	}
	kill(b)
	deadline := time.Now().Add(lease + 3*time.Second)
	for {
		r := a.do(t, "POST", "/v1/sandboxes/"+id+"/exec", a.root, map[string]any{"cmd": "true"})
		if r.status == 503 {
			if code, _, msg := errField(r); code != "unavailable" || !strings.Contains(msg, "host b") || !strings.Contains(msg, "down") {
				t.Fatalf("503: %s", r.raw)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exec through a in a sandbox of a dead host: %d %s", r.status, r.raw)
		}
		if r.status != 502 { // (until its lease lapses: it cannot be reached)
			t.Fatalf("exec through a in a sandbox of a dead host: %d %s", r.status, r.raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if g := a.must(t, 200, "GET", "/v1/sandboxes/"+id, a.root, nil); str(g, "state") != "lost" || !strings.Contains(str(g, "error"), "host b") {
		t.Fatalf("get through a: %s", g.raw)
	}
	l := a.must(t, 200, "GET", "/v1/sandboxes?state=lost", a.root, nil)
	if got := ids(l.body["sandboxes"]); len(got) != 1 || got[0] != id {
		t.Fatalf("lost sandboxes: %s", l.raw)
	}
	// New sandboxes go to a.
	if r := a.must(t, 201, "POST", "/v1/sandboxes", a.root, map[string]any{}); str(r, "host") != "a" {
		t.Fatalf("created on %q with b down", str(r, "host"))
	}
	// b is gone for good: removed, its sandbox is deleted and its data key
	// erased; a key may not remove a host.
	k := a.must(t, 201, "POST", "/v1/keys", a.root, map[string]any{"scope": map[string]any{}})
	if r := a.do(t, "DELETE", "/v1/hosts/b", str(k, "secret"), nil); r.status != 403 {
		t.Fatalf("a key removes a host: %d %s", r.status, r.raw)
	}
	r := a.must(t, 200, "DELETE", "/v1/hosts/b", a.root, nil)
	if got := r.body["deleted_sandboxes"].([]any); len(got) != 1 || got[0] != id {
		t.Fatalf("remove host b: %s", r.raw)
	}
	if g := a.must(t, 200, "GET", "/v1/sandboxes/"+id, a.root, nil); str(g, "state") != "deleted" || !strings.Contains(str(g, "error"), "host b was removed") {
		t.Fatalf("b's sandbox after b was removed: %s", g.raw)
	}
	if _, err := a.store.GetSecret(context.Background(), "sandbox/"+id, secrets.DataKeyName); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("its data key after b was removed: %v", err)
	}
	if l := a.must(t, 200, "GET", "/v1/hosts", a.root, nil); len(l.body["hosts"].([]any)) != 1 {
		t.Fatalf("hosts after b was removed: %s", l.raw)
	}
	a.must(t, 404, "DELETE", "/v1/hosts/b", a.root, nil)
}

// hostAddress is a host's internal endpoint as it registered it.
func hostAddress(t *testing.T, f *fastAPI) string {
	t.Helper()
	hs, err := f.eng.Cluster().Hosts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if h.Name == f.eng.Cluster().Name() {
			return h.Address
		}
	}
	t.Fatal("not registered")
	return ""
}

// A create that takes longer than the body's timeout (Timeouts.Body) is
// not cut by it. With several hosts, placement reads a create's body
// before the create does; the deadline the create's decode then set came
// after the body's end, stayed on net/http's watch of the connection, and
// cancelled the create when it fired (and every later request on that
// connection). Through a: one create served there, one forwarded to b,
// then calls on the same connections.
func TestSlowCreateOutlivesTheBodyTimeout(t *testing.T) {
	a, _, _ := twoHostsWith(t, 900*time.Millisecond, memhv.Options{LaunchDelay: 1500 * time.Millisecond},
		api.Timeouts{Body: 500 * time.Millisecond, BodyIdle: 500 * time.Millisecond})
	for _, want := range []string{"a", "b"} {
		box := a.must(t, 201, "POST", "/v1/sandboxes", a.root, map[string]any{"name": "slow-on-" + want})
		if str(box, "host") != want {
			t.Fatalf("placed on %q, want %s", str(box, "host"), want)
		}
		id := str(box, "id")
		a.must(t, 200, "PUT", "/v1/sandboxes/"+id+"/firewall", a.root, map[string]any{"default_outbound": "deny"})
		a.must(t, 200, "PUT", "/v1/sandboxes/"+id+"/files?path=/tmp/f", a.root, "written through a")
		if r := a.must(t, 200, "POST", "/v1/sandboxes/"+id+"/exec", a.root, map[string]any{"cmd": "sleep 1"}); !strings.Contains(string(r.raw), `"exit_code":0`) {
			t.Fatalf("exec: %s", r.raw)
		}
	}
}
