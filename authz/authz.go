// Package authz decides what a caller may do. Authentication (a token to a
// Principal) happens elsewhere (apikey); the principal travels in the
// context.Context, and every domain (the engine, tenants, keys) asks Decide
// before it acts. A context without a principal is the operator: a Go
// program that embeds the library owns the host and may do everything.
//
// Denials use the engine's one error vocabulary: ErrForbidden for an action
// the key lacks, ErrNotFound for an object outside what the key may see
// (never ErrForbidden, which would confirm that the object exists).
package authz

import (
	"context"
	"net/netip"
	"slices"

	"github.com/harebox/harebox/sandbox"
)

// Principal is who makes a call: the operator, or an API key of one account
// with its scope.
type Principal struct {
	// Operator is the host's owner (the root key, or no principal at all).
	Operator bool `json:"operator"`
	// AccountID is the key's account; empty for the operator.
	AccountID string `json:"account_id,omitempty"`
	// KeyID is the API key's ID; empty for the operator.
	KeyID string `json:"key_id,omitempty"`
	// Scope limits what the key may do.
	Scope Scope `json:"scope"`
}

// Operator is the principal of a context that carries none.
var Operator = Principal{Operator: true}

type principalKey struct{}
type sourceKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// From returns the principal ctx carries, or Operator.
func From(ctx context.Context) Principal {
	if p, ok := ctx.Value(principalKey{}).(Principal); ok {
		return p
	}
	return Operator
}

// WithSource records the caller's network address (the API server sets it
// from the socket, or from X-Forwarded-For of a trusted proxy).
func WithSource(ctx context.Context, addr netip.Addr) context.Context {
	return context.WithValue(ctx, sourceKey{}, addr)
}

// Source returns the caller's address, if one was recorded.
func Source(ctx context.Context) (netip.Addr, bool) {
	a, ok := ctx.Value(sourceKey{}).(netip.Addr)
	return a, ok && a.IsValid()
}

// Target is the object an action is on. Only the fields that apply are set:
// a sandbox has all of them, a project has AccountID and ProjectID, an
// account has AccountID.
type Target struct {
	AccountID string
	ProjectID string
	SandboxID string
	Labels    map[string]string
	// KeyID and KeyAncestors describe a key as a target: a key sees itself
	// and the keys it created, directly or not.
	KeyID        string
	KeyAncestors []string
}

// TargetOf is a sandbox as the target of an action on it.
func TargetOf(s *sandbox.Sandbox) Target {
	return Target{AccountID: s.AccountID, ProjectID: s.ProjectID, SandboxID: s.ID, Labels: s.Labels}
}

// Decide reports whether p may do action on t: nil, or an *sandbox.Error of
// kind ErrForbidden or ErrNotFound.
func Decide(p Principal, action string, t Target) error {
	if p.Operator {
		return nil
	}
	if err := Allowed(p, action); err != nil {
		return err
	}
	if !Visible(p, t) {
		return sandbox.Errorf(sandbox.ErrNotFound, "", "not found")
	}
	return nil
}

// Allowed reports whether p's scope includes action, whatever the target:
// nil or an ErrForbidden error.
func Allowed(p Principal, action string) error {
	if p.Operator {
		return nil
	}
	if operatorOnly[action] {
		return sandbox.Errorf(sandbox.ErrForbidden, "", "%s is for the operator (the root key) only", action)
	}
	if !p.Scope.allows(action) {
		return sandbox.Errorf(sandbox.ErrForbidden, "", "this API key may not %s", action)
	}
	return nil
}

// Visible reports whether p may see t at all.
func Visible(p Principal, t Target) bool {
	if p.Operator {
		return true
	}
	if t.AccountID != p.AccountID {
		return false
	}
	s := p.Scope
	if t.KeyID != "" {
		return t.KeyID == p.KeyID || slices.Contains(t.KeyAncestors, p.KeyID)
	}
	if t.ProjectID != "" && len(s.Projects) > 0 && !slices.Contains(s.Projects, t.ProjectID) {
		return false
	}
	if t.SandboxID == "" {
		return true
	}
	if len(s.Sandboxes) > 0 && !slices.Contains(s.Sandboxes, t.SandboxID) {
		return false
	}
	for k, v := range s.Labels {
		if got, ok := t.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
