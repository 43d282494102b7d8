// Package wgtunnel keeps this host's end of the mesh's tunnels: one
// WireGuard device (wireguard-go, in user space, for kernels without
// WireGuard) whose peers are the deployment's other hosts, each allowed
// exactly the mesh addresses of its own sandboxes, and a host route into
// the device for each of those addresses.
//
// What it guarantees: everything between two hosts' sandboxes crosses the
// underlay as WireGuard's UDP (ChaCha20-Poly1305, keys agreed with Noise
// IK); a packet that comes out of the device has a source address its
// sending host serves (WireGuard's cryptokey routing drops the rest).
// What it does not decide: which sandbox may talk to which. The host's
// nftables (firewall/nft) does, at each sandbox's tap and for the device
// itself (nothing from it reaches the host or leaves for anywhere but a
// sandbox here).
//
// The private key is made here, kept sealed in a file (Options.KeyFile,
// under Options.Seal), and never leaves the host; Rotate replaces it.
package wgtunnel

import (
	"bufio"
	"bytes"
	"crypto/cipher"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/harebox/harebox/internal/inns"
	"github.com/harebox/harebox/secrets"
)

// DefaultName is the device's name when Options.Name is empty.
const DefaultName = "hb-mesh"

// DefaultMTU leaves room for WireGuard's 60 bytes (IPv4 underlay) in a
// 1,500-byte link, with 20 to spare for an IPv6 underlay.
const DefaultMTU = 1420

// keepalive (seconds) keeps each tunnel's session up. Setting it on a
// new peer also starts a handshake at once: a host that restarted or
// rotated its key is reached again without waiting for its peers'
// sessions to time out. Of two hosts that add each other at one moment
// (as both do on the same change in the store), the one with the lower
// public key sets it at once and the other after kickDelay, if it has not
// already: two initiations that cross leave both sides waiting for
// WireGuard's retry, 5 s later.
const keepalive = 25

const kickDelay = time.Second

// maxPeers bounds a peer list (the deployment's hosts).
const maxPeers = 1024

// Options configure Open.
type Options struct {
	// Name is the device's interface name; default DefaultName.
	Name string
	// Port is the UDP port the tunnels arrive on (all addresses). Required.
	Port uint16
	// KeyFile keeps the private key, sealed under Seal; made on first use.
	KeyFile string
	// Seal encrypts the key file (the host's master key).
	Seal cipher.AEAD
	// MTU of the device; default DefaultMTU.
	MTU    int
	Logger *slog.Logger
}

// Peer is another host's end: its public key, where its tunnels arrive
// and the mesh addresses its sandboxes hold.
type Peer struct {
	PublicKey wgtypes.Key
	Endpoint  netip.AddrPort
	Allowed   []netip.Prefix
}

// Status is what the device knows of a peer.
type Status struct {
	PublicKey        wgtypes.Key
	Endpoint         string
	LastHandshake    time.Time // zero: none yet
	RxBytes, TxBytes uint64
	Allowed          []netip.Prefix
}

// Tunnel is this host's WireGuard device.
type Tunnel struct {
	o    Options
	log  *slog.Logger
	dev  *device.Device
	tun  tun.Device
	nl   *netlink.Handle // of the network namespace Open ran in
	ns   netns.NsHandle  // that namespace, for the device's sockets
	link int

	mu     sync.Mutex
	closed bool
	key    wgtypes.Key
	peers  map[wgtypes.Key]Peer
	kept   map[wgtypes.Key]bool // keepalive set
	routes map[netip.Prefix]bool
}

// Open makes the device, brings it up with the key from Options.KeyFile
// (made and sealed if there is none) and no peers. Everything it makes
// lives in the network namespace of the calling thread.
func Open(o Options) (_ *Tunnel, err error) {
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.MTU == 0 {
		o.MTU = DefaultMTU
	}
	if o.Port == 0 || o.KeyFile == "" || o.Seal == nil {
		return nil, errors.New("wgtunnel: Port, KeyFile and Seal are required")
	}
	if len(o.Name) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("wgtunnel: interface name %q is too long", o.Name)
	}
	t := &Tunnel{o: o, log: o.Logger, ns: netns.None(), peers: map[wgtypes.Key]Peer{}, kept: map[wgtypes.Key]bool{}, routes: map[netip.Prefix]bool{}}
	if t.log == nil {
		t.log = slog.Default()
	}
	if t.key, err = t.loadKey(); err != nil {
		return nil, err
	}
	if t.ns, err = netns.Get(); err != nil {
		return nil, fmt.Errorf("wgtunnel: network namespace: %w", err)
	}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	if t.nl, err = netlink.NewHandle(); err != nil {
		return nil, fmt.Errorf("wgtunnel: netlink: %w", err)
	}
	if t.tun, err = tun.CreateTUN(o.Name, o.MTU); err != nil {
		return nil, fmt.Errorf("wgtunnel: create %s: %w", o.Name, err)
	}
	logf := func(format string, args ...any) { t.log.Debug("wgtunnel: " + fmt.Sprintf(format, args...)) }
	t.dev = device.NewDevice(t.tun, t.bind(), &device.Logger{Verbosef: logf, Errorf: logf})
	if err := t.dev.IpcSet(fmt.Sprintf("private_key=%s\nlisten_port=%d\n", hexKey(t.key), o.Port)); err != nil {
		return nil, fmt.Errorf("wgtunnel: configure: %w", err)
	}
	if err := t.dev.Up(); err != nil {
		return nil, fmt.Errorf("wgtunnel: up: %w", err)
	}
	link, err := t.nl.LinkByName(o.Name)
	if err != nil {
		return nil, fmt.Errorf("wgtunnel: %w", err)
	}
	t.link = link.Attrs().Index
	if err := t.nl.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("wgtunnel: up %s: %w", o.Name, err)
	}
	return t, nil
}

// Name is the device's interface name.
func (t *Tunnel) Name() string { return t.o.Name }

// PublicKey is this host's public key, as peers must know it.
func (t *Tunnel) PublicKey() wgtypes.Key {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.key.PublicKey()
}

// SetPeers makes the device's peers exactly ps: a peer gone is removed
// (with its routes), one new is added, one changed gets its endpoint and
// addresses; a peer unchanged keeps its session. A peer whose key
// changed (rotated) is a new peer.
func (t *Tunnel) SetPeers(ps []Peer) error {
	if len(ps) > maxPeers {
		return fmt.Errorf("wgtunnel: %d peers, at most %d", len(ps), maxPeers)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	want := map[wgtypes.Key]Peer{}
	owner := map[netip.Prefix]wgtypes.Key{}
	self := t.key.PublicKey()
	for _, p := range ps {
		if p.PublicKey == self || p.PublicKey == (wgtypes.Key{}) {
			return fmt.Errorf("wgtunnel: peer key %s is not another host's", p.PublicKey)
		}
		if _, dup := want[p.PublicKey]; dup {
			return fmt.Errorf("wgtunnel: peer %s twice", p.PublicKey)
		}
		if !p.Endpoint.IsValid() || p.Endpoint.Port() == 0 {
			return fmt.Errorf("wgtunnel: peer %s: bad endpoint %s", p.PublicKey, p.Endpoint)
		}
		p.Allowed = slices.Clone(p.Allowed)
		for i, a := range p.Allowed {
			if !a.IsValid() || a.Masked() != a {
				return fmt.Errorf("wgtunnel: peer %s: bad address %s", p.PublicKey, a)
			}
			if o, dup := owner[a]; dup {
				return fmt.Errorf("wgtunnel: %s is both %s's and %s's", a, o, p.PublicKey)
			}
			owner[a] = p.PublicKey
			p.Allowed[i] = a
		}
		slices.SortFunc(p.Allowed, func(a, b netip.Prefix) int { return strings.Compare(a.String(), b.String()) })
		want[p.PublicKey] = p
	}
	// Removals first: an address that moves to another peer is free for it.
	var b strings.Builder
	for k := range t.peers {
		if _, ok := want[k]; !ok {
			fmt.Fprintf(&b, "public_key=%s\nremove=true\n", hexKey(k))
			delete(t.kept, k)
		}
	}
	later := false
	for k, p := range want {
		old, ok := t.peers[k]
		if ok && old.Endpoint == p.Endpoint && slices.Equal(old.Allowed, p.Allowed) {
			continue
		}
		fmt.Fprintf(&b, "public_key=%s\nendpoint=%s\nreplace_allowed_ips=true\n", hexKey(k), p.Endpoint)
		for _, a := range p.Allowed {
			fmt.Fprintf(&b, "allowed_ip=%s\n", a)
		}
		switch {
		case t.kept[k]:
		case bytes.Compare(self[:], k[:]) < 0:
			fmt.Fprintf(&b, "persistent_keepalive_interval=%d\n", keepalive)
			t.kept[k] = true
		default:
			later = true
		}
	}
	if b.Len() > 0 {
		if err := t.dev.IpcSet(b.String()); err != nil {
			return fmt.Errorf("wgtunnel: set peers: %w", err)
		}
	}
	t.peers = want
	if later {
		time.AfterFunc(kickDelay, t.kick)
	}
	return t.syncRoutes(owner)
}

// kick sets the keepalive on the peers that have none yet.
func (t *Tunnel) kick() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	var b strings.Builder
	for k := range t.peers {
		if !t.kept[k] {
			fmt.Fprintf(&b, "public_key=%s\nupdate_only=true\npersistent_keepalive_interval=%d\n", hexKey(k), keepalive)
			t.kept[k] = true
		}
	}
	if b.Len() > 0 {
		if err := t.dev.IpcSet(b.String()); err != nil {
			t.log.Warn("wgtunnel: keepalive", "err", err)
		}
	}
}

// syncRoutes routes exactly the peers' addresses into the device. The
// caller holds t.mu.
func (t *Tunnel) syncRoutes(want map[netip.Prefix]wgtypes.Key) error {
	var errs []error
	for p := range t.routes {
		if _, ok := want[p]; !ok {
			if err := t.nl.RouteDel(t.route(p)); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("wgtunnel: route %s: %w", p, err))
				continue
			}
			delete(t.routes, p)
		}
	}
	for p := range want {
		if t.routes[p] {
			continue
		}
		if err := t.nl.RouteReplace(t.route(p)); err != nil {
			errs = append(errs, fmt.Errorf("wgtunnel: route %s: %w", p, err))
			continue
		}
		t.routes[p] = true
	}
	return errors.Join(errs...)
}

func (t *Tunnel) route(p netip.Prefix) *netlink.Route {
	return &netlink.Route{LinkIndex: t.link, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
}

// Rotate makes a new private key, seals it in place of the old one and
// uses it. Sessions made with the old key end; each peer must be given
// the new public key (it is a new peer to them) before a new one starts,
// which takes the first retransmission after that.
func (t *Tunnel) Rotate() (wgtypes.Key, error) {
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		return wgtypes.Key{}, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.saveKey(k); err != nil {
		return wgtypes.Key{}, err
	}
	if err := t.dev.IpcSet("private_key=" + hexKey(k) + "\n"); err != nil {
		return wgtypes.Key{}, fmt.Errorf("wgtunnel: set key: %w", err)
	}
	t.key = k
	return k.PublicKey(), nil
}

// Status reports each peer: its last handshake and the bytes through it.
func (t *Tunnel) Status() ([]Status, error) {
	s, err := t.dev.IpcGet()
	if err != nil {
		return nil, fmt.Errorf("wgtunnel: status: %w", err)
	}
	var out []Status
	var cur *Status
	var sec, nsec int64
	done := func() {
		if cur != nil {
			if sec != 0 || nsec != 0 {
				cur.LastHandshake = time.Unix(sec, nsec)
			}
			out = append(out, *cur)
		}
		sec, nsec = 0, 0
	}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		if k == "public_key" {
			done()
			cur = &Status{}
			b, err := hexDecode(v)
			if err != nil {
				return nil, err
			}
			cur.PublicKey = b
			continue
		}
		if cur == nil {
			continue
		}
		switch k {
		case "endpoint":
			cur.Endpoint = v
		case "last_handshake_time_sec":
			sec, _ = strconv.ParseInt(v, 10, 64)
		case "last_handshake_time_nsec":
			nsec, _ = strconv.ParseInt(v, 10, 64)
		case "rx_bytes":
			cur.RxBytes, _ = strconv.ParseUint(v, 10, 64)
		case "tx_bytes":
			cur.TxBytes, _ = strconv.ParseUint(v, 10, 64)
		case "allowed_ip":
			if p, err := netip.ParsePrefix(v); err == nil {
				cur.Allowed = append(cur.Allowed, p)
			}
		}
	}
	done()
	return out, sc.Err()
}

// Close removes the device (its routes go with it).
func (t *Tunnel) Close() error {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	if t.dev != nil {
		t.dev.Close() // (closes the TUN device too)
	} else if t.tun != nil {
		t.tun.Close()
	}
	if t.nl != nil {
		t.nl.Close()
	}
	if t.ns.IsOpen() {
		t.ns.Close()
	}
	return nil
}

// bind is the device's UDP sockets, opened in the tunnel's network
// namespace. The device opens them again whenever it goes down and up,
// which its TUN's watcher does from a goroutine on whatever thread (the
// link reported down, then up). In the namespace the process started in
// (hareboxd's, whose threads never leave it) that is the standard bind,
// which the device also watches routes for; in any other (a test host's,
// entered by one thread of the process) an nsBind, which opens them
// there from whatever thread asks.
func (t *Tunnel) bind() conn.Bind {
	std := conn.NewDefaultBind()
	if startNS.IsOpen() && startNS.Equal(t.ns) {
		return std
	}
	return nsBind{Bind: std, ns: t.ns}
}

// startNS is the network namespace this process started in, taken before
// main runs (and before any of its threads could enter another).
var startNS, _ = netns.Get()

// nsBind opens its sockets in the network namespace ns, on a thread of
// their own (inns.In).
type nsBind struct {
	conn.Bind
	ns netns.NsHandle
}

func (b nsBind) Open(port uint16) (fns []conn.ReceiveFunc, actual uint16, err error) {
	if nsErr := inns.In(b.ns, func() { fns, actual, err = b.Bind.Open(port) }); nsErr != nil {
		return nil, 0, fmt.Errorf("wgtunnel: enter the tunnel's network namespace: %w", nsErr)
	}
	return fns, actual, err
}

// keyAD binds the sealed key to its purpose.
const keyAD = "harebox mesh tunnel private key"

func (t *Tunnel) loadKey() (wgtypes.Key, error) {
	b, err := os.ReadFile(t.o.KeyFile)
	if errors.Is(err, os.ErrNotExist) {
		k, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			return k, err
		}
		return k, t.saveKey(k)
	}
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("wgtunnel: key: %w", err)
	}
	plain, err := secrets.OpenWith(t.o.Seal, []byte(keyAD), b)
	if errors.Is(err, secrets.ErrDamaged) {
		return wgtypes.Key{}, fmt.Errorf("wgtunnel: key file %s is damaged", t.o.KeyFile)
	}
	if err != nil || len(plain) != wgtypes.KeyLen {
		return wgtypes.Key{}, fmt.Errorf("wgtunnel: key file %s does not open under this host's master key", t.o.KeyFile)
	}
	return wgtypes.Key(plain), nil
}

// saveKey seals k into the key file, replacing it atomically.
func (t *Tunnel) saveKey(k wgtypes.Key) error {
	sealed, err := secrets.SealWith(t.o.Seal, []byte(keyAD), k[:])
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(t.o.KeyFile), ".mesh-key-*")
	if err != nil {
		return fmt.Errorf("wgtunnel: save key: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(sealed)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), t.o.KeyFile)
	}
	if err != nil {
		return fmt.Errorf("wgtunnel: save key: %w", err)
	}
	return nil
}

// hexKey is a key as WireGuard's configuration protocol writes it.
func hexKey(k wgtypes.Key) string { return hex.EncodeToString(k[:]) }

func hexDecode(s string) (wgtypes.Key, error) {
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != wgtypes.KeyLen {
		return wgtypes.Key{}, fmt.Errorf("wgtunnel: bad key %q", s)
	}
	return wgtypes.Key(b), nil
}
