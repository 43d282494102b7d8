// Package network is the engine's interface to a sandbox's host-side
// network. The Linux implementation (network/linuxnet: tap, nftables, DNS,
// egress proxy) implements it; None gives sandboxes no network.
package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/harebox/harebox/firewall"
)

// Network prepares and removes a sandbox's host-side network and enforces
// its firewall policy on the host.
type Network interface {
	// Attach prepares the host side before the sandbox's VM boots, with
	// policy (nil: firewall.Default()) already in force, and says what the
	// VM gets. A policy that does not validate is refused with a
	// *firewall.Error and nothing is made. Attaching an attached sandbox
	// re-installs its policy and returns the same attachment.
	Attach(ctx context.Context, sandboxID string, policy *firewall.Policy) (*Attachment, error)
	// SetPolicy replaces an attached sandbox's policy atomically and cuts
	// open connections the new policy forbids. A policy that does not
	// validate is refused with a *firewall.Error and the old one stays.
	SetPolicy(ctx context.Context, sandboxID string, policy *firewall.Policy) error
	// Detach removes everything Attach made. It is idempotent.
	Detach(ctx context.Context, sandboxID string) error
	// Prune removes what belongs to sandboxes not in keep (engine start).
	Prune(ctx context.Context, keep []string) error
}

// Checker is what a Network that can tell whether it works also does: its
// firewall in force for every attached sandbox, its services up. The
// server's readiness asks it.
type Checker interface {
	Check(ctx context.Context) error
}

// Meter is what a Network that counts traffic also does: the bytes a
// sandbox's guest has sent out of its link, and received on it, since it
// was attached (counters that may restart from zero when the link is made
// again).
type Meter interface {
	Traffic(sandboxID string) (sent, received uint64, err error)
}

// Attachment is what a VM gets: a tap device with a MAC, and kernel
// command-line parameters that tell the guest agent its addresses.
type Attachment struct {
	Tap     string `json:"tap"`
	MAC     string `json:"mac"`
	Cmdline string `json:"cmdline,omitempty"`
}

// None gives sandboxes no network at all. It still refuses invalid
// policies so the API behaves the same with and without a network.
type None struct{}

func (None) Attach(_ context.Context, _ string, p *firewall.Policy) (*Attachment, error) {
	return nil, validate(p)
}

func (None) SetPolicy(_ context.Context, _ string, p *firewall.Policy) error { return validate(p) }
func (None) Detach(context.Context, string) error                            { return nil }
func (None) Prune(context.Context, []string) error                           { return nil }

func validate(p *firewall.Policy) error {
	if p == nil {
		return nil
	}
	return p.Validate()
}

// Ingress is what a Network that lets the host's ingress reach guests
// also does. Inbound traffic stays denied except connections the ingress
// makes with DialGuest, to the ports it asked for.
type Ingress interface {
	// DialGuest connects to a TCP port of the sandbox's guest, opening
	// that port to the host's ingress (and to nothing else) first if it
	// is not open yet. It fails when the sandbox is not attached.
	DialGuest(ctx context.Context, sandboxID string, port uint16) (net.Conn, error)
	// ClosePorts closes ports to the ingress again; connections already
	// made are the ingress's to close.
	ClosePorts(ctx context.Context, sandboxID string, ports ...uint16) error
}

// Mesher is what a Network that puts sandboxes on their project's private
// mesh also does. The mesh's addresses and rules are the host's: the
// guest only gets its address and a route.
type Mesher interface {
	// SetMesh puts attached sandbox sandboxID on its project's mesh at m
	// (nil takes it off) and returns its attachment as its guest must now
	// see it (Cmdline names the mesh address).
	SetMesh(ctx context.Context, sandboxID string, m *Mesh) (*Attachment, error)
	// SetMeshNames gives the host resolver the mesh's names: a mesh
	// sandbox's query for a name under .internal is answered with
	// lookup(the asking sandbox's ID, the name), and never upstream.
	SetMeshNames(lookup func(ctx context.Context, sandboxID, name string) (netip.Addr, bool))
}

// Mesh is a sandbox's place on its project's mesh: its own address, and
// its project's range, the only addresses it reaches and is reached from
// there.
type Mesh struct {
	Addr    netip.Addr   `json:"addr"`
	Project netip.Prefix `json:"project"`
	// Rules decide what the sandbox opens to its project's other mesh
	// sandboxes, in order, the first match winning (its policy's mesh
	// rules, each resolved to its peers' addresses); none matching, Deny
	// refuses (else allowed). Replies to what it opened always pass.
	Rules []MeshRule `json:"rules,omitempty"`
	Deny  bool       `json:"deny,omitempty"`
}

// MeshRule is a firewall.MeshRule with its peers resolved.
type MeshRule struct {
	Allow    bool              `json:"allow"`
	Protocol firewall.Protocol `json:"protocol"` // tcp, udp or any
	Ports    string            `json:"ports,omitempty"`
	Peers    []netip.Addr      `json:"peers"`
}

// MaxMeshPeers bounds a mesh rule's peers (a project's range holds
// 1,022 addresses).
const MaxMeshPeers = 1024

// Validate checks that m is an IPv4 address within an IPv4 range, with
// rules whose peers are in that range.
func (m *Mesh) Validate() error {
	if !m.Addr.Is4() || !m.Project.Addr().Is4() || !m.Project.Contains(m.Addr) || m.Project.Masked() != m.Project {
		return fmt.Errorf("network: mesh address %s in %s: want an IPv4 address within an IPv4 range", m.Addr, m.Project)
	}
	for i, r := range m.Rules {
		if len(r.Peers) > MaxMeshPeers {
			return fmt.Errorf("network: mesh rule %d: %d peers, at most %d", i, len(r.Peers), MaxMeshPeers)
		}
		if r.Protocol != firewall.TCP && r.Protocol != firewall.UDP && r.Protocol != firewall.Any || r.Ports != "" && r.Protocol == firewall.Any {
			return fmt.Errorf("network: mesh rule %d: protocol %q with ports %q", i, r.Protocol, r.Ports)
		}
		if _, err := firewall.ParsePorts(r.Ports); r.Ports != "" && err != nil {
			return fmt.Errorf("network: mesh rule %d: %w", i, err)
		}
		for _, p := range r.Peers {
			if !m.Project.Contains(p) {
				return fmt.Errorf("network: mesh rule %d: peer %s is not in %s", i, p, m.Project)
			}
		}
	}
	return nil
}
