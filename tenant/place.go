package tenant

import (
	"context"
	"fmt"
	"maps"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Placer is what placing a sandbox reads: the references, and the key
// that creates it.
type Placer interface {
	Resolver
	GetKey(ctx context.Context, id string) (*store.Key, error)
}

// MayCreate says whether p may create sandboxes at all.
func MayCreate(p authz.Principal) error {
	if err := authz.Allowed(p, "createSandbox"); err != nil {
		return err
	}
	if len(p.Scope.Sandboxes) > 0 {
		return sandbox.Errorf(sandbox.ErrForbidden, "", "this API key is limited to some sandboxes; it cannot create new ones")
	}
	return nil
}

// Place puts a new sandbox's record in its account, project and fleet for
// the principal in ctx, read in tx (the create's transaction: a project
// deleted at the same time either sees the sandbox or the sandbox does not
// get the project), and returns the project. A key's labels are forced on
// the sandboxes it creates; the principal must be allowed to create the
// sandbox so placed.
func (s *Service) Place(ctx context.Context, tx Placer, req *sandbox.CreateRequest, rec *store.Sandbox) (*Project, error) {
	p := authz.From(ctx)
	if err := MayCreate(p); err != nil {
		return nil, err
	}
	ref := req.Project
	if ref == "" && len(p.Scope.Projects) == 1 {
		ref = p.Scope.Projects[0]
	}
	acc, proj, err := s.ProjectIn(ctx, tx, req.AccountID, ref)
	if err != nil {
		field := "project"
		if acc == nil {
			field = "account_id"
		}
		return nil, sandbox.Errorf(sandbox.ErrInvalid, field, "%v", err)
	}
	rec.AccountID, rec.ProjectID, rec.Project = acc.ID, proj.ID, proj.Name
	if p.KeyID != "" {
		k, err := tx.GetKey(ctx, p.KeyID)
		if err != nil {
			return nil, err
		}
		rec.KeyID, rec.KeyAncestors = k.ID, k.Ancestors
	}
	if req.Fleet != "" {
		f, err := s.Fleet(ctx, tx, proj, req.Fleet)
		if err != nil {
			return nil, sandbox.Errorf(sandbox.ErrInvalid, "fleet", "%v", err)
		}
		rec.FleetID, rec.Fleet = f.ID, f.Name
	}
	if len(p.Scope.Labels) > 0 {
		labels := maps.Clone(rec.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		for k, v := range p.Scope.Labels {
			if got, ok := labels[k]; ok && got != v {
				return nil, sandbox.Errorf(sandbox.ErrInvalid, fmt.Sprintf("labels[%s]", k), "this API key creates sandboxes with %s=%s", k, v)
			}
			labels[k] = v
		}
		if len(labels) > 32 {
			return nil, sandbox.Errorf(sandbox.ErrInvalid, "labels", "at most 32 labels, with the key's own")
		}
		rec.Labels = labels
	}
	return proj, authz.Decide(p, "createSandbox", authz.TargetOf(&rec.Sandbox))
}
