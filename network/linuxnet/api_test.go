package linuxnet

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/harebox/harebox/api"
	"github.com/harebox/harebox/firewall"
)

// A sandbox reaches the HareBox API as http://api.harebox.internal/ only
// when its policy names that host, through the proxy and never by address;
// the server sees the sandbox's own address as the peer.
func TestAPIFromGuest(t *testing.T) {
	e := newEnv(t)
	pipes := api.NewPipes()
	var calls atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		fmt.Fprintf(w, "peer=%s host=%s", r.RemoteAddr, r.Host)
	})}
	go srv.Serve(pipes)
	t.Cleanup(func() { srv.Close() })
	e.api = pipes.Dial
	n := e.newNetwork("")

	open := mustPolicy(t, `{"default_outbound": "deny", "outbound": [{"action": "allow", "protocol": "tcp", "ports": "80", "hosts": ["`+firewall.APIHost+`"]}]}`)
	g := e.attach(n, open)
	addr, err := g.resolve(firewall.APIHost)
	if err != nil || addr != g.gw.String() {
		t.Fatalf("resolve: %q %v, want the gateway %s", addr, err, g.gw)
	}
	c, err := g.dial("tcp4", addr+":80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	body, err := get(c, firewall.APIHost, "/")
	if want := fmt.Sprintf("peer=%s:0 host=%s", g.addr, firewall.APIHost); err != nil || body != want {
		t.Fatalf("through the proxy: %q %v, want %q", body, err, want)
	}
	// Another port, or another name to the same address, goes nowhere.
	if c2, err := g.dial("tcp4", addr+":8080"); err == nil {
		c2.SetDeadline(time.Now().Add(3 * time.Second))
		if b, err := get(c2, firewall.APIHost, "/"); err == nil {
			t.Errorf("port 8080 reached the API: %q", b)
		}
		c2.Close()
	}
	if c3, err := g.dial("tcp4", addr+":80"); err == nil {
		c3.SetDeadline(time.Now().Add(3 * time.Second))
		if b, err := get(c3, "pypi.org", "/"); err == nil && strings.Contains(b, "peer=") {
			t.Errorf("another Host reached the API: %q", b)
		}
		c3.Close()
	}
	before := calls.Load()

	// A policy that stops naming it cuts the open connection, and an
	// allow-by-default policy does not open it.
	if err := n.SetPolicy(context.Background(), g.id, firewall.Default()); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", firewall.APIHost)
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("the open connection survived a policy that no longer names the API")
	}
	if _, err := g.resolve(firewall.APIHost); err == nil {
		t.Error("the default policy resolves the API's name")
	}
	g2 := e.attach(n, firewall.Default())
	if c4, err := g2.dial("tcp4", g2.gw.String()+":80"); err == nil {
		c4.SetDeadline(time.Now().Add(3 * time.Second))
		if b, err := get(c4, firewall.APIHost, "/"); err == nil {
			t.Errorf("the default policy reached the API: %q", b)
		}
		c4.Close()
	}
	if n := calls.Load(); n != before {
		t.Errorf("the API got %d requests it should not have", n-before)
	}
}
