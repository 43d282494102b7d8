package firewall

import (
	"net/netip"
	"strings"
)

// DefaultPrivate are the private ranges blocked unless a CIDR rule names
// them: RFC 1918 and CGNAT (RFC 6598).
func DefaultPrivate() []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("172.16.0.0/12"),
		netip.MustParsePrefix("192.168.0.0/16"),
		netip.MustParsePrefix("100.64.0.0/10"),
	}
}

// AlwaysInternal are the ranges blocked whatever the configuration:
// "this network", loopback, link-local with cloud metadata, multicast,
// and the reserved block with the limited broadcast address.
func AlwaysInternal() []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/8"),
		netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("169.254.0.0/16"),
		netip.MustParsePrefix("224.0.0.0/4"),
		netip.MustParsePrefix("240.0.0.0/4"),
	}
}

// Blocked is the set of internal destinations for one host: the ranges no
// rule reaches unless a CIDR rule names them. Build it from
// AlwaysInternal, the configured private ranges, the sandbox pool and the
// host's own addresses.
type Blocked []netip.Prefix

// Contains reports whether a is internal.
func (b Blocked) Contains(a netip.Addr) bool {
	for _, p := range b {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Guard is the part of b that stays blocked for a CIDR rule naming p: the
// internal ranges that overlap p but do not contain it. A rule for
// 10.1.0.0/16 opens it inside 10.0.0.0/8 yet still not the sandbox pool
// if that lies inside; a rule for 0.0.0.0/0 opens nothing internal.
func (b Blocked) Guard(p netip.Prefix) []netip.Prefix {
	var g []netip.Prefix
	for _, r := range b {
		if !r.Overlaps(p) {
			continue
		}
		if r.Bits() <= p.Bits() && r.Contains(p.Addr()) {
			continue // p lies inside r: the rule names r
		}
		g = append(g, r)
	}
	return g
}

// Conn describes a new outbound connection for Decide.
type Conn struct {
	Proto Protocol // tcp, udp or icmp
	Port  uint16   // destination port (tcp, udp)
	Host  string   // the name asked for (SNI or Host), if known; lower case
	Addr  netip.Addr
}

// Verdict is a decision and the rule that made it (-1: the default).
type Verdict struct {
	Allow bool
	Rule  int
}

// Decide applies p to c with first-match semantics. A hostname rule matches
// only when c.Host is set; at packet level (no name) it never matches.
//
// A name never opens an internal address: when a hostname rule allows c
// but c.Addr is internal, the verdict is what the policy says of the same
// flow without the name, so only a CIDR rule for that protocol, port and
// address lets it through (this stops DNS answers that point into the
// host's networks, and names used to reach ports a CIDR rule did not open).
func (p *Policy) Decide(b Blocked, c Conn) Verdict {
	for i, r := range p.Outbound {
		if r.Matches(b, c) {
			allow := r.Action == Allow
			if allow && len(r.Hosts) > 0 && c.Addr.IsValid() && b.Contains(c.Addr) {
				bare := c
				bare.Host = ""
				allow = p.Decide(b, bare).Allow
			}
			return Verdict{Allow: allow, Rule: i}
		}
	}
	return Verdict{Allow: p.DefaultOutbound == Allow && !b.Contains(c.Addr), Rule: -1}
}

// Matches reports whether r matches c. r must be normalized.
func (r *Rule) Matches(b Blocked, c Conn) bool {
	if r.Protocol != Any && r.Protocol != c.Proto {
		return false
	}
	if r.Ports != "" {
		spans, err := ParsePorts(r.Ports)
		if err != nil || !inSpans(spans, c.Port) {
			return false
		}
	}
	switch {
	case len(r.Hosts) > 0:
		return c.Host != "" && MatchHosts(r.Hosts, c.Host)
	case len(r.CIDRs) > 0:
		for _, s := range r.CIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil || !p.Contains(c.Addr) {
				continue
			}
			if !Blocked(b.Guard(p)).Contains(c.Addr) {
				return true
			}
		}
		return false
	case r.Action == Deny:
		return true
	default:
		return !b.Contains(c.Addr)
	}
}

func inSpans(spans []PortSpan, port uint16) bool {
	for _, s := range spans {
		if port >= s.Lo && port <= s.Hi {
			return true
		}
	}
	return false
}

// MatchHosts reports whether name matches one of the patterns: equal, or
// a proper subdomain of a "*.suffix" pattern. Both are compared without
// case and trailing dot.
func MatchHosts(patterns []string, name string) bool {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	for _, p := range patterns {
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			if strings.HasSuffix(name, "."+suffix) {
				return true
			}
		} else if p == name {
			return true
		}
	}
	return false
}

// Opens reports whether an allow rule with cidrs reaches the internal
// address a (on some protocol or port).
func (p *Policy) Opens(b Blocked, a netip.Addr) bool {
	for _, r := range p.Outbound {
		if r.Action != Allow || len(r.CIDRs) == 0 {
			continue
		}
		for _, s := range r.CIDRs {
			pfx, err := netip.ParsePrefix(s)
			if err == nil && pfx.Contains(a) && !Blocked(b.Guard(pfx)).Contains(a) {
				return true
			}
		}
	}
	return false
}

// Resolvable reports whether the host resolver should answer name: some
// hostname rule allows it on some port before a rule denies it on every
// port, or no rule decides and the default allows.
func (p *Policy) Resolvable(name string) bool {
	if allow, ok := p.byName(name); ok {
		return allow
	}
	return p.DefaultOutbound == Allow
}

// byName is the verdict of the first rule that decides name whatever the
// port: an allow rule naming it, or a port-less deny rule naming it.
func (p *Policy) byName(name string) (allow, ok bool) {
	for _, r := range p.Outbound {
		if len(r.Hosts) == 0 || !MatchHosts(r.Hosts, name) {
			continue
		}
		if r.Action == Allow {
			return true, true
		}
		if r.Ports == "" {
			return false, true
		}
	}
	return false, false
}

// APIHost is the name a sandbox reaches the HareBox API under, over plain
// HTTP through the host's egress proxy, never leaving the host. Only a
// policy whose allow rule names it explicitly opens it: an allow-by-default
// policy does not.
const APIHost = "api.harebox.internal"

// Names reports whether an allow rule names name explicitly (the default
// does not count): how a sandbox is given a host-side service.
func (p *Policy) Names(name string) bool {
	allow, ok := p.byName(name)
	return ok && allow
}

// NamesAllow reports whether the first rule that matches a TCP connection
// to name on port is an allow rule that names it.
func (p *Policy) NamesAllow(name string, port uint16) bool {
	c := Conn{Proto: TCP, Port: port, Host: name}
	for _, r := range p.Outbound {
		if r.Matches(nil, c) {
			return r.Action == Allow && len(r.Hosts) > 0
		}
	}
	return false
}

// HostPorts returns the TCP port spans covered by hostname rules: the
// connections the host sends through the egress proxy.
func (p *Policy) HostPorts() (all bool, spans []PortSpan) {
	for _, r := range p.Outbound {
		if len(r.Hosts) == 0 {
			continue
		}
		if r.Ports == "" {
			return true, nil
		}
		s, _ := ParsePorts(r.Ports)
		spans = append(spans, s...)
	}
	return false, spans
}
