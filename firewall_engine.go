package harebox

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// policyKey is where a sandbox record keeps its firewall policy.
const policyKey = "firewall"

// Firewall returns a sandbox's firewall policy.
func (e *Engine) Firewall(ctx context.Context, id string) (*firewall.Policy, error) {
	if err := e.check(ctx, "getFirewall", id); err != nil {
		return nil, err
	}
	if b := e.boxes.get(id); b != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		return policyOf(b.rec.Extra[policyKey])
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	return policyOf(rec.Extra[policyKey])
}

func policyOf(raw json.RawMessage) (*firewall.Policy, error) {
	if raw == nil {
		return firewall.Default(), nil
	}
	return firewall.Parse(raw)
}

// SetFirewall replaces a sandbox's firewall policy. The policy is
// validated and enforced before it is stored; if either fails, the old
// policy stays in force.
func (e *Engine) SetFirewall(ctx context.Context, id string, p *firewall.Policy) (_ *firewall.Policy, err error) {
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
	raw, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	b.rec.SetExtra(policyKey, json.RawMessage(raw))
	if err := e.store.PutSandbox(ctx, b.rec); err != nil {
		return nil, err
	}
	return p, nil
}

// initialPolicy puts a new sandbox's policy in its record: the request's,
// or the engine's default, so that a later change of the default leaves
// existing sandboxes as they are. The network installs it before boot.
func (e *Engine) initialPolicy(req *sandbox.CreateRequest, rec *store.Sandbox) error {
	p := e.opts.DefaultFirewall
	if req.Firewall != nil {
		var err error
		if p, err = firewall.Parse(req.Firewall); err != nil {
			var fe *firewall.Error
			if errors.As(err, &fe) {
				field := "firewall"
				if fe.Field != "" {
					field += "." + fe.Field
				}
				return sandbox.Errorf(sandbox.ErrInvalid, field, "%s", fe.Msg)
			}
			return &sandbox.Error{Kind: sandbox.ErrInvalid, Field: "firewall", Msg: "invalid firewall policy", Err: err}
		}
	}
	if p == nil {
		return nil
	}
	raw, err := json.Marshal(p)
	if err != nil {
		return err
	}
	rec.SetExtra(policyKey, json.RawMessage(raw))
	return nil
}
