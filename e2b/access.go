package e2b

import (
	"context"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
)

// The Handler is envd's Access (envd.Access): it knows each sandbox's
// access token, and whom a request that carries it acts as.

// Token is sandbox id's envd access token (id in either form).
func (h *Handler) Token(ctx context.Context, id string) (string, error) {
	return h.tokens.get(ctx, InternalID(id))
}

// Principal is whom a request with sandbox id's access token acts as: a
// key of the sandbox's account that sees that sandbox only and may do
// what the token was handed out for (envdActions), so the engine
// authorizes and audits each of its calls as any key's. Its key ID names
// the sandbox ("envd:" and the ID), which is what the audit log shows.
// A sandbox that is not running has none: its envd does not answer.
func (h *Handler) Principal(ctx context.Context, id string) (authz.Principal, error) {
	id = InternalID(id)
	box, err := h.o.Engine.Get(authz.WithPrincipal(ctx, authz.Operator), id)
	if err != nil {
		return authz.Principal{}, err
	}
	if box.State != sandbox.StateRunning {
		return authz.Principal{}, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is %s", ExternalID(id), box.State)
	}
	return authz.Principal{AccountID: box.AccountID, KeyID: "envd:" + id,
		Scope: authz.Scope{Sandboxes: []string{id}, Actions: envdActions}}, nil
}
