package linuxnet

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/harebox/harebox/firewall"
)

// keepAlive is an HTTPS connection from the guest that sends request after
// request.
type keepAlive struct {
	c  net.Conn
	br *bufio.Reader
}

func (g *guest) keepAlive(t *testing.T, addr, name string) *keepAlive {
	t.Helper()
	c, err := g.dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, &tls.Config{ServerName: name, RootCAs: g.e.certs})
	t.Cleanup(func() { tc.Close() })
	return &keepAlive{c: tc, br: bufio.NewReader(tc)}
}

func (k *keepAlive) get(host string) (string, error) {
	k.c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintf(k.c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func echo(c net.Conn, msg string) error {
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return fmt.Errorf("echo: got %q", buf)
	}
	return nil
}

// TestLiveUpdate tightens a running sandbox's policy: open connections the
// new policy forbids are cut (proxied and direct), allowed ones survive,
// and a bad policy is refused with the old one left in force.
func TestLiveUpdate(t *testing.T) {
	e := newEnv(t)
	n := e.newNetwork("")
	t.Cleanup(func() { n.Destroy(context.Background()) })
	loose := mustPolicy(t, `{"default_outbound":"deny","outbound":[
	  {"action":"allow","hosts":["pypi.org","example.com"],"ports":"443"},
	  {"action":"allow","protocol":"tcp","ports":"7","cidrs":["`+exampleIP+`"]}]}`)
	g := e.attach(n, loose)

	ex := g.keepAlive(t, exampleIP+":443", "example.com")
	py := g.keepAlive(t, pypiIP+":443", "pypi.org")
	direct, err := g.dial("tcp4", exampleIP+":7")
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if b, err := ex.get("example.com"); err != nil || !strings.HasPrefix(b, "server=example.com") {
		t.Fatalf("example.com before: %q %v", b, err)
	}
	if b, err := py.get("pypi.org"); err != nil || !strings.HasPrefix(b, "server=pypi.org") {
		t.Fatalf("pypi.org before: %q %v", b, err)
	}
	if err := echo(direct, "hello"); err != nil {
		t.Fatalf("direct before: %v", err)
	}

	if err := n.SetPolicy(context.Background(), g.id, mustPolicy(t, walkthrough)); err != nil {
		t.Fatal(err)
	}
	if b, err := ex.get("example.com"); err == nil {
		t.Errorf("proxied example.com connection survived the new policy: %q", b)
	}
	if err := echo(direct, "again"); err == nil {
		t.Error("direct connection to example.com:7 survived the new policy")
	}
	if b, err := py.get("pypi.org"); err != nil || !strings.HasPrefix(b, "server=pypi.org") {
		t.Errorf("allowed pypi.org connection was cut: %q %v", b, err)
	}
	if _, err := g.dial("tcp4", exampleIP+":7"); err == nil {
		t.Error("new direct connection allowed after tightening")
	}

	// A bad policy is refused, naming the field, and changes nothing.
	bad := &firewall.Policy{DefaultOutbound: firewall.Allow, Outbound: []firewall.Rule{{Action: firewall.Allow, Protocol: firewall.TCP, Ports: "0-80"}}}
	err = n.SetPolicy(context.Background(), g.id, bad)
	var fe *firewall.Error
	if !errors.As(err, &fe) || fe.Field != "outbound[0].ports" {
		t.Fatalf("bad policy: %v", err)
	}
	if _, err := g.https(exampleIP+":443", "example.com", "example.com"); err == nil {
		t.Error("example.com reachable after a refused policy")
	}
	if b, err := g.https(pypiIP+":443", "pypi.org", "pypi.org"); err != nil || !strings.HasPrefix(b, "server=pypi.org") {
		t.Errorf("pypi.org after a refused policy: %q %v", b, err)
	}
	if err := n.SetPolicy(context.Background(), "sbx_nope", firewall.Default()); err == nil {
		t.Error("SetPolicy on an unknown sandbox succeeded")
	}
	if _, err := n.Attach(context.Background(), "sbx_bad", bad); !errors.As(err, &fe) {
		t.Errorf("Attach with a bad policy: %v", err)
	}
	if _, err := netlink.LinkByName(TapName("sbx_bad")); err == nil {
		t.Error("refused Attach left a link")
	}
}

// TestNameNeverOpensInternal: a hostname rule for a name that resolves to
// an internal address (metadata, the host) neither resolves for the guest
// nor gets dialed by the proxy.
func TestNameNeverOpensInternal(t *testing.T) {
	e := newEnv(t)
	n := e.newNetwork("")
	t.Cleanup(func() { n.Destroy(context.Background()) })
	g := e.attach(n, mustPolicy(t, fmt.Sprintf(`{"default_outbound":"deny","outbound":[
	  {"action":"allow","hosts":["meta.test","hostaddr.test"],"ports":"80,%d"}]}`, e.hostPort)))
	if ip, err := g.resolve("meta.test"); err == nil {
		t.Errorf("meta.test resolved to %s", ip)
	}
	for _, c := range []struct {
		port int
		host string
		ctr  *counter
	}{{80, "meta.test", e.count(metaIP + ":80")}, {e.hostPort, "hostaddr.test", e.count("host")}} {
		conn, err := g.dial("tcp4", fmt.Sprintf("%s:%d", exampleIP, c.port))
		if err == nil {
			_, err = get(conn, c.host, "/")
			conn.Close()
		}
		mustBlocked(t, c.host, err, c.ctr)
	}
}

// TestDefaultPolicy: a new sandbox reaches the public test internet, by
// name and by address, but nothing internal.
func TestDefaultPolicy(t *testing.T) {
	e := newEnv(t)
	n := e.newNetwork("")
	t.Cleanup(func() { n.Destroy(context.Background()) })
	g := e.attach(n, nil)
	ip, err := g.resolve("example.com")
	if err != nil || ip != exampleIP {
		t.Fatalf("resolve: %s %v", ip, err)
	}
	if b, err := g.https(ip+":443", "example.com", "example.com"); err != nil || !strings.HasPrefix(b, "server=example.com") {
		t.Fatalf("example.com: %q %v", b, err)
	}
	c, err := g.dial("tcp4", exampleIP+":22")
	if err != nil {
		t.Fatalf("example.com:22: %v", err)
	}
	c.Close()
	_, err = g.dial("tcp4", metaIP+":80")
	mustBlocked(t, "metadata", err, e.count(metaIP+":80"))
	_, err = g.dial("tcp4", fmt.Sprintf("%s:%d", g.gw, e.hostPort))
	mustBlocked(t, "host", err, e.count("host"))
	_, err = g.lookup(outsideIP+":53", "pypi.org", true)
	mustBlocked(t, "outside DNS", err, e.count("outside-dns"))
}

// TestRestartAndPrune: a new Network on the same state keeps addresses and
// policy (rebuilding the table); Prune then removes everything.
func TestRestartAndPrune(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	n1 := e.newNetwork(dir)
	g := e.attach(n1, mustPolicy(t, walkthrough))
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	n2 := e.newNetwork(dir)
	t.Cleanup(func() { n2.Destroy(context.Background()) })
	if a, gw, ok := n2.Addr(g.id); !ok || a != g.addr || gw != g.gw {
		t.Fatalf("addresses after restart: %s %s %v", a, gw, ok)
	}
	if b, err := g.https(pypiIP+":443", "pypi.org", "pypi.org"); err != nil || !strings.HasPrefix(b, "server=pypi.org") {
		t.Fatalf("pypi.org after restart: %q %v", b, err)
	}
	_, err := g.https(exampleIP+":443", "example.com", "example.com")
	mustBlocked(t, "example.com after restart", err, e.count("example.com"))
	// Re-attach (the engine does this when it re-adopts a VM) is a no-op.
	att, err := n2.Attach(context.Background(), g.id, mustPolicy(t, walkthrough))
	if err != nil || att.Tap != TapName(g.id) {
		t.Fatalf("re-attach: %+v %v", att, err)
	}

	if err := n2.Prune(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(TapName(g.id)); err == nil {
		t.Error("tap left after Prune")
	}
	if taps, err := n2.table.Taps(); err != nil || len(taps) != 0 {
		t.Errorf("chains left after Prune: %v %v", taps, err)
	}
	if files, _ := os.ReadDir(dir); len(files) != 0 {
		t.Errorf("state left after Prune: %v", files)
	}
	if err := n2.Detach(context.Background(), g.id); err != nil {
		t.Errorf("Detach after Prune: %v", err)
	}
}
