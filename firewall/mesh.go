package firewall

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
)

// MaxMeshLabels bounds the labels a mesh rule matches on, and
// maxMeshField the length of a fleet or a label's key or value.
const (
	MaxMeshLabels = 16
	maxMeshField  = 256
)

// MeshRule is one rule of a sandbox's policy for its project's mesh: it
// decides connections (and datagrams) the sandbox opens to the project's
// other mesh sandboxes that are in Fleet (its name or ID) and carry every
// one of Labels, on Protocol and Ports. Neither Fleet nor Labels: every
// mesh sandbox of the project. The first rule that matches wins; none
// matching, the project's mesh default decides (allow unless it says
// deny). Replies to what a sandbox was allowed to open always pass.
type MeshRule struct {
	Action   Action            `json:"action"`
	Protocol Protocol          `json:"protocol,omitempty"`
	Ports    string            `json:"ports,omitempty"`
	Fleet    string            `json:"fleet,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
}

// Peer is a mesh sandbox as a mesh rule sees it.
type Peer struct {
	FleetID, Fleet string
	Labels         map[string]string
}

// Matches reports whether the rule is about peer p (its fleet and labels;
// protocol and ports are the host's to match).
func (r *MeshRule) Matches(p Peer) bool {
	if r.Fleet != "" && r.Fleet != p.FleetID && r.Fleet != p.Fleet {
		return false
	}
	for k, v := range r.Labels {
		if got, ok := p.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func (r *MeshRule) normalize(path string) error {
	switch r.Action {
	case Allow, Deny:
	case "":
		return errorf(path+".action", `required: "allow" or "deny"`)
	default:
		return errorf(path+".action", `must be "allow" or "deny", not %q`, r.Action)
	}
	switch r.Protocol {
	case TCP, UDP, Any:
	case "":
		r.Protocol = Any
	default:
		return errorf(path+".protocol", `must be "tcp", "udp" or "any", not %q`, r.Protocol)
	}
	if r.Ports != "" {
		if r.Protocol == Any {
			return errorf(path+".ports", `ports need protocol "tcp" or "udp"`)
		}
		spans, err := ParsePorts(r.Ports)
		if err != nil {
			return errorf(path+".ports", "%v", err)
		}
		r.Ports = FormatPorts(spans)
	}
	if len(r.Fleet) > maxMeshField || strings.TrimSpace(r.Fleet) != r.Fleet {
		return errorf(path+".fleet", "a fleet's name or ID, at most %d bytes", maxMeshField)
	}
	if r.Labels != nil && len(r.Labels) == 0 {
		return errorf(path+".labels", "empty; leave it out to match any sandbox")
	}
	if len(r.Labels) > MaxMeshLabels {
		return errorf(path+".labels", "too many entries: %d, at most %d", len(r.Labels), MaxMeshLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(r.Labels)) {
		if k == "" || len(k) > maxMeshField || len(r.Labels[k]) > maxMeshField {
			return errorf(path+".labels", "a key of 1 to %d bytes and a value of at most %d (%q)", maxMeshField, maxMeshField, k)
		}
	}
	return nil
}

func decodeMeshRule(raw json.RawMessage, path string, r *MeshRule) error {
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
		case "fleet":
			err = str(f.val, fp, &r.Fleet)
			if err == nil && r.Fleet == "" {
				err = errorf(fp, "empty; leave fleet out to match any fleet")
			}
		case "labels":
			var ls []field
			if ls, err = object(f.val, fp); err != nil {
				break
			}
			if len(ls) > MaxMeshLabels {
				return errorf(fp, "too many entries: %d, at most %d", len(ls), MaxMeshLabels)
			}
			r.Labels = map[string]string{}
			for _, l := range ls {
				var v string
				if err = str(l.val, fp+"."+l.key, &v); err != nil {
					break
				}
				r.Labels[l.key] = v
			}
		default:
			err = errorf(fp, "unknown field (known: action, protocol, ports, fleet, labels)")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// cloneMesh is a deep copy of rules.
func cloneMesh(rules []MeshRule) []MeshRule {
	if rules == nil {
		return nil
	}
	out := make([]MeshRule, len(rules))
	for i, r := range rules {
		r.Labels = maps.Clone(r.Labels)
		out[i] = r
	}
	return out
}
