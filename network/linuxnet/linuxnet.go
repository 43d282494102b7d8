// Package linuxnet is the Linux host network for sandboxes: per sandbox a
// tap device with its own /30 from a pool, NAT to the uplink, and its
// firewall policy enforced in the host (nftables, the host DNS resolver
// and the egress proxy). Nothing runs in the guest that the guest could
// change to get around it.
//
// The kernel objects (taps, the nftables table) outlive the process, like
// the VMs that use them; New rebuilds the table from the state directory
// so an engine restart keeps every sandbox's addresses and policy.
package linuxnet

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/firewall/credproxy"
	"github.com/harebox/harebox/firewall/dnsfilter"
	"github.com/harebox/harebox/firewall/egress"
	"github.com/harebox/harebox/firewall/nft"
	"github.com/harebox/harebox/network"
)

// Options configure the network.
type Options struct {
	// StateDir keeps one JSON file per attached sandbox (its address slot
	// and policy). Required.
	StateDir string
	// Pool is where sandbox addresses come from, a /30 each (gateway .1,
	// guest .2). Default 10.231.0.0/16.
	Pool netip.Prefix
	// Private ranges are blocked unless a CIDR rule names them. Nil means
	// firewall.DefaultPrivate() (RFC 1918 and CGNAT); an empty non-nil
	// slice blocks none beyond the fixed internal ranges.
	Private []netip.Prefix
	// Upstream is the DNS server (host:port) the host resolver forwards
	// allowed names to. Default: the first nameserver in /etc/resolv.conf.
	Upstream string
	// Table is the nftables table (family inet). Default "harebox".
	Table string
	// ListenAddr is where the resolver and the proxy listen; sandboxes
	// reach them through nftables redirects. Default 0.0.0.0 (the table
	// drops anyone else who tries those ports).
	ListenAddr netip.Addr
	// DNSPort and ProxyPort; 0 picks free ports.
	DNSPort, ProxyPort uint16
	// IngressMark marks the ingress's connections to guests (DialGuest);
	// 0 means DefaultIngressMark. Nothing else on the host should use it.
	IngressMark uint32
	// API connects a sandbox (by its guest address) to the HareBox API,
	// which it then reaches as http://api.harebox.internal/ when its
	// policy names that host (firewall.APIHost). Nil: never.
	API func(ctx context.Context, src netip.Addr) (net.Conn, error)
	// MeshPool is the address space of the projects' meshes (mesh.Options):
	// only sandboxes here and MeshTunnel may send to it. Unset: not
	// guarded beyond each sandbox's own chains.
	MeshPool netip.Prefix
	// MeshTunnel is the interface of the mesh's tunnels to the other
	// hosts (network/wgtunnel), if any.
	MeshTunnel string
	// Roots verify the real hosts behind credential rules; nil means the
	// system's roots (tests use their own CA).
	Roots  *x509.CertPool
	Logger *slog.Logger

	// newLink makes the sandbox's host interface; tests replace the tap
	// with a veth whose peer sits in a "guest" network namespace.
	newLink func(name string) error
}

// Network implements network.Network.
type Network struct {
	opts     Options
	log      *slog.Logger
	table    *nft.Table
	upstream *dnsfilter.Upstream
	resolver *dnsfilter.Resolver
	proxy    *egress.Proxy

	mu    sync.Mutex // serializes changes
	boxes map[string]*box

	// pmu guards byAddr and boxes' policies, which the resolver and the
	// proxy read on every query and connection (also during changes).
	pmu    sync.RWMutex
	byAddr map[netip.Addr]*box

	blockedMu    sync.Mutex
	blocked      firewall.Blocked
	blockedUntil time.Time

	// creds returns a sandbox's credentials (SetCredentials).
	creds atomic.Pointer[func(sandboxID string) *credproxy.Sandbox]
	// meshNames answers mesh names (SetMeshNames).
	meshNames atomic.Pointer[func(ctx context.Context, sandboxID, name string) (netip.Addr, bool)]
}

var _ network.Network = (*Network)(nil)

// box is one attached sandbox, as stored in the state directory.
type box struct {
	ID     string           `json:"id"`
	Slot   int              `json:"slot"`
	Tap    string           `json:"tap"`
	MAC    string           `json:"mac"`
	Policy *firewall.Policy `json:"policy"`
	// Exposed are the guest ports open to the host's ingress.
	Exposed []uint16 `json:"exposed,omitempty"`
	// Mesh is its place on its project's mesh, if any (SetMesh).
	Mesh *network.Mesh `json:"mesh,omitempty"`

	// dialed are the ingress's open connections to the guest: closed
	// when the box is detached, since its address goes to the next
	// sandbox attached.
	dmu    sync.Mutex
	dialed map[*guestConn]struct{}
	closed bool
}

// New starts the resolver and proxy and installs the table for the
// sandboxes in the state directory. Close stops the services; the kernel
// objects stay.
func New(ctx context.Context, opts Options) (*Network, error) {
	if opts.StateDir == "" {
		return nil, errors.New("linuxnet: StateDir is required")
	}
	if !opts.Pool.IsValid() {
		opts.Pool = netip.MustParsePrefix("10.231.0.0/16")
	}
	if !opts.Pool.Addr().Is4() || opts.Pool.Bits() > 30 || opts.Pool.Masked() != opts.Pool {
		return nil, fmt.Errorf("linuxnet: pool %s must be an IPv4 prefix of /30 or larger", opts.Pool)
	}
	if opts.Private == nil {
		opts.Private = firewall.DefaultPrivate()
	}
	if opts.Table == "" {
		opts.Table = "harebox"
	}
	if !opts.ListenAddr.IsValid() {
		opts.ListenAddr = netip.IPv4Unspecified()
	}
	if opts.Upstream == "" {
		up, err := systemResolver("/etc/resolv.conf")
		if err != nil {
			return nil, err
		}
		opts.Upstream = up
	}
	if opts.IngressMark == 0 {
		opts.IngressMark = DefaultIngressMark
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.newLink == nil {
		opts.newLink = newTap
	}
	if err := os.MkdirAll(opts.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("linuxnet: %w", err)
	}
	if o, err := RouteOverlaps(opts.Pool, opts.MeshPool); err != nil {
		opts.Logger.Warn("cannot check the address pools against the host's routes", "err", err)
	} else if len(o) > 0 {
		opts.Logger.Warn("the host routes networks inside the sandboxes' address pools: the host's traffic to their addresses that a sandbox is given goes to the sandbox, and sandboxes cannot reach them; pick pools no host network uses (--address-pool, --mesh-pool)", "routes", o)
	}
	n := &Network{opts: opts, log: opts.Logger, boxes: map[string]*box{}, byAddr: map[netip.Addr]*box{}}
	if err := n.load(); err != nil {
		return nil, err
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return nil, fmt.Errorf("linuxnet: enable IPv4 forwarding: %w", err)
	}

	udp, tcp, err := listenDNS(opts.ListenAddr, opts.DNSPort)
	if err != nil {
		return nil, err
	}
	pl, err := net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(netip.AddrPortFrom(opts.ListenAddr, opts.ProxyPort)))
	if err != nil {
		udp.Close()
		tcp.Close()
		return nil, fmt.Errorf("linuxnet: proxy listener: %w", err)
	}
	dnsPort := uint16(udp.LocalAddr().(*net.UDPAddr).Port)
	proxyPort := uint16(pl.Addr().(*net.TCPAddr).Port)

	n.upstream = &dnsfilter.Upstream{Addr: opts.Upstream}
	n.resolver = &dnsfilter.Resolver{Policy: n.policyFor, Upstream: n.upstream, Log: n.log, Mesh: n.meshName}
	n.proxy = &egress.Proxy{Policy: n.policyFor, LookupA: n.upstream.LookupA, Log: n.log, Internal: opts.API,
		Credentials: n.credentialsFor, Creds: &credproxy.Proxy{Roots: opts.Roots, Log: n.log}}
	if opts.API != nil {
		// The guest is .2 of its /30, the gateway (the host) .1; the name
		// resolves to the gateway and the proxy takes the connection.
		n.resolver.Internal = func(src netip.Addr) (netip.Addr, bool) { return src.Prev(), true }
	}
	n.table, err = nft.Open(nft.Config{Table: opts.Table, Pool: opts.Pool, DNSPort: dnsPort, ProxyPort: proxyPort, IngressMark: opts.IngressMark,
		MeshPool: opts.MeshPool, Tunnel: opts.MeshTunnel})
	if err == nil {
		err = n.table.Reset(n.sandboxes())
	}
	if err == nil {
		err = n.resolver.Start(udp, tcp)
	}
	if err != nil {
		udp.Close()
		tcp.Close()
		pl.Close()
		if n.table != nil {
			n.table.Close()
		}
		return nil, fmt.Errorf("linuxnet: %w", err)
	}
	go n.proxy.Serve(pl)
	return n, nil
}

var _ network.Checker = (*Network)(nil)

// Check implements network.Checker: every attached sandbox's firewall is
// in force in the kernel. When it is not (the table, a chain or a jump
// removed on the host), Check puts the whole table back as it should be
// and still reports what it found, so the gap is seen.
func (n *Network) Check(ctx context.Context) error {
	n.mu.Lock() // (no attach or detach meanwhile)
	defer n.mu.Unlock()
	taps := make([]string, 0, len(n.boxes))
	for _, b := range n.boxes {
		taps = append(taps, b.Tap)
	}
	err := n.table.Check(taps)
	if err == nil {
		return nil
	}
	n.log.Warn("the sandboxes' firewall was altered on the host; putting it back", "err", err)
	if rerr := n.table.Reset(n.sandboxes()); rerr != nil {
		return fmt.Errorf("linuxnet: %w; putting it back failed: %w", err, rerr)
	}
	return fmt.Errorf("linuxnet: %w (put back)", err)
}

// Close stops the resolver and proxy (cutting proxied connections). Taps
// and nftables rules stay in force for running VMs.
func (n *Network) Close() error {
	return errors.Join(n.resolver.Close(), n.proxy.Close(), n.table.Close())
}

// Destroy detaches every sandbox, deletes the table and closes n.
func (n *Network) Destroy(ctx context.Context) error {
	err := n.Prune(ctx, nil)
	return errors.Join(err, n.table.Delete(), n.Close())
}

var idRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Attach implements network.Network.
func (n *Network) Attach(ctx context.Context, id string, policy *firewall.Policy) (*network.Attachment, error) {
	if !idRE.MatchString(id) {
		return nil, fmt.Errorf("linuxnet: bad sandbox id %q", id)
	}
	p, err := normalized(policy)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	b, existed := n.boxes[id]
	if !existed {
		slot, err := n.freeSlot()
		if err != nil {
			return nil, err
		}
		b = &box{ID: id, Slot: slot, Tap: TapName(id), MAC: MAC(id)}
	}
	old := b.Policy
	n.setPolicy(b, p)
	undo := func() {
		if existed {
			n.setPolicy(b, old)
			n.save(b)
			return
		}
		n.table.Remove(b.Tap)
		deleteLink(b.Tap)
		os.Remove(n.statePath(id))
	}
	if err := n.save(b); err != nil {
		undo()
		return nil, err
	}
	// The policy goes in before the interface exists: no window of open
	// network.
	if err := n.table.Put(n.sandbox(b)); err != nil {
		undo()
		return nil, err
	}
	gw, guest := n.addrs(b.Slot)
	if err := n.ensureLink(b.Tap, gw); err != nil {
		undo()
		return nil, err
	}
	if b.Mesh != nil {
		// (Re-attached after a restart: its routes, as SetMesh made them.)
		if err := n.meshRoutes(b, nil, b.Mesh); err != nil {
			undo()
			return nil, err
		}
	}
	n.boxes[id] = b
	n.pmu.Lock()
	n.byAddr[guest] = b
	n.pmu.Unlock()
	if existed {
		n.cut(b)
	}
	return n.attachment(b), nil
}

// attachment is what b's VM gets.
func (n *Network) attachment(b *box) *network.Attachment {
	gw, guest := n.addrs(b.Slot)
	cmdline := Cmdline(gw, guest, b.MAC)
	if m := b.Mesh; m != nil {
		cmdline += " " + layout.ParamMesh + "=" + netip.PrefixFrom(m.Addr, m.Project.Bits()).String()
	}
	return &network.Attachment{Tap: b.Tap, MAC: b.MAC, Cmdline: cmdline}
}

var _ network.Mesher = (*Network)(nil)

// SetMesh implements network.Mesher: the mesh's rules go into the
// sandbox's chains (nft.Mesh), and the host routes its mesh address to
// its tap, with a fixed neighbour entry (the guest's MAC), so that what
// the guest answers to ARP changes nothing.
func (n *Network) SetMesh(ctx context.Context, id string, m *network.Mesh) (*network.Attachment, error) {
	if m != nil {
		if err := m.Validate(); err != nil {
			return nil, err
		}
		if m.Project.Overlaps(n.opts.Pool) {
			return nil, fmt.Errorf("linuxnet: mesh range %s overlaps the address pool %s", m.Project, n.opts.Pool)
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	b, ok := n.boxes[id]
	if !ok {
		return nil, fmt.Errorf("linuxnet: sandbox %s is not attached", id)
	}
	for _, o := range n.boxes {
		if o != b && m != nil && o.Mesh != nil && o.Mesh.Addr == m.Addr {
			return nil, fmt.Errorf("linuxnet: mesh address %s is sandbox %s's", m.Addr, o.ID)
		}
	}
	old := b.Mesh
	n.setMesh(b, m)
	if err := n.table.Put(n.sandbox(b)); err != nil {
		n.setMesh(b, old)
		return nil, err
	}
	if err := n.meshRoutes(b, old, m); err != nil {
		return nil, err
	}
	if err := n.save(b); err != nil {
		return nil, err
	}
	return n.attachment(b), nil
}

func (n *Network) setMesh(b *box, m *network.Mesh) {
	n.pmu.Lock()
	b.Mesh = m
	n.pmu.Unlock()
}

// meshRoutes moves b's host routes from mesh old to mesh m (either nil):
// its mesh address through its tap, with a neighbour entry that pins its
// MAC (so that what the guest answers to ARP changes nothing), and its
// project's range unreachable but for those addresses, while any sandbox
// here is on it (an address no sandbox has goes nowhere, not out the
// uplink). The caller holds n.mu.
func (n *Network) meshRoutes(b *box, old, m *network.Mesh) error {
	if old != nil && (m == nil || old.Addr != m.Addr || old.Project != m.Project) {
		n.dropMeshRoutes(b, old)
	}
	if m == nil {
		return nil
	}
	link, err := netlink.LinkByName(b.Tap)
	if err != nil {
		return fmt.Errorf("linuxnet: mesh route: %w", err)
	}
	mac, err := net.ParseMAC(b.MAC)
	if err != nil {
		return err
	}
	dst := ipNet(netip.PrefixFrom(m.Addr, 32))
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT, IP: dst.IP, HardwareAddr: mac}); err != nil {
		return fmt.Errorf("linuxnet: mesh neighbour of %s: %w", b.ID, err)
	}
	if err := netlink.RouteReplace(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("linuxnet: mesh route of %s: %w", b.ID, err)
	}
	if err := netlink.RouteReplace(&netlink.Route{Dst: ipNet(m.Project), Type: unix.RTN_UNREACHABLE}); err != nil {
		return fmt.Errorf("linuxnet: mesh range %s: %w", m.Project, err)
	}
	return nil
}

// dropMeshRoutes removes b's routes for mesh m (those its tap holds go
// with it), and m's range's once no other sandbox here is on it.
func (n *Network) dropMeshRoutes(b *box, m *network.Mesh) {
	dst := ipNet(netip.PrefixFrom(m.Addr, 32))
	if link, err := netlink.LinkByName(b.Tap); err == nil {
		netlink.NeighDel(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: unix.AF_INET, IP: dst.IP})
		netlink.RouteDel(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Scope: netlink.SCOPE_LINK})
	}
	for _, o := range n.boxes {
		if o != b && o.Mesh != nil && o.Mesh.Project == m.Project {
			return
		}
	}
	if err := netlink.RouteDel(&netlink.Route{Dst: ipNet(m.Project), Type: unix.RTN_UNREACHABLE}); err != nil && !errors.Is(err, unix.ESRCH) {
		n.log.Warn("linuxnet: cannot remove a mesh range's route", "range", m.Project, "err", err)
	}
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// SetMeshNames implements network.Mesher.
func (n *Network) SetMeshNames(lookup func(ctx context.Context, sandboxID, name string) (netip.Addr, bool)) {
	n.meshNames.Store(&lookup)
}

// meshName is the resolver's view of the mesh: the address of name for
// the mesh sandbox whose guest address is src.
func (n *Network) meshName(src netip.Addr, name string) (netip.Addr, bool) {
	f := n.meshNames.Load()
	n.pmu.RLock()
	b, ok := n.byAddr[src]
	onMesh := ok && b.Mesh != nil
	n.pmu.RUnlock()
	if f == nil || !onMesh {
		return netip.Addr{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return (*f)(ctx, b.ID, name)
}

// SetPolicy implements network.Network.
func (n *Network) SetPolicy(ctx context.Context, id string, policy *firewall.Policy) error {
	if policy == nil {
		return &firewall.Error{Msg: "no policy"}
	}
	p, err := normalized(policy)
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	b, ok := n.boxes[id]
	if !ok {
		return fmt.Errorf("linuxnet: sandbox %s is not attached", id)
	}
	old := b.Policy
	n.setPolicy(b, p)
	if err := n.table.Put(n.sandbox(b)); err != nil {
		n.setPolicy(b, old) // the transaction failed: the old rules are in force
		return err
	}
	if err := n.save(b); err != nil {
		n.log.Error("linuxnet: policy in force but not saved", "id", id, "err", err)
	}
	n.cut(b)
	return nil
}

// Detach implements network.Network.
func (n *Network) Detach(ctx context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.detach(id)
}

func (n *Network) detach(id string) error {
	tap := TapName(id)
	var errs []error
	if err := n.table.Remove(tap); err != nil {
		errs = append(errs, err)
	}
	if err := deleteLink(tap); err != nil {
		errs = append(errs, err)
	}
	if b, ok := n.boxes[id]; ok {
		_, guest := n.addrs(b.Slot)
		if b.Mesh != nil {
			n.dropMeshRoutes(b, b.Mesh)
		}
		delete(n.boxes, id)
		n.pmu.Lock()
		delete(n.byAddr, guest)
		n.pmu.Unlock()
		n.proxy.Recheck(guest) // no policy: cuts everything
		deleteFlows(guest, func(netlink.ConntrackFlow) bool { return true })
		// And the host's own connections to it (the ingress's).
		b.closeDialed()
		netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, toGuest(guest))
	}
	if err := os.Remove(n.statePath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Prune implements network.Network: it detaches every sandbox not in
// keep, and removes table chains no sandbox owns.
func (n *Network) Prune(ctx context.Context, keep []string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []error
	owned := map[string]bool{}
	for id, b := range n.boxes {
		if slices.Contains(keep, id) {
			owned[b.Tap] = true
			continue
		}
		n.log.Info("linuxnet: pruning sandbox network", "id", id)
		if err := n.detach(id); err != nil {
			errs = append(errs, err)
		}
	}
	taps, err := n.table.Taps()
	if err != nil {
		errs = append(errs, err)
	}
	for _, tap := range taps {
		if !owned[tap] {
			errs = append(errs, n.table.Remove(tap), deleteLink(tap))
		}
	}
	return errors.Join(errs...)
}

// Addr returns a sandbox's guest and gateway addresses.
func (n *Network) Addr(id string) (guest, gateway netip.Addr, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	b, ok := n.boxes[id]
	if !ok {
		return netip.Addr{}, netip.Addr{}, false
	}
	gateway, guest = n.addrs(b.Slot)
	return guest, gateway, true
}

// Cmdline is the kernel command line that tells the guest agent its
// network (see agent/layout).
func Cmdline(gw, guest netip.Addr, mac string) string {
	return fmt.Sprintf("%s=%s/30 %s=%s %s=%s %s=%s", layout.ParamIP, guest, layout.ParamGateway, gw, layout.ParamDNS, gw, layout.ParamMAC, mac)
}

// Traffic implements network.Meter from the tap's counters: what the
// guest sent is what the tap received (to the internet and to the host's
// services alike, denied packets too) but what it sent over its mesh
// (the mesh is not egress), and what it received is what the tap sent.
func (n *Network) Traffic(sandboxID string) (sent, received uint64, err error) {
	tap := TapName(sandboxID)
	l, err := netlink.LinkByName(tap)
	if err != nil {
		return 0, 0, fmt.Errorf("linuxnet: traffic of %s: %w", sandboxID, err)
	}
	st := l.Attrs().Statistics
	if st == nil {
		return 0, 0, fmt.Errorf("linuxnet: traffic of %s: the tap has no statistics", sandboxID)
	}
	// (Under n.mu: the table's netlink connection takes one change or
	// query at a time.)
	n.mu.Lock()
	meshBytes, meshPackets, _, err := n.table.MeshCounted(tap)
	n.mu.Unlock()
	if err != nil {
		return 0, 0, fmt.Errorf("linuxnet: traffic of %s: %w", sandboxID, err)
	}
	// (The tap counts Ethernet frames, the counter IP packets.)
	mesh := meshBytes + meshPackets*ethHeader
	return st.RxBytes - min(mesh, st.RxBytes), st.TxBytes, nil
}

// ethHeader is what a frame on a tap has before its IP packet.
const ethHeader = 14

// TapName derives a sandbox's tap name: "hb" and 12 characters of a hash
// of its ID (14 < IFNAMSIZ).
func TapName(id string) string {
	h := sha256.Sum256([]byte("tap:" + id))
	return "hb" + strings.ToLower(base32.StdEncoding.EncodeToString(h[:]))[:12]
}

// MAC derives the guest NIC's MAC: locally administered, unicast.
func MAC(id string) string {
	h := sha256.Sum256([]byte("mac:" + id))
	return net.HardwareAddr{0x02, h[0], h[1], h[2], h[3], h[4]}.String()
}

func (n *Network) setPolicy(b *box, p *firewall.Policy) {
	n.pmu.Lock()
	b.Policy = p
	n.pmu.Unlock()
}

func normalized(p *firewall.Policy) (*firewall.Policy, error) {
	if p == nil {
		return firewall.Default(), nil
	}
	q := p.Clone()
	if err := q.Normalize(); err != nil {
		return nil, err
	}
	return q, nil
}

// addrs returns the gateway (.1) and guest (.2) of a slot's /30.
func (n *Network) addrs(slot int) (gw, guest netip.Addr) {
	base := n.opts.Pool.Addr().As4()
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v += uint32(slot) * 4
	a := func(x uint32) netip.Addr {
		return netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
	}
	return a(v + 1), a(v + 2)
}

func (n *Network) freeSlot() (int, error) {
	used := map[int]bool{}
	for _, b := range n.boxes {
		used[b.Slot] = true
	}
	limit := 1 << (30 - n.opts.Pool.Bits())
	for s := range limit {
		if !used[s] {
			return s, nil
		}
	}
	return 0, fmt.Errorf("linuxnet: address pool %s is full", n.opts.Pool)
}

func (n *Network) sandbox(b *box) nft.Sandbox {
	gw, guest := n.addrs(b.Slot)
	sb := nft.Sandbox{Tap: b.Tap, Addr: guest, Gateway: gw, Policy: b.Policy, Blocked: n.blockedNow(true), Exposed: b.Exposed}
	if m := b.Mesh; m != nil {
		sb.Mesh = &nft.Mesh{Addr: m.Addr, Project: m.Project, Rules: m.Rules, Deny: m.Deny}
	}
	return sb
}

func (n *Network) sandboxes() []nft.Sandbox {
	var out []nft.Sandbox
	for _, b := range n.boxes {
		out = append(out, n.sandbox(b))
	}
	return out
}

// SetCredentials gives the proxy each sandbox's credentials (the engine
// holds them): connections to the names they cover get the real values.
func (n *Network) SetCredentials(f func(sandboxID string) *credproxy.Sandbox) {
	n.creds.Store(&f)
}

func (n *Network) credentialsFor(src netip.Addr) *credproxy.Sandbox {
	f := n.creds.Load()
	if f == nil {
		return nil
	}
	n.pmu.RLock()
	b, ok := n.byAddr[src]
	n.pmu.RUnlock()
	if !ok {
		return nil
	}
	return (*f)(b.ID)
}

// policyFor is the resolver's and proxy's view: which sandbox owns src.
func (n *Network) policyFor(src netip.Addr) (*firewall.Policy, firewall.Blocked, bool) {
	n.pmu.RLock()
	b, ok := n.byAddr[src]
	var p *firewall.Policy
	if ok {
		p = b.Policy
	}
	n.pmu.RUnlock()
	if !ok {
		return nil, nil, false
	}
	return p, n.blockedNow(false), true
}

// blockedNow returns the internal ranges: the fixed ones, the private
// ranges, the pool and the host's own addresses (re-read at most every few
// seconds unless fresh is set).
func (n *Network) blockedNow(fresh bool) firewall.Blocked {
	n.blockedMu.Lock()
	defer n.blockedMu.Unlock()
	if !fresh && time.Now().Before(n.blockedUntil) {
		return n.blocked
	}
	b := append(firewall.AlwaysInternal(), n.opts.Private...)
	b = append(b, n.opts.Pool)
	if addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4); err == nil {
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && !firewall.Blocked(b).Contains(ip) {
				b = append(b, netip.PrefixFrom(ip, 32))
			}
		}
	} else {
		n.log.Warn("linuxnet: cannot list host addresses", "err", err)
	}
	n.blocked, n.blockedUntil = b, time.Now().Add(5*time.Second)
	return b
}

// cut ends b's open connections its policy no longer allows: proxied ones
// in the proxy, direct ones by deleting their conntrack entries (the next
// packet is then checked against the new rules and rejected).
func (n *Network) cut(b *box) {
	_, guest := n.addrs(b.Slot)
	n.proxy.Recheck(guest)
	blocked := n.blockedNow(false)
	deleteFlows(guest, func(f netlink.ConntrackFlow) bool {
		dst, _ := netip.AddrFromSlice(f.Forward.DstIP.To4())
		if rsrc, _ := netip.AddrFromSlice(f.Reverse.SrcIP.To4()); rsrc != dst {
			return false // redirected to the resolver or proxy
		}
		c := firewall.Conn{Port: f.Forward.DstPort, Addr: dst}
		switch f.Forward.Protocol {
		case unix.IPPROTO_TCP:
			c.Proto = firewall.TCP
		case unix.IPPROTO_UDP:
			c.Proto = firewall.UDP
		case unix.IPPROTO_ICMP:
			c.Proto = firewall.ICMP
		default:
			return true
		}
		return !b.Policy.Decide(blocked, c).Allow
	})
}

type flowFilter struct {
	src   net.IP
	match func(netlink.ConntrackFlow) bool
}

func (f flowFilter) MatchConntrackFlow(fl *netlink.ConntrackFlow) bool {
	return fl.Forward.SrcIP.Equal(f.src) && f.match(*fl)
}

func deleteFlows(src netip.Addr, match func(netlink.ConntrackFlow) bool) {
	netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, flowFilter{src: src.AsSlice(), match: match})
}

// --- links ---

func newTap(name string) error {
	tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: name}, Mode: netlink.TUNTAP_MODE_TAP,
		Flags: netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR}
	if err := netlink.LinkAdd(tap); err != nil {
		return fmt.Errorf("linuxnet: create tap %s: %w", name, err)
	}
	return nil
}

// ensureLink makes the sandbox's host interface if it is missing and
// gives it the gateway address, without IPv6.
func (n *Network) ensureLink(name string, gw netip.Addr) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		if err := n.opts.newLink(name); err != nil {
			return err
		}
		if l, err = netlink.LinkByName(name); err != nil {
			return fmt.Errorf("linuxnet: %s: %w", name, err)
		}
	}
	// No IPv6 on the link at all: no link-local address, no router
	// solicitations; the table drops IPv6 too.
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("linuxnet: disable IPv6 on %s: %w", name, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: gw.AsSlice(), Mask: net.CIDRMask(30, 32)}}
	if err := netlink.AddrReplace(l, addr); err != nil {
		return fmt.Errorf("linuxnet: address %s on %s: %w", gw, name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("linuxnet: up %s: %w", name, err)
	}
	return nil
}

func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("linuxnet: %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("linuxnet: delete %s: %w", name, err)
	}
	return nil
}

// --- state ---

func (n *Network) statePath(id string) string { return filepath.Join(n.opts.StateDir, id+".json") }

func (n *Network) save(b *box) error {
	data, err := json.Marshal(b)
	if err != nil {
		return err
	}
	tmp := n.statePath(b.ID) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("linuxnet: %w", err)
	}
	if err := os.Rename(tmp, n.statePath(b.ID)); err != nil {
		return fmt.Errorf("linuxnet: %w", err)
	}
	return nil
}

func (n *Network) load() error {
	files, err := filepath.Glob(filepath.Join(n.opts.StateDir, "*.json"))
	if err != nil {
		return err
	}
	limit := 1 << (30 - n.opts.Pool.Bits())
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("linuxnet: %w", err)
		}
		var b box
		if err := json.Unmarshal(data, &b); err != nil || !idRE.MatchString(b.ID) || b.Tap != TapName(b.ID) || b.Slot < 0 || b.Slot >= limit || b.Policy == nil {
			n.log.Warn("linuxnet: ignoring bad state file", "file", f, "err", err)
			continue
		}
		if err := b.Policy.Normalize(); err != nil {
			n.log.Warn("linuxnet: bad policy in state; denying all", "file", f, "err", err)
			b.Policy = firewall.DenyAll()
		}
		_, guest := n.addrs(b.Slot)
		if _, dup := n.byAddr[guest]; dup {
			n.log.Warn("linuxnet: ignoring state with a taken slot", "file", f)
			continue
		}
		n.boxes[b.ID] = &b
		n.byAddr[guest] = &b
	}
	return nil
}

// --- listeners ---

// listenDNS binds UDP and TCP on the same port (port 0: a free one).
func listenDNS(addr netip.Addr, port uint16) (*net.UDPConn, *net.TCPListener, error) {
	for range 20 {
		u, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, port)))
		if err != nil {
			return nil, nil, fmt.Errorf("linuxnet: resolver listener: %w", err)
		}
		p := u.LocalAddr().(*net.UDPAddr).Port
		t, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: addr.AsSlice(), Port: p})
		if err == nil {
			return u, t, nil
		}
		u.Close()
		if port != 0 {
			return nil, nil, fmt.Errorf("linuxnet: resolver listener: %w", err)
		}
	}
	return nil, nil, errors.New("linuxnet: no free port for the resolver")
}

// systemResolver returns the first nameserver of a resolv.conf.
func systemResolver(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("linuxnet: no Upstream and %w", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil && a.Is4() {
				return netip.AddrPortFrom(a, 53).String(), nil
			}
		}
	}
	return "", fmt.Errorf("linuxnet: no IPv4 nameserver in %s; set Upstream", path)
}
