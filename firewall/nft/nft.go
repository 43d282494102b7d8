// Package nft compiles sandbox firewall policies into the host's HareBox
// nftables table and installs them, each change in one netlink
// transaction so packets see either the old rules or the new ones.
//
// Layout of the table (family inet):
//
//	forward     filter/forward:    iifname TAP jump o-TAP
//	forward-in  filter/forward+10: oifname TAP jump i-TAP (a base chain of
//	            its own, so that a packet between two sandboxes passes
//	            both the sender's o- and the receiver's i-chain: an accept
//	            ends only its own base chain)
//	input       filter/input:   iifname TAP jump h-TAP; then nothing else may
//	            reach the resolver or proxy ports
//	output      filter/output:  oifname TAP jump i-TAP
//	prerouting  nat/dstnat:     iifname TAP jump p-TAP
//	postrouting nat/srcnat:     pool -> elsewhere masquerade
//	reject      TCP reset, else ICMP admin-prohibited
//	o-TAP       the sandbox's outbound policy (forwarded traffic); its
//	            mesh traffic: from its mesh address to its project's range
//	h-TAP       what the sandbox may send to the host: DNS and the proxy
//	i-TAP       inbound: replies only, new TCP connections to the
//	            sandbox's exposed ports from the host's ingress (its mark),
//	            and its project's mesh to its mesh address
//	p-TAP       DNS to the gateway -> resolver; hostname-ruled TCP -> proxy
//
// Hostname rules never match in o-TAP (a packet carries no name): their
// connections are redirected in p-TAP to the egress proxy, which applies the
// whole policy by name. p-TAP mirrors the rule order, so a CIDR rule listed
// before a hostname rule still decides its own traffic directly.
package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/network"
)

// Config is what the compiled rules need to know about the host.
type Config struct {
	Table     string       // nftables table name (family inet)
	Pool      netip.Prefix // all sandbox addresses
	DNSPort   uint16       // the host resolver's port on the gateway addresses
	ProxyPort uint16       // the egress proxy's port
	// IngressMark is the socket mark (SO_MARK) of the host ingress's
	// connections to guests; 0 lets nothing in.
	IngressMark uint32
	// MeshPool is the address space of the projects' meshes: nothing is
	// forwarded to it but from a sandbox's tap (its own chains decide) or
	// from Tunnel. Unset: no such rule.
	MeshPool netip.Prefix
	// Tunnel is the mesh's tunnel device (network/wgtunnel), if any: what
	// comes out of it reaches sandboxes here only (their i- chains
	// decide), never the host or anywhere else.
	Tunnel string
}

// Sandbox is one sandbox's network identity and policy.
type Sandbox struct {
	Tap     string
	Addr    netip.Addr // the guest
	Gateway netip.Addr // the host end; also the guest's DNS server
	Policy  *firewall.Policy
	Blocked firewall.Blocked
	// Exposed are the guest's TCP ports the host ingress may connect to.
	Exposed []uint16
	// Mesh, if set, is the sandbox's place on its project's mesh.
	Mesh *Mesh
}

// Mesh is a sandbox's place on its project's private network: its own
// address there, and its project's range, the only addresses it reaches
// and is reached from over the mesh.
type Mesh struct {
	Addr    netip.Addr
	Project netip.Prefix
	// Rules and Deny decide what the sandbox opens on the mesh (see
	// network.Mesh).
	Rules []network.MeshRule
	Deny  bool
}

// Table manages the HareBox table through one netlink connection.
type Table struct {
	cfg  Config
	conn *nftables.Conn
	t    *nftables.Table
}

// Open returns a handle on the table; it changes nothing.
func Open(cfg Config) (*Table, error) {
	if cfg.Table == "" || !cfg.Pool.IsValid() || cfg.DNSPort == 0 || cfg.ProxyPort == 0 {
		return nil, errors.New("nft: incomplete config")
	}
	if len(cfg.Tunnel) >= unix.IFNAMSIZ || cfg.MeshPool.IsValid() && (!cfg.MeshPool.Addr().Is4() || cfg.MeshPool.Overlaps(cfg.Pool)) {
		return nil, fmt.Errorf("nft: bad mesh pool %s (sandboxes' pool %s) or tunnel %q", cfg.MeshPool, cfg.Pool, cfg.Tunnel)
	}
	c, err := nftables.New(nftables.WithSockOptions(bigBuffers))
	if err != nil {
		return nil, fmt.Errorf("nft: %w", err)
	}
	return &Table{cfg: cfg, conn: c, t: &nftables.Table{Name: cfg.Table, Family: nftables.TableFamilyINet}}, nil
}

// socketBuffer bounds one transaction and the kernel's acknowledgements
// of it: Reset installs every sandbox's chains at once after a restart,
// and with the default buffers a few sandboxes' rules are too large a
// message to send (EMSGSIZE) and their acks too many to receive (ENOBUFS),
// so the engine could not start.
const socketBuffer = 64 << 20

// bigBuffers sets socketBuffer both ways, past net.core.{r,w}mem_max where
// the process may (SO_*BUFFORCE, root), else as large as allowed.
func bigBuffers(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var rerr, werr error
	if err := rc.Control(func(fd uintptr) {
		rerr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, socketBuffer)
		werr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, socketBuffer)
	}); err != nil {
		return err
	}
	if rerr != nil {
		if err := c.SetReadBuffer(socketBuffer); err != nil {
			return err
		}
	}
	if werr != nil {
		return c.SetWriteBuffer(socketBuffer)
	}
	return nil
}

// Close releases the netlink connection; the rules stay in the kernel.
func (t *Table) Close() error { return t.conn.CloseLasting() }

func (t *Table) exists() (bool, error) {
	ts, err := t.conn.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return false, fmt.Errorf("nft: list tables: %w", err)
	}
	for _, x := range ts {
		if x.Name == t.cfg.Table {
			return true, nil
		}
	}
	return false, nil
}

// Check says whether the firewall of every tap in taps is in force: the
// table is in the kernel, its base chains jump to each tap's chains (five
// jumps, tagged with the tap), and each tap's outbound chain has its
// rules. Something on the host (nft flush ruleset, another firewall's
// reload) can take any of it away; the base chains accept by default, so
// a sandbox whose jumps are gone is not filtered at all.
func (t *Table) Check(taps []string) error {
	if ok, err := t.exists(); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("nft: table inet %s is missing", t.cfg.Table)
	}
	jumps := map[string]int{}
	b := t.baseChains()
	for _, c := range b.jumping() {
		rules, err := t.conn.GetRules(t.t, c)
		if err != nil {
			return fmt.Errorf("nft: table inet %s, chain %s: %w", t.cfg.Table, c.Name, err)
		}
		for _, r := range rules {
			jumps[string(r.UserData)]++
		}
	}
	for _, tap := range taps {
		if jumps[tap] < 5 {
			return fmt.Errorf("nft: table inet %s: the jumps to %s's chains are gone", t.cfg.Table, tap)
		}
		o, _, _, _ := chainNames(tap)
		rules, err := t.conn.GetRules(t.t, &nftables.Chain{Name: o, Table: t.t})
		if err != nil || len(rules) == 0 {
			return fmt.Errorf("nft: table inet %s: chain %s is gone or empty", t.cfg.Table, o)
		}
	}
	return nil
}

// Reset replaces the whole table with one holding sbs, in one transaction.
// The mesh counters keep what they counted (their taps' counters do).
func (t *Table) Reset(sbs []Sandbox) error {
	ok, err := t.exists()
	if err != nil {
		return err
	}
	counted := map[string]*nftables.CounterObj{}
	if ok {
		objs, err := t.conn.GetObjects(t.t)
		if err != nil {
			return fmt.Errorf("nft: list counters: %w", err)
		}
		for _, o := range objs {
			if c, ok := o.(*nftables.CounterObj); ok {
				counted[c.Name] = c
			}
		}
		t.conn.DelTable(t.t)
	}
	t.conn.AddTable(t.t)
	base := t.addBase()
	for _, sb := range sbs {
		if sb.Mesh != nil {
			c := &nftables.CounterObj{Table: t.t, Name: meshCounter(sb.Tap)}
			if old := counted[c.Name]; old != nil {
				c.Bytes, c.Packets = old.Bytes, old.Packets
			}
			t.conn.AddObj(c)
		}
		if err := t.addSandbox(base, sb); err != nil {
			return err
		}
	}
	if err := t.conn.Flush(); err != nil {
		return fmt.Errorf("nft: install table %s: %w", t.cfg.Table, err)
	}
	return nil
}

// Delete removes the table if it exists.
func (t *Table) Delete() error {
	ok, err := t.exists()
	if err != nil || !ok {
		return err
	}
	t.conn.DelTable(t.t)
	if err := t.conn.Flush(); err != nil {
		return fmt.Errorf("nft: delete table %s: %w", t.cfg.Table, err)
	}
	return nil
}

// Put installs or replaces one sandbox's chains in one transaction.
func (t *Table) Put(sb Sandbox) error {
	base := t.baseChains()
	if err := t.removeSandbox(base, sb.Tap); err != nil {
		return err
	}
	if sb.Mesh != nil {
		if _, _, ok, err := t.MeshCounted(sb.Tap); err != nil {
			return err
		} else if !ok {
			t.conn.AddObj(&nftables.CounterObj{Table: t.t, Name: meshCounter(sb.Tap)})
		}
	}
	if err := t.addSandbox(base, sb); err != nil {
		return err
	}
	if err := t.conn.Flush(); err != nil {
		return fmt.Errorf("nft: install %s: %w", sb.Tap, err)
	}
	return nil
}

// Remove deletes one sandbox's chains and jumps; removing an absent
// sandbox is not an error.
func (t *Table) Remove(tap string) error {
	ok, err := t.exists()
	if err != nil || !ok {
		return err
	}
	if err := t.removeSandbox(t.baseChains(), tap); err != nil {
		return err
	}
	if _, _, counted, err := t.MeshCounted(tap); err != nil {
		return err
	} else if counted {
		t.conn.DeleteObject(&nftables.CounterObj{Table: t.t, Name: meshCounter(tap)})
	}
	if err := t.conn.Flush(); err != nil {
		return fmt.Errorf("nft: remove %s: %w", tap, err)
	}
	return nil
}

// meshCounter names the counter of what a tap's sandbox sent over its
// mesh.
func meshCounter(tap string) string { return "m-" + tap }

// MeshCounted is what tap's sandbox has sent over its mesh since it was
// put on it (the IP packets' bytes, and their number); ok is false when it
// never was.
func (t *Table) MeshCounted(tap string) (bytes, packets uint64, ok bool, err error) {
	objs, err := t.conn.GetObjects(t.t)
	if err != nil {
		if ok, xerr := t.exists(); xerr == nil && !ok {
			return 0, 0, false, nil
		}
		return 0, 0, false, fmt.Errorf("nft: list counters: %w", err)
	}
	for _, o := range objs {
		if c, isCounter := o.(*nftables.CounterObj); isCounter && c.Name == meshCounter(tap) {
			return c.Bytes, c.Packets, true, nil
		}
	}
	return 0, 0, false, nil
}

// Taps lists the taps that have chains in the table.
func (t *Table) Taps() ([]string, error) {
	ok, err := t.exists()
	if err != nil || !ok {
		return nil, err
	}
	chains, err := t.conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("nft: list chains: %w", err)
	}
	var taps []string
	for _, c := range chains {
		if c.Table.Name == t.cfg.Table && len(c.Name) > 2 && c.Name[:2] == "o-" {
			taps = append(taps, c.Name[2:])
		}
	}
	sort.Strings(taps)
	return taps, nil
}

type baseChains struct {
	forward, forwardIn, input, output, prerouting, postrouting, reject *nftables.Chain
}

// jumping are the base chains that jump to a sandbox's chains.
func (b baseChains) jumping() []*nftables.Chain {
	return []*nftables.Chain{b.forward, b.forwardIn, b.input, b.output, b.prerouting}
}

func (t *Table) baseChains() baseChains {
	ch := func(name string) *nftables.Chain { return &nftables.Chain{Name: name, Table: t.t} }
	return baseChains{ch("forward"), ch("forward-in"), ch("input"), ch("output"), ch("prerouting"), ch("postrouting"), ch("reject")}
}

func (t *Table) addBase() baseChains {
	accept := nftables.ChainPolicyAccept
	add := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		return t.conn.AddChain(&nftables.Chain{Name: name, Table: t.t, Type: typ, Hooknum: hook, Priority: prio, Policy: &accept})
	}
	b := baseChains{
		forward:     add("forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter),
		forwardIn:   add("forward-in", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityRef(*nftables.ChainPriorityFilter+10)),
		input:       add("input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter),
		output:      add("output", nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter),
		prerouting:  add("prerouting", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest),
		postrouting: add("postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource),
		reject:      t.conn.AddChain(&nftables.Chain{Name: "reject", Table: t.t}),
	}
	t.rule(b.reject, nil, l4(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})
	t.rule(b.reject, nil, []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}})
	// Sandboxes reach the resolver and proxy through their h- chains
	// (which accept before this rule); nobody else may, as they listen on
	// all addresses.
	for _, p := range []struct {
		proto byte
		port  uint16
	}{{unix.IPPROTO_UDP, t.cfg.DNSPort}, {unix.IPPROTO_TCP, t.cfg.DNSPort}, {unix.IPPROTO_TCP, t.cfg.ProxyPort}} {
		t.rule(b.input, nil, l4(p.proto), dport(p.port), verdict(expr.VerdictDrop))
	}
	// The mesh: packets from a sandbox's tap never get here (its o- chain
	// decides them all); anything else bound for the mesh's addresses
	// must come out of the tunnel, and what comes out of the tunnel goes
	// to a sandbox (forward-in jumps to its i- chain ahead of this drop)
	// or nowhere.
	if mp := t.cfg.MeshPool; mp.IsValid() {
		var from []expr.Any
		if t.cfg.Tunnel != "" {
			from = ifnameCmp(unix.NFT_META_IIFNAME, t.cfg.Tunnel, expr.CmpOpNeq)
		}
		t.rule(b.forward, nil, ipv4(), prefixCmp(16, mp, expr.CmpOpEq), from, verdict(expr.VerdictDrop))
	}
	if tun := t.cfg.Tunnel; tun != "" {
		t.rule(b.forwardIn, nil, ifname(unix.NFT_META_IIFNAME, tun), verdict(expr.VerdictDrop))
		t.rule(b.input, nil, ifname(unix.NFT_META_IIFNAME, tun), verdict(expr.VerdictDrop))
	}
	// Masquerade sandboxes to the uplink; sandbox-to-sandbox traffic is
	// refused by policy anyway.
	pool := t.cfg.Pool
	t.rule(b.postrouting, nil, ipv4(), prefixCmp(12, pool, expr.CmpOpEq), prefixCmp(16, pool, expr.CmpOpNeq), []expr.Any{&expr.Masq{}})
	return b
}

// rule appends a rule made of the expression groups to c, tagged with
// tag (the owning tap) so Remove can find jumps in base chains.
func (t *Table) rule(c *nftables.Chain, tag []byte, groups ...[]expr.Any) {
	var e []expr.Any
	for _, g := range groups {
		e = append(e, g...)
	}
	t.conn.AddRule(&nftables.Rule{Table: t.t, Chain: c, Exprs: e, UserData: tag})
}

func chainNames(tap string) (o, h, i, p string) {
	return "o-" + tap, "h-" + tap, "i-" + tap, "p-" + tap
}

func (t *Table) removeSandbox(b baseChains, tap string) error {
	tag := []byte(tap)
	for _, c := range b.jumping() {
		rules, err := t.conn.GetRules(t.t, c)
		if err != nil {
			return fmt.Errorf("nft: list %s: %w", c.Name, err)
		}
		for _, r := range rules {
			if string(r.UserData) == string(tag) {
				if err := t.conn.DelRule(r); err != nil {
					return fmt.Errorf("nft: %w", err)
				}
			}
		}
	}
	chains, err := t.conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("nft: list chains: %w", err)
	}
	o, h, i, p := chainNames(tap)
	for _, c := range chains {
		if c.Table.Name == t.cfg.Table && (c.Name == o || c.Name == h || c.Name == i || c.Name == p) {
			// A chain must be empty to be deleted; flushing first in the
			// same transaction does that.
			t.conn.FlushChain(c)
			t.conn.DelChain(c)
		}
	}
	return nil
}

func (t *Table) addSandbox(b baseChains, sb Sandbox) error {
	if len(sb.Tap) == 0 || len(sb.Tap) >= unix.IFNAMSIZ || !sb.Addr.Is4() || !sb.Gateway.Is4() || sb.Policy == nil {
		return fmt.Errorf("nft: bad sandbox %+v", sb)
	}
	if m := sb.Mesh; m != nil && (!m.Addr.Is4() || !m.Project.Addr().Is4() || !m.Project.Contains(m.Addr) || t.cfg.Pool.Overlaps(m.Project)) {
		return fmt.Errorf("nft: bad mesh %s in %s for %s (pool %s)", m.Addr, m.Project, sb.Tap, t.cfg.Pool)
	}
	p := sb.Policy.Clone()
	if err := p.Normalize(); err != nil {
		return err
	}
	on, hn, in, pn := chainNames(sb.Tap)
	ch := func(name string) *nftables.Chain { return t.conn.AddChain(&nftables.Chain{Name: name, Table: t.t}) }
	o, h, i, pre := ch(on), ch(hn), ch(in), ch(pn)
	tag := []byte(sb.Tap)
	iif, oif := ifname(unix.NFT_META_IIFNAME, sb.Tap), ifname(unix.NFT_META_OIFNAME, sb.Tap)
	// Jumps go first in the base chains, ahead of the input chain's
	// drops for the resolver and proxy ports.
	for _, j := range []struct {
		c    *nftables.Chain
		m    []expr.Any
		dest string
	}{{b.forward, iif, on}, {b.forwardIn, oif, in}, {b.input, iif, hn}, {b.output, oif, in}, {b.prerouting, iif, pn}} {
		t.conn.InsertRule(&nftables.Rule{Table: t.t, Chain: j.c, Exprs: append(slices.Clone(j.m), jump(j.dest)...), UserData: tag})
	}
	rej := []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: "reject"}}
	drop := verdict(expr.VerdictDrop)
	accept := verdict(expr.VerdictAccept)

	// Inbound: replies only, and the host ingress to exposed ports. The
	// mark is set on the ingress's own sockets; packets from the wire or
	// another sandbox carry none.
	t.rule(i, nil, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept)
	if t.cfg.IngressMark != 0 && len(sb.Exposed) > 0 {
		var spans []firewall.PortSpan
		for _, p := range sb.Exposed {
			spans = append(spans, firewall.PortSpan{Lo: p, Hi: p})
		}
		// New connections only, from an address of the host itself (the
		// chain is also jumped to for forwarded packets).
		t.rule(i, nil, markCmp(t.cfg.IngressMark), ctState(expr.CtStateBitNEW), ipv4(), localSource(),
			addrCmp(16, sb.Addr, expr.CmpOpEq), l4(unix.IPPROTO_TCP), t.portSet(spans), accept)
	}
	// The mesh: from the project's range to the mesh address. (Each
	// sender's o-chain holds it to its own mesh address; both chains
	// see every packet between two sandboxes.)
	if m := sb.Mesh; m != nil {
		t.rule(i, nil, ipv4(), prefixCmp(12, m.Project, expr.CmpOpEq), addrCmp(16, m.Addr, expr.CmpOpEq), accept)
	}
	t.rule(i, nil, drop)

	// To the host: DNS and the proxy, reached only through p- redirects,
	// and only from the sandbox's own address.
	t.rule(h, nil, nfproto(unix.NFPROTO_IPV6), drop)
	t.rule(h, nil, ipv4(), addrCmp(12, sb.Addr, expr.CmpOpNeq), drop)
	t.rule(h, nil, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept)
	for _, x := range []struct {
		proto byte
		port  uint16
	}{{unix.IPPROTO_UDP, t.cfg.DNSPort}, {unix.IPPROTO_TCP, t.cfg.DNSPort}, {unix.IPPROTO_TCP, t.cfg.ProxyPort}} {
		t.rule(h, nil, ctDNAT(), ipv4(), addrCmp(16, sb.Gateway, expr.CmpOpEq), l4(x.proto), dport(x.port), accept)
	}
	t.rule(h, nil, rej)

	// Outbound.
	t.rule(o, nil, nfproto(unix.NFPROTO_IPV6), drop)
	if m := sb.Mesh; m != nil {
		// The mesh, from its own mesh address only, to its project's
		// range only; the rest of its policy is not for the mesh. Replies
		// first, then its mesh rules (first match), then its default.
		mesh := func() []expr.Any {
			return slices.Concat(ipv4(), addrCmp(12, m.Addr, expr.CmpOpEq), prefixCmp(16, m.Project, expr.CmpOpEq))
		}
		count := []expr.Any{&expr.Objref{Type: unix.NFT_OBJECT_COUNTER, Name: meshCounter(sb.Tap)}}
		t.rule(o, nil, mesh(), ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), count, accept)
		for _, r := range m.Rules {
			if len(r.Peers) == 0 {
				continue // (no sandbox it is about, now)
			}
			var ports []expr.Any
			if r.Ports != "" {
				spans, _ := firewall.ParsePorts(r.Ports)
				ports = t.portSet(spans)
			}
			peers := make([]netip.Prefix, len(r.Peers))
			for i, p := range r.Peers {
				peers[i] = netip.PrefixFrom(p, 32)
			}
			v := rej
			if r.Allow {
				v = slices.Concat(count, accept)
			}
			t.rule(o, nil, mesh(), t.addrSet(16, peers, false), protoMatch(r.Protocol), ports, v)
		}
		if m.Deny {
			t.rule(o, nil, mesh(), rej)
		} else {
			t.rule(o, nil, mesh(), count, accept)
		}
	}
	t.rule(o, nil, ipv4(), addrCmp(12, sb.Addr, expr.CmpOpNeq), drop) // no spoofing
	t.rule(o, nil, ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept)
	t.rule(o, nil, ctState(expr.CtStateBitINVALID), drop)
	// (An anonymous set belongs to one rule: each rule builds its own.)
	dnsPorts := []firewall.PortSpan{{Lo: 53, Hi: 53}, {Lo: 853, Hi: 853}}
	t.rule(o, nil, l4(unix.IPPROTO_TCP), t.portSet(dnsPorts), rej)
	t.rule(o, nil, l4(unix.IPPROTO_UDP), t.portSet(dnsPorts), rej)
	if p.HasHostRules() {
		t.rule(o, nil, l4(unix.IPPROTO_UDP), dport(443), rej)
	}

	// DNS to the gateway goes to the host resolver.
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		t.rule(pre, nil, ipv4(), addrCmp(16, sb.Gateway, expr.CmpOpEq), l4(proto), dport(53), redirect(t.cfg.DNSPort))
	}

	hostRules := p.HasHostRules()
	for _, r := range p.Outbound {
		// Builders, not values: an anonymous set can belong to one rule
		// only, so every rule gets fresh ones.
		ports := func() []expr.Any { return nil }
		if r.Ports != "" {
			spans, _ := firewall.ParsePorts(r.Ports)
			ports = func() []expr.Any { return t.portSet(spans) }
		}
		if len(r.Hosts) > 0 {
			t.rule(pre, nil, l4(unix.IPPROTO_TCP), ports(), redirect(t.cfg.ProxyPort))
			continue
		}
		v := accept
		if r.Action == firewall.Deny {
			v = rej
		}
		for _, dst := range t.destinations(r, sb.Blocked) {
			t.rule(o, nil, protoMatch(r.Protocol), ports(), dst(), v)
			// Mirror in p- so this rule keeps deciding its TCP traffic
			// even when a later hostname rule covers the port.
			if hostRules && (r.Protocol == firewall.TCP || r.Protocol == firewall.Any) {
				t.rule(pre, nil, l4(unix.IPPROTO_TCP), ports(), dst(), verdict(expr.VerdictReturn))
			}
		}
	}
	if p.DefaultOutbound == firewall.Allow {
		t.rule(o, nil, ipv4(), t.addrSet(16, sb.Blocked, true), accept)
	}
	t.rule(o, nil, rej)
	return nil
}

// destinations returns builders of the address matches of r: one per
// distinct guard
// (see firewall.Blocked.Guard), or a not-internal match for a rule
// without cidrs. A deny rule without cidrs matches everything.
func (t *Table) destinations(r firewall.Rule, b firewall.Blocked) []func() []expr.Any {
	if len(r.CIDRs) == 0 {
		if r.Action == firewall.Deny {
			return []func() []expr.Any{func() []expr.Any { return nil }}
		}
		return []func() []expr.Any{func() []expr.Any { return append(ipv4(), t.addrSet(16, b, true)...) }}
	}
	type group struct {
		guard []netip.Prefix
		cidrs []netip.Prefix
	}
	var groups []*group
outer:
	for _, s := range r.CIDRs {
		pfx := netip.MustParsePrefix(s)
		g := b.Guard(pfx)
		for _, x := range groups {
			if slices.Equal(x.guard, g) {
				x.cidrs = append(x.cidrs, pfx)
				continue outer
			}
		}
		groups = append(groups, &group{guard: g, cidrs: []netip.Prefix{pfx}})
	}
	var out []func() []expr.Any
	for _, g := range groups {
		out = append(out, func() []expr.Any {
			m := append(ipv4(), t.addrSet(16, g.cidrs, false)...)
			if len(g.guard) > 0 {
				m = append(m, t.addrSet(16, g.guard, true)...)
			}
			return m
		})
	}
	return out
}

func protoMatch(p firewall.Protocol) []expr.Any {
	switch p {
	case firewall.TCP:
		return l4(unix.IPPROTO_TCP)
	case firewall.UDP:
		return l4(unix.IPPROTO_UDP)
	case firewall.ICMP:
		return l4(unix.IPPROTO_ICMP)
	}
	return nil
}

// --- expression helpers ---

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

func ifname(key expr.MetaKey, name string) []expr.Any { return ifnameCmp(key, name, expr.CmpOpEq) }

func ifnameCmp(key expr.MetaKey, name string, op expr.CmpOp) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: b}}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

func ipv4() []expr.Any { return nfproto(unix.NFPROTO_IPV4) }

func l4(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// addrCmp compares the IPv4 address at offset (12 source, 16 destination).
func addrCmp(off uint32, a netip.Addr, op expr.CmpOp) []expr.Any {
	b := a.As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Cmp{Op: op, Register: 1, Data: b[:]},
	}
}

func prefixCmp(off uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	a := p.Masked().Addr().As4()
	mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		mask = []byte{0, 0, 0, 0}
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: op, Register: 1, Data: a[:]},
	}
}

// localSource matches packets whose source address is one of the host's.
func localSource() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagSADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

func markCmp(mark uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(mark)},
	}
}

func ctState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func ctDNAT() []expr.Any {
	const ipsDstNAT = 0x20
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func redirect(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	}
}

// portSet matches the transport destination port against spans: a compare
// for one port, a range for one span, else an anonymous interval set.
func (t *Table) portSet(spans []firewall.PortSpan) []expr.Any {
	load := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	be := binaryutil.BigEndian.PutUint16
	if len(spans) == 1 {
		s := spans[0]
		if s.Lo == s.Hi {
			return []expr.Any{load, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be(s.Lo)}}
		}
		return []expr.Any{load, &expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: be(s.Lo), ToData: be(s.Hi)}}
	}
	var iv []interval
	for _, s := range spans {
		iv = append(iv, interval{uint64(s.Lo), uint64(s.Hi)})
	}
	set := &nftables.Set{Table: t.t, Anonymous: true, Constant: true, Interval: true, KeyType: nftables.TypeInetService}
	return append([]expr.Any{load}, t.lookup(set, elements(iv, 2), false)...)
}

// addrSet matches the IPv4 address at offset against prefixes (inverted:
// not in them) with an anonymous interval set.
func (t *Table) addrSet(off uint32, prefixes []netip.Prefix, invert bool) []expr.Any {
	load := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4}
	if len(prefixes) == 0 {
		if invert {
			return nil // not in the empty set: always true
		}
		return []expr.Any{load, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{255, 255, 255, 255}}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 0, 0, 0}}}
	}
	var iv []interval
	for _, p := range prefixes {
		p = p.Masked()
		lo := uint64(binary.BigEndian.Uint32(p.Addr().AsSlice()))
		hi := lo + (uint64(1) << (32 - p.Bits())) - 1
		iv = append(iv, interval{lo, hi})
	}
	set := &nftables.Set{Table: t.t, Anonymous: true, Constant: true, Interval: true, KeyType: nftables.TypeIPAddr}
	return append([]expr.Any{load}, t.lookup(set, elements(iv, 4), invert)...)
}

func (t *Table) lookup(set *nftables.Set, elems []nftables.SetElement, invert bool) []expr.Any {
	// AddSet only queues the set in the current batch; errors are about
	// malformed sets, which elements() does not produce.
	if err := t.conn.AddSet(set, elems); err != nil {
		panic(fmt.Sprintf("nft: anonymous set: %v", err))
	}
	return []expr.Any{&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: invert}}
}

type interval struct{ lo, hi uint64 }

// elements encodes merged, sorted intervals the way nft does for interval
// sets: an end element at zero unless the first interval starts there,
// then start and (exclusive) end per interval, with the last end left out
// when the interval runs to the top of the key space.
func elements(iv []interval, size int) []nftables.SetElement {
	sort.Slice(iv, func(i, j int) bool { return iv[i].lo < iv[j].lo })
	merged := iv[:1]
	for _, x := range iv[1:] {
		last := &merged[len(merged)-1]
		if x.lo <= last.hi+1 {
			last.hi = max(last.hi, x.hi)
			continue
		}
		merged = append(merged, x)
	}
	top := uint64(1)<<(8*size) - 1
	key := func(v uint64) []byte {
		b := binary.BigEndian.AppendUint64(nil, v)
		return b[8-size:]
	}
	var out []nftables.SetElement
	if merged[0].lo != 0 {
		out = append(out, nftables.SetElement{Key: key(0), IntervalEnd: true})
	}
	for _, x := range merged {
		out = append(out, nftables.SetElement{Key: key(x.lo)})
		if x.hi < top {
			out = append(out, nftables.SetElement{Key: key(x.hi + 1), IntervalEnd: true})
		}
	}
	return out
}
