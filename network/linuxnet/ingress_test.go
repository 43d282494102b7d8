package linuxnet

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/harebox/harebox/firewall"
)

// markedDial connects from the host with a socket mark, as DialGuest does.
func markedDial(addr string, mark uint32) (net.Conn, error) {
	d := net.Dialer{Timeout: 700 * time.Millisecond, Control: markSocket(mark)}
	return d.Dial("tcp4", addr)
}

// TestIngress: the host's ingress reaches exactly the ports it opened on
// one guest; nothing else gets in (another process of the host, another
// sandbox, another port), and closing a port shuts it again.
func TestIngress(t *testing.T) {
	e := newEnv(t)
	n := e.newNetwork("")
	g := e.attach(n, firewall.Default())
	other := e.attach(n, &firewall.Policy{DefaultOutbound: firewall.Allow})
	seen := map[string]*counter{}
	for _, port := range []string{"8080", "8081"} {
		var ln net.Listener
		var err error
		inNS(t, g.ns, func() { ln, err = net.Listen("tcp4", ":"+port) })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		seen[port] = &counter{}
		go acceptEcho(ln, seen[port])
	}
	guest8080, guest8081 := g.addr.String()+":8080", g.addr.String()+":8081"
	ctx := context.Background()

	// Before anything is exposed, neither the ingress's mark nor a plain
	// host socket gets in.
	_, err := markedDial(guest8080, DefaultIngressMark)
	mustBlocked(t, "marked, before exposing", err, seen["8080"])
	c, err := n.DialGuest(ctx, g.id, 8080)
	if err != nil {
		t.Fatalf("DialGuest: %v", err)
	}
	if err := echo(c, "hello"); err != nil {
		t.Fatalf("through the ingress: %v", err)
	}
	c.Close()
	before := seen["8080"].get()
	_, err = net.DialTimeout("tcp4", guest8080, 700*time.Millisecond)
	if err == nil || seen["8080"].get() != before {
		t.Errorf("a host socket without the mark got in: %v", err)
	}
	_, err = markedDial(guest8081, DefaultIngressMark)
	mustBlocked(t, "marked, to a port not exposed", err, seen["8081"])
	_, err = other.dial("tcp4", guest8080)
	if err == nil || seen["8080"].get() != before {
		t.Errorf("another sandbox got in: %v", err)
	}
	if _, err := n.DialGuest(ctx, "sbx_missing", 8080); err == nil {
		t.Error("DialGuest to a sandbox that is not attached succeeded")
	}

	// The opened port survives a restart of the network (state dir), and
	// closing it shuts it.
	if err := n.ClosePorts(ctx, g.id, 8080); err != nil {
		t.Fatal(err)
	}
	_, err = markedDial(guest8080, DefaultIngressMark)
	if err == nil || seen["8080"].get() != before {
		t.Errorf("marked dial after ClosePorts got in: %v", err)
	}
	if c, err = n.DialGuest(ctx, g.id, 8081); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if b := n.boxes[g.id]; len(b.Exposed) != 1 || b.Exposed[0] != 8081 {
		t.Errorf("exposed = %v, want [8081]", b.Exposed)
	}

	// Detaching closes the ingress's open connections to the guest: its
	// address goes to the next sandbox attached.
	if c, err = n.DialGuest(ctx, g.id, 8081); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echo(c, "before"); err != nil {
		t.Fatal(err)
	}
	if err := n.Detach(ctx, g.id); err != nil {
		t.Fatal(err)
	}
	if err := echo(c, "after"); err == nil {
		t.Error("an ingress connection outlived the guest's detach")
	}
}
