// Package firewall is a sandbox's outbound network policy: the model, its
// strict decoding and validation, and the first-match semantics every
// enforcer (host nftables, the host DNS resolver, the egress proxy) follows.
//
// A policy is ordered. For a new outbound connection the rules are tried in
// order and the first rule that matches decides; when none matches,
// default_outbound decides. Inbound connections to a sandbox are always
// denied (replies to its own connections are not inbound).
//
// A rule matches a connection when its protocol matches, its ports contain
// the destination port (no ports: any port), and its destination matches:
//
//   - hosts: the name the guest asked for (TLS SNI or HTTP Host, read by the
//     host egress proxy) equals a listed name, or is a subdomain of a
//     "*.example.com" entry ("*.example.com" does not match example.com).
//     Hostname rules are TCP only.
//   - cidrs: the destination address is in one of the prefixes.
//   - neither: any destination.
//
// Some destinations are internal and never reachable unless a CIDR rule
// names them (see Blocked): link-local and cloud metadata (169.254.0.0/16),
// the host's own addresses, other sandboxes, the private ranges (by default
// RFC 1918 and CGNAT 100.64.0.0/10), loopback, multicast and broadcast. A
// CIDR "names" an internal range when it lies inside it: 10.1.0.0/16 opens
// that part of 10.0.0.0/8, while 0.0.0.0/0 opens nothing internal.
//
// Independent of any rule: DNS goes only to the host resolver (port 53 and
// 853 anywhere else are blocked), UDP/443 (QUIC, which the proxy cannot
// read) is blocked while the policy has hostname rules, and IPv6 is dropped.
package firewall

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/harebox/harebox/model"
)

// Limits on a policy's size. They bound the nftables rules, the DNS and
// proxy checks, and the memory a request can make the host spend.
const (
	MaxPolicyBytes  = 64 << 10
	MaxRules        = 256
	MaxHostsPerRule = 64
	MaxCIDRsPerRule = 64
	MaxPortSpans    = 32 // comma-separated entries in a rule's ports
	maxHostLen      = 253
)

// Action is what a rule or the default does with a connection.
type Action string

const (
	Allow Action = "allow"
	Deny  Action = "deny"
)

// Protocol is the transport a rule matches.
type Protocol string

const (
	TCP  Protocol = "tcp"
	UDP  Protocol = "udp"
	ICMP Protocol = "icmp"
	Any  Protocol = "any"
)

// Policy is a sandbox's firewall.
type Policy struct {
	// DefaultOutbound decides outbound connections no rule matches.
	DefaultOutbound Action `json:"default_outbound"`
	// Outbound rules, tried in order; the first match wins.
	Outbound []Rule `json:"outbound"`
	// Mesh rules decide what the sandbox opens to its project's other
	// mesh sandboxes, tried in order; the first match wins (MeshRule).
	Mesh []MeshRule `json:"mesh,omitempty"`
}

// Rule is one outbound rule. After Parse or Normalize, Protocol is set
// (hostname rules: tcp; others without one: any), Ports is canonical,
// Hosts are lower case without a trailing dot and CIDRs are canonical.
type Rule struct {
	Action   Action   `json:"action"`
	Protocol Protocol `json:"protocol,omitempty"`
	// Ports: "443", "80,443", "8000-9000" or a mix; empty means all.
	Ports string   `json:"ports,omitempty"`
	Hosts []string `json:"hosts,omitempty"`
	CIDRs []string `json:"cidrs,omitempty"`
}

// Error is a validation error: the JSON path of the field at fault (such
// as "outbound[0].ports"; empty for the document as a whole) and a message
// for people.
type Error struct {
	Field string
	Msg   string
}

func (e *Error) Error() string {
	if e.Field == "" {
		return "firewall: " + e.Msg
	}
	return "firewall: " + e.Field + ": " + e.Msg
}

// Invalid is err as the vocabulary's invalid-request error
// (model.ErrInvalid, naming the field at fault), for a policy that came
// in a request.
func Invalid(err error) error {
	var fe *Error
	if errors.As(err, &fe) {
		return model.Errorf(model.ErrInvalid, fe.Field, "%s", fe.Msg)
	}
	return &model.Error{Kind: model.ErrInvalid, Msg: "invalid firewall policy", Err: err}
}

func errorf(field, format string, args ...any) *Error {
	return &Error{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Default is the policy of a new sandbox: outbound allowed to the public
// internet. Internal destinations (metadata, the host, other sandboxes,
// private ranges) stay blocked because no CIDR rule names them, and DNS
// goes only to the host resolver.
func Default() *Policy {
	return &Policy{DefaultOutbound: Allow, Outbound: []Rule{}}
}

// DenyAll is a policy that allows nothing outbound.
func DenyAll() *Policy {
	return &Policy{DefaultOutbound: Deny, Outbound: []Rule{}}
}

// Parse decodes a policy strictly (one JSON object, no unknown or
// duplicate fields, no nulls, at most MaxPolicyBytes) and validates it.
// The result is normalized. Errors are *Error.
func Parse(data []byte) (*Policy, error) {
	if len(data) > MaxPolicyBytes {
		return nil, errorf("", "policy is larger than %d bytes", MaxPolicyBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, errorf("", "not valid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errorf("", "trailing data after the policy object")
	}
	p := &Policy{}
	fields, err := object(raw, "")
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, f := range fields {
		seen[f.key] = true
		switch f.key {
		case "default_outbound":
			if err := str(f.val, f.key, (*string)(&p.DefaultOutbound)); err != nil {
				return nil, err
			}
		case "outbound":
			items, err := array(f.val, f.key)
			if err != nil {
				return nil, err
			}
			if len(items) > MaxRules {
				return nil, errorf("outbound", "too many rules: %d, at most %d", len(items), MaxRules)
			}
			p.Outbound = make([]Rule, len(items))
			for i, it := range items {
				if err := decodeRule(it, fmt.Sprintf("outbound[%d]", i), &p.Outbound[i]); err != nil {
					return nil, err
				}
			}
		case "mesh":
			items, err := array(f.val, f.key)
			if err != nil {
				return nil, err
			}
			if len(items) > MaxRules {
				return nil, errorf("mesh", "too many rules: %d, at most %d", len(items), MaxRules)
			}
			p.Mesh = make([]MeshRule, len(items))
			for i, it := range items {
				if err := decodeMeshRule(it, fmt.Sprintf("mesh[%d]", i), &p.Mesh[i]); err != nil {
					return nil, err
				}
			}
		default:
			return nil, errorf(f.key, "unknown field (known: default_outbound, outbound, mesh)")
		}
	}
	if !seen["default_outbound"] {
		return nil, errorf("default_outbound", `required: "allow" or "deny"`)
	}
	if p.Outbound == nil {
		p.Outbound = []Rule{}
	}
	if err := p.Normalize(); err != nil {
		return nil, err
	}
	return p, nil
}

func decodeRule(raw json.RawMessage, path string, r *Rule) error {
	fields, err := object(raw, path)
	if err != nil {
		return err
	}
	for _, f := range fields {
		fp := path + "." + f.key
		switch f.key {
		case "action":
			err = str(f.val, fp, (*string)(&r.Action))
		case "protocol":
			err = str(f.val, fp, (*string)(&r.Protocol))
		case "ports":
			err = ports(f.val, fp, &r.Ports)
		case "hosts":
			r.Hosts, err = strs(f.val, fp, MaxHostsPerRule)
		case "cidrs":
			r.CIDRs, err = strs(f.val, fp, MaxCIDRsPerRule)
		default:
			err = errorf(fp, "unknown field (known: action, protocol, ports, hosts, cidrs)")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ports decodes a rule's ports: a string, or a lone number (what people
// type for one port).
func ports(raw json.RawMessage, path string, dst *string) error {
	var n json.Number
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if d.Decode(&n) == nil {
		*dst = n.String()
	} else if err := str(raw, path, dst); err != nil {
		return err
	}
	if strings.TrimSpace(*dst) == "" {
		return errorf(path, "empty; leave ports out to match any port")
	}
	return nil
}

type field struct {
	key string
	val json.RawMessage
}

// object splits a JSON object into its fields in order, refusing
// duplicates and non-objects.
func object(raw json.RawMessage, path string) ([]field, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errorf(path, "must be a JSON object")
	}
	var out []field
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, errorf(path, "bad JSON: %v", err)
		}
		k, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, errorf(join(path, k), "bad JSON: %v", err)
		}
		if seen[k] {
			return nil, errorf(join(path, k), "duplicate field")
		}
		seen[k] = true
		out = append(out, field{k, v})
	}
	return out, nil
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

func array(raw json.RawMessage, path string) ([]json.RawMessage, error) {
	var a []json.RawMessage
	if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) || json.Unmarshal(raw, &a) != nil {
		return nil, errorf(path, "must be an array")
	}
	return a, nil
}

func str(raw json.RawMessage, path string, dst *string) error {
	if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) || json.Unmarshal(raw, dst) != nil {
		return errorf(path, "must be a string")
	}
	return nil
}

func strs(raw json.RawMessage, path string, max int) ([]string, error) {
	items, err := array(raw, path)
	if err != nil {
		return nil, errorf(path, "must be an array of strings")
	}
	if len(items) > max {
		return nil, errorf(path, "too many entries: %d, at most %d", len(items), max)
	}
	out := make([]string, len(items))
	for i, it := range items {
		if err := str(it, fmt.Sprintf("%s[%d]", path, i), &out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Validate reports the first problem with p as an *Error, without
// changing p.
func (p *Policy) Validate() error {
	if p == nil {
		return errorf("", "no policy")
	}
	return p.Clone().Normalize()
}

// Clone returns a deep copy.
func (p *Policy) Clone() *Policy {
	if p == nil {
		return nil
	}
	q := &Policy{DefaultOutbound: p.DefaultOutbound, Outbound: make([]Rule, len(p.Outbound)), Mesh: cloneMesh(p.Mesh)}
	for i, r := range p.Outbound {
		r.Hosts = slices.Clone(r.Hosts)
		r.CIDRs = slices.Clone(r.CIDRs)
		q.Outbound[i] = r
	}
	return q
}

// Normalize validates p and rewrites it in canonical form (see Rule).
func (p *Policy) Normalize() error {
	switch p.DefaultOutbound {
	case Allow, Deny:
	case "":
		return errorf("default_outbound", `required: "allow" or "deny"`)
	default:
		return errorf("default_outbound", `must be "allow" or "deny", not %q`, p.DefaultOutbound)
	}
	if len(p.Outbound) > MaxRules {
		return errorf("outbound", "too many rules: %d, at most %d", len(p.Outbound), MaxRules)
	}
	if p.Outbound == nil {
		p.Outbound = []Rule{}
	}
	for i := range p.Outbound {
		if err := p.Outbound[i].normalize(fmt.Sprintf("outbound[%d]", i)); err != nil {
			return err
		}
	}
	if len(p.Mesh) > MaxRules {
		return errorf("mesh", "too many rules: %d, at most %d", len(p.Mesh), MaxRules)
	}
	for i := range p.Mesh {
		if err := p.Mesh[i].normalize(fmt.Sprintf("mesh[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

func (r *Rule) normalize(path string) error {
	switch r.Action {
	case Allow, Deny:
	case "":
		return errorf(path+".action", `required: "allow" or "deny"`)
	default:
		return errorf(path+".action", `must be "allow" or "deny", not %q`, r.Action)
	}
	if len(r.Hosts) > 0 && len(r.CIDRs) > 0 {
		return errorf(path, "a rule names hosts or cidrs, not both; split it into two rules")
	}
	if r.Hosts != nil && len(r.Hosts) == 0 {
		return errorf(path+".hosts", "empty; leave it out to match any destination")
	}
	if r.CIDRs != nil && len(r.CIDRs) == 0 {
		return errorf(path+".cidrs", "empty; leave it out to match any destination")
	}
	switch r.Protocol {
	case TCP, UDP, ICMP, Any:
	case "":
		if len(r.Hosts) > 0 {
			r.Protocol = TCP
		} else {
			r.Protocol = Any
		}
	default:
		return errorf(path+".protocol", `must be "tcp", "udp", "icmp" or "any", not %q`, r.Protocol)
	}
	if len(r.Hosts) > 0 && r.Protocol != TCP {
		return errorf(path+".protocol", `hostname rules apply to tcp only; use "tcp" or leave protocol out`)
	}
	if r.Ports != "" {
		if r.Protocol != TCP && r.Protocol != UDP {
			return errorf(path+".ports", `ports need protocol "tcp" or "udp" (protocol is %q)`, r.Protocol)
		}
		spans, err := ParsePorts(r.Ports)
		if err != nil {
			return errorf(path+".ports", "%v", err)
		}
		r.Ports = FormatPorts(spans)
	}
	if len(r.Hosts) > MaxHostsPerRule {
		return errorf(path+".hosts", "too many entries: %d, at most %d", len(r.Hosts), MaxHostsPerRule)
	}
	for i, h := range r.Hosts {
		n, err := NormalizeHost(h)
		if err != nil {
			return errorf(fmt.Sprintf("%s.hosts[%d]", path, i), "%v", err)
		}
		r.Hosts[i] = n
	}
	if len(r.CIDRs) > MaxCIDRsPerRule {
		return errorf(path+".cidrs", "too many entries: %d, at most %d", len(r.CIDRs), MaxCIDRsPerRule)
	}
	for i, c := range r.CIDRs {
		pfx, err := ParseCIDR(c)
		if err != nil {
			return errorf(fmt.Sprintf("%s.cidrs[%d]", path, i), "%v", err)
		}
		r.CIDRs[i] = pfx.String()
	}
	return nil
}

// PortSpan is an inclusive port range.
type PortSpan struct{ Lo, Hi uint16 }

// ParsePorts parses "443", "80,443", "8000-9000" or a mix. Spans are
// returned sorted and merged.
func ParsePorts(s string) ([]PortSpan, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("empty; leave ports out to match any port")
	}
	parts := strings.Split(s, ",")
	if len(parts) > MaxPortSpans {
		return nil, fmt.Errorf("too many entries: %d, at most %d", len(parts), MaxPortSpans)
	}
	var spans []PortSpan
	for _, part := range parts {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := port(lo)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = port(hi); err != nil {
				return nil, err
			}
			if a > b {
				return nil, fmt.Errorf("range %q runs backwards (low port first)", part)
			}
		}
		spans = append(spans, PortSpan{a, b})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].Lo < spans[j].Lo })
	out := spans[:1]
	for _, s := range spans[1:] {
		last := &out[len(out)-1]
		if uint32(s.Lo) <= uint32(last.Hi)+1 {
			last.Hi = max(last.Hi, s.Hi)
			continue
		}
		out = append(out, s)
	}
	return out, nil
}

func port(s string) (uint16, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, errors.New(`empty port; write "443", "80,443" or "8000-9000"`)
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf(`bad port %q; write "443", "80,443" or "8000-9000"`, s)
		}
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %s out of range 1-65535", s)
	}
	return uint16(n), nil
}

// FormatPorts is the canonical text of spans.
func FormatPorts(spans []PortSpan) string {
	var b strings.Builder
	for i, s := range spans {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(int(s.Lo)))
		if s.Hi != s.Lo {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(int(s.Hi)))
		}
	}
	return b.String()
}

// NormalizeHost checks a hosts entry (an RFC 1123 name, optionally with a
// leading "*.") and returns it lower case without a trailing dot.
func NormalizeHost(h string) (string, error) {
	if h == "" {
		return "", errors.New("empty host name")
	}
	n := strings.ToLower(strings.TrimSuffix(h, "."))
	if _, err := netip.ParseAddr(strings.Trim(n, "[]")); err == nil {
		return "", fmt.Errorf("%q is an IP address; put addresses in cidrs", h)
	}
	if _, err := netip.ParsePrefix(n); err == nil {
		return "", fmt.Errorf("%q is a CIDR; put it in cidrs", h)
	}
	name, wild := strings.CutPrefix(n, "*.")
	if len(n) > maxHostLen {
		return "", fmt.Errorf("host name longer than %d characters", maxHostLen)
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if err := checkLabel(l); err != nil {
			return "", fmt.Errorf("bad host name %q: %v", h, err)
		}
	}
	last := labels[len(labels)-1]
	if strings.Trim(last, "0123456789") == "" {
		return "", fmt.Errorf("bad host name %q: the last label is all digits", h)
	}
	if wild && len(labels) < 2 {
		return "", fmt.Errorf("wildcard %q is too broad; name at least two labels after \"*.\"", h)
	}
	return n, nil
}

func checkLabel(l string) error {
	switch {
	case l == "":
		return errors.New("empty label")
	case l == "*":
		return errors.New(`"*" is only allowed as the whole first label`)
	case len(l) > 63:
		return errors.New("label longer than 63 characters")
	case l[0] == '-' || l[len(l)-1] == '-':
		return errors.New("label starts or ends with '-'")
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("character %q not allowed (letters, digits, '-')", c)
		}
	}
	return nil
}

// ParseCIDR parses an IPv4 prefix ("10.0.0.0/8") or address (a /32).
// Host bits must be zero; IPv6 is refused because sandboxes have none.
func ParseCIDR(s string) (netip.Prefix, error) {
	var p netip.Prefix
	if a, err := netip.ParseAddr(s); err == nil {
		p = netip.PrefixFrom(a, a.BitLen())
	} else if p, err = netip.ParsePrefix(s); err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR such as 10.0.0.0/8", s)
	}
	if !p.Addr().Is4() || p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q: only IPv4 is supported (sandboxes have no IPv6)", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%q has host bits set; did you mean %s?", s, p.Masked())
	}
	return p, nil
}

// HasHostRules reports whether any rule names hosts.
func (p *Policy) HasHostRules() bool {
	for _, r := range p.Outbound {
		if len(r.Hosts) > 0 {
			return true
		}
	}
	return false
}
