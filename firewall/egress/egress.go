// Package egress is the host egress proxy. The host's nftables redirect a
// sandbox's TCP connections on hostname-ruled ports here. The proxy reads
// the name the guest asks for (TLS SNI, or the HTTP Host header for
// cleartext HTTP), applies the sandbox's policy to that name, resolves the
// name itself through the host's upstream and dials it, never the address
// the guest connected to; then it splices the two connections.
//
// What is checked, and what is not:
//   - TLS: only the SNI is visible. The proxy dials the SNI name, so the
//     server the guest reaches is the one the name resolves to, with that
//     name's certificate. A different Host header inside the TLS session
//     (SNI pypi.org, Host example.com) reaches pypi.org's server, never
//     example.com's. ClientHellos with Encrypted Client Hello are refused,
//     since their real name is hidden.
//   - HTTP: the Host header of the first request decides. Later requests
//     on the same connection go to the same server whatever their Host
//     says, because the upstream connection is already made to that name.
//   - Neither (no SNI, an IP literal, other protocols): there is no name,
//     so only CIDR rules and the default can allow it, and then the proxy
//     dials the original destination.
//
// Every dial rejects internal addresses (metadata, the host, private
// ranges, other sandboxes) unless a CIDR rule names them.
package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/firewall/credproxy"
)

// PolicyFunc returns the policy and internal ranges of the sandbox whose
// guest address is src; ok is false for unknown sources.
type PolicyFunc func(src netip.Addr) (p *firewall.Policy, b firewall.Blocked, ok bool)

// Proxy is the egress proxy.
type Proxy struct {
	Policy PolicyFunc
	// LookupA resolves a name through the host's upstream resolver.
	LookupA func(ctx context.Context, name string) ([]netip.Addr, error)
	// Dial makes the upstream connection; default a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// OriginalDst returns where the guest was connecting; default reads
	// SO_ORIGINAL_DST from the redirected socket.
	OriginalDst func(c net.Conn) (netip.AddrPort, error)

	// Internal connects a sandbox to the HareBox API when it asks for
	// firewall.APIHost over HTTP and its policy names that host on the
	// port; src is the guest's address. Nil: the name is refused.
	Internal func(ctx context.Context, src netip.Addr) (net.Conn, error)

	// Credentials returns the credentials of the sandbox whose guest
	// address is src, or nil. A connection to a name they cover (TLS, or
	// plain HTTP where a rule allows it) goes through Creds, which puts
	// the real values in on the way out.
	Credentials func(src netip.Addr) *credproxy.Sandbox
	Creds       *credproxy.Proxy

	HelloTimeout time.Duration // to read the SNI or Host; default 10s
	DialTimeout  time.Duration // default 10s
	MaxConns     int           // open connections per sandbox; default 1024
	Log          *slog.Logger

	mu     sync.Mutex
	conns  map[*flow]struct{}
	perSrc map[netip.Addr]int
	ln     net.Listener
	wg     sync.WaitGroup
}

// flow is one proxied connection, kept so a policy change can cut it.
// host and addr are written under the proxy's mu (Recheck reads them);
// up and closed under the flow's own mu.
type flow struct {
	src  netip.Addr
	host string
	port uint16
	addr netip.Addr
	down net.Conn

	mu     sync.Mutex
	up     net.Conn
	closed bool
}

func (f *flow) close() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = true
	up := f.up
	f.mu.Unlock()
	f.down.Close()
	if up != nil {
		up.Close()
	}
}

// setUp attaches the upstream connection, unless the flow was cut while
// it was being dialled (then the caller closes up).
func (f *flow) setUp(up net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.up = up
	return true
}

// maxHello bounds what the proxy reads before it knows the name.
const maxHello = 64 << 10

// Serve accepts connections on ln until it is closed.
func (p *Proxy) Serve(ln net.Listener) error {
	if p.Policy == nil || p.LookupA == nil {
		return errors.New("egress: Policy and LookupA are required")
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return err
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

// Close stops accepting and cuts every open connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	ln := p.ln
	var fs []*flow
	for f := range p.conns {
		fs = append(fs, f)
	}
	p.mu.Unlock()
	var err error
	if ln != nil {
		err = ln.Close()
	}
	for _, f := range fs {
		f.close()
	}
	p.wg.Wait()
	return err
}

// Recheck applies src's current policy to its open connections and cuts
// those it no longer allows (src's policy gone: all of them).
func (p *Proxy) Recheck(src netip.Addr) int {
	pol, blocked, ok := p.Policy(src)
	p.mu.Lock()
	var cut []*flow
	for f := range p.conns {
		if f.src != src {
			continue
		}
		if !ok || !p.allowed(pol, blocked, f) {
			cut = append(cut, f)
		}
	}
	p.mu.Unlock()
	for _, f := range cut {
		p.log().Info("egress: connection cut by new policy", "src", src, "host", f.host, "port", f.port)
		f.close()
	}
	return len(cut)
}

func (p *Proxy) log() *slog.Logger {
	if p.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Log
}

func (p *Proxy) track(f *flow) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	limit := p.MaxConns
	if limit == 0 {
		limit = 1024
	}
	if p.perSrc[f.src] >= limit {
		return false
	}
	if p.conns == nil {
		p.conns = map[*flow]struct{}{}
		p.perSrc = map[netip.Addr]int{}
	}
	p.conns[f] = struct{}{}
	p.perSrc[f.src]++
	return true
}

func (p *Proxy) untrack(f *flow) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.conns[f]; ok {
		delete(p.conns, f)
		if p.perSrc[f.src]--; p.perSrc[f.src] <= 0 {
			delete(p.perSrc, f.src)
		}
	}
}

func (p *Proxy) handle(down net.Conn) {
	src := addrOf(down.RemoteAddr())
	f := &flow{src: src, down: down}
	defer f.close()
	if _, _, ok := p.Policy(src); !ok {
		return
	}
	if !p.track(f) {
		p.log().Warn("egress: too many connections", "src", src)
		return
	}
	defer p.untrack(f)

	origDst := p.OriginalDst
	if origDst == nil {
		origDst = originalDst
	}
	dst, err := origDst(down)
	if err != nil {
		p.log().Warn("egress: no original destination", "src", src, "err", err)
		return
	}
	if local := addrOf(down.LocalAddr()); dst.Addr() == local && dst.Port() == portOf(down.LocalAddr()) {
		return // connected to the proxy port itself, not redirected
	}
	f.port = dst.Port()

	timeout := p.HelloTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	down.SetReadDeadline(time.Now().Add(timeout))
	host, head, err := sniff(down)
	if err != nil {
		p.log().Info("egress: refused", "src", src, "port", f.port, "err", err)
		return
	}
	down.SetReadDeadline(time.Time{})

	ctx, cancel := context.WithTimeout(context.Background(), p.dialTimeout())
	defer cancel()
	if host == firewall.APIHost {
		p.internal(ctx, f, head)
		return
	}
	target, err := p.choose(ctx, src, host, dst)
	if err == nil && host != "" && p.Credentials != nil && p.Creds != nil {
		secure := len(head) > 0 && head[0] == 0x16
		sb := p.Credentials(src)
		if !sb.Covers(host, f.port, secure) && !secure && sb.CarriedBy(head) {
			// Plain HTTP shows its first request: a placeholder sent to a
			// host no rule names is recorded (it goes out as it is).
			sb.Misused(host)
		}
		if sb.Covers(host, f.port, secure) {
			cancel()
			p.mu.Lock()
			f.host, f.addr = host, target.Addr()
			p.mu.Unlock()
			p.Creds.Serve(credproxy.Conn{Down: down, Head: head, Host: host, Port: f.port, Secure: secure, Sandbox: sb,
				Dial: func(ctx context.Context) (net.Conn, error) { return p.dialName(ctx, src, host, dst) }})
			return
		}
	}
	if err != nil {
		p.log().Info("egress: denied", "src", src, "host", host, "port", f.port, "dst", dst, "err", err)
		return
	}
	p.mu.Lock()
	f.host, f.addr = host, target.Addr()
	p.mu.Unlock()
	dial := p.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	up, err := dial(ctx, "tcp4", target.String())
	if err != nil {
		p.log().Info("egress: dial failed", "src", src, "host", host, "target", target, "err", err)
		return
	}
	if !f.setUp(up) {
		up.Close() // cut by a policy change during the dial
		return
	}
	// The policy may have changed while this connection was being set up.
	if pol, b, ok := p.Policy(src); !ok || !pol.Decide(b, firewall.Conn{Proto: firewall.TCP, Port: f.port, Host: host, Addr: f.addr}).Allow {
		return
	}
	if _, err := up.Write(head); err != nil {
		return
	}
	splice(down, up)
}

// allowed says whether pol still allows an established flow.
func (p *Proxy) allowed(pol *firewall.Policy, blocked firewall.Blocked, f *flow) bool {
	if f.host == firewall.APIHost {
		return pol.NamesAllow(firewall.APIHost, f.port)
	}
	return pol.Decide(blocked, firewall.Conn{Proto: firewall.TCP, Port: f.port, Host: f.host, Addr: f.addr}).Allow
}

// internal splices a flow to the HareBox API. It is never dialed by
// address: the name is answered by the host, the connection stays in it.
func (p *Proxy) internal(ctx context.Context, f *flow, head []byte) {
	pol, _, ok := p.Policy(f.src)
	if !ok || p.Internal == nil || !pol.NamesAllow(firewall.APIHost, f.port) {
		p.log().Info("egress: denied", "src", f.src, "host", firewall.APIHost, "port", f.port)
		return
	}
	p.mu.Lock()
	f.host = firewall.APIHost
	p.mu.Unlock()
	up, err := p.Internal(ctx, f.src)
	if err != nil {
		p.log().Warn("egress: the API is unreachable", "src", f.src, "err", err)
		return
	}
	if !f.setUp(up) {
		up.Close()
		return
	}
	if _, err := up.Write(head); err != nil {
		return
	}
	splice(f.down, up)
}

// dialName dials host for src as a fresh connection would: the policy
// decides again, at the name's current addresses.
func (p *Proxy) dialName(ctx context.Context, src netip.Addr, host string, dst netip.AddrPort) (net.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, p.dialTimeout())
	defer cancel()
	target, err := p.choose(dctx, src, host, dst)
	if err != nil {
		return nil, err
	}
	dial := p.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return dial(dctx, "tcp4", target.String())
}

func (p *Proxy) dialTimeout() time.Duration {
	if p.DialTimeout == 0 {
		return 10 * time.Second
	}
	return p.DialTimeout
}

// choose decides the connection and picks the address to dial: the first
// address of host the policy allows, or, without a name, the original
// destination if the policy allows it.
func (p *Proxy) choose(ctx context.Context, src netip.Addr, host string, dst netip.AddrPort) (netip.AddrPort, error) {
	pol, blocked, ok := p.Policy(src)
	if !ok {
		return netip.AddrPort{}, errors.New("unknown sandbox")
	}
	// DNS goes only to the host resolver: the proxy never carries DNS over
	// TCP (53) or DNS over TLS (853), whatever the policy says of the port.
	if port := dst.Port(); port == 53 || port == 853 {
		return netip.AddrPort{}, fmt.Errorf("DNS to %s is not allowed: use the host resolver", dst)
	}
	c := firewall.Conn{Proto: firewall.TCP, Port: dst.Port(), Host: host}
	if host == "" {
		c.Addr = dst.Addr()
		if v := pol.Decide(blocked, c); !v.Allow {
			return netip.AddrPort{}, fmt.Errorf("no name, and %s is not allowed (rule %d)", dst, v.Rule)
		}
		return dst, nil
	}
	// Refuse before resolving names the policy denies whatever their
	// address, so denied names cause no upstream queries.
	if !pol.Resolvable(host) {
		return netip.AddrPort{}, fmt.Errorf("name %q not allowed", host)
	}
	addrs, err := p.LookupA(ctx, host)
	if err != nil {
		return netip.AddrPort{}, err
	}
	for _, a := range addrs {
		c.Addr = a
		if pol.Decide(blocked, c).Allow {
			return netip.AddrPortFrom(a, dst.Port()), nil
		}
	}
	return netip.AddrPort{}, fmt.Errorf("%s:%d not allowed at any of its addresses %v", host, dst.Port(), addrs)
}

// splice copies both ways until both are done; a finished direction is
// half-closed so request/response protocols end cleanly. io.Copy between
// two TCP connections uses splice(2).
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
}

// sniff reads the start of the guest's stream and returns the name it
// asks for ("" when there is none) and every byte read, to be replayed
// upstream.
func sniff(c net.Conn) (host string, head []byte, err error) {
	var rec bytes.Buffer
	r := io.TeeReader(io.LimitReader(c, maxHello), &rec)
	var first [1]byte
	if _, err := io.ReadFull(r, first[:]); err != nil {
		return "", nil, fmt.Errorf("reading the first byte: %w", err)
	}
	br := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(first[:]), r), 4096)
	switch {
	case first[0] == 0x16: // TLS handshake record
		host, err = sniffTLS(br)
	case first[0] >= 'A' && first[0] <= 'Z':
		host, err = sniffHTTP(br)
	default:
		// Not TLS or HTTP: no name. Only what was read so far is replayed.
		return "", rec.Bytes(), nil
	}
	if err != nil {
		return "", nil, err
	}
	if host != "" {
		if _, perr := netip.ParseAddr(strings.Trim(host, "[]")); perr == nil {
			host = "" // an IP literal is no name
		} else if host, err = firewall.NormalizeHost(host); err != nil || strings.HasPrefix(host, "*.") {
			return "", nil, fmt.Errorf("bad name: %v", err)
		}
	}
	return host, rec.Bytes(), nil
}

var errGotHello = errors.New("got client hello")

// eceExtension is Encrypted Client Hello (draft-ietf-tls-esni).
const echExtension = 0xfe0d

func sniffTLS(r io.Reader) (string, error) {
	var sni string
	var ech bool
	conn := tls.Server(readOnlyConn{r}, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		sni = h.ServerName
		for _, e := range h.Extensions {
			if e == echExtension {
				ech = true
			}
		}
		return nil, errGotHello
	}})
	err := conn.Handshake()
	if !errors.Is(err, errGotHello) {
		return "", fmt.Errorf("not a TLS ClientHello: %v", err)
	}
	if ech {
		return "", errors.New("encrypted client hello hides the name")
	}
	return sni, nil
}

func sniffHTTP(r *bufio.Reader) (string, error) {
	req, err := http.ReadRequest(r)
	if err != nil {
		return "", fmt.Errorf("not an HTTP request: %v", err)
	}
	if req.Method == http.MethodConnect {
		return "", errors.New("CONNECT is not proxied")
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if host == "" {
		return "", errors.New("HTTP request without Host")
	}
	return host, nil
}

// readOnlyConn feeds recorded bytes to crypto/tls and swallows its
// replies, so nothing reaches the guest while the hello is parsed.
type readOnlyConn struct{ r io.Reader }

func (c readOnlyConn) Read(p []byte) (int, error)     { return c.r.Read(p) }
func (readOnlyConn) Write(p []byte) (int, error)      { return len(p), nil }
func (readOnlyConn) Close() error                     { return nil }
func (readOnlyConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (readOnlyConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (readOnlyConn) SetDeadline(time.Time) error      { return nil }
func (readOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (readOnlyConn) SetWriteDeadline(time.Time) error { return nil }

// originalDst reads where a redirected connection was going
// (SO_ORIGINAL_DST, kept by conntrack for nftables redirect).
func originalDst(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a socket")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var mreq *unix.IPv6Mreq
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		// sockaddr_in fits the 20-byte IPv6Mreq; this is the usual way to
		// call getsockopt with a struct the x/sys wrappers do not name.
		mreq, gerr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
	}); err != nil {
		return netip.AddrPort{}, err
	}
	if gerr != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", gerr)
	}
	b := mreq.Multiaddr
	port := uint16(b[2])<<8 | uint16(b[3])
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), port), nil
}

func addrOf(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(t.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}

func portOf(a net.Addr) uint16 {
	if t, ok := a.(*net.TCPAddr); ok {
		return uint16(t.Port)
	}
	return 0
}
