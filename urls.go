package harebox

import (
	"context"

	"github.com/harebox/harebox/ingress"
	"github.com/harebox/harebox/sandbox"
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
	u, err := e.urls.Create(ctx, id, rec.AccountID, req)
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
