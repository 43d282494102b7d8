package mesh

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/harebox/harebox/network/wgtunnel"
	"github.com/harebox/harebox/store"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// NoticeTopic is the store notice of a change to the mesh between hosts:
// a sandbox joined or left (payload ""), a host's key or endpoint
// changed (""), or an operator asked host NAME to rotate its key
// ("rotate NAME"). Every host reconciles its tunnels on it.
const NoticeTopic = "mesh"

// DefaultInterval is how often a host reconciles its tunnels and reports
// them when no notice comes.
const DefaultInterval = 10 * time.Second

// Tunnel is this host's end of the tunnels to the other hosts
// (network/wgtunnel.Tunnel).
type Tunnel interface {
	PublicKey() wgtypes.Key
	SetPeers([]wgtunnel.Peer) error
	Rotate() (wgtypes.Key, error)
	Status() ([]wgtunnel.Status, error)
}

// TunnelTx is what reconciling writes in a transaction.
type TunnelTx interface {
	GetHost(ctx context.Context, name string) (*store.Host, error)
	PutHost(ctx context.Context, h *store.Host) error
	Notify(ctx context.Context, topic, payload string) error
}

// TunnelStore is what the tunnels read and write.
type TunnelStore interface {
	Update(ctx context.Context, fn func(tx TunnelTx) error) error
	ListHosts(ctx context.Context) ([]*store.Host, error)
	MeshAddressesByHost(ctx context.Context) (map[string][]string, error)
}

// TunnelOptions configure Tunnels.
type TunnelOptions struct {
	Store TunnelStore
	// Host is this host's name (its row in the store, registered).
	Host string
	// Endpoint is where the other hosts reach this host's tunnel: an
	// address of its own on the underlay and the tunnel's UDP port.
	Endpoint netip.AddrPort
	Tunnel   Tunnel
	// Pool is the mesh's address space: a peer is given its addresses in
	// it only.
	Pool     netip.Prefix
	Interval time.Duration // default DefaultInterval
	Log      *slog.Logger
}

// Tunnels keeps this host's tunnels to the deployment's other hosts in
// step with the store: each host's public key and endpoint as it
// published them, each given exactly the mesh addresses of its own
// sandboxes. It reconciles on every notice (NoticeTopic) and every
// Interval, and publishes this host's key, endpoint and tunnels.
type Tunnels struct {
	o     TunnelOptions
	nudge chan struct{}

	mu     sync.Mutex
	rotate bool // asked for, not done yet
}

// NewTunnels returns Tunnels; Run reconciles.
func NewTunnels(o TunnelOptions) (*Tunnels, error) {
	if o.Store == nil || o.Tunnel == nil || o.Host == "" || !o.Endpoint.IsValid() || o.Endpoint.Port() == 0 || !o.Pool.IsValid() {
		return nil, errors.New("mesh: tunnels need a store, a tunnel, a host name, a pool and an endpoint (ADDR:PORT)")
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Tunnels{o: o, nudge: make(chan struct{}, 1)}, nil
}

// Run reconciles until ctx ends: at once, on Changed, and every Interval.
func (t *Tunnels) Run(ctx context.Context) {
	tick := time.NewTicker(t.o.Interval)
	defer tick.Stop()
	for {
		if err := t.Reconcile(ctx); err != nil && ctx.Err() == nil {
			t.o.Log.Warn("mesh: reconciling the tunnels failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.nudge:
		case <-tick.C:
		}
	}
}

// Changed acts on a notice (NoticeTopic; "" when notices may have been
// missed): a reconcile soon, after a rotation of this host's key if the
// notice asks for one.
func (t *Tunnels) Changed(payload string) {
	if name, ok := strings.CutPrefix(payload, "rotate "); ok && name == t.o.Host {
		t.mu.Lock()
		t.rotate = true
		t.mu.Unlock()
	}
	select {
	case t.nudge <- struct{}{}:
	default:
	}
}

// AskRotate asks host name to rotate its tunnel's key (through the
// store's notices: any host may ask for any).
func AskRotate(ctx context.Context, s TunnelStore, name string) error {
	return s.Update(ctx, func(tx TunnelTx) error { return tx.Notify(ctx, NoticeTopic, "rotate "+name) })
}

// Reconcile runs one round: a rotation if asked for, the peers set from
// the store, this host's key, endpoint and tunnels published.
func (t *Tunnels) Reconcile(ctx context.Context) error {
	t.mu.Lock()
	rotate := t.rotate
	t.rotate = false
	t.mu.Unlock()
	if rotate {
		if _, err := t.o.Tunnel.Rotate(); err != nil {
			return fmt.Errorf("mesh: rotate the tunnel's key: %w", err)
		}
		t.o.Log.Info("mesh: the tunnel's key rotated", "public_key", t.o.Tunnel.PublicKey())
	}
	hosts, err := t.o.Store.ListHosts(ctx)
	if err != nil {
		return err
	}
	addrs, err := t.o.Store.MeshAddressesByHost(ctx)
	if err != nil {
		return err
	}
	// (Peers first: what is published of the tunnels is then this
	// round's.)
	return errors.Join(t.o.Tunnel.SetPeers(t.peers(hosts, addrs)), t.publish(ctx, hosts))
}

// peers are the other hosts that published a tunnel, each with its
// sandboxes' addresses in the pool. A host whose key or endpoint does not
// parse, or repeats another's (a copied data directory), is left out.
func (t *Tunnels) peers(hosts []*store.Host, addrs map[string][]string) []wgtunnel.Peer {
	self := t.o.Tunnel.PublicKey()
	seen := map[wgtypes.Key]string{self: t.o.Host}
	var out []wgtunnel.Peer
	for _, h := range hosts {
		if h.Name == t.o.Host || h.Mesh == nil {
			continue
		}
		k, err := wgtypes.ParseKey(h.Mesh.PublicKey)
		ep, eerr := netip.ParseAddrPort(h.Mesh.Endpoint)
		if err != nil || eerr != nil || ep.Port() == 0 {
			t.o.Log.Warn("mesh: a host's tunnel does not parse: left out", "host", h.Name, "public_key", h.Mesh.PublicKey, "endpoint", h.Mesh.Endpoint)
			continue
		}
		if other, dup := seen[k]; dup {
			t.o.Log.Warn("mesh: two hosts have one tunnel key: the second is left out", "host", h.Name, "other", other)
			continue
		}
		seen[k] = h.Name
		p := wgtunnel.Peer{PublicKey: k, Endpoint: ep}
		for _, s := range addrs[h.Name] {
			if a, err := netip.ParseAddr(s); err == nil && t.o.Pool.Contains(a) {
				p.Allowed = append(p.Allowed, netip.PrefixFrom(a, 32))
			}
		}
		out = append(out, p)
	}
	return out
}

// publish writes this host's key, endpoint and tunnels into its row, and
// tells the other hosts when its key or endpoint changed.
func (t *Tunnels) publish(ctx context.Context, hosts []*store.Host) error {
	byKey := map[wgtypes.Key]string{}
	for _, h := range hosts {
		if h.Mesh != nil {
			if k, err := wgtypes.ParseKey(h.Mesh.PublicKey); err == nil {
				byKey[k] = h.Name
			}
		}
	}
	st, err := t.o.Tunnel.Status()
	if err != nil {
		return err
	}
	var tunnels []store.Tunnel
	for _, s := range st {
		tunnels = append(tunnels, store.Tunnel{Host: byKey[s.PublicKey], PublicKey: s.PublicKey.String(), Endpoint: s.Endpoint,
			LastHandshake: s.LastHandshake.UTC(), RxBytes: s.RxBytes, TxBytes: s.TxBytes})
	}
	slices.SortFunc(tunnels, func(a, b store.Tunnel) int { return strings.Compare(a.Host, b.Host) })
	mine := store.HostMesh{PublicKey: t.o.Tunnel.PublicKey().String(), Endpoint: t.o.Endpoint.String(), Tunnels: tunnels, ReportedAt: time.Now().UTC()}
	return t.o.Store.Update(ctx, func(tx TunnelTx) error {
		h, err := tx.GetHost(ctx, t.o.Host)
		if err != nil {
			return fmt.Errorf("mesh: this host's row: %w", err)
		}
		changed := h.Mesh == nil || h.Mesh.PublicKey != mine.PublicKey || h.Mesh.Endpoint != mine.Endpoint
		m := mine
		h.Mesh = &m
		if err := tx.PutHost(ctx, h); err != nil {
			return err
		}
		if changed {
			return tx.Notify(ctx, NoticeTopic, "")
		}
		return nil
	})
}
