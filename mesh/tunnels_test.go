package mesh_test

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/harebox/harebox/mesh"
	"github.com/harebox/harebox/network/wgtunnel"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// tunnel records what the reconciler sets (the real device is
// network/wgtunnel's, tested there and in e2e/host).
type tunnel struct {
	mu    sync.Mutex
	key   wgtypes.Key
	peers []wgtunnel.Peer
}

func newTunnel(t *testing.T) *tunnel {
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	return &tunnel{key: k}
}

func (f *tunnel) PublicKey() wgtypes.Key {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.key.PublicKey()
}

func (f *tunnel) SetPeers(ps []wgtunnel.Peer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.peers = ps
	return nil
}

func (f *tunnel) Rotate() (wgtypes.Key, error) {
	k, err := wgtypes.GeneratePrivateKey()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.key = k
	return k.PublicKey(), err
}

func (f *tunnel) Status() ([]wgtunnel.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []wgtunnel.Status
	for _, p := range f.peers {
		out = append(out, wgtunnel.Status{PublicKey: p.PublicKey, Endpoint: p.Endpoint.String(), RxBytes: 1, TxBytes: 2})
	}
	return out, nil
}

// TestTunnels: three hosts on one store, each reconciling its own
// tunnel: each has the other two as peers, with exactly their sandboxes'
// mesh addresses; a rotation asked through the store reaches the host
// and then its peers; a host whose key repeats another's or does not
// parse is left out; a removed host is dropped.
func TestTunnels(t *testing.T) {
	ctx := context.Background()
	db := open(t)
	pool := netip.MustParsePrefix("10.240.0.0/16")
	narrow := store.Narrow(db, func(tx store.Tx) mesh.TunnelTx { return tx })
	names := []string{"a", "b", "c"}
	tuns := map[string]*tunnel{}
	recs := map[string]*mesh.Tunnels{}
	for i, n := range names {
		if err := db.PutHost(ctx, &store.Host{Name: n, Up: true}); err != nil {
			t.Fatal(err)
		}
		tuns[n] = newTunnel(t)
		r, err := mesh.NewTunnels(mesh.TunnelOptions{Store: narrow, Host: n, Tunnel: tuns[n], Pool: pool,
			Endpoint: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)}), 51820)})
		if err != nil {
			t.Fatal(err)
		}
		recs[n] = r
	}
	// Sandboxes: two on a, one on b, one on c outside the pool, one with
	// no host.
	for _, s := range []struct{ id, host, addr string }{
		{"sbx_1", "a", "10.240.0.1"}, {"sbx_2", "a", "10.240.0.2"}, {"sbx_3", "b", "10.240.0.3"}, {"sbx_4", "c", "10.99.0.4"}, {"sbx_5", "", "10.240.0.5"},
	} {
		if err := db.PutSandbox(ctx, &store.Sandbox{Sandbox: sandbox.Sandbox{ID: s.id, Host: s.host, State: sandbox.StateRunning, CreatedAt: time.Now()}}); err != nil {
			t.Fatal(err)
		}
		if err := db.AddMeshAddress(ctx, &store.MeshAddress{Addr: s.addr, ProjectID: "prj", SandboxID: s.id, Name: s.id}); err != nil {
			t.Fatal(err)
		}
	}
	reconcile := func(names ...string) {
		t.Helper()
		for _, n := range names {
			if err := recs[n].Reconcile(ctx); err != nil {
				t.Fatalf("%s: %v", n, err)
			}
		}
	}
	// peersOf is n's peers: their endpoints' last octet (the host) and
	// their addresses.
	peersOf := func(n string) map[string][]string {
		out := map[string][]string{}
		for _, p := range tuns[n].peers {
			var as []string
			for _, a := range p.Allowed {
				as = append(as, a.String())
			}
			host := names[p.Endpoint.Addr().As4()[3]-1]
			if tuns[host].PublicKey() != p.PublicKey {
				t.Errorf("%s's peer %s has key %s, not %s's", n, host, p.PublicKey, host)
			}
			out[host] = as
		}
		return out
	}
	reconcile("a", "b", "c", "a", "b") // (the first round publishes; the second sees all)
	if p := peersOf("a"); len(p) != 2 || !slices.Equal(p["b"], []string{"10.240.0.3/32"}) || p["c"] != nil {
		t.Errorf("a's peers: %v", p)
	}
	if p := peersOf("b"); len(p) != 2 || !slices.Equal(p["a"], []string{"10.240.0.1/32", "10.240.0.2/32"}) {
		t.Errorf("b's peers: %v", p)
	}
	if h, err := db.GetHost(ctx, "a"); err != nil || h.Mesh == nil || h.Mesh.PublicKey != tuns["a"].PublicKey().String() ||
		h.Mesh.Endpoint != "192.0.2.1:51820" || len(h.Mesh.Tunnels) != 2 || h.Mesh.Tunnels[0].Host != "b" || h.Mesh.Tunnels[1].TxBytes != 2 {
		t.Errorf("a's row: %+v %v", h.Mesh, err)
	}

	// A rotation asked for b, through the store: b's next round makes a
	// new key and publishes it; the others take it on theirs.
	old := tuns["b"].PublicKey()
	notices := make(chan string, 16)
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	db.Listen(lctx, func(topic, payload string) {
		if topic == mesh.NoticeTopic {
			notices <- payload
			for _, r := range recs {
				r.Changed(payload)
			}
		}
	})
	if err := mesh.AskRotate(ctx, narrow, "b"); err != nil {
		t.Fatal(err)
	}
	if got := <-notices; got != "rotate b" {
		t.Fatalf("notice %q", got)
	}
	reconcile("a", "c") // (not asked: their keys stay)
	reconcile("b")
	if tuns["b"].PublicKey() == old {
		t.Fatal("b did not rotate")
	}
	if got := <-notices; got != "" {
		t.Fatalf("after the rotation, notice %q", got)
	}
	reconcile("a")
	if p := peersOf("a"); len(p) != 2 || !slices.Equal(p["b"], []string{"10.240.0.3/32"}) {
		t.Errorf("a's peers after b's rotation: %v", p)
	}

	// c's row gets a's key (a copied data directory), then a key that
	// does not parse: a leaves c out either way.
	for _, k := range []string{tuns["a"].PublicKey().String(), "not a key"} {
		db.Update(ctx, func(tx store.Tx) error {
			h, _ := tx.GetHost(ctx, "c")
			h.Mesh.PublicKey = k
			return tx.PutHost(ctx, h)
		})
		reconcile("a")
		if p := peersOf("a"); len(p) != 1 || p["b"] == nil {
			t.Errorf("a's peers with c's key %q: %v", k, p)
		}
	}

	// b removed: a drops it.
	if err := db.DeleteHost(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	reconcile("a")
	if p := peersOf("a"); len(p) != 0 {
		t.Errorf("a's peers after b's removal: %v", p)
	}
}
