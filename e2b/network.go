package e2b

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"strings"

	"github.com/harebox/harebox/firewall"
)

// E2B's network rules are put on the host firewall (firewall.Policy,
// enforced by host nftables, the host DNS resolver and the egress proxy,
// which root in the guest cannot change), in E2B's order of precedence:
// the allowOut entries first (CIDRs and bare addresses as CIDR rules,
// domain names and "*.domain" wildcards as hostname rules), then the
// denyOut ones (CIDRs and addresses only, as in E2B), then the default:
// allow, or deny when allow_internet_access is false. Internal addresses
// (metadata, the host, other sandboxes, private ranges) stay closed
// unless an allowOut CIDR names them, as for any HareBox policy.
//
// Not served, and refused rather than ignored: per-domain transform
// rules, an egress proxy of the caller's, a request host mask.

// NetworkConfig is SandboxNetworkConfig and SandboxNetworkUpdateConfig.
type NetworkConfig struct {
	AllowPublicTraffic *bool           `json:"allowPublicTraffic,omitempty"`
	AllowOut           []string        `json:"allowOut,omitempty"`
	DenyOut            []string        `json:"denyOut,omitempty"`
	EgressProxy        json.RawMessage `json:"egressProxy,omitempty"`
	MaskRequestHost    *string         `json:"maskRequestHost,omitempty"`
	Rules              json.RawMessage `json:"rules,omitempty"`
	HTTPSPorts         json.RawMessage `json:"httpsPorts,omitempty"`
	// AllowInternetAccess is the update's own field (a create has it
	// beside network).
	AllowInternetAccess *bool `json:"allow_internet_access,omitempty"`
}

// policy is the host firewall for a create's network configuration (n
// may be nil; nil: nothing asked, the engine's default); allowInternet is
// the create's allow_internet_access.
func policy(n *NetworkConfig, allowInternet *bool) (*firewall.Policy, error) {
	var c NetworkConfig
	if n != nil {
		c = *n
	}
	if allowInternet != nil {
		c.AllowInternetAccess = allowInternet
	}
	return c.policy()
}

// policy is the host firewall the configuration asks for (nil: nothing
// asked).
func (n *NetworkConfig) policy() (*firewall.Policy, error) {
	switch {
	case set(n.Rules):
		return nil, badRequest("network.rules (per-domain transforms) are not served by this server")
	case set(n.EgressProxy):
		return nil, badRequest("network.egressProxy is not served by this server")
	case n.MaskRequestHost != nil && *n.MaskRequestHost != "":
		return nil, badRequest("network.maskRequestHost is not served by this server")
	case set(n.HTTPSPorts):
		return nil, badRequest("network.httpsPorts is not served by this server")
	}
	// (allowPublicTraffic is about the sandbox's ports: ports.go.)
	deny := n.AllowInternetAccess != nil && !*n.AllowInternetAccess
	if len(n.AllowOut) == 0 && len(n.DenyOut) == 0 && !deny {
		return nil, nil
	}
	p := &firewall.Policy{DefaultOutbound: firewall.Allow, Outbound: []firewall.Rule{}}
	if deny {
		p.DefaultOutbound = firewall.Deny
	}
	var hosts, allowCIDRs, denyCIDRs []string
	for _, e := range n.AllowOut {
		if c, ok := cidr(e); ok {
			allowCIDRs = append(allowCIDRs, c)
		} else {
			hosts = append(hosts, strings.TrimSpace(e))
		}
	}
	for _, e := range n.DenyOut {
		c, ok := cidr(e)
		if !ok {
			return nil, badRequest("network.denyOut: %q is not a CIDR block or an IP address (domain names are not supported for deny rules)", e)
		}
		denyCIDRs = append(denyCIDRs, c)
	}
	p.Outbound = append(p.Outbound, rules(firewall.Allow, allowCIDRs, false)...)
	p.Outbound = append(p.Outbound, rules(firewall.Allow, hosts, true)...)
	p.Outbound = append(p.Outbound, rules(firewall.Deny, denyCIDRs, false)...)
	if err := p.Normalize(); err != nil {
		var fe *firewall.Error
		if errors.As(err, &fe) {
			return nil, badRequest("network: %s", fe.Msg)
		}
		return nil, badRequest("network: %v", err)
	}
	return p, nil
}

// private reports whether a create's network (n may be nil) asks for
// its ports to be reached with its traffic token only
// (allowPublicTraffic false).
func (n *NetworkConfig) private() bool {
	return n != nil && n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic
}

// cidr is e as a CIDR block, if it is one or a bare address.
func cidr(e string) (string, bool) {
	e = strings.TrimSpace(e)
	if p, err := netip.ParsePrefix(e); err == nil {
		return p.Masked().String(), true
	}
	if a, err := netip.ParseAddr(e); err == nil {
		return netip.PrefixFrom(a, a.BitLen()).String(), true
	}
	return "", false
}

// rules are the rules of action for items (hostnames or CIDRs), as many
// as the per-rule limits need.
func rules(action firewall.Action, items []string, hosts bool) []firewall.Rule {
	per := firewall.MaxCIDRsPerRule
	if hosts {
		per = firewall.MaxHostsPerRule
	}
	var out []firewall.Rule
	for len(items) > 0 {
		n := min(per, len(items))
		r := firewall.Rule{Action: action}
		if hosts {
			r.Hosts = items[:n]
		} else {
			r.CIDRs = items[:n]
		}
		out = append(out, r)
		items = items[n:]
	}
	return out
}

// updateNetwork is PUT /sandboxes/{id}/network: the running sandbox's
// host firewall replaced by the configuration (a field left out is
// cleared: no rules at all is the default, allow).
func (h *Handler) updateNetwork(w http.ResponseWriter, r *http.Request) error {
	var body NetworkConfig
	if err := decodeStrictly(r, &body); err != nil {
		return err
	}
	p, err := body.policy()
	if err != nil {
		return err
	}
	if p == nil {
		p = &firewall.Policy{DefaultOutbound: firewall.Allow, Outbound: []firewall.Rule{}}
	}
	ctx := r.Context()
	box, err := h.lookup(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	if _, err := h.o.Engine.SetFirewall(ctx, box.ID, p); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// decodeStrictly is decode for a body that must be there.
func decodeStrictly(r *http.Request, v any) error {
	if r.ContentLength == 0 {
		return badRequest("a JSON body is required")
	}
	return decode(r, v)
}
