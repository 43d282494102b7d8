// Package dnsfilter is the host DNS resolver sandboxes use: it knows which
// sandbox asks by the query's source address and answers only the names
// that sandbox's firewall policy allows, forwarding them to a configurable
// upstream. It also gives the egress proxy its own lookups (Upstream), so
// the proxy never trusts an address the guest chose.
package dnsfilter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/harebox/harebox/firewall"
)

// PolicyFunc returns the policy and internal ranges of the sandbox whose
// guest address is src; ok is false for unknown sources.
type PolicyFunc func(src netip.Addr) (p *firewall.Policy, b firewall.Blocked, ok bool)

// Upstream is the resolver the host forwards to, with a small cache.
type Upstream struct {
	Addr    string        // host:port
	Timeout time.Duration // per exchange; default 3s

	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	addrs []netip.Addr
	until time.Time
}

const (
	maxCache = 4096
	maxTTL   = 60 * time.Second
)

// Exchange sends m upstream over UDP, retrying over TCP when truncated.
func (u *Upstream) Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	t := u.Timeout
	if t == 0 {
		t = 3 * time.Second
	}
	c := &dns.Client{Net: "udp", Timeout: t}
	r, _, err := c.ExchangeContext(ctx, m, u.Addr)
	if err == nil && r.Truncated {
		c.Net = "tcp"
		r, _, err = c.ExchangeContext(ctx, m, u.Addr)
	}
	if err != nil {
		return nil, fmt.Errorf("dns upstream %s: %w", u.Addr, err)
	}
	return r, nil
}

// LookupA returns name's IPv4 addresses from the upstream (cached for the
// records' TTL, at most a minute).
func (u *Upstream) LookupA(ctx context.Context, name string) ([]netip.Addr, error) {
	name = strings.ToLower(dns.Fqdn(name))
	now := time.Now()
	u.mu.Lock()
	if c, ok := u.cache[name]; ok && now.Before(c.until) {
		u.mu.Unlock()
		return c.addrs, nil
	}
	u.mu.Unlock()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	r, err := u.Exchange(ctx, m)
	if err != nil {
		return nil, err
	}
	if r.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("dns: %s: %s", name, dns.RcodeToString[r.Rcode])
	}
	var addrs []netip.Addr
	ttl := maxTTL
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			if ip, ok := netip.AddrFromSlice(a.A.To4()); ok {
				addrs = append(addrs, ip)
				ttl = min(ttl, time.Duration(a.Hdr.Ttl)*time.Second)
			}
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("dns: %s: no IPv4 address", name)
	}
	u.mu.Lock()
	if u.cache == nil || len(u.cache) >= maxCache {
		u.cache = map[string]cached{}
	}
	u.cache[name] = cached{addrs, now.Add(ttl)}
	u.mu.Unlock()
	return addrs, nil
}

// Resolver answers sandboxes' queries.
type Resolver struct {
	Policy   PolicyFunc
	Upstream *Upstream
	Log      *slog.Logger
	// Internal answers firewall.APIHost for a sandbox whose policy names
	// it: the address the sandbox reaches it at. Nil: never answered.
	Internal func(src netip.Addr) (netip.Addr, bool)
	// Mesh answers the names of a sandbox's project's mesh
	// (NAME.PROJECT.internal) for the sandbox at src: the address, or
	// false for a name it may not see (or a sandbox on no mesh). Names
	// under .internal never go upstream. Nil: none answered.
	Mesh func(src netip.Addr, name string) (netip.Addr, bool)

	udp, tcp *dns.Server

	mu       sync.Mutex
	inflight map[netip.Addr]int // queries being answered, by sandbox
	total    int
}

// Bounds on queries in flight. Each one may hold a goroutine and an
// upstream socket for seconds; a sandbox asking for random names under a
// domain whose server never answers must not exhaust the host's file
// descriptors, nor starve other sandboxes.
const (
	MaxInflightPerSandbox = 32
	MaxInflight           = 1024
)

func (r *Resolver) acquire(src netip.Addr) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inflight == nil {
		r.inflight = map[netip.Addr]int{}
	}
	if r.inflight[src] >= MaxInflightPerSandbox || r.total >= MaxInflight {
		return false
	}
	r.inflight[src]++
	r.total++
	return true
}

func (r *Resolver) release(src netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inflight[src]--; r.inflight[src] <= 0 {
		delete(r.inflight, src)
	}
	r.total--
}

// ServeDNS answers one query: REFUSED for unknown sources, NXDOMAIN for
// names the policy does not allow, no records for anything but A (so no
// IPv6, no HTTPS/SVCB records with ECH keys or address hints), and
// upstream A answers without addresses the sandbox may not reach.
func (r *Resolver) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	src := addrOf(w.RemoteAddr())
	if !r.acquire(src) {
		resp := new(dns.Msg)
		resp.SetRcode(req, dns.RcodeRefused)
		w.WriteMsg(resp)
		return
	}
	defer r.release(src)
	resp := r.answer(w.RemoteAddr(), req)
	if resp != nil {
		w.WriteMsg(resp)
	}
}

func (r *Resolver) answer(remote net.Addr, req *dns.Msg) *dns.Msg {
	resp := new(dns.Msg)
	if req.Response || len(req.Question) != 1 || req.Opcode != dns.OpcodeQuery {
		resp.SetRcode(req, dns.RcodeRefused)
		return resp
	}
	q := req.Question[0]
	src := addrOf(remote)
	p, blocked, ok := r.Policy(src)
	if !ok || q.Qclass != dns.ClassINET {
		resp.SetRcode(req, dns.RcodeRefused)
		return resp
	}
	name := strings.ToLower(strings.TrimSuffix(q.Name, "."))
	if name == firewall.APIHost {
		return r.internal(req, src, p)
	}
	if strings.HasSuffix(name, MeshDomain) || name == MeshDomain[1:] {
		return r.mesh(req, src, name)
	}
	if _, err := firewall.NormalizeHost(name); err != nil || strings.HasPrefix(name, "*.") || !p.Resolvable(name) {
		r.log().Info("dns: name refused by policy", "src", src, "name", name)
		resp.SetRcode(req, dns.RcodeNameError)
		resp.RecursionAvailable = true
		return resp
	}
	if q.Qtype != dns.TypeA {
		resp.SetReply(req)
		resp.RecursionAvailable = true
		return resp
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	up := new(dns.Msg)
	up.SetQuestion(dns.Fqdn(name), dns.TypeA)
	ur, err := r.Upstream.Exchange(ctx, up)
	if err != nil {
		r.log().Warn("dns: upstream failed", "name", name, "err", err)
		resp.SetRcode(req, dns.RcodeServerFailure)
		return resp
	}
	resp.SetRcode(req, ur.Rcode)
	resp.RecursionAvailable = true
	for _, rr := range ur.Answer {
		switch rr := rr.(type) {
		case *dns.CNAME:
			resp.Answer = append(resp.Answer, rr)
		case *dns.A:
			ip, ok := netip.AddrFromSlice(rr.A.To4())
			if !ok || (blocked.Contains(ip) && !p.Opens(blocked, ip)) {
				continue
			}
			rr.Hdr.Name = strings.ToLower(rr.Hdr.Name)
			resp.Answer = append(resp.Answer, rr)
		}
	}
	return resp
}

// MeshDomain is the domain of mesh names (".internal", which ICANN keeps
// for private use; firewall.APIHost is under it too).
const MeshDomain = ".internal"

// mesh answers a name under MeshDomain from the host, never upstream,
// when the asking sandbox may see it (TTL 1 s: a deleted sandbox's name
// stops resolving at once).
func (r *Resolver) mesh(req *dns.Msg, src netip.Addr, name string) *dns.Msg {
	var addr netip.Addr
	ok := false
	if r.Mesh != nil {
		addr, ok = r.Mesh(src, name)
	}
	return hostAnswer(req, name, addr, ok, 1)
}

// internal answers firewall.APIHost from the host, never upstream, and only
// when the sandbox's policy names it.
func (r *Resolver) internal(req *dns.Msg, src netip.Addr, p *firewall.Policy) *dns.Msg {
	var addr netip.Addr
	ok := false
	if r.Internal != nil && p.Names(firewall.APIHost) {
		addr, ok = r.Internal(src)
	}
	return hostAnswer(req, firewall.APIHost, addr, ok, 60)
}

// hostAnswer is the host's own answer for name: addr (an A record, for an
// A query) when ok, else no such name.
func hostAnswer(req *dns.Msg, name string, addr netip.Addr, ok bool, ttl uint32) *dns.Msg {
	resp := new(dns.Msg)
	if !ok {
		resp.SetRcode(req, dns.RcodeNameError)
		resp.RecursionAvailable = true
		return resp
	}
	resp.SetReply(req)
	resp.RecursionAvailable = true
	if req.Question[0].Qtype == dns.TypeA {
		resp.Answer = append(resp.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: dns.Fqdn(name), Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl},
			A:   addr.AsSlice(),
		})
	}
	return resp
}

func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}

func (r *Resolver) log() *slog.Logger {
	if r.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Log
}

// Start serves on pc (UDP) and ln (TCP) until Close.
func (r *Resolver) Start(pc net.PacketConn, ln net.Listener) error {
	if r.Policy == nil || r.Upstream == nil {
		return errors.New("dnsfilter: Policy and Upstream are required")
	}
	started := make(chan struct{}, 2)
	notify := func() { started <- struct{}{} }
	r.udp = &dns.Server{PacketConn: pc, Handler: r, NotifyStartedFunc: notify, ReadTimeout: 2 * time.Second}
	r.tcp = &dns.Server{Listener: ln, Handler: r, NotifyStartedFunc: notify, ReadTimeout: 2 * time.Second, MaxTCPQueries: 16}
	errs := make(chan error, 2)
	go func() { errs <- r.udp.ActivateAndServe() }()
	go func() { errs <- r.tcp.ActivateAndServe() }()
	for range 2 {
		select {
		case <-started:
		case err := <-errs:
			r.Close()
			return fmt.Errorf("dnsfilter: %w", err)
		}
	}
	return nil
}

// Close stops serving and closes the sockets.
func (r *Resolver) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var errs []error
	for _, s := range []*dns.Server{r.udp, r.tcp} {
		if s != nil {
			if err := s.ShutdownContext(ctx); err != nil && !strings.Contains(err.Error(), "not started") {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
