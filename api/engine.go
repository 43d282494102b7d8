package api

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/harebox/harebox/apikey"
	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/clone"
	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/codeinterp"
	"github.com/harebox/harebox/env"
	"github.com/harebox/harebox/events"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/history"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images/catalog"
	"github.com/harebox/harebox/ingress"
	"github.com/harebox/harebox/monitor"
	"github.com/harebox/harebox/move"
	"github.com/harebox/harebox/processes"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/tenant"
	"github.com/harebox/harebox/volume"
)

// The engine as the REST layer sees it: the sandbox runtime's calls, in
// small interfaces by job, and the domain services it hands out.
// *harebox.Engine implements Engine; the API does not import the root
// package, so the dependency points one way (cmd/hareboxd composes the
// two).

// Engine is everything the server calls.
type Engine interface {
	Sandboxes
	Commands
	Files
	Firewalls
	Domains
	Control
}

// Sandboxes are the calls on a sandbox's lifecycle.
type Sandboxes interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (*sandbox.Sandbox, error)
	Get(ctx context.Context, id string) (*sandbox.Sandbox, error)
	List(ctx context.Context, f sandbox.ListFilter) ([]*sandbox.Sandbox, error)
	Delete(ctx context.Context, id string) error
	Pause(ctx context.Context, id string) (*sandbox.Sandbox, error)
	Resume(ctx context.Context, id string) (*sandbox.Sandbox, error)
	Stop(ctx context.Context, id string) (*sandbox.Sandbox, error)
	Start(ctx context.Context, id string) (*sandbox.Sandbox, error)
	Hibernate(ctx context.Context, id string) (*sandbox.Sandbox, error)
	// Move moves a sandbox to another host (the operator only).
	Move(ctx context.Context, id, to string) (*move.Result, error)
	// SetTimeout sets when the sandbox expires: ttl from now, or never
	// for 0.
	SetTimeout(ctx context.Context, id string, ttl time.Duration) (*sandbox.Sandbox, error)
}

// Commands run commands in a sandbox (its background processes are
// package processes', in Domains).
type Commands interface {
	Exec(ctx context.Context, id string, r sandbox.ExecRequest) (*sandbox.ExecResult, error)
	ExecStream(ctx context.Context, id string, r sandbox.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (*sandbox.ExecResult, error)
	Shell(ctx context.Context, id string, r sandbox.ExecRequest, term *sandbox.Terminal, stdin io.Reader, stdout, stderr io.Writer) (*sandbox.ExecResult, error)
}

// Files are the calls on a sandbox's files.
type Files interface {
	ReadFile(ctx context.Context, id, path string, w io.Writer) (int64, error)
	WriteFile(ctx context.Context, id, path string, r io.Reader, o sandbox.WriteOptions) (*sandbox.FileInfo, error)
	StatFile(ctx context.Context, id, path string) (*sandbox.FileInfo, error)
	ListFiles(ctx context.Context, id, path string, depth int) ([]sandbox.FileInfo, bool, error)
	Mkdir(ctx context.Context, id, path string, mode uint32, owner string) (*sandbox.FileInfo, error)
	MoveFile(ctx context.Context, id, from, to string) (*sandbox.FileInfo, error)
	RemoveFile(ctx context.Context, id, path string, recursive bool) error
}

// Firewalls read and replace a sandbox's firewall policy.
type Firewalls interface {
	Firewall(ctx context.Context, id string) (*firewall.Policy, error)
	SetFirewall(ctx context.Context, id string, p *firewall.Policy) (*firewall.Policy, error)
}

// Domains are the domain services the REST layer calls directly for
// their own calls.
type Domains interface {
	Tenants() *tenant.Service
	Keys() *apikey.Service
	Environments() *env.Service
	Volumes() *volume.Service
	Budgets() *budget.Service
	Audit() *audit.Log
	History() *history.Service
	Monitor() *monitor.Service
	Processes() *processes.Service
	Code() *codeinterp.Service
	URLCalls() *ingress.Calls
	Images() *catalog.Catalog
	Events() *events.Service
	Snapshots() *clone.Snapshots
	// Pool is the warm pool's setting, the same for every host.
	Pool() *clone.PoolSettings
	// Cluster is the deployment's hosts: this one's name, where a
	// sandbox runs and a create goes, the hosts listed and removed.
	Cluster() *cluster.Registry
}

// Control is the engine as a whole: authorization, counts and
// readiness.
type Control interface {
	Authorize(ctx context.Context, action, id string) error
	OnSandbox(ctx context.Context, action, id string, call func(context.Context) error) error
	Stats(ctx context.Context) (monitor.Stats, error)
	Ready(ctx context.Context) map[string]error
	Capabilities(ctx context.Context) (hypervisor.Capabilities, error)
	Site() sandbox.Site
	// Drain marks this host draining and moves its sandboxes to others;
	// Undrain lets new sandboxes come again (the operator only).
	Drain(ctx context.Context, name string) (*move.DrainReport, error)
	Undrain(ctx context.Context, name string) error
	// Moves serves this host's side of moves from other hosts (on the
	// internal endpoint only).
	Moves() http.Handler
	// RotateMeshKey has a host make a new key for its mesh tunnel.
	RotateMeshKey(ctx context.Context, host string) error
	Close() error
}
