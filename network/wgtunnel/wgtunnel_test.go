package wgtunnel

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/inns"
	"github.com/harebox/harebox/internal/netcapture"
	"github.com/vishvananda/netns"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

const port = 51820

// host is one end: a network namespace with an underlay address on the
// link between the two, a mesh address of its "sandbox" on its loopback,
// and a tunnel.
type host struct {
	t          *testing.T
	ns         string
	underlay   netip.Addr
	mesh       netip.Addr
	keyFile    string
	seal       cipher.AEAD
	tun        *Tunnel
	underlayIf string
}

func sh(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// inNS runs fn in namespace ns.
func inNS(t testing.TB, ns string, fn func()) {
	t.Helper()
	if err := inns.Run(ns, fn); err != nil {
		t.Fatalf("netns %s: %v", ns, err)
	}
}

func newSeal(t *testing.T) cipher.AEAD {
	k := make([]byte, 32)
	rand.Read(k)
	b, err := aes.NewCipher(k)
	if err != nil {
		t.Fatal(err)
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// twoHosts makes a and b: namespaces joined by a veth (192.0.2.1 and .2),
// mesh addresses 10.240.0.1 and 10.240.0.2, a tunnel in each, peered.
func twoHosts(t *testing.T) (a, b *host) {
	if os.Geteuid() != 0 {
		t.Skip("wgtunnel: needs root (network namespaces, a TUN device)")
	}
	var id [3]byte
	rand.Read(id[:])
	sfx := fmt.Sprintf("%x", id)
	a = &host{t: t, ns: "hbwa" + sfx, underlay: netip.MustParseAddr("192.0.2.1"), mesh: netip.MustParseAddr("10.240.0.1"), underlayIf: "u" + sfx + "a"}
	b = &host{t: t, ns: "hbwb" + sfx, underlay: netip.MustParseAddr("192.0.2.2"), mesh: netip.MustParseAddr("10.240.0.2"), underlayIf: "u" + sfx + "b"}
	for _, h := range []*host{a, b} {
		sh(t, "ip", "netns", "add", h.ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", h.ns).Run() })
	}
	sh(t, "ip", "link", "add", a.underlayIf, "netns", a.ns, "type", "veth", "peer", "name", b.underlayIf, "netns", b.ns)
	for _, h := range []*host{a, b} {
		sh(t, "ip", "-n", h.ns, "addr", "add", h.underlay.String()+"/24", "dev", h.underlayIf)
		sh(t, "ip", "netns", "exec", h.ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
		sh(t, "ip", "-n", h.ns, "link", "set", h.underlayIf, "up")
		sh(t, "ip", "-n", h.ns, "link", "set", "lo", "up")
		sh(t, "ip", "-n", h.ns, "addr", "add", h.mesh.String()+"/32", "dev", "lo")
		h.keyFile = filepath.Join(t.TempDir(), "mesh.key")
		h.seal = newSeal(t)
		h.open()
	}
	a.peer(b)
	b.peer(a)
	a.handshake(b)
	return a, b
}

// handshake waits until h reaches its peer o through the tunnel. (Two
// hosts that start one at the same moment may each answer the other's
// first initiation, leaving both waiting for WireGuard's retry, 5 s
// later.)
func (h *host) handshake(o *host) {
	h.t.Helper()
	var ln net.Listener
	var err error
	inNS(h.t, o.ns, func() { ln, err = net.Listen("tcp4", netip.AddrPortFrom(o.mesh, 9).String()) })
	if err != nil {
		h.t.Fatal(err)
	}
	defer ln.Close()
	// (Traffic from this end while the other's keepalive starts the first
	// handshake makes two initiations cross: give that one a moment.)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if st, _ := h.tun.Status(); len(st) == 1 && !st[0].LastHandshake.IsZero() {
			break
		}
	}
	for end := time.Now().Add(20 * time.Second); ; {
		var c net.Conn
		inNS(h.t, h.ns, func() {
			d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: h.mesh.AsSlice()}}
			c, err = d.Dial("tcp4", netip.AddrPortFrom(o.mesh, 9).String())
		})
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(end) {
			h.t.Fatalf("%s never reached %s: %v", h.ns, o.ns, err)
		}
	}
}

func (h *host) open() {
	t := h.t
	t.Helper()
	var err error
	inNS(t, h.ns, func() { h.tun, err = Open(Options{Port: port, KeyFile: h.keyFile, Seal: h.seal}) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.tun.Close() })
}

// peer makes o h's only peer.
func (h *host) peer(o *host) {
	h.t.Helper()
	if err := h.tun.SetPeers([]Peer{o.asPeer()}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *host) asPeer() Peer {
	return Peer{PublicKey: h.tun.PublicKey(), Endpoint: netip.AddrPortFrom(h.underlay, port), Allowed: []netip.Prefix{netip.PrefixFrom(h.mesh, 32)}}
}

// listen starts a TCP echo server and a UDP one on h's mesh address.
func (h *host) listen() {
	t := h.t
	var ln net.Listener
	var pc net.PacketConn
	var err error
	inNS(t, h.ns, func() {
		if ln, err = net.Listen("tcp4", netip.AddrPortFrom(h.mesh, 7).String()); err == nil {
			pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(h.mesh, 7).String())
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
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
}

// dial connects from h's mesh address (or from, if set) to o's.
func (h *host) dial(network string, o *host, from netip.Addr, timeout time.Duration) (c net.Conn, err error) {
	if !from.IsValid() {
		from = h.mesh
	}
	inNS(h.t, h.ns, func() {
		d := net.Dialer{Timeout: timeout}
		if network == "tcp4" {
			d.LocalAddr = &net.TCPAddr{IP: from.AsSlice()}
		} else {
			d.LocalAddr = &net.UDPAddr{IP: from.AsSlice()}
		}
		c, err = d.Dial(network, netip.AddrPortFrom(o.mesh, 7).String())
	})
	return c, err
}

// echo sends msg from h to o's echo server and wants it back.
func (h *host) echo(network string, o *host, msg string) error {
	c, err := h.dial(network, o, netip.Addr{}, 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if string(got) != msg {
		return fmt.Errorf("echo: got %q", got)
	}
	return nil
}

// TestTunnel: two hosts' sandboxes talk TCP and UDP through the tunnel;
// the underlay carries WireGuard's UDP only (a canary sent through is
// nowhere in a capture); a source address the sending host does not
// serve gets nowhere; the key persists sealed and opens only under its
// seal.
func TestTunnel(t *testing.T) {
	a, b := twoHosts(t)
	b.listen()
	a.listen()
	capture := netcapture.Start(t, a.ns, a.underlayIf)
	canary := "harebox-canary-" + rand.Text()
	for _, network := range []string{"tcp4", "udp4"} {
		if err := a.echo(network, b, canary); err != nil {
			t.Fatalf("a -> b %s: %v", network, err)
		}
		if err := b.echo(network, a, canary); err != nil {
			t.Fatalf("b -> a %s: %v", network, err)
		}
	}
	n, err := netcapture.UDPOnly(capture.Stop(), []byte(canary), port)
	if err != nil || n == 0 {
		t.Fatalf("on the underlay: %v (%d WireGuard datagrams)", err, n)
	}

	// A source address a does not serve: b's device drops it.
	spoof := netip.MustParseAddr("10.240.0.9")
	sh(t, "ip", "-n", a.ns, "addr", "add", spoof.String()+"/32", "dev", "lo")
	if c, err := a.dial("tcp4", b, spoof, time.Second); err == nil {
		c.Close()
		t.Fatal("a spoofed source address reached b")
	}

	st, err := a.tun.Status()
	if err != nil || len(st) != 1 || st[0].PublicKey != b.tun.PublicKey() || st[0].LastHandshake.IsZero() || st[0].TxBytes == 0 || st[0].RxBytes == 0 ||
		st[0].Endpoint != "192.0.2.2:51820" || len(st[0].Allowed) != 1 || st[0].Allowed[0] != netip.MustParsePrefix("10.240.0.2/32") {
		t.Fatalf("status: %+v %v", st, err)
	}

	// The key persists, sealed: the same after a restart, unreadable under
	// another seal, and not in the file in the clear.
	pub := b.tun.PublicKey()
	b.tun.Close()
	b.open()
	if b.tun.PublicKey() != pub {
		t.Fatal("b's key changed over a restart")
	}
	raw, _ := os.ReadFile(b.keyFile)
	if fi, _ := os.Stat(b.keyFile); fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v", fi.Mode())
	}
	b.peer(a)
	b.handshake(a)
	if err := a.echo("tcp4", b, "after b's restart"); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, b.tun.key[:]) {
		t.Fatal("the key file holds the key in the clear")
	}
	if _, err := Open(Options{Name: "hb-x", Port: port + 1, KeyFile: b.keyFile, Seal: newSeal(t)}); err == nil || !strings.Contains(err.Error(), "does not open") {
		t.Fatalf("a key file under another seal: %v", err)
	}
}

// TestRotateAndRemove: b's key rotated under a running transfer, and a
// told: the transfer completes. b removed from a's peers: a's route to b's
// address goes and nothing reaches b.
func TestRotateAndRemove(t *testing.T) {
	a, b := twoHosts(t)
	b.listen()
	c, err := a.dial("tcp4", b, netip.Addr{}, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const total = 8 << 20
	got := make(chan error, 1)
	go func() {
		n, err := io.CopyN(io.Discard, c, total)
		if err == nil && n != total {
			err = fmt.Errorf("%d bytes", n)
		}
		got <- err
	}()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	sent := 0
	old := b.tun.PublicKey()
	for sent < total {
		if _, err := c.Write(chunk); err != nil {
			t.Fatalf("after %d bytes: %v", sent, err)
		}
		sent += len(chunk)
		if sent == total/2 {
			pub, err := b.tun.Rotate()
			if err != nil {
				t.Fatal(err)
			}
			if pub == old || pub != b.tun.PublicKey() {
				t.Fatal("the key did not change")
			}
			a.peer(b)
		}
	}
	if err := <-got; err != nil {
		t.Fatalf("the transfer across the rotation: %v", err)
	}
	// (The rotated key persisted.)
	pub := b.tun.PublicKey()
	b.tun.Close()
	b.open()
	if b.tun.PublicKey() != pub || pub == old {
		t.Fatal("the rotated key did not persist")
	}
	b.peer(a)

	if err := a.tun.SetPeers(nil); err != nil {
		t.Fatal(err)
	}
	if st, _ := a.tun.Status(); len(st) != 0 {
		t.Fatalf("a still has peers: %+v", st)
	}
	out, _ := exec.Command("ip", "-n", a.ns, "route", "show", "10.240.0.2").CombinedOutput()
	if strings.TrimSpace(string(out)) != "" {
		t.Fatalf("a still routes b's address: %s", out)
	}
	if err := a.echo("udp4", b, "after removal"); err == nil {
		t.Fatal("a reached b after dropping it")
	}
}

// TestSetPeersRefuses: bad peer lists change nothing.
func TestSetPeersRefuses(t *testing.T) {
	a, b := twoHosts(t)
	good := b.asPeer()
	k, _ := wgtypes.GeneratePrivateKey()
	other := Peer{PublicKey: k.PublicKey(), Endpoint: netip.MustParseAddrPort("192.0.2.3:51820"), Allowed: good.Allowed}
	for name, ps := range map[string][]Peer{
		"self":          {{PublicKey: a.tun.PublicKey(), Endpoint: good.Endpoint}},
		"twice":         {good, good},
		"no endpoint":   {{PublicKey: good.PublicKey}},
		"shared addr":   {good, other},
		"unmasked addr": {{PublicKey: good.PublicKey, Endpoint: good.Endpoint, Allowed: []netip.Prefix{netip.MustParsePrefix("10.240.0.2/24")}}},
	} {
		if err := a.tun.SetPeers(ps); err == nil {
			t.Fatalf("%s: accepted", name)
		}
	}
	if st, _ := a.tun.Status(); len(st) != 1 || st[0].PublicKey != good.PublicKey {
		t.Fatalf("peers changed: %+v", st)
	}
}

// TestRebindStaysInNamespace: the device takes its link going down and
// up again (the TUN's own watcher does, from a goroutine on whatever
// thread) by opening its sockets again, and they open in the namespace
// the tunnel was made in, not in the namespace of the thread that
// happened to run the rebind (this test's, the host's).
func TestRebindStaysInNamespace(t *testing.T) {
	a, b := twoHosts(t)
	b.listen()
	if err := a.tun.dev.Down(); err != nil {
		t.Fatal(err)
	}
	if err := a.tun.dev.Up(); err != nil { // (on this goroutine: the host's namespace)
		t.Fatal(err)
	}
	var err error
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); {
		if err = a.echo("tcp4", b, "after a rebind"); err == nil {
			return
		}
	}
	t.Fatalf("a -> b after a rebind: %v", err)
}

// TestBindKeptStandard: in the process's own namespace the device keeps
// wireguard-go's standard bind (which it also watches routes for); made
// from a thread in another namespace, it gets one that opens there.
func TestBindKeptStandard(t *testing.T) {
	a, _ := twoHosts(t)
	if _, ok := a.tun.bind().(nsBind); !ok {
		t.Fatalf("a tunnel made in a test host's namespace: bind %T", a.tun.bind())
	}
	here, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer here.Close()
	if b := (&Tunnel{ns: here}).bind(); func() bool { _, ok := b.(*conn.StdNetBind); return !ok }() {
		t.Fatalf("a tunnel made in the process's namespace: bind %T", b)
	}
}
