package harebox

import (
	"context"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/ingress"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Published ports. The ingress package keeps the URLs and serves them;
// the engine authorizes each call on the sandbox and records it, and
// unpublishes a sandbox's URLs when it is destroyed.

// URLs is the engine's ingress: the caller serves it on its own listener
// (Serve) at Options.Ingress.
func (e *Engine) URLs() *ingress.Service { return e.urls }

// CreateURL publishes a port of a sandbox that is not deleted. The result
// carries the URL's token, shown only here and by RotateURL.
func (e *Engine) CreateURL(ctx context.Context, id string, req sandbox.URLRequest) (_ *sandbox.URL, err error) {
	defer e.audited(ctx, "createURL", id, &err)
	if err := e.check(ctx, "createURL", id); err != nil {
		return nil, err
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec.State == sandbox.StateDeleted {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is deleted", id)
	}
	u, err := e.urls.Create(ctx, ingress.Owner{SandboxID: id, AccountID: rec.AccountID, ProjectID: rec.ProjectID}, req)
	if err != nil {
		return nil, err
	}
	// A Delete that ran meanwhile marks the sandbox deleted before its
	// last sweep of URLs: either that sweep saw this one, or this check
	// sees the mark.
	if rec, err := e.record(ctx, id); err == nil && rec.State == sandbox.StateDeleted {
		e.urls.Delete(context.WithoutCancel(ctx), id, u.ID)
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is deleted", id)
	}
	return u, nil
}

// ListURLs lists a sandbox's URLs, oldest first.
func (e *Engine) ListURLs(ctx context.Context, id string) ([]*sandbox.URL, error) {
	if err := e.check(ctx, "listURLs", id); err != nil {
		return nil, err
	}
	return e.urls.List(ctx, id)
}

// GetURL returns one URL of a sandbox.
func (e *Engine) GetURL(ctx context.Context, id, urlID string) (*sandbox.URL, error) {
	if err := e.check(ctx, "getURL", id); err != nil {
		return nil, err
	}
	return e.urls.Get(ctx, id, urlID)
}

// RotateURL gives a URL a new token. When it returns the old token is
// refused, and what it opened (requests, streams, WebSockets, HTTP/1.1
// connections) is cut.
func (e *Engine) RotateURL(ctx context.Context, id, urlID string) (_ *sandbox.URL, err error) {
	defer e.audited(ctx, "rotateURL", id, &err)
	if err := e.check(ctx, "rotateURL", id); err != nil {
		return nil, err
	}
	return e.urls.Rotate(ctx, id, urlID)
}

// DeleteURL unpublishes a URL.
func (e *Engine) DeleteURL(ctx context.Context, id, urlID string) (err error) {
	defer e.audited(ctx, "deleteURL", id, &err)
	if err := e.check(ctx, "deleteURL", id); err != nil {
		return err
	}
	return e.urls.Delete(ctx, id, urlID)
}

// URL certificate authorities: a project's mtls URLs take the client
// certificates its CA signed. The calls name the project as environments'
// do (account and project references; "" the default).

// urlProject resolves the project of a URL CA call for the principal in
// ctx. A key limited to some sandboxes may read the CA but not change it
// or issue from it: its certificates open every mtls URL of the project.
func (e *Engine) urlProject(ctx context.Context, action, accountRef, projectRef string, change bool) (*store.Project, error) {
	p := authz.From(ctx)
	if err := authz.Allowed(p, action); err != nil {
		return nil, err
	}
	if change && (len(p.Scope.Sandboxes) > 0 || len(p.Scope.Labels) > 0) {
		return nil, sandbox.Errorf(sandbox.ErrForbidden, "", "this API key is limited to some sandboxes; a project's URL CA vouches for all of its URLs")
	}
	var proj *store.Project
	err := e.store.Update(ctx, func(tx store.Tx) error {
		var err error
		_, proj, err = e.tenants.ProjectIn(ctx, tx, accountRef, projectRef)
		return err
	})
	return proj, err
}

// URLCA returns a project's URL certificate authority.
func (e *Engine) URLCA(ctx context.Context, accountRef, projectRef string) (*sandbox.URLCA, error) {
	proj, err := e.urlProject(ctx, "getURLCA", accountRef, projectRef, false)
	if err != nil {
		return nil, err
	}
	return e.urls.CA(ctx, proj.ID)
}

// SetURLCA gives a project a new URL CA: uploaded, or made here. The old
// one's certificates stop working, and what they opened is cut.
func (e *Engine) SetURLCA(ctx context.Context, accountRef, projectRef string, req sandbox.URLCARequest) (_ *sandbox.URLCA, err error) {
	proj, err := e.urlProject(ctx, "setURLCA", accountRef, projectRef, true)
	defer e.auditedProject(ctx, "setURLCA", proj, projectRef, &err)
	if err != nil {
		return nil, err
	}
	return e.urls.SetCA(ctx, proj.ID, proj.AccountID, req)
}

// DeleteURLCA deletes a project's URL CA: its mtls URLs refuse everyone.
func (e *Engine) DeleteURLCA(ctx context.Context, accountRef, projectRef string) (err error) {
	proj, err := e.urlProject(ctx, "deleteURLCA", accountRef, projectRef, true)
	defer e.auditedProject(ctx, "deleteURLCA", proj, projectRef, &err)
	if err != nil {
		return err
	}
	return e.urls.DeleteCA(ctx, proj.ID)
}

// IssueClientCert issues a client certificate from a project's URL CA.
func (e *Engine) IssueClientCert(ctx context.Context, accountRef, projectRef string, req sandbox.ClientCertRequest) (_ *sandbox.ClientCert, err error) {
	proj, err := e.urlProject(ctx, "issueClientCert", accountRef, projectRef, true)
	defer e.auditedProject(ctx, "issueClientCert", proj, projectRef, &err)
	if err != nil {
		return nil, err
	}
	return e.urls.IssueCert(ctx, proj.ID, req)
}

// ListClientCerts lists a project's issued and revoked certificates.
func (e *Engine) ListClientCerts(ctx context.Context, accountRef, projectRef string) ([]*sandbox.ClientCert, error) {
	proj, err := e.urlProject(ctx, "listClientCerts", accountRef, projectRef, false)
	if err != nil {
		return nil, err
	}
	return e.urls.ListCerts(ctx, proj.ID)
}

// RevokeClientCert revokes a certificate of a project's URL CA by serial.
func (e *Engine) RevokeClientCert(ctx context.Context, accountRef, projectRef, serial string) (_ *sandbox.ClientCert, err error) {
	proj, err := e.urlProject(ctx, "revokeClientCert", accountRef, projectRef, true)
	defer e.auditedProject(ctx, "revokeClientCert", proj, projectRef, &err)
	if err != nil {
		return nil, err
	}
	return e.urls.RevokeCert(ctx, proj.ID, serial)
}

// auditedProject records a call on a project (ref when it was not found).
func (e *Engine) auditedProject(ctx context.Context, action string, proj *store.Project, ref string, err *error) {
	acc, target := "", ref
	if proj != nil {
		acc, target = proj.AccountID, proj.ID
	}
	e.audit.Record(ctx, action, acc, target, *err)
}
