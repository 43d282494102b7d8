package mesh

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/store"
)

// Applier gives the host's network each sandbox's place on its mesh with
// its rules resolved (Service.Rules), and remembers what it gave each, so
// that a refresh after a notice gives only what changed.
type Applier struct {
	svc *Service
	net network.Mesher

	mu    sync.Mutex
	given map[string]string // sandbox ID -> the network.Mesh given, as JSON
}

// Applier returns an Applier onto net.
func (s *Service) Applier(net network.Mesher) *Applier {
	return &Applier{svc: s, net: net, given: map[string]string{}}
}

// Apply gives the network rec's place on its mesh with policy's rules
// resolved; if changedOnly, only when that differs from what it gave
// last (then the attachment is nil).
func (a *Applier) Apply(ctx context.Context, rec *store.Sandbox, policy *firewall.Policy, changedOnly bool) (*network.Attachment, error) {
	m, err := a.svc.Rules(ctx, rec, Of(rec), policy)
	if err != nil {
		return nil, err
	}
	key, _ := json.Marshal(m)
	a.mu.Lock()
	same := a.given[rec.ID] == string(key)
	a.mu.Unlock()
	if changedOnly && same {
		return nil, nil
	}
	att, err := a.net.SetMesh(ctx, rec.ID, m)
	if err == nil {
		a.mu.Lock()
		a.given[rec.ID] = string(key)
		a.mu.Unlock()
	}
	return att, err
}

// Keep forgets what it gave the sandboxes live does not report.
func (a *Applier) Keep(live func(id string) bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id := range a.given {
		if !live(id) {
			delete(a.given, id)
		}
	}
}
