package sandboxrt

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/mesh"
	"github.com/harebox/harebox/sandbox"
)

// Firewall returns a sandbox's firewall policy.
func (e *Runtime) Firewall(ctx context.Context, id string) (*firewall.Policy, error) {
	if err := e.check(ctx, "getFirewall", id); err != nil {
		return nil, err
	}
	if b := e.boxes.get(id); b != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		return firewall.Stored(b.rec.Extra[firewall.RecordKey])
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	return firewall.Stored(rec.Extra[firewall.RecordKey])
}

// SetFirewall replaces a sandbox's firewall policy. The policy is
// validated and enforced before it is stored; if either fails, the old
// policy stays in force.
func (e *Runtime) SetFirewall(ctx context.Context, id string, p *firewall.Policy) (_ *firewall.Policy, err error) {
	defer e.audited(ctx, "setFirewall", id, &err)
	if err := e.check(ctx, "setFirewall", id); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, firewall.Invalid(err)
	}
	b, err := e.liveOrErr(ctx, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if st := b.rec.State; st != sandbox.StateRunning && st != sandbox.StatePaused {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is %s", id, st)
	}
	if err := e.net.SetPolicy(ctx, id, p); err != nil {
		var fe *firewall.Error
		if errors.As(err, &fe) {
			return nil, firewall.Invalid(err)
		}
		return nil, &sandbox.Error{Kind: sandbox.ErrUnavailable, Msg: "the firewall could not be updated; the old policy stays in force", Err: err}
	}
	if mesh.Of(b.rec) != nil {
		// (Its mesh rules, resolved: the policy above kept its old ones.)
		if _, err := e.setMesh(ctx, b.rec, p, false); err != nil {
			return nil, &sandbox.Error{Kind: sandbox.ErrUnavailable, Msg: "the mesh rules could not be updated", Err: err}
		}
	}
	raw, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	b.rec.SetExtra(firewall.RecordKey, json.RawMessage(raw))
	if err := e.store.PutSandbox(ctx, b.rec); err != nil {
		return nil, err
	}
	return p, nil
}
