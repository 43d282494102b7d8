package linuxnet

// The test "internet": a network namespace reached from the host through
// a veth, holding the test hosts (pypi.org, files.pythonhosted.org,
// example.com), their DNS server, an outside resolver and a fake metadata
// service. Sandboxes are network namespaces standing in for guests, wired
// to the host by a veth whose host end carries the sandbox's tap name.
// Sandbox traffic is policy-routed into the test internet, so nothing a
// test sends can leave the machine even if enforcement broke.

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"github.com/coder/websocket"

	"github.com/harebox/harebox/internal/inns"
	"github.com/harebox/harebox/internal/testweb"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	guestagent "github.com/harebox/harebox/agent/guest"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/sandbox"
)

const (
	hostSide  = "198.18.0.1"
	inetSide  = "198.18.0.2"
	pypiIP    = "198.18.0.10"
	filesIP   = "198.18.0.11"
	exampleIP = "198.18.0.12"
	dnsIP     = "198.18.0.53"
	outsideIP = "198.18.0.54"
	metaIP    = "169.254.169.254"
)

var names = map[string]string{
	"pypi.org.":               pypiIP,
	"files.pythonhosted.org.": filesIP,
	"example.com.":            exampleIP,
	"www.example.com.":        exampleIP,
	"hostaddr.test.":          hostSide,
	"meta.test.":              metaIP,
}

const walkthrough = `{"default_outbound": "deny", "outbound": [
 {"action": "allow", "protocol": "tcp", "ports": "443", "hosts": ["pypi.org", "files.pythonhosted.org"]}]}`

func mustPolicy(t testing.TB, s string) *firewall.Policy {
	t.Helper()
	p, err := firewall.Parse([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, nftables)")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
}

func sh(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// shq runs a cleanup command; failures are reported, not fatal.
func shq(args ...string) {
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "cleanup: %s: %v %s\n", strings.Join(args, " "), err, out)
	}
}

func suffix() string {
	b := make([]byte, 3)
	rand.Read(b)
	return fmt.Sprintf("%x", b)
}

// inNS runs fn on a thread in the named namespace. The thread is never
// returned to the scheduler (it exits with the goroutine), so no other
// goroutine runs in the wrong namespace. Sockets fn creates stay in ns.
func inNS(t testing.TB, ns string, fn func()) {
	t.Helper()
	if err := inns.Run(ns, fn); err != nil {
		t.Fatalf("netns %s: %v", ns, err)
	}
}

// counter counts what reached a test server.
type counter struct{ n atomic.Int64 }

func (c *counter) get() int64 { return c.n.Load() }

// env is the test internet plus a network under test.
type env struct {
	t        testing.TB
	id       string // random suffix for names
	inet     string // internet netns
	table    int    // policy routing table
	pool     netip.Prefix
	certs    *x509.CertPool
	hits     map[string]*counter // server name -> connections or packets
	hostLn   net.Listener        // a host service
	hostPort int
	upstream string
	// api is Options.API for the networks the env makes.
	api func(ctx context.Context, src netip.Addr) (net.Conn, error)
	// meshPool and meshTunnel are their Options.MeshPool and MeshTunnel.
	meshPool   netip.Prefix
	meshTunnel string
	mu         sync.Mutex
	// seen is what each HTTPS test host last received: its Authorization
	// header and its query (what a credential proxy put in).
	seen map[string]string
	// pems are the test hosts' certificates, for a guest's trust store.
	pems []byte
	// files are documents the HTTPS test hosts serve, by "host/path"
	// (a package index, a wheel); see serve.
	files map[string]served
}

type served struct {
	contentType string
	body        []byte
}

// serve makes the HTTPS test host name answer GET path with body.
func (e *env) serve(name, path, contentType string, body []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.files == nil {
		e.files = map[string]served{}
	}
	e.files[name+path] = served{contentType, body}
}

// saw returns what the named HTTPS test host last received.
func (e *env) saw(name string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.seen[name]
}

func newEnv(t testing.TB) *env {
	requireRoot(t)
	e := &env{t: t, id: suffix(), hits: map[string]*counter{}, certs: x509.NewCertPool()}
	e.inet = "hbtn-" + e.id
	e.table = 2320 + int(e.id[0])
	// Each env gets its own /24 so parallel packages do not collide.
	var b [1]byte
	rand.Read(b[:])
	e.pool = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 232, b[0], 0}), 24)

	old, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	t.Cleanup(func() { os.WriteFile("/proc/sys/net/ipv4/ip_forward", old, 0o644) })

	veth := "hbtv" + e.id
	sh(t, "ip", "netns", "add", e.inet)
	t.Cleanup(func() { shq("ip", "netns", "del", e.inet) })
	sh(t, "ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", e.inet)
	t.Cleanup(func() { shq("ip", "link", "del", veth) })
	sh(t, "ip", "addr", "add", hostSide+"/24", "dev", veth)
	sh(t, "ip", "link", "set", veth, "up")
	ns := func(args ...string) { sh(t, append([]string{"ip", "-n", e.inet}, args...)...) }
	ns("link", "set", "lo", "up")
	ns("link", "set", "eth0", "up")
	for _, a := range []string{inetSide, pypiIP, filesIP, exampleIP, dnsIP, outsideIP} {
		ns("addr", "add", a+"/24", "dev", "eth0")
	}
	ns("addr", "add", metaIP+"/32", "dev", "lo")
	// Sandbox traffic (from the pool) goes only to the test internet,
	// except to other sandboxes on this host.
	tbl := fmt.Sprint(e.table)
	sh(t, "ip", "route", "add", "default", "via", inetSide, "table", tbl)
	sh(t, "ip", "route", "add", "throw", e.pool.String(), "table", tbl)
	sh(t, "ip", "rule", "add", "from", e.pool.String(), "lookup", tbl, "pref", "1000")
	t.Cleanup(func() {
		shq("ip", "rule", "del", "from", e.pool.String(), "lookup", tbl, "pref", "1000")
		shq("ip", "route", "flush", "table", tbl)
	})
	e.upstream = dnsIP + ":53"
	e.startServers()
	return e
}

func (e *env) count(name string) *counter {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.hits[name]
	if c == nil {
		c = &counter{}
		e.hits[name] = c
	}
	return c
}

func (e *env) startServers() {
	t := e.t
	var closers []io.Closer
	t.Cleanup(func() {
		for _, c := range closers {
			c.Close()
		}
	})
	listen := func(network, addr string) net.Listener {
		var ln net.Listener
		var err error
		inNS(t, e.inet, func() { ln, err = net.Listen(network, addr) })
		if err != nil {
			t.Fatal(err)
		}
		closers = append(closers, ln)
		return ln
	}
	listenUDP := func(addr string) net.PacketConn {
		var pc net.PacketConn
		var err error
		inNS(t, e.inet, func() { pc, err = net.ListenPacket("udp4", addr) })
		if err != nil {
			t.Fatal(err)
		}
		closers = append(closers, pc)
		return pc
	}
	// The test hosts' DNS (the host resolver's upstream).
	zone := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		ip, ok := names[strings.ToLower(q.Name)]
		if !ok {
			m.Rcode = dns.RcodeNameError
		} else if q.Qtype == dns.TypeA {
			rr, _ := dns.NewRR(q.Name + " 30 IN A " + ip)
			m.Answer = append(m.Answer, rr)
		}
		w.WriteMsg(m)
	})
	// An outside resolver the guest must not reach: it would say pypi.org
	// is example.com's address.
	outside := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		e.count("outside-dns").n.Add(1)
		m := new(dns.Msg)
		m.SetReply(r)
		rr, _ := dns.NewRR(r.Question[0].Name + " 30 IN A " + exampleIP)
		m.Answer = append(m.Answer, rr)
		w.WriteMsg(m)
	})
	for _, s := range []struct {
		addr string
		h    dns.Handler
	}{{dnsIP + ":53", zone}, {outsideIP + ":53", outside}} {
		pc := listenUDP(s.addr)
		ln := listen("tcp4", s.addr)
		for _, srv := range []*dns.Server{{PacketConn: pc, Handler: s.h}, {Listener: ln, Handler: s.h}} {
			go srv.ActivateAndServe()
		}
	}
	// HTTPS servers, each with its own certificate; the body names the
	// server, so a test knows which one it reached.
	for name, ip := range map[string]string{"pypi.org": pypiIP, "files.pythonhosted.org": filesIP, "example.com": exampleIP} {
		// Cleartext HTTP on port 80, counted as "name:80".
		plain := &http.Server{
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				e.mu.Lock()
				if e.seen == nil {
					e.seen = map[string]string{}
				}
				e.seen[name+":80"] = "auth=" + r.Header.Get("Authorization")
				e.mu.Unlock()
				fmt.Fprintf(w, "server=%s host=%s", name, r.Host)
			}),
			ConnState: func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					e.count(name + ":80").n.Add(1)
				}
			},
		}
		closers = append(closers, plain)
		go plain.Serve(listen("tcp4", ip+":80"))

		cert := e.cert(name)
		ln := listen("tcp4", ip+":443")
		srv := &http.Server{
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				e.mu.Lock()
				f, ok := e.files[name+r.URL.Path]
				e.mu.Unlock()
				if ok {
					w.Header().Set("Content-Type", f.contentType)
					w.Write(f.body)
					return
				}
				if r.URL.Path == "/echo" {
					testweb.Echo(w, r)
					return
				}
				if strings.HasPrefix(r.URL.Path, "/answer/") {
					answerHost(w, r)
					return
				}
				if r.URL.Path == "/big" {
					w.Header().Set("Content-Length", fmt.Sprint(bigSize))
					for range bigSize / len(bigChunk) {
						if _, err := w.Write(bigChunk); err != nil {
							return
						}
					}
					return
				}
				got := "auth=" + r.Header.Get("Authorization") + " query=" + r.URL.RawQuery
				e.mu.Lock()
				if e.seen == nil {
					e.seen = map[string]string{}
				}
				e.seen[name] = got
				e.mu.Unlock()
				if r.URL.Path == "/redirect" {
					http.Redirect(w, r, "https://example.com/", http.StatusFound)
					return
				}
				if r.URL.Path == "/ws" && r.Header.Get("Upgrade") == "websocket" {
					// A WebSocket: each message is noted (as "name ws")
					// and sent back.
					c, err := websocket.Accept(w, r, nil)
					if err != nil {
						return
					}
					defer c.CloseNow()
					for {
						typ, m, err := c.Read(r.Context())
						if err != nil {
							return
						}
						e.mu.Lock()
						e.seen[name+" ws"] = string(m)
						e.mu.Unlock()
						c.Write(r.Context(), typ, m)
					}
				}
				w.Header().Set("X-Echo", r.Header.Get("Authorization"))
				fmt.Fprintf(w, "server=%s host=%s %s", name, r.Host, got)
			}),
			TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
			ConnState: func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					e.count(name).n.Add(1)
				}
			},
		}
		closers = append(closers, srv)
		go srv.ServeTLS(ln, "", "")
	}
	// The same answers over HTTP/1 only (the proxy's leg to 443 is
	// HTTP/2), where a test host can write raw bytes.
	h1 := &http.Server{Handler: http.HandlerFunc(answerHost),
		TLSConfig:    &tls.Config{Certificates: []tls.Certificate{e.cert("pypi.org")}},
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}}
	closers = append(closers, h1)
	go h1.ServeTLS(listen("tcp4", pypiIP+":9443"), "", "")
	// Plain TCP listeners that count connections (and echo).
	for _, addr := range []string{pypiIP + ":8443", exampleIP + ":7", outsideIP + ":853", metaIP + ":80", exampleIP + ":22"} {
		ln := listen("tcp4", addr)
		c := e.count(addr)
		go acceptEcho(ln, c)
	}
	// QUIC-looking UDP.
	pc := listenUDP(pypiIP + ":443")
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			e.count("udp443").n.Add(1)
		}
	}()
	// A host service, on all host addresses.
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	closers = append(closers, ln)
	e.hostLn, e.hostPort = ln, ln.Addr().(*net.TCPAddr).Port
	go acceptEcho(ln, e.count("host"))
}

func acceptEcho(ln net.Listener, c *counter) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		c.n.Add(1)
		go func() {
			defer conn.Close()
			io.Copy(conn, conn)
		}()
	}
}

// bigSize is the download the benchmarks time (the credentials issue's
// 100 MB), served in bigChunk pieces.
const bigSize = 100 << 20

var bigChunk = make([]byte, 1<<20)

func (e *env) cert(name string) tls.Certificate {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: name},
		DNSNames:              []string{name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		e.t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	e.certs.AddCert(c)
	e.mu.Lock()
	e.pems = append(e.pems, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	e.mu.Unlock()
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// newNetwork starts the network under test with the env's pool, table
// and upstream, its sandbox links being veths into guest namespaces.
func (e *env) newNetwork(stateDir string) *Network {
	return e.newNetworkWith(stateDir, e.vethIntoGuest)
}

func (e *env) newNetworkWith(stateDir string, newLink func(string) error) *Network {
	t := e.t
	if stateDir == "" {
		stateDir = t.TempDir()
	}
	n, err := New(context.Background(), Options{
		StateDir:   stateDir,
		Pool:       e.pool,
		Upstream:   e.upstream,
		Table:      "harebox_t" + e.id,
		newLink:    newLink,
		API:        e.api,
		Roots:      e.certs,
		MeshPool:   e.meshPool,
		MeshTunnel: e.meshTunnel,
		Logger:     slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	// Whatever the test does, its table and links go with it.
	t.Cleanup(func() { n.Destroy(context.Background()) })
	return n
}

// vethIntoGuest makes the sandbox's host interface a veth whose peer is
// eth0 of a new guest namespace named after the tap.
func (e *env) vethIntoGuest(tap string) error {
	ns := guestNS(tap)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	e.t.Cleanup(func() { shq("ip", "netns", "del", ns) })
	if out, err := exec.Command("ip", "link", "add", tap, "type", "veth", "peer", "name", "eth0", "netns", ns).CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

func guestNS(tap string) string { return "hbtg-" + tap }

// guest is a sandbox under test: its namespace, configured the way the
// guest agent configures a VM.
type guest struct {
	e    *env
	id   string
	ns   string
	addr netip.Addr
	gw   netip.Addr
}

func (e *env) attach(n *Network, policy *firewall.Policy) *guest {
	t := e.t
	id := sandbox.NewID()
	att, err := n.Attach(context.Background(), id, policy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Detach(context.Background(), id) })
	addr, gw, _ := n.Addr(id)
	g := &guest{e: e, id: id, ns: guestNS(att.Tap), addr: addr, gw: gw}
	// Configure the guest the way the guest agent does in a VM: from the
	// kernel command line the attachment carries, on the NIC with its MAC.
	sh(t, "ip", "-n", g.ns, "link", "set", "lo", "up")
	sh(t, "ip", "-n", g.ns, "link", "set", "eth0", "address", att.MAC)
	cfg, err := guestagent.ParseNetworkConfig(att.Cmdline)
	if err != nil || cfg == nil {
		t.Fatalf("cmdline %q: %v", att.Cmdline, err)
	}
	if cfg.Addr.Addr() != addr || cfg.Gateway != gw || cfg.DNS != gw {
		t.Fatalf("cmdline %q does not match %s via %s", att.Cmdline, addr, gw)
	}
	root := t.TempDir()
	inNS(t, g.ns, func() { err = guestagent.SetupNetwork(context.Background(), cfg, root) })
	if err != nil {
		t.Fatal(err)
	}
	if rc, _ := os.ReadFile(root + "/etc/resolv.conf"); !strings.Contains(string(rc), "nameserver "+gw.String()+"\n") {
		t.Fatalf("resolv.conf: %q", rc)
	}
	return g
}

// dial connects from inside the guest.
func (g *guest) dial(network, addr string) (net.Conn, error) {
	var c net.Conn
	var err error
	inNS(g.e.t, g.ns, func() { c, err = net.DialTimeout(network, addr, 3*time.Second) })
	return c, err
}

// lookup asks a DNS server from inside the guest.
func (g *guest) lookup(server, name string, tcp bool) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	var r *dns.Msg
	var err error
	c := &dns.Client{Timeout: 2 * time.Second}
	if tcp {
		c.Net = "tcp"
	}
	inNS(g.e.t, g.ns, func() {
		var conn *dns.Conn
		conn, err = c.Dial(server)
		if err != nil {
			return
		}
		defer conn.Close()
		r, _, err = c.ExchangeWithConn(m, conn)
	})
	return r, err
}

// resolve is the guest's resolver: the host resolver on the gateway.
func (g *guest) resolve(name string) (string, error) {
	r, err := g.lookup(netip.AddrPortFrom(g.gw, 53).String(), name, false)
	if err != nil {
		return "", err
	}
	if r.Rcode != dns.RcodeSuccess {
		return "", fmt.Errorf("%s: %s", name, dns.RcodeToString[r.Rcode])
	}
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			return a.A.String(), nil
		}
	}
	return "", fmt.Errorf("%s: no address", name)
}

// https opens a TLS connection from the guest to addr with SNI sni
// (verified against the test certificates) and does a GET with the
// given Host. It returns the body.
func (g *guest) https(addr, sni, host string) (string, error) {
	c, err := g.dial("tcp4", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return g.tlsGet(c, sni, host)
}

func (g *guest) tlsGet(c net.Conn, sni, host string) (string, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: g.e.certs, InsecureSkipVerify: sni == ""})
	if err := tc.Handshake(); err != nil {
		return "", err
	}
	return get(tc, host, "/")
}

func get(c net.Conn, host, path string) (string, error) {
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, host)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
