// Package sandboxrt is the sandbox runtime: the boxes of one host and
// their table, create as named steps with their undo, destroy, the
// transitions (pause, stop and start, hibernate and wake), re-adoption at
// start, the TTL reaper and the agents' health, and the views of its
// sandboxes that the domain services are lent.
//
// Only package harebox imports it: harebox.New composes the parts and
// wires them in (Wire), and harebox.Engine's calls on sandboxes forward
// here. Each domain (budgets, environments, URLs, volumes, clones, moves)
// stays in its own package; the runtime calls it at fixed points of a
// sandbox's life.
package sandboxrt

import (
	"context"
	"log/slog"
	"sync"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/budget/meter"
	"github.com/harebox/harebox/capacity"
	"github.com/harebox/harebox/clone"
	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/codeinterp"
	"github.com/harebox/harebox/commands"
	"github.com/harebox/harebox/env"
	"github.com/harebox/harebox/files"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/guestenv"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/ingress"
	"github.com/harebox/harebox/internal/stall"
	"github.com/harebox/harebox/mesh"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/monitor"
	"github.com/harebox/harebox/move"
	"github.com/harebox/harebox/move/mover"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/processes"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
	"github.com/harebox/harebox/volume"
)

// Config is what the runtime takes of harebox.Options.
type Config struct {
	Site            sandbox.Site
	BootTimeout     time.Duration
	MaxOutputBytes  int
	DefaultFirewall *firewall.Policy
	Images          map[string]images.Image
	// MachinesDir holds each sandbox's state directory.
	MachinesDir string
	// Stall says when a cold boot has stalled (launched again, once).
	Stall stall.Rule
	// Step, if set, is called at each step of a delete with the
	// sandbox's ID (the crash tests stop the engine there).
	Step func(step, id string)
}

// Parts are the pieces harebox.New composed, handed to the runtime once
// they all exist (Wire).
type Parts struct {
	Store       store.Store
	Hypervisor  hypervisor.Hypervisor
	Network     network.Network
	Secrets     secrets.Store
	Capacity    *capacity.Host
	Meter       Meter
	Tenants     Tenants
	Guests      Guests
	Volumes     Volumes
	Mesh        Mesh
	MeshApply   *mesh.Applier // nil: the network has no mesh
	URLs        URLs
	History     History
	Monitor     Purger
	Processes   Forgetter
	Code        Forgetter
	Catalog     Images
	Clones      Clones
	Snapshots   Snapshots
	Hibernation Hibernation
	Moves       Moves
	Audit       Audit
	Hosts       Hosts
	// DefaultAccount is where records from before tenancy are placed.
	DefaultAccount *tenant.Account
	// Encrypt: the backend encrypts under Spec.DataKey, so every sandbox
	// gets a data key (crypto-erase). Reuse: it boots a machine again on
	// its disks (Stop/Start). Shared: other hosts share the store.
	Encrypt, Reuse, Shared bool
}

// The domains the runtime calls at fixed points of a sandbox's life, each
// as the calls it makes (harebox.New wires in the services).
type (
	// Meter charges a sandbox (budget/meter): admitted when it is placed,
	// settled at each transition, finally and released when it goes, and
	// kept when another host hands it over.
	Meter interface {
		Admit(ctx context.Context, tx store.Tx, rec *store.Sandbox) error
		Transition(ctx context.Context, rec *store.Sandbox, next sandbox.State, admit bool) error
		Final(ctx context.Context, rec *store.Sandbox)
		Release(ctx context.Context, rec *store.Sandbox) error
		Keep(ctx context.Context, rec *store.Sandbox, state sandbox.State) error
	}
	// Guests gives a guest its environment and credentials (guestenv):
	// pinned in the create's transaction, prepared at create, loaded when
	// it runs again, delivered after every boot, erased at delete.
	Guests interface {
		Pin(ctx context.Context, tx env.Tx, req *sandbox.CreateRequest, proj *store.Project, rec *store.Sandbox) error
		PrepareEnv(ctx context.Context, sb guestenv.Sandbox, vars map[string]string) error
		PrepareCredentials(ctx context.Context, sb guestenv.Sandbox) error
		LoadEnv(ctx context.Context, sb guestenv.Sandbox) error
		LoadCredentials(ctx context.Context, sb guestenv.Sandbox) error
		Deliver(ctx context.Context, sb guestenv.Sandbox, a guestenv.Agent) error
		Erase(ctx context.Context, sandboxID string) error
	}
	// Volumes attaches a sandbox's volumes (volume): claimed at create,
	// mounted after a boot, detached for a snapshot, unmounted and
	// released when it goes; a removed host's dropped.
	Volumes interface {
		Claim(ctx context.Context, tx volume.Tx, rec *store.Sandbox, mounts []sandbox.VolumeMount) ([]volume.Layering, error)
		Layer(ctx context.Context, l volume.Layering, m hypervisor.Machine, c *agentclient.Client) error
		Layered(ctx context.Context, l volume.Layering) error
		Await(ctx context.Context, l volume.Layering) error
		Mount(ctx context.Context, rec *store.Sandbox, m hypervisor.Machine, c *agentclient.Client) error
		Detach(ctx context.Context, rec *store.Sandbox, m hypervisor.Machine, c *agentclient.Client) error
		Unmount(ctx context.Context, rec *store.Sandbox, c *agentclient.Client)
		Release(ctx context.Context, rec *store.Sandbox) error
		DropHost(ctx context.Context, host string) error
	}
	// URLs are a sandbox's published ports (ingress): forgotten when it
	// is destroyed, let go of and taken up when it moves.
	URLs interface {
		Forget(ctx context.Context, sandboxID string) error
		Left(sandboxID string)
		Took(ctx context.Context, sandboxID string) error
	}
	// History is the sandboxes' command history: erased with a sandbox,
	// purged by retention.
	History interface {
		Erase(ctx context.Context, sandboxID string) error
		Purge(ctx context.Context)
	}
	// Forgetter forgets what a service keeps of a sandbox whose machine
	// went (processes, the code interpreter's clients).
	Forgetter interface{ Forget(id string) }
	// Purger applies every account's retention (monitoring samples).
	Purger interface{ Purge(ctx context.Context) }
	// Tenants place a create in its account, project and fleet (tenant).
	Tenants interface {
		Place(ctx context.Context, tx tenant.Placer, req *sandbox.CreateRequest, rec *store.Sandbox) (*tenant.Project, error)
		Account(ctx context.Context, tx tenant.Resolver, ref string) (*tenant.Account, error)
		ProjectIn(ctx context.Context, tx tenant.Resolver, accountRef, ref string) (*tenant.Account, *tenant.Project, error)
		Fleet(ctx context.Context, tx tenant.Resolver, p *tenant.Project, ref string) (*tenant.Fleet, error)
	}
	// Mesh gives a sandbox its place on its project's mesh (mesh): joined
	// in the create's transaction, left when it goes.
	Mesh interface {
		Join(ctx context.Context, tx mesh.Tx, req *sandbox.CreateRequest, proj *model.Project, rec *store.Sandbox) error
		Leave(ctx context.Context, id string) error
	}
	// Images finds an image's build by name (images/catalog).
	Images interface {
		Lookup(name string) (images.Image, error)
	}
	// Clones are the golden snapshots and the warm pool (clone.Service):
	// a create claims a member or restores from a golden snapshot, and
	// reserves its capacity through the pool.
	Clones interface {
		Claim(img images.Image, res sandbox.Resources) *clone.Member
		Discard(pm *clone.Member)
		Golden(name string, img images.Image, res sandbox.Resources) (*store.Snapshot, []byte)
		Failed(img images.Image, res sandbox.Resources, snap *store.Snapshot, err error)
		Reserve(res sandbox.Resources) error
		Idle() int
		SharedMemory() bool
	}
	// Snapshots are the snapshots kept (clone.Snapshots): a create opens
	// one to restore from; a snapshot's files are dropped.
	Snapshots interface {
		Open(ctx context.Context, req *sandbox.CreateRequest) (*clone.Origin, error)
		MayTake(rec *store.Sandbox) error
		Drop(ctx context.Context, sn *store.Snapshot) error
	}
	// Hibernation holds a hibernated sandbox's files (clone.Hibernation).
	Hibernation interface {
		Prepare(id string) error
		Write(ctx context.Context, m hypervisor.Machine, id string, key []byte) (int64, error)
		Origin(id string, key []byte) (*clone.Origin, error)
		Bytes(id string) int64
		Remove(id string) error
		Finish(ctx context.Context, rec *store.Sandbox)
	}
	// Moves move a sandbox to another host, and drain this one
	// (move/mover).
	Moves interface {
		Move(ctx context.Context, id, to string) (*move.Result, error)
		Drain(ctx context.Context, name string, moveOne func(ctx context.Context, id, to string) (*move.Result, error)) (*move.DrainReport, error)
	}
	// Audit records what was done (audit.Log).
	Audit interface {
		Record(ctx context.Context, action, accountID, target string, err error)
		RecordIn(ctx context.Context, tx audit.Tx, action, accountID, target string, err error) error
		RecordEvent(principal, accountID, action, target string)
	}
	// Hosts are the deployment's hosts (cluster.Registry): this one's name
	// and draining, the host of a sandbox or snapshot.
	Hosts interface {
		Name() string
		Get(ctx context.Context, name string) (*cluster.Host, error)
		Foreign(rec *store.Sandbox) bool
		SnapshotElsewhere(ctx context.Context, id string) (*cluster.Host, error)
		Draining() bool
		SetDraining(ctx context.Context, on bool) error
	}
)

// Runtime runs one host's sandboxes. It is safe for concurrent use.
type Runtime struct {
	opts Config
	log  *slog.Logger

	store       store.Store
	hv          hypervisor.Hypervisor
	net         network.Network
	sec         secrets.Store
	capacity    *capacity.Host // what the host's sandboxes reserve
	meter       Meter
	tenants     Tenants
	guests      Guests
	volumes     Volumes
	mesh        Mesh
	meshApply   *mesh.Applier
	urls        URLs
	history     History
	monitor     Purger
	processes   Forgetter
	code        Forgetter
	catalog     Images
	clones      Clones
	snaps       Snapshots
	hibernation Hibernation
	moves       Moves
	audit       Audit
	hosts       Hosts
	defaultAcc  *tenant.Account
	encrypt     bool
	reuse       bool
	shared      bool

	boxes    *table
	meshWake chan struct{} // refreshMesh's
	// creates sums the creates' timings by how they were served.
	creates createStats

	ctx context.Context // lives until the engine closes
	wg  *sync.WaitGroup // the engine's: Close waits for the runtime's loops
}

// New makes a runtime with no sandboxes; nothing runs until Run. Its
// views (Views) may be handed out at once; no call on them may come
// before Wire.
func New(ctx context.Context, wg *sync.WaitGroup, c Config, log *slog.Logger) *Runtime {
	if c.Step == nil {
		c.Step = func(string, string) {}
	}
	return &Runtime{opts: c, log: log, boxes: newTable(), meshWake: make(chan struct{}, 1), ctx: ctx, wg: wg}
}

// Wire gives the runtime its parts, before Adopt.
func (e *Runtime) Wire(p Parts) {
	e.store, e.hv, e.net, e.sec = p.Store, p.Hypervisor, p.Network, p.Secrets
	e.capacity, e.meter, e.tenants, e.guests, e.volumes = p.Capacity, p.Meter, p.Tenants, p.Guests, p.Volumes
	e.mesh, e.meshApply, e.urls, e.history, e.monitor = p.Mesh, p.MeshApply, p.URLs, p.History, p.Monitor
	e.processes, e.code, e.catalog, e.clones, e.snaps = p.Processes, p.Code, p.Catalog, p.Clones, p.Snapshots
	e.hibernation, e.moves, e.audit, e.hosts, e.defaultAcc = p.Hibernation, p.Moves, p.Audit, p.Hosts, p.DefaultAccount
	e.encrypt, e.reuse, e.shared = p.Encrypt, p.Reuse, p.Shared
}

// Run starts the runtime's loops on the engine's context and wait group:
// the TTL reaper, the agents' health checks every health (none if not
// positive), and the mesh's refresh when the network has a mesh.
func (e *Runtime) Run(health time.Duration) {
	if e.meshApply != nil {
		e.wg.Add(1)
		go e.refreshMesh()
	}
	e.wg.Add(1)
	go e.reapExpired()
	if health > 0 {
		e.wg.Add(1)
		go e.watchAgents(health)
	}
}

// HangUpAll closes every live sandbox's agent connection with why (the
// engine is closing; the sandboxes run on).
func (e *Runtime) HangUpAll(why error) {
	for _, b := range e.boxes.all() {
		b.closeAgent(why)
	}
}

// Views are the runtime's sandboxes as each domain service takes them.
type Views struct {
	Monitor   monitor.Sandboxes
	Guests    guestenv.Sandboxes
	URLs      ingress.Sandboxes
	Processes processes.Sandboxes
	Meter     meter.Sandboxes
	Code      codeinterp.Sandboxes
	Commands  commands.Sandboxes
	Files     files.Sandboxes
	Clones    clone.Host
	Snapshots interface {
		clone.Sources
		clone.Hosts
	}
	Hosts cluster.Sandboxes
	Moves mover.Runtime
}

// Views returns the views of the runtime's sandboxes.
func (e *Runtime) Views() Views {
	v := sandboxView{e}
	return Views{Monitor: v, Guests: v, URLs: v, Processes: v, Meter: v, Code: codeView{v}, Commands: commandView{v},
		Files: fileView{v}, Clones: cloneHost{e}, Snapshots: snapshotSources{e}, Hosts: hostView{e}, Moves: moveRuntime{e}}
}

func (e *Runtime) machinesDir() string { return e.opts.MachinesDir }
