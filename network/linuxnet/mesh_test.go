package linuxnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	guestagent "github.com/harebox/harebox/agent/guest"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/network"
)

// onMesh puts g on a mesh at addr in project and configures its guest
// from the attachment SetMesh returns, as the agent does.
func (g *guest) onMesh(n *Network, addr, project string) netip.Addr {
	t := g.e.t
	t.Helper()
	m := &network.Mesh{Addr: netip.MustParseAddr(addr), Project: netip.MustParsePrefix(project)}
	att, err := n.SetMesh(context.Background(), g.id, m)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := guestagent.ParseNetworkConfig(att.Cmdline)
	if err != nil || cfg == nil || cfg.Mesh != netip.PrefixFrom(m.Addr, m.Project.Bits()) {
		t.Fatalf("cmdline %q: %+v %v", att.Cmdline, cfg, err)
	}
	inNS(t, g.ns, func() { err = guestagent.SetupNetwork(context.Background(), cfg, t.TempDir()) })
	if err != nil {
		t.Fatal(err)
	}
	return m.Addr
}

// a1tap is g's tap.
func a1tap(n *Network, g *guest) string { return TapName(g.id) }

// echoServer answers TCP and UDP on port 7 of addr inside g, each
// connection or datagram with what it got.
func (g *guest) echoServer(addr netip.Addr) {
	t := g.e.t
	var ln net.Listener
	var pc net.PacketConn
	var err error
	inNS(t, g.ns, func() {
		if ln, err = net.Listen("tcp4", netip.AddrPortFrom(addr, 7).String()); err == nil {
			pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(addr, 7).String())
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close(); pc.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	go func() {
		buf := make([]byte, 1500)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:k], from)
		}
	}()
}

// echo sends a line to addr:7 over proto from inside g, from src if
// valid (a spoofed source the guest added itself), and says whether it
// came back within a second (loopback's time, many times over).
func (g *guest) echo(proto string, src, addr netip.Addr) error {
	var err error
	inNS(g.e.t, g.ns, func() {
		d := net.Dialer{Timeout: time.Second}
		if src.IsValid() {
			if proto == "tcp4" {
				d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
			} else {
				d.LocalAddr = &net.UDPAddr{IP: src.AsSlice()}
			}
		}
		var c net.Conn
		if c, err = d.Dial(proto, netip.AddrPortFrom(addr, 7).String()); err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		if _, err = io.WriteString(c, "mesh canary\n"); err != nil {
			return
		}
		buf := make([]byte, 64)
		var k int
		if k, err = c.Read(buf); err == nil && string(buf[:k]) != "mesh canary\n" {
			err = io.ErrUnexpectedEOF
		}
	})
	return err
}

// TestMesh puts sandboxes of two projects on their meshes on one host and
// checks, as root in the guests, who reaches whom: a project's sandboxes
// each other, by address and by name, TCP and UDP; nobody else, whatever
// source address a guest claims; and a sandbox taken off the mesh, or
// detached, at once.
func TestMesh(t *testing.T) {
	e := newEnv(t)
	state := t.TempDir()
	n := e.newNetwork(state)
	// (The test host sends the pool's traffic to its test internet, but
	// the mesh's ranges to the sandboxes, as a host's main table does.)
	sh(t, "ip", "route", "add", "throw", "100.112.0.0/12", "table", fmt.Sprint(e.table))
	// (The meshes are in 100.112.0.0/12, not in hareboxd's default mesh
	// pool: a hareboxd on this host drops, in its own table, what is
	// bound for its mesh pool but not from its sandboxes.)
	// Outbound allowed everywhere, private and shared ranges too: the
	// mesh must not depend on a policy that denies.
	open := mustPolicy(t, `{"default_outbound":"allow","outbound":[{"action":"allow","cidrs":["10.0.0.0/8","100.64.0.0/10"]}]}`)
	a1, a2, b1, c := e.attach(n, open), e.attach(n, open), e.attach(n, open), e.attach(n, open)
	const projA, projB = "100.112.4.0/22", "100.112.8.0/22"
	m1, m2 := a1.onMesh(n, "100.112.4.1", projA), a2.onMesh(n, "100.112.4.2", projA)
	mb := b1.onMesh(n, "100.112.8.1", projB)
	for _, g := range []*guest{a2, b1} {
		g.echoServer(map[*guest]netip.Addr{a2: m2, b1: mb}[g])
	}
	a1.echoServer(m1)

	// Names: the engine answers (here a table), for mesh sandboxes only.
	var mu sync.Mutex
	var asked []string
	n.SetMeshNames(func(_ context.Context, id, name string) (netip.Addr, bool) {
		mu.Lock()
		asked = append(asked, id+" "+name)
		mu.Unlock()
		if name == "a2.proj-a.internal" && (id == a1.id || id == a2.id) {
			return m2, true
		}
		return netip.Addr{}, false
	})

	t.Run("a project's sandboxes reach each other by name and address", func(t *testing.T) {
		ip, err := a1.resolve("a2.proj-a.internal")
		if err != nil || ip != m2.String() {
			t.Fatalf("a2.proj-a.internal from a1: %s %v", ip, err)
		}
		for _, proto := range []string{"tcp4", "udp4"} {
			if err := a1.echo(proto, netip.Addr{}, m2); err != nil {
				t.Errorf("a1 to a2 over %s: %v", proto, err)
			}
			if err := a2.echo(proto, netip.Addr{}, m1); err != nil {
				t.Errorf("a2 to a1 over %s: %v", proto, err)
			}
		}
	})

	t.Run("no other project, no sandbox off the mesh", func(t *testing.T) {
		if _, err := b1.resolve("a2.proj-a.internal"); err == nil || !strings.Contains(err.Error(), "NXDOMAIN") {
			t.Errorf("b1 resolved a2's name: %v", err)
		}
		if _, err := c.resolve("a2.proj-a.internal"); err == nil || !strings.Contains(err.Error(), "NXDOMAIN") {
			t.Errorf("a sandbox off the mesh resolved a2's name: %v", err)
		}
		mu.Lock()
		for _, q := range asked {
			if strings.HasPrefix(q, c.id) {
				t.Errorf("the names were asked for a sandbox off the mesh: %s", q)
			}
		}
		mu.Unlock()
		// (Each guest has a route to the other range as root adds one.)
		for _, g := range []*guest{b1, c} {
			sh(t, "ip", "-n", g.ns, "route", "replace", projA, "via", g.gw.String())
		}
		sh(t, "ip", "-n", a1.ns, "route", "replace", projB, "via", a1.gw.String())
		for _, x := range []struct {
			what     string
			g        *guest
			src, dst netip.Addr
		}{
			{"b1 to a2", b1, netip.Addr{}, m2},
			{"c (off the mesh) to a2", c, netip.Addr{}, m2},
			{"a1 to b1", a1, netip.Addr{}, mb},
			{"a1 from its pool address to b1", a1, a1.addr, mb},
		} {
			for _, proto := range []string{"tcp4", "udp4"} {
				if err := x.g.echo(proto, x.src, x.dst); err == nil {
					t.Errorf("%s over %s: got through", x.what, proto)
				}
			}
		}
	})

	t.Run("spoofed sources reach nobody", func(t *testing.T) {
		// b1 claims an address of project A; a1 claims another of A's
		// (not its own), and a2's own.
		spoofB := netip.MustParseAddr("100.112.4.99")
		sh(t, "ip", "-n", b1.ns, "addr", "add", spoofB.String()+"/32", "dev", "eth0")
		spoofA := netip.MustParseAddr("100.112.4.77")
		sh(t, "ip", "-n", a1.ns, "addr", "add", spoofA.String()+"/32", "dev", "eth0")
		for _, x := range []struct {
			what     string
			g        *guest
			src, dst netip.Addr
		}{
			{"b1 as 100.112.4.99 to a2", b1, spoofB, m2},
			{"a1 as 100.112.4.77 to a2", a1, spoofA, m2},
		} {
			for _, proto := range []string{"tcp4", "udp4"} {
				if err := x.g.echo(proto, x.src, x.dst); err == nil {
					t.Errorf("%s over %s: got through", x.what, proto)
				}
			}
		}
	})

	t.Run("mesh rules: the first match, then the default; replies pass", func(t *testing.T) {
		rules := func(deny bool, rs ...network.MeshRule) {
			t.Helper()
			m := &network.Mesh{Addr: m1, Project: netip.MustParsePrefix(projA), Rules: rs, Deny: deny}
			if _, err := n.SetMesh(context.Background(), a1.id, m); err != nil {
				t.Fatal(err)
			}
		}
		defer rules(false)
		// TCP to a2's port 7 allowed, the rest denied by default.
		rules(true, network.MeshRule{Allow: true, Protocol: firewall.TCP, Ports: "7", Peers: []netip.Addr{m2}})
		if err := a1.echo("tcp4", netip.Addr{}, m2); err != nil {
			t.Errorf("a1 to a2 over tcp, allowed by its rule: %v", err)
		}
		if err := a1.echo("udp4", netip.Addr{}, m2); err == nil {
			t.Error("a1 to a2 over udp, denied by default: got through")
		}
		// A rule that denies a2, before one that allows everyone; the
		// default allows. a2 still opens to a1, and a1's replies pass.
		rules(false, network.MeshRule{Protocol: firewall.Any, Peers: []netip.Addr{m2}},
			network.MeshRule{Allow: true, Protocol: firewall.Any, Peers: []netip.Addr{m2, m1}})
		for _, proto := range []string{"tcp4", "udp4"} {
			if err := a1.echo(proto, netip.Addr{}, m2); err == nil {
				t.Errorf("a1 to a2 over %s, denied by its first rule: got through", proto)
			}
			if err := a2.echo(proto, netip.Addr{}, m1); err != nil {
				t.Errorf("a2 to a1 over %s (a1's replies): %v", proto, err)
			}
		}
		// A peer outside the project's range is refused.
		m := &network.Mesh{Addr: m1, Project: netip.MustParsePrefix(projA), Rules: []network.MeshRule{{Allow: true, Protocol: firewall.Any, Peers: []netip.Addr{mb}}}}
		if _, err := n.SetMesh(context.Background(), a1.id, m); err == nil {
			t.Error("a rule with a peer of another project's range was taken")
		}
	})

	t.Run("the mesh is not egress", func(t *testing.T) {
		// 1 MB from a1 to a2 over the mesh: a1's egress grows by its
		// frames' share at most, not by the megabyte; 100 kB to the test
		// internet still count.
		before, _, err := n.Traffic(a1.id)
		if err != nil {
			t.Fatal(err)
		}
		var c net.Conn
		inNS(t, a1.ns, func() { c, err = net.Dial("tcp4", netip.AddrPortFrom(m2, 7).String()) })
		if err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, c)
		if _, err := c.Write(make([]byte, 1<<20)); err != nil {
			t.Fatal(err)
		}
		c.Close()
		time.Sleep(300 * time.Millisecond)
		after, _, _ := n.Traffic(a1.id)
		if after-before > 50_000 {
			t.Errorf("a1's egress grew by %d bytes for 1 MB over the mesh", after-before)
		}
		var pc net.PacketConn
		inNS(t, a1.ns, func() { pc, err = net.ListenPacket("udp4", ":0") })
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		for range 100 {
			pc.WriteTo(make([]byte, 1000), &net.UDPAddr{IP: net.ParseIP(outsideIP), Port: 9})
		}
		time.Sleep(300 * time.Millisecond)
		if last, _, _ := n.Traffic(a1.id); last-after < 100_000 {
			t.Errorf("a1's egress grew by %d bytes for 100 kB to the internet", last-after)
		}
	})

	t.Run("a restart keeps the mesh and what it counted", func(t *testing.T) {
		sent, _, err := n.Traffic(a1.id)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
		n = e.newNetwork(state) // (the table rebuilt from the state)
		n.SetMeshNames(func(context.Context, string, string) (netip.Addr, bool) { return m2, true })
		if after, _, err := n.Traffic(a1.id); err != nil || after < sent || after-sent > 1_000 {
			t.Errorf("a1's egress %d after a restart, %d before (%v)", after, sent, err)
		}
		if err := a1.echo("tcp4", netip.Addr{}, m2); err != nil {
			t.Errorf("a1 to a2 after a restart: %v", err)
		}
		if ip, err := a1.resolve("a2.proj-a.internal"); err != nil || ip != m2.String() {
			t.Errorf("a2's name after a restart: %s %v", ip, err)
		}
		if err := b1.echo("tcp4", netip.Addr{}, m2); err == nil {
			t.Error("b1 reached a2 after a restart")
		}
	})

	t.Run("an address of the range that no sandbox has goes nowhere", func(t *testing.T) {
		if err := a1.echo("udp4", netip.Addr{}, netip.MustParseAddr("100.112.4.200")); err == nil {
			t.Error("got an answer")
		}
		out, _ := exec.Command("ip", "route", "get", "100.112.4.200", "from", m1.String(), "iif", a1tap(n, a1)).CombinedOutput()
		if !strings.Contains(string(out), "unreachable") && !strings.Contains(string(out), "No route to host") {
			t.Errorf("the host routes it: %s", out)
		}
	})

	t.Run("the host is not on the mesh", func(t *testing.T) {
		// The host's resolver port, from the mesh address.
		ln, err := net.Listen("tcp4", net.JoinHostPort(a1.gw.String(), "7"))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		if err := a1.echo("tcp4", m1, a1.gw); err == nil {
			t.Error("a1 from its mesh address reached the host")
		}
	})

	t.Run("off the mesh at once", func(t *testing.T) {
		if _, err := n.SetMesh(context.Background(), a2.id, nil); err != nil {
			t.Fatal(err)
		}
		if err := a1.echo("tcp4", netip.Addr{}, m2); err == nil {
			t.Error("a1 reached a2 after a2 left the mesh")
		}
		a2.onMesh(n, "100.112.4.2", projA)
		if err := a1.echo("tcp4", netip.Addr{}, m2); err != nil {
			t.Errorf("a1 to a2 back on the mesh: %v", err)
		}
		if err := n.Detach(context.Background(), a2.id); err != nil {
			t.Fatal(err)
		}
		if err := a1.echo("tcp4", netip.Addr{}, m2); err == nil {
			t.Error("a1 reached a2 after a2 was detached")
		}
	})

	t.Run("bad meshes are refused", func(t *testing.T) {
		for _, m := range []*network.Mesh{
			{Addr: netip.MustParseAddr("100.112.9.1"), Project: netip.MustParsePrefix(projA)},
			{Addr: m1, Project: netip.MustParsePrefix(projA)}, // a1's
			{Addr: e.pool.Addr().Next(), Project: e.pool},
		} {
			if _, err := n.SetMesh(context.Background(), c.id, m); err == nil {
				t.Errorf("%+v: accepted", m)
			}
		}
	})
}

// TestMeshTunnelRules: what comes out of the mesh's tunnel device (a veth
// here, whose far end plays the other hosts' sandboxes) reaches a mesh
// sandbox of this host, and nothing else: not a service of the host, not
// the test internet. And a mesh address is reached from the tunnel and
// the sandboxes only: a datagram from the test internet with a source in
// the sandbox's project's range gets nowhere (rp_filter is off here, as
// on many hosts).
func TestMeshTunnelRules(t *testing.T) {
	e := newEnv(t)
	tun, peer := "hbmt"+e.id, "hbmp-"+e.id
	sh(t, "ip", "netns", "add", peer)
	t.Cleanup(func() { shq("ip", "netns", "del", peer) })
	sh(t, "ip", "link", "add", tun, "type", "veth", "peer", "name", "eth0", "netns", peer)
	t.Cleanup(func() { shq("ip", "link", "del", tun) })
	sh(t, "ip", "link", "set", tun, "up")
	const remote = "100.112.4.9" // (a sandbox of project A on another host)
	// (Everything from the far end goes to the veth, through a gateway
	// that is its MAC: WireGuard's device has no link layer.)
	mac, err := os.ReadFile("/sys/class/net/" + tun + "/address")
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"link", "set", "eth0", "up"}, {"addr", "add", remote + "/32", "dev", "eth0"},
		{"route", "add", "169.254.0.1", "dev", "eth0"}, {"neigh", "replace", "169.254.0.1", "lladdr", strings.TrimSpace(string(mac)), "dev", "eth0", "nud", "permanent"},
		{"route", "add", "default", "via", "169.254.0.1", "dev", "eth0"}} {
		sh(t, append([]string{"ip", "-n", peer}, args...)...)
	}
	sh(t, "ip", "route", "add", remote+"/32", "dev", tun) // (as network/wgtunnel routes a peer's address)
	e.meshPool, e.meshTunnel = netip.MustParsePrefix("100.112.0.0/12"), tun
	n := e.newNetwork("")
	sh(t, "ip", "route", "add", "throw", "100.112.0.0/12", "table", fmt.Sprint(e.table))
	a1 := e.attach(n, mustPolicy(t, `{"default_outbound":"allow"}`))
	m1 := a1.onMesh(n, "100.112.4.1", "100.112.4.0/22")
	a1.echoServer(m1)
	// A datagram counter on a1's mesh address.
	var got counter
	var pc net.PacketConn
	inNS(t, a1.ns, func() { pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(m1, 9).String()) })
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 64)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			got.n.Add(1)
		}
	}()
	dialFrom := func(ns, src, network, dst string) (c net.Conn, err error) {
		inNS(t, ns, func() {
			d := net.Dialer{Timeout: time.Second}
			if network == "tcp4" {
				d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
			} else {
				d.LocalAddr = &net.UDPAddr{IP: net.ParseIP(src)}
			}
			c, err = d.Dial(network, dst)
		})
		return c, err
	}
	send := func(ns, src, dst string) {
		t.Helper()
		c, err := dialFrom(ns, src, "udp4", dst)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for range 3 {
			c.Write([]byte("mesh canary\n"))
		}
		time.Sleep(300 * time.Millisecond)
	}

	// From the tunnel to a1: TCP both ways, and datagrams.
	c, err := dialFrom(peer, remote, "tcp4", netip.AddrPortFrom(m1, 7).String())
	if err != nil {
		t.Fatalf("from the tunnel to a1: %v", err)
	}
	c.Close()
	send(peer, remote, netip.AddrPortFrom(m1, 9).String())
	if got.get() == 0 {
		t.Fatal("from the tunnel to a1: no datagram arrived")
	}
	// From the tunnel to the host and to the test internet: nothing.
	_, err = dialFrom(peer, remote, "tcp4", net.JoinHostPort(hostSide, fmt.Sprint(e.hostPort)))
	mustBlocked(t, "from the tunnel to a host service", err, e.count("host"))
	send(peer, remote, pypiIP+":443")
	mustBlocked(t, "from the tunnel to the test internet", errors.New("sent"), e.count("udp443"))
	// From the test internet, as project A's 100.112.4.77, to a1.
	sh(t, "ip", "-n", e.inet, "addr", "add", "100.112.4.77/32", "dev", "lo")
	sh(t, "ip", "-n", e.inet, "route", "add", m1.String()+"/32", "via", hostSide)
	before := got.get()
	send(e.inet, "100.112.4.77", netip.AddrPortFrom(m1, 9).String())
	if got.get() != before {
		t.Errorf("from the test internet as 100.112.4.77: %d datagrams reached a1", got.get()-before)
	}
}
