package ingress

import (
	"context"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
)

// Sandboxes is what the URL calls need of the sandboxes (the engine).
type Sandboxes interface {
	// Check authorizes action on sandbox id for the principal in ctx. A
	// sandbox the principal may not see is ErrNotFound, exactly like a
	// missing one.
	Check(ctx context.Context, action, id string) error
	// Sandbox returns sandbox id's stored record (ErrNotFound: none).
	Sandbox(ctx context.Context, id string) (*sandbox.Sandbox, error)
	// AccountOf is the account sandbox id belongs to, for its audit
	// entries ("" when there is no such sandbox).
	AccountOf(ctx context.Context, id string) string
}

// Projects resolves the project a URL CA call names (the tenant service).
type Projects interface {
	ProjectIn(ctx context.Context, tx tenant.Resolver, accountRef, ref string) (*store.Account, *store.Project, error)
}

// Auditor records a call, and how it ended, in the audit log.
type Auditor interface {
	Record(ctx context.Context, action, accountID, target string, err error)
}

// Calls are the URL and URL CA calls of the principal in the context (the
// REST API's): each authorized on its sandbox or project, and each change
// recorded in the audit log, over a Service.
type Calls struct {
	svc   *Service
	store interface {
		Update(ctx context.Context, fn func(tx tenant.Resolver) error) error
	}
	sandboxes Sandboxes
	projects  Projects
	audit     Auditor
}

// NewCalls returns the calls over svc: the store is svc's.
func NewCalls(svc *Service, sandboxes Sandboxes, projects Projects, audit Auditor) *Calls {
	return &Calls{svc: svc, store: store.Narrow(svc.opts.Store, func(tx store.Tx) tenant.Resolver { return tx }), sandboxes: sandboxes, projects: projects, audit: audit}
}

// audited records, when a call ends, what the principal in ctx did to
// sandbox id (and how it ended).
func (c *Calls) audited(ctx context.Context, action, id string, err *error) {
	c.audit.Record(ctx, action, c.sandboxes.AccountOf(ctx, id), id, *err)
}

// Create publishes a port of a sandbox that is not deleted. The result
// carries the URL's token, shown only here and by Rotate.
func (c *Calls) Create(ctx context.Context, id string, req sandbox.URLRequest) (_ *sandbox.URL, err error) {
	defer c.audited(ctx, "createURL", id, &err)
	if err := c.sandboxes.Check(ctx, "createURL", id); err != nil {
		return nil, err
	}
	rec, err := c.sandboxes.Sandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec.State == sandbox.StateDeleted {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is deleted", id)
	}
	u, err := c.svc.Create(ctx, Owner{SandboxID: id, AccountID: rec.AccountID, ProjectID: rec.ProjectID}, req)
	if err != nil {
		return nil, err
	}
	// A delete that ran meanwhile marks the sandbox deleted before its
	// last sweep of URLs (Forget): either that sweep saw this one, or
	// this check sees the mark.
	if rec, err := c.sandboxes.Sandbox(ctx, id); err == nil && rec.State == sandbox.StateDeleted {
		c.svc.Delete(context.WithoutCancel(ctx), id, u.ID)
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is deleted", id)
	}
	return u, nil
}

// List lists a sandbox's URLs, oldest first.
func (c *Calls) List(ctx context.Context, id string) ([]*sandbox.URL, error) {
	if err := c.sandboxes.Check(ctx, "listURLs", id); err != nil {
		return nil, err
	}
	return c.svc.List(ctx, id)
}

// Get returns one URL of a sandbox.
func (c *Calls) Get(ctx context.Context, id, urlID string) (*sandbox.URL, error) {
	if err := c.sandboxes.Check(ctx, "getURL", id); err != nil {
		return nil, err
	}
	return c.svc.Get(ctx, id, urlID)
}

// Rotate gives a URL a new token. When it returns the old token is
// refused, and what it opened (requests, streams, WebSockets, HTTP/1.1
// connections) is cut.
func (c *Calls) Rotate(ctx context.Context, id, urlID string) (_ *sandbox.URL, err error) {
	defer c.audited(ctx, "rotateURL", id, &err)
	if err := c.sandboxes.Check(ctx, "rotateURL", id); err != nil {
		return nil, err
	}
	return c.svc.Rotate(ctx, id, urlID)
}

// Delete unpublishes a URL.
func (c *Calls) Delete(ctx context.Context, id, urlID string) (err error) {
	defer c.audited(ctx, "deleteURL", id, &err)
	if err := c.sandboxes.Check(ctx, "deleteURL", id); err != nil {
		return err
	}
	return c.svc.Delete(ctx, id, urlID)
}

// URL certificate authorities: a project's mtls URLs take the client
// certificates its CA signed. The calls name the project as environments'
// do (account and project references; "" the default).

// project resolves the project of a URL CA call for the principal in ctx.
// A key limited to some sandboxes may read the CA but not change it or
// issue from it: its certificates open every mtls URL of the project.
func (c *Calls) project(ctx context.Context, action, accountRef, projectRef string, change bool) (*store.Project, error) {
	p := authz.From(ctx)
	if err := authz.Allowed(p, action); err != nil {
		return nil, err
	}
	if change && (len(p.Scope.Sandboxes) > 0 || len(p.Scope.Labels) > 0) {
		return nil, sandbox.Errorf(sandbox.ErrForbidden, "", "this API key is limited to some sandboxes; a project's URL CA vouches for all of its URLs")
	}
	var proj *store.Project
	err := c.store.Update(ctx, func(tx tenant.Resolver) error {
		var err error
		_, proj, err = c.projects.ProjectIn(ctx, tx, accountRef, projectRef)
		return err
	})
	return proj, err
}

// auditedProject records a call on a project (ref when it was not found).
func (c *Calls) auditedProject(ctx context.Context, action string, proj *store.Project, ref string, err *error) {
	acc, target := "", ref
	if proj != nil {
		acc, target = proj.AccountID, proj.ID
	}
	c.audit.Record(ctx, action, acc, target, *err)
}

// CA returns a project's URL certificate authority.
func (c *Calls) CA(ctx context.Context, accountRef, projectRef string) (*sandbox.URLCA, error) {
	proj, err := c.project(ctx, "getURLCA", accountRef, projectRef, false)
	if err != nil {
		return nil, err
	}
	return c.svc.CA(ctx, proj.ID)
}

// SetCA gives a project a new URL CA: uploaded, or made here. The old
// one's certificates stop working, and what they opened is cut.
func (c *Calls) SetCA(ctx context.Context, accountRef, projectRef string, req sandbox.URLCARequest) (_ *sandbox.URLCA, err error) {
	proj, err := c.project(ctx, "setURLCA", accountRef, projectRef, true)
	defer c.auditedProject(ctx, "setURLCA", proj, projectRef, &err)
	if err != nil {
		return nil, err
	}
	return c.svc.SetCA(ctx, proj.ID, proj.AccountID, req)
}

// DeleteCA deletes a project's URL CA: its mtls URLs refuse everyone.
func (c *Calls) DeleteCA(ctx context.Context, accountRef, projectRef string) (err error) {
	proj, err := c.project(ctx, "deleteURLCA", accountRef, projectRef, true)
	defer c.auditedProject(ctx, "deleteURLCA", proj, projectRef, &err)
	if err != nil {
		return err
	}
	return c.svc.DeleteCA(ctx, proj.ID)
}

// IssueCert issues a client certificate from a project's URL CA.
func (c *Calls) IssueCert(ctx context.Context, accountRef, projectRef string, req sandbox.ClientCertRequest) (_ *sandbox.ClientCert, err error) {
	proj, err := c.project(ctx, "issueClientCert", accountRef, projectRef, true)
	defer c.auditedProject(ctx, "issueClientCert", proj, projectRef, &err)
	if err != nil {
		return nil, err
	}
	return c.svc.IssueCert(ctx, proj.ID, req)
}

// ListCerts lists a project's issued and revoked certificates.
func (c *Calls) ListCerts(ctx context.Context, accountRef, projectRef string) ([]*sandbox.ClientCert, error) {
	proj, err := c.project(ctx, "listClientCerts", accountRef, projectRef, false)
	if err != nil {
		return nil, err
	}
	return c.svc.ListCerts(ctx, proj.ID)
}

// RevokeCert revokes a certificate of a project's URL CA by serial.
func (c *Calls) RevokeCert(ctx context.Context, accountRef, projectRef, serial string) (_ *sandbox.ClientCert, err error) {
	proj, err := c.project(ctx, "revokeClientCert", accountRef, projectRef, true)
	defer c.auditedProject(ctx, "revokeClientCert", proj, projectRef, &err)
	if err != nil {
		return nil, err
	}
	return c.svc.RevokeCert(ctx, proj.ID, serial)
}
