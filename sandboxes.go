package harebox

import (
	"context"
	"time"

	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/internal/sandboxrt"
	"github.com/harebox/harebox/monitor"
	"github.com/harebox/harebox/sandbox"
)

// The calls on sandboxes are the runtime's (internal/sandboxrt): each is
// authorized for the principal in the context (authz.WithPrincipal; none
// is the operator) and audited there; the methods below are the library's
// names for them.

// Create boots a new sandbox and returns it once its agent answers.
func (e *Engine) Create(ctx context.Context, req sandbox.CreateRequest) (*sandbox.Sandbox, error) {
	return e.rt.Create(ctx, req)
}

// Get returns a sandbox, including deleted ones.
func (e *Engine) Get(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return e.rt.Get(ctx, id)
}

// List returns the sandboxes that match f, oldest first. Deleted
// sandboxes are listed only when f.State asks for them.
func (e *Engine) List(ctx context.Context, f sandbox.ListFilter) ([]*sandbox.Sandbox, error) {
	return e.rt.List(ctx, f)
}

// Delete destroys a sandbox: its VM, disks and network. Deleting a deleted
// sandbox is an error; the record stays, with state deleted.
func (e *Engine) Delete(ctx context.Context, id string) error {
	return e.rt.Delete(ctx, id)
}

// Pause freezes a running sandbox's VM.
func (e *Engine) Pause(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return e.rt.Pause(ctx, id)
}

// Resume continues a paused sandbox.
func (e *Engine) Resume(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return e.rt.Resume(ctx, id)
}

// Stop shuts a running or paused sandbox down and keeps its disk, its data
// key and its record; Start boots it again on that disk. What ran in it
// (processes, memory) is gone; its network is given up and made again at
// Start. A stopped sandbox holds no host capacity and is charged for its disk only.
func (e *Engine) Stop(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return e.rt.Stop(ctx, id)
}

// Start boots a sandbox that Stop stopped, on the disk it kept, with its
// environment, credentials and firewall policy; it is admitted again (host
// capacity, budgets) as a create is.
func (e *Engine) Start(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return e.rt.Start(ctx, id)
}

// Hibernate writes a sandbox's memory to disk and frees its host RAM.
func (e *Engine) Hibernate(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return e.rt.Hibernate(ctx, id)
}

// SetTimeout sets when a running or paused sandbox expires: ttl from now
// (the reaper deletes it then, as a create's TTL does), or never for a ttl
// of 0. It replaces whatever TTL the sandbox had, shorter or longer.
func (e *Engine) SetTimeout(ctx context.Context, id string, ttl time.Duration) (*sandbox.Sandbox, error) {
	return e.rt.SetTimeout(ctx, id, ttl)
}

// Firewall returns a sandbox's firewall policy.
func (e *Engine) Firewall(ctx context.Context, id string) (*firewall.Policy, error) {
	return e.rt.Firewall(ctx, id)
}

// SetFirewall replaces a sandbox's firewall policy. The policy is
// validated and enforced before it is stored; if either fails, the old
// policy stays in force.
func (e *Engine) SetFirewall(ctx context.Context, id string, p *firewall.Policy) (*firewall.Policy, error) {
	return e.rt.SetFirewall(ctx, id, p)
}

// Authorize reports whether the principal in ctx may do action on sandbox
// id, which must exist: nil, or the error the call itself would return
// first. A server uses it to answer before it commits to a stream.
func (e *Engine) Authorize(ctx context.Context, action, id string) error {
	return e.rt.Authorize(ctx, action, id)
}

// OnSandbox authorizes action on sandbox id, which must exist, for the
// principal in ctx, then calls call, and records the action and how it
// ended in the audit log: a domain's service called directly (by the REST
// layer) on a sandbox is checked and audited as the engine's own calls are.
func (e *Engine) OnSandbox(ctx context.Context, action, id string, call func(context.Context) error) error {
	return e.rt.OnSandbox(ctx, action, id, call)
}

// Stats returns the engine's counts now (for a principal that
// monitor.MayReadServer allows: they are the host's, across accounts).
func (e *Engine) Stats(ctx context.Context) (monitor.Stats, error) {
	return e.rt.Stats(ctx)
}

// MaxSerialLogBytes bounds a sandbox's console log: the guest writes to
// its serial port as fast as it likes, for as long as it lives.
const MaxSerialLogBytes = sandboxrt.MaxSerialLogBytes
