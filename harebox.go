// Package harebox is the HareBox engine: it runs untrusted code in
// sandboxes that are real virtual machines, and keeps every control outside
// the VM. New composes the pluggable parts (hypervisor, network, secret
// store, billing) over an embedded database; every consumer (the REST
// server, the CLI, agent frameworks) goes through the Engine.
//
//	eng, err := harebox.New(ctx, harebox.Options{DataDir: "/var/lib/harebox"})
//	box, err := eng.Create(ctx, sandbox.CreateRequest{Name: "job", TTLSeconds: 900})
//	res, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "python3 job.py"})
//	err = eng.Delete(ctx, box.ID)
package harebox

import (
	"context"
	"crypto/cipher"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/harebox/harebox/apikey"
	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/budget/meter"
	"github.com/harebox/harebox/capacity"
	"github.com/harebox/harebox/clone"
	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/codeinterp"
	"github.com/harebox/harebox/commands"
	"github.com/harebox/harebox/env"
	"github.com/harebox/harebox/events"
	"github.com/harebox/harebox/files"
	"github.com/harebox/harebox/firewall/credproxy"
	"github.com/harebox/harebox/guestenv"
	"github.com/harebox/harebox/history"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images/catalog"
	"github.com/harebox/harebox/ingress"
	"github.com/harebox/harebox/internal/sandboxrt"
	"github.com/harebox/harebox/mesh"
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

// Engine runs sandboxes. It is safe for concurrent use.
type Engine struct {
	opts    Options
	log     *slog.Logger
	store   store.Store
	hv      hypervisor.Hypervisor
	net     network.Network
	sec     secrets.Store
	budgets *budget.Service
	meter   *meter.Service
	closer  []func() error

	// rt runs the sandboxes; the calls on them forward to it.
	rt *sandboxrt.Runtime

	tenants *tenant.Service
	keys    *apikey.Service
	envs    *env.Service
	volumes *volume.Service
	guests  *guestenv.Service
	history *history.Service
	catalog *catalog.Catalog
	clones  *clone.Service
	// pool is set in New after the store's notices start (atomic: they
	// may ask for it meanwhile).
	pool        atomic.Pointer[clone.PoolSettings]
	snaps       *clone.Snapshots
	hibernation *clone.Hibernation
	moves       *mover.Service
	monitor     *monitor.Service
	processes   *processes.Service
	code        *codeinterp.Service
	files       *files.Service
	commands    *commands.Service
	audit       *audit.Log
	urls        *ingress.Service
	hosts       *cluster.Registry
	mesh        *mesh.Service
	tunnels     *mesh.Tunnels // nil: no tunnels to other hosts

	// urlCalls answer the calls on urls, for a principal.
	urlCalls *ingress.Calls
	events   *events.Service

	// shared: other hosts share the store (see cluster.Registry.Foreign).
	// It, hosts and capacity are set once in New, before the runtime is
	// wired with them.
	shared   bool
	capacity *capacity.Host // what the host's sandboxes reserve

	ctx    context.Context // lives until Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New opens the engine: it opens the database, starts the hypervisor
// backend, re-adopts sandboxes that were running, cleans up what a crash
// left half-made, and starts the TTL reaper.
func New(ctx context.Context, opts Options) (*Engine, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	e := &Engine{opts: opts, log: opts.Logger, net: opts.Network, sec: opts.Secrets}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.rt = sandboxrt.New(e.ctx, &e.wg, sandboxrt.Config{Site: opts.Site, BootTimeout: opts.BootTimeout, MaxOutputBytes: opts.MaxOutputBytes,
		DefaultFirewall: opts.DefaultFirewall, Images: opts.Images, MachinesDir: e.machinesDir(), Stall: opts.bootStall, Step: atStep}, e.log)
	views := e.rt.Views()
	ok := false
	defer func() {
		if !ok {
			e.cancel() // (the store's listener, if it started)
			e.closeParts()
		}
	}()
	for _, d := range []string{opts.DataDir, e.machinesDir(), opts.ImageDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("harebox: %w", err)
		}
	}
	if opts.Store != nil {
		e.store = opts.Store
	} else {
		db, err := store.OpenSQLite(ctx, filepath.Join(opts.DataDir, "harebox.db"))
		if err != nil {
			return nil, err
		}
		e.store = db
		e.closer = append(e.closer, db.Close)
	}
	if e.sec == nil {
		s, err := secrets.NewSealed(e.store, filepath.Join(opts.DataDir, "master.key"))
		if err != nil {
			return nil, err
		}
		e.sec = s
	}
	al, err := audit.Open(ctx, e.store, audit.Options{KeyFile: filepath.Join(opts.DataDir, "audit.key"), Log: e.log,
		Anchor: opts.AuditAnchor, Interval: opts.AuditCheckpointInterval})
	if err != nil {
		return nil, err
	}
	e.audit = al
	// (Before the store closes: its time-bound checkpoint stops.)
	e.closer = append(e.closer, func() error { return al.Close(context.Background()) })
	e.tenants = tenant.New(e.store)
	e.tenants.Audit = al
	e.keys = apikey.New(e.store, e.tenants)
	e.keys.Audit = al
	e.tenants.AccountDeleted = e.keys.ForgetAccount
	e.history = history.New(history.Options{Store: e.store, Secrets: e.sec, Key: e.rt.DataKey, Now: opts.Now, Log: e.log})
	// Lowering an account's retention purges at once.
	e.tenants.AccountUpdated = func(string) { e.rt.PurgeRetention(e.ctx) }
	traffic, _ := e.net.(network.Meter)
	e.monitor = monitor.New(monitor.Options{Store: e.store, Sandboxes: views.Monitor, Meter: traffic, Now: opts.Now, Log: e.log})
	e.catalog = catalog.New(catalog.Options{Images: opts.Images, Dir: opts.ImageDir, AgentPath: opts.AgentPath, Owner: opts.DataDir,
		Pool: e.poolSpecs, Store: e.store, Held: e.heldImages, Warm: e.warm,
		DropGoldens: func(dir string) { e.clones.DropImage(dir) }, Audit: al, Log: e.log})
	e.envs = env.New(e.store, e.tenants, e.sec)
	e.envs.Audit = al
	e.guests = guestenv.New(guestenv.Options{Store: e.store, Secrets: e.sec, Environments: e.envs, Audit: al, Sandboxes: views.Guests})
	mesher, _ := e.net.(network.Mesher)
	if e.mesh, err = mesh.New(mesh.Options{Store: e.store, Pool: opts.MeshPool, Enabled: mesher != nil}); err != nil {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "mesh_pool", "%v", err)
	}
	var meshApply *mesh.Applier // (nil: the network has no mesh)
	if mesher != nil {
		mesher.SetMeshNames(e.mesh.Lookup)
		meshApply = e.mesh.Applier(mesher)
	}
	e.tenants.ProjectUpdated = func(string) {
		if err := e.store.Notify(e.ctx, mesh.NoticeTopic, ""); err != nil {
			e.log.Warn("mesh: cannot tell the hosts of a project's new mesh default", "err", err)
		}
	}
	guests, _ := e.net.(network.Ingress)
	e.urls, err = ingress.New(ctx, ingress.Options{Store: e.store, Secrets: e.sec, Guests: guests, Base: opts.Ingress,
		Record: al.RecordURLAccess, Log: e.log, Now: opts.Now})
	if err != nil {
		return nil, err
	}
	e.urlCalls = ingress.NewCalls(e.urls, views.URLs, e.tenants, al)
	e.code = codeinterp.NewService(codeinterp.ServiceOptions{Sandboxes: views.Code, History: e.history, Audit: al,
		Client: codeinterp.Options{MaxOutput: opts.MaxOutputBytes}, Now: opts.Now})
	e.commands = commands.New(commands.Options{Sandboxes: views.Commands, History: e.history, Audit: al, Now: opts.Now})
	e.files = files.New(files.Options{Sandboxes: views.Files, Audit: al, MaxFileBytes: opts.MaxFileBytes})
	e.processes = processes.New(e.ctx, processes.Options{Sandboxes: views.Processes, History: e.history, Audit: al, MaxOutputBytes: opts.MaxOutputBytes, Log: e.log})
	e.budgets = budget.New(e.store, e.tenants, *opts.Prices, opts.Now)
	e.budgets.Audit = al
	e.budgets.Billing = opts.Billing
	e.events = events.New(events.Options{Log: al, Store: e.store, Budgets: e.budgets, Accounts: e.tenants})
	e.meter = meter.New(meter.Options{Budgets: e.budgets, Store: e.store, Sandboxes: views.Meter, Traffic: traffic,
		Interval: opts.MeterInterval, Now: opts.Now, Log: e.log})
	acc, err := e.tenants.EnsureDefault(ctx)
	if err != nil {
		return nil, err
	}
	// Changes made through the other hosts that share the store.
	e.store.Listen(e.ctx, e.notice)
	if n, ok := e.net.(interface {
		SetCredentials(func(sandboxID string) *credproxy.Sandbox)
	}); ok {
		n.SetCredentials(e.guests.Credentials)
	}
	if err := e.startHypervisor(ctx); err != nil {
		return nil, err
	}
	caps, err := e.hv.Capabilities(ctx)
	if err != nil {
		return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "hypervisor backend %s: %v", opts.Backend, err)
	}
	e.log.Info("hypervisor ready", "backend", caps.Name, "version", caps.Version, "accelerator", caps.Accelerator, "notice", caps.Notice)
	if !caps.Encryption && !opts.PlaintextDisks {
		return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "hypervisor backend %s cannot encrypt sandboxes' disks: set PlaintextDisks (hareboxd --plaintext-disks) to run it without crypto-erase", caps.Name)
	}
	encrypt := !opts.PlaintextDisks
	if !encrypt {
		e.log.Warn("sandboxes' disks and snapshots are not encrypted: delete is not a crypto-erase", "backend", caps.Name)
	}
	notTaken := "" // (why this host's machines take no volumes)
	switch {
	case !caps.Volumes:
		notTaken = fmt.Sprintf("this host's hypervisor (%s) does not take volumes", caps.Name)
	case caps.VolumesNeedDataKey && !encrypt:
		notTaken = fmt.Sprintf("this host's hypervisor (%s) takes volumes only into sandboxes with encrypted disks, and this host runs without (--plaintext-disks)", caps.Name)
	}
	e.capacity = capacity.New(opts.Capacity.Limits(opts.DataDir), e.usedChanged, e.log)
	pool, _ := clone.ParsePool(opts.Pool) // (checked by defaults)
	golden := opts.GoldenSnapshots && caps.Snapshot
	var seal cipher.AEAD // (golden snapshots kept across restarts)
	if golden {
		if seal, err = secrets.MasterKey(opts.GoldenKey); err != nil {
			return nil, fmt.Errorf("golden key: %w", err)
		}
	}
	e.clones = clone.New(e.ctx, clone.Options{Hypervisor: e.hv, Network: e.net, Images: e.catalog, Host: views.Clones,
		Dir: opts.GoldenDir, Seal: seal, Backend: fmt.Sprintf("%s %s %s network=%T", caps.Name, caps.Accelerator, caps.Version, e.net),
		Golden: golden, SharedMemory: opts.GoldenSharedMemory, Encrypt: encrypt, Pool: pool,
		BootTimeout: opts.BootTimeout, Stall: opts.bootStall, Agent: e.rt.AgentOptions(), Step: atStep, Log: e.log})
	e.snaps = clone.NewSnapshots(clone.SnapshotOptions{Store: e.store, Secrets: e.sec, Meter: e.meter, Envs: e.guests, Audit: al,
		Hosts: views.Snapshots, Sources: views.Snapshots, Capable: caps.Snapshot, Dir: filepath.Join(opts.DataDir, "snapshots"),
		Encrypt: encrypt, Log: e.log})
	e.hibernation = clone.NewHibernation(clone.HibernationOptions{Hypervisor: e.hv, Network: e.net, Store: e.store,
		Dir: filepath.Join(opts.DataDir, "hibernated"), Foreign: func(r *store.Sandbox) bool { return e.hosts.Foreign(r) }, Log: e.log})
	if err := e.registerHost(ctx); err != nil {
		return nil, err
	}
	e.pool.Store(clone.NewPoolSettings(clone.PoolSettingsOptions{
		Store: store.Narrow(e.store, func(tx store.Tx) clone.PoolTx { return tx }),
		Pool:  e.clones, Local: opts.Pool, Host: e.hosts.Name(), Audit: al, Now: opts.Now, Log: e.log}))
	e.volumes = volume.New(volume.Options{Store: e.store, Tenants: e.tenants, Secrets: e.sec,
		Dir: filepath.Join(opts.DataDir, "volumes"), Host: e.hosts.Name(), MaxGB: opts.MaxVolumeGB, ProjectGB: opts.ProjectVolumeGB,
		Capacity: e.capacity, Meter: e.meter, Audit: al, Log: e.log, NotTaken: notTaken})
	var client *move.Client // (none: no internal endpoint, no moves away)
	if opts.Host.TLS != nil {
		client = move.NewClient(opts.Host.TLS.Client)
	}
	e.moves = mover.New(mover.Options{Store: e.store, Hosts: e.hosts, Runtime: views.Moves, Files: e.hibernation, Volumes: moveVolumes{e.volumes},
		MachinesDir: e.machinesDir(), Client: client, Stale: moveStale, Every: moveEvery, Now: opts.Now, Step: atStep, Log: e.log})
	if err := e.volumes.Adopt(ctx); err != nil {
		return nil, err
	}
	if e.shared {
		e.moves.PruneVolumes(ctx)
	}
	if opts.MeshTunnel != nil {
		if e.tunnels, err = mesh.NewTunnels(mesh.TunnelOptions{Store: store.Narrow(e.store, func(tx store.Tx) mesh.TunnelTx { return tx }),
			Host: e.hosts.Name(), Endpoint: opts.MeshEndpoint, Tunnel: opts.MeshTunnel, Pool: e.mesh.Pool(), Log: e.log}); err != nil {
			return nil, sandbox.Errorf(sandbox.ErrInvalid, "mesh_endpoint", "%v", err)
		}
	}
	e.rt.Wire(sandboxrt.Parts{Store: e.store, Hypervisor: e.hv, Network: e.net, Secrets: e.sec, Capacity: e.capacity, Meter: e.meter,
		Tenants: e.tenants, Guests: e.guests, Volumes: e.volumes, Mesh: e.mesh, MeshApply: meshApply, URLs: e.urls, History: e.history,
		Monitor: e.monitor, Processes: e.processes, Code: e.code, Catalog: e.catalog, Clones: e.clones, Snapshots: e.snaps,
		Hibernation: e.hibernation, Moves: e.moves, Audit: al, Hosts: e.hosts, DefaultAccount: acc,
		Encrypt: encrypt, Reuse: caps.Reuse, Shared: e.shared})
	if err := e.rt.Adopt(ctx); err != nil {
		return nil, err
	}
	if err := e.meter.Reconcile(ctx); err != nil {
		return nil, err
	}
	e.clones.Open() // (the kept golden snapshots; what a crash left removed)
	if err := e.hibernation.Prune(ctx); err != nil {
		e.log.Warn("hibernation files: prune failed", "err", err)
	}
	if err := e.snaps.Prune(ctx); err != nil {
		e.log.Warn("snapshot directories: prune failed", "err", err)
	}
	// What ran while the engine was down is charged, and budgets reached
	// meanwhile are acted on, before anything new is admitted.
	if err := e.meter.Settle(ctx); err != nil {
		e.log.Warn("metering at start failed", "err", err)
	}
	if e.shared { // (one host on SQLite: no lease to keep)
		e.wg.Add(1)
		go func() { defer e.wg.Done(); e.hosts.Run(e.ctx) }()
	}
	if e.tunnels != nil {
		e.wg.Add(1)
		go func() { defer e.wg.Done(); e.tunnels.Run(e.ctx) }()
	}
	if e.shared {
		e.wg.Add(1)
		go func() { defer e.wg.Done(); e.moves.Run(e.ctx) }()
	}
	e.rt.Run(opts.HealthInterval)
	e.wg.Add(1)
	go func() { defer e.wg.Done(); e.catalog.Run(e.ctx) }()
	if opts.MeterInterval > 0 {
		e.wg.Add(1)
		go func() { defer e.wg.Done(); e.meter.Run(e.ctx, opts.MeterInterval) }()
	}
	if opts.MetricsInterval > 0 {
		e.wg.Add(1)
		go func() { defer e.wg.Done(); e.monitor.Run(e.ctx, opts.MetricsInterval) }()
	}
	e.pool.Load().Load(ctx)
	if golden { // (the pool's setting may name images later: harebox pool set)
		e.wg.Add(1)
		go func() { defer e.wg.Done(); e.clones.Run(e.ctx) }()
	}
	ok = true
	return e, nil
}

// Ready says whether the engine can serve, part by part (nil: ready):
// "database" (it answers a read), "hypervisor" (the backend answers; a
// crashed plugin is started again by this check) and, with a Network that
// can tell (network.Checker), "network" (every attached sandbox's firewall
// in the kernel). It needs no principal: it tells
// no more than whether the host works.
func (e *Engine) Ready(ctx context.Context) map[string]error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out := map[string]error{"database": e.store.Ping(ctx)}
	_, out["hypervisor"] = e.hv.Capabilities(ctx)
	if c, ok := e.net.(network.Checker); ok {
		out["network"] = c.Check(ctx)
	}
	return out
}

// Site is where this engine's sandboxes run.
func (e *Engine) Site() sandbox.Site { return e.opts.Site }

// Secrets is the engine's secret store (Options.Secrets or its default),
// for a part that keeps a sandbox's secrets in its scope, as the E2B
// control plane keeps its envd tokens.
func (e *Engine) Secrets() secrets.Store { return e.sec }

// Close stops the engine. Sandboxes keep running; a new engine on the same
// data directory re-adopts them.
func (e *Engine) Close() error {
	e.cancel()
	e.wg.Wait()
	e.clones.Close()
	// A last checkpoint: the sandboxes keep running, and the next engine
	// charges from here.
	e.meter.SettleAll(context.Background())
	if err := e.audit.Close(context.Background()); err != nil {
		e.log.Error("audit: cannot sign the last entries", "err", err)
	}
	e.rt.HangUpAll(sandbox.Errorf(sandbox.ErrUnavailable, "", "the server is shutting down"))
	e.code.Close()
	return e.closeParts()
}

func (e *Engine) closeParts() error {
	var errs []error
	for i := len(e.closer) - 1; i >= 0; i-- {
		errs = append(errs, e.closer[i]())
	}
	e.closer = nil
	return errors.Join(errs...)
}

func (e *Engine) machinesDir() string { return filepath.Join(e.opts.DataDir, "m") }

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
