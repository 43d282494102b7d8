// Package mesh gives a project's sandboxes their places on the project's
// private network: a range of the deployment's mesh pool per project and
// an address and a name per sandbox, allocated in the store the hosts
// share, and the names answered only to the project's own sandboxes. The
// host's network (network.Mesher) routes and enforces them; the guest
// gets only its address and a route.
package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// RangeBits is the size of a project's range: a /22, 1,022 addresses.
const RangeBits = 22

// DefaultPool is the mesh's address space when Options.Pool is not set:
// 1,024 projects' ranges.
var DefaultPool = netip.MustParsePrefix("10.240.0.0/12")

// Domain ends every mesh name: NAME.PROJECT.internal.
const Domain = "internal"

// Tx is what a create's transaction lends the mesh.
type Tx interface {
	MeshRanges(ctx context.Context) (map[string]string, error)
	AddMeshRange(ctx context.Context, projectID, prefix string) error
	MeshAddresses(ctx context.Context, projectID string) ([]*store.MeshAddress, error)
	AddMeshAddress(ctx context.Context, a *store.MeshAddress) error
	Notify(ctx context.Context, topic, payload string) error
}

// Store is what the mesh reads and writes outside a create.
type Store interface {
	GetSandbox(ctx context.Context, id string) (*store.Sandbox, error)
	MeshAddressByName(ctx context.Context, projectID, name string) (*store.MeshAddress, error)
	DeleteMeshAddress(ctx context.Context, sandboxID string) error
	Notify(ctx context.Context, topic, payload string) error
	MeshAddresses(ctx context.Context, projectID string) ([]*store.MeshAddress, error)
	GetProject(ctx context.Context, id string) (*store.Project, error)
}

// Options configure a Service.
type Options struct {
	Store Store
	// Pool is the deployment's mesh address space (the same on every
	// host); default DefaultPool. It must not overlap the sandboxes' own
	// address pool.
	Pool netip.Prefix
	// Enabled says the host's network can put sandboxes on a mesh; a
	// create that asks for one is refused otherwise.
	Enabled bool
}

// Service allocates and answers the mesh's addresses and names.
type Service struct{ o Options }

// New returns a Service.
func New(o Options) (*Service, error) {
	if !o.Pool.IsValid() {
		o.Pool = DefaultPool
	}
	if !o.Pool.Addr().Is4() || o.Pool.Bits() > RangeBits || o.Pool.Masked() != o.Pool {
		return nil, fmt.Errorf("mesh: pool %s: want an IPv4 prefix of /%d or larger", o.Pool, RangeBits)
	}
	return &Service{o: o}, nil
}

// Pool is the deployment's mesh address space.
func (s *Service) Pool() netip.Prefix { return s.o.Pool }

// recordKey holds a sandbox's network.Mesh in its record's Extra.
const recordKey = "mesh"

// Of is sandbox rec's place on its project's mesh, or nil.
func Of(rec *store.Sandbox) *network.Mesh {
	raw, ok := rec.Extra[recordKey]
	if !ok {
		return nil
	}
	var m network.Mesh
	if json.Unmarshal(raw, &m) != nil || m.Validate() != nil {
		return nil
	}
	return &m
}

// Join puts a new sandbox on its project's mesh if the request or else
// the project asks for it, in the create's transaction: the project's
// range (allocated on its first mesh sandbox), the sandbox's address and
// its name (its own name, or its ID), on rec.
func (s *Service) Join(ctx context.Context, tx Tx, req *sandbox.CreateRequest, proj *model.Project, rec *store.Sandbox) error {
	on := proj.Mesh
	if req.Mesh != nil {
		on = *req.Mesh
	}
	if !on {
		return nil
	}
	if !s.o.Enabled {
		return sandbox.Errorf(sandbox.ErrInvalid, "mesh", "this server has no mesh: its sandboxes have no network (hareboxd --network none)")
	}
	r, err := s.projectRange(ctx, tx, proj.ID)
	if err != nil {
		return err
	}
	taken, err := tx.MeshAddresses(ctx, proj.ID)
	if err != nil {
		return err
	}
	used := map[string]bool{}
	for _, a := range taken {
		used[a.Addr] = true
	}
	// The range's first and last addresses are left out, as a network's.
	for a := r.Addr().Next(); r.Contains(a.Next()); a = a.Next() {
		if used[a.String()] {
			continue
		}
		name := rec.Name
		if name == "" {
			name = strings.ReplaceAll(rec.ID, "_", "-")
		}
		name = strings.ToLower(name)
		err := tx.AddMeshAddress(ctx, &store.MeshAddress{Addr: a.String(), ProjectID: proj.ID, SandboxID: rec.ID, Name: name})
		if errors.Is(err, store.ErrConflict) {
			continue // (another host's create took it meanwhile)
		}
		if err != nil {
			return err
		}
		rec.MeshAddress, rec.MeshName = a.String(), name+"."+strings.ToLower(proj.Name)+"."+Domain
		rec.SetExtra(recordKey, network.Mesh{Addr: a, Project: r})
		return tx.Notify(ctx, NoticeTopic, "") // (the other hosts route it to this one)
	}
	return sandbox.Errorf(sandbox.ErrCapacity, "mesh", "project %s's mesh range %s is full", proj.Name, r)
}

// projectRange is the project's range, allocated (the first free one of
// the pool) if it has none.
func (s *Service) projectRange(ctx context.Context, tx Tx, projectID string) (netip.Prefix, error) {
	ranges, err := tx.MeshRanges(ctx)
	if err != nil {
		return netip.Prefix{}, err
	}
	if r, ok := ranges[projectID]; ok {
		return netip.ParsePrefix(r)
	}
	used := map[string]bool{}
	for _, r := range ranges {
		used[r] = true
	}
	size := uint32(1) << (32 - RangeBits)
	for i := uint32(0); i < 1<<(RangeBits-s.o.Pool.Bits()); i++ {
		a := s.o.Pool.Addr().As4()
		v := (uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])) + i*size
		r := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), RangeBits)
		if used[r.String()] {
			continue
		}
		err := tx.AddMeshRange(ctx, projectID, r.String())
		if errors.Is(err, store.ErrConflict) {
			// Another host's create took this range, or gave the
			// project one meanwhile.
			if again, err := tx.MeshRanges(ctx); err == nil && again[projectID] != "" {
				return netip.ParsePrefix(again[projectID])
			}
			continue
		}
		if err != nil {
			return netip.Prefix{}, err
		}
		return r, nil
	}
	return netip.Prefix{}, sandbox.Errorf(sandbox.ErrCapacity, "mesh", "the mesh pool %s has no free range", s.o.Pool)
}

// Leave frees sandbox id's address and name (a delete): from then on its
// name resolves for nobody, and its address goes to the next sandbox of
// its project that joins.
func (s *Service) Leave(ctx context.Context, id string) error {
	if err := s.o.Store.DeleteMeshAddress(ctx, id); err != nil {
		return err
	}
	return s.o.Store.Notify(ctx, NoticeTopic, "") // (the other hosts stop routing it here)
}

// Lookup answers name for sandbox id's guest: the address of
// NAME.PROJECT.internal when PROJECT is id's own project and NAME one of
// its mesh sandboxes; false for anything else.
func (s *Service) Lookup(ctx context.Context, id, name string) (netip.Addr, bool) {
	labels := strings.Split(strings.ToLower(strings.TrimSuffix(name, ".")), ".")
	if len(labels) != 3 || labels[2] != Domain {
		return netip.Addr{}, false
	}
	rec, err := s.o.Store.GetSandbox(ctx, id)
	if err != nil || Of(rec) == nil || strings.ToLower(rec.Project) != labels[1] {
		return netip.Addr{}, false
	}
	a, err := s.o.Store.MeshAddressByName(ctx, rec.ProjectID, labels[0])
	if err != nil { // (store.ErrNotFound: no such name)
		return netip.Addr{}, false
	}
	addr, err := netip.ParseAddr(a.Addr)
	return addr, err == nil
}

// Rules resolves sandbox rec's place on its mesh for the host: m with
// the mesh rules of policy, each given the addresses of the project's
// other mesh sandboxes it is about (their fleet and labels, as they are
// now), and the project's mesh default. A project whose peers change
// calls for it again (NoticeTopic).
func (s *Service) Rules(ctx context.Context, rec *store.Sandbox, m *network.Mesh, policy *firewall.Policy) (*network.Mesh, error) {
	out := &network.Mesh{Addr: m.Addr, Project: m.Project}
	proj, err := s.o.Store.GetProject(ctx, rec.ProjectID)
	if err != nil {
		return nil, fmt.Errorf("mesh: the project of %s: %w", rec.ID, err)
	}
	out.Deny = proj.MeshDefault == "deny"
	if policy == nil || len(policy.Mesh) == 0 {
		return out, nil
	}
	members, err := s.o.Store.MeshAddresses(ctx, rec.ProjectID)
	if err != nil {
		return nil, err
	}
	type peer struct {
		addr netip.Addr
		firewall.Peer
	}
	var peers []peer
	for _, a := range members {
		addr, err := netip.ParseAddr(a.Addr)
		if a.SandboxID == rec.ID || err != nil || !m.Project.Contains(addr) {
			continue
		}
		p, err := s.o.Store.GetSandbox(ctx, a.SandboxID)
		if errors.Is(err, store.ErrNotFound) {
			continue // (deleted meanwhile)
		}
		if err != nil {
			return nil, err
		}
		peers = append(peers, peer{addr, firewall.Peer{FleetID: p.FleetID, Fleet: p.Fleet, Labels: p.Labels}})
	}
	for _, r := range policy.Mesh {
		nr := network.MeshRule{Allow: r.Action == firewall.Allow, Protocol: r.Protocol, Ports: r.Ports, Peers: []netip.Addr{}}
		if nr.Protocol == "" { // (a stored policy was validated, not normalized)
			nr.Protocol = firewall.Any
		}
		for _, p := range peers {
			if r.Matches(p.Peer) {
				nr.Peers = append(nr.Peers, p.addr)
			}
		}
		out.Rules = append(out.Rules, nr)
	}
	return out, nil
}
