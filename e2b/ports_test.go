package e2b_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/console"
	"github.com/harebox/harebox/e2b"
	"github.com/harebox/harebox/e2b/envd"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
)

// webNet stands for the network's guest dialing (linuxnet's, tested in
// network/linuxnet and e2e): every guest port is one web server on
// loopback, and it records what was dialed.
type webNet struct {
	network.None
	addr string
	mu   sync.Mutex
	dial []string
}

func (n *webNet) DialGuest(ctx context.Context, id string, port uint16) (net.Conn, error) {
	n.mu.Lock()
	n.dial = append(n.dial, id+":"+strconv.Itoa(int(port)))
	n.mu.Unlock()
	var d net.Dialer
	return d.DialContext(ctx, "tcp", n.addr)
}

func (n *webNet) ClosePorts(context.Context, string, ...uint16) error { return nil }

// TestPorts: a sandbox's other ports through the listener, as E2B's edge
// serves them: public, or with the traffic token; a port published as a
// HareBox URL only through its URL; a sandbox not running, none.
func TestPorts(t *testing.T) {
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// (What reached the guest: the sandbox's own credentials must not.)
		// (A guest cannot set the console's session cookie either.)
		w.Header().Add("Set-Cookie", console.Cookie+"=fixated; Path=/")
		w.Header().Add("Set-Cookie", "app=1")
		json.NewEncoder(w).Encode(map[string]string{"host": r.Host, "path": r.URL.Path,
			"token":  r.Header.Get("X-Access-Token") + r.Header.Get("E2b-Traffic-Access-Token") + r.Header.Get("X-Api-Key"),
			"cookie": r.Header.Get("Cookie")})
	}))
	t.Cleanup(web.Close)
	n := &webNet{addr: web.Listener.Addr().String()}
	f := newFixtureWith(t, func(eo *harebox.Options, ho *e2b.Options) {
		eo.Network = n
		eo.Ingress, _ = url.Parse("https://apps.test:8443")
		ho.Guests = n
	})
	ev := envd.New(envd.Options{Files: f.eng, Access: f.h})
	srv := httptest.NewServer(&e2b.Router{API: f.h, Envd: ev.Handler, Ports: f.h.Port, Domain: "e2b.test"})
	t.Cleanup(srv.Close)
	get := func(host string, hdr map[string]string) (int, map[string]string) {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+"/app/x", nil)
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]string
		json.Unmarshal(b, &m)
		if m == nil {
			m = map[string]string{"raw": string(b)}
		}
		if sc := resp.Header.Values("Set-Cookie"); resp.StatusCode == 200 && (len(sc) != 1 || sc[0] != "app=1") {
			t.Errorf("the guest's cookies reached the client as %q", sc)
		}
		return resp.StatusCode, m
	}

	// Public (E2B's default): by host name, or by the SDK's headers.
	pub := f.create(t, f.key, map[string]any{})
	if pub.TrafficAccessToken != nil {
		t.Errorf("a public sandbox has a traffic token")
	}
	host := "8080-" + pub.SandboxID + ".e2b.test"
	if st, m := get(host, map[string]string{"X-Access-Token": pub.EnvdAccessToken, "X-API-KEY": f.key, "Cookie": "a=1; " + console.Cookie + "=consolesession"}); st != 200 ||
		m["host"] != host || m["path"] != "/app/x" || m["token"] != "" || m["cookie"] != "a=1" {
		t.Fatalf("a public port: %d %v", st, m)
	}
	if st, m := get("", map[string]string{"E2b-Sandbox-Id": pub.SandboxID, "E2b-Sandbox-Port": "3000"}); st != 200 || m["path"] != "/app/x" {
		t.Fatalf("a public port by header: %d %v", st, m)
	}

	// Private: the traffic token, from create, info and connect alike.
	priv := f.create(t, f.key, map[string]any{"network": map[string]any{"allowPublicTraffic": false}})
	if priv.TrafficAccessToken == nil || len(*priv.TrafficAccessToken) < 32 {
		t.Fatalf("a private sandbox's traffic token: %v", priv.TrafficAccessToken)
	}
	var d e2b.Sandbox
	f.must(t, 200, "POST", "/sandboxes/"+priv.SandboxID+"/connect", f.key, map[string]any{"timeout": 60}).decode(t, &d)
	if d.TrafficAccessToken == nil || *d.TrafficAccessToken != *priv.TrafficAccessToken {
		t.Errorf("connect's traffic token: %v", d.TrafficAccessToken)
	}
	ph := "8080-" + priv.SandboxID + ".e2b.test"
	for _, bad := range []string{"", "x", strings.ToUpper(*priv.TrafficAccessToken), *priv.TrafficAccessToken + "0"} {
		if st, m := get(ph, map[string]string{"E2b-Traffic-Access-Token": bad}); st != 403 || !strings.Contains(m["message"], "traffic token") {
			t.Errorf("traffic token %q: %d %v", bad, st, m)
		}
	}
	if st, m := get(ph, map[string]string{"E2b-Traffic-Access-Token": *priv.TrafficAccessToken}); st != 200 || m["token"] != "" {
		t.Errorf("with its traffic token: %d %v", st, m)
	}

	// A private sandbox's fork is private, with a token of its own.
	var forks []struct {
		Sandbox *e2b.Sandbox `json:"sandbox"`
	}
	f.must(t, 201, "POST", "/sandboxes/"+priv.SandboxID+"/fork", f.key, nil).decode(t, &forks)
	if len(forks) != 1 || forks[0].Sandbox == nil || forks[0].Sandbox.TrafficAccessToken == nil || *forks[0].Sandbox.TrafficAccessToken == *priv.TrafficAccessToken {
		t.Fatalf("a private sandbox's fork: %+v", forks)
	}
	fh := "8080-" + forks[0].Sandbox.SandboxID + ".e2b.test"
	if st, _ := get(fh, map[string]string{"E2b-Traffic-Access-Token": *priv.TrafficAccessToken}); st != 403 {
		t.Errorf("a fork with its source's traffic token: %d", st)
	}

	// A port published as a HareBox URL: only through its URL.
	if _, err := f.eng.URLCalls().Create(context.Background(), e2b.InternalID(pub.SandboxID), sandbox.URLRequest{Port: 9090}); err != nil {
		t.Fatal(err)
	}
	if st, m := get("9090-"+pub.SandboxID+".e2b.test", nil); st != 403 {
		t.Errorf("a published port: %d %v", st, m)
	}
	// Not running: paused, then killed.
	f.must(t, 204, "POST", "/sandboxes/"+pub.SandboxID+"/pause", f.key, nil)
	if st, m := get(host, nil); st != 502 {
		t.Errorf("a paused sandbox's port: %d %v", st, m)
	}
	f.must(t, 204, "DELETE", "/sandboxes/"+pub.SandboxID, f.key, nil)
	if st, m := get(host, nil); st != 502 {
		t.Errorf("a killed sandbox's port: %d %v", st, m)
	}
	n.mu.Lock()
	dials := n.dial
	n.mu.Unlock()
	want := []string{e2b.InternalID(pub.SandboxID) + ":8080", e2b.InternalID(pub.SandboxID) + ":3000", e2b.InternalID(priv.SandboxID) + ":8080"}
	if !slices.Equal(dials, want) {
		t.Errorf("the guest ports dialed: %v, want %v (a refused request dials nothing)", dials, want)
	}
}
