package sandboxrt

import (
	"context"
	"path/filepath"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/clone"
	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
	"github.com/harebox/harebox/volume"
)

// Create boots a new sandbox and returns it once its agent answers.
func (e *Runtime) Create(ctx context.Context, req sandbox.CreateRequest) (out *sandbox.Sandbox, err error) {
	created := false // (then create recorded it)
	defer func() {
		if !created {
			e.audited(ctx, "createSandbox", "", &err)
		}
	}()
	// Rights first: a key that may not create learns nothing from the
	// request's validation (which images exist, ...).
	if err := tenant.MayCreate(authz.From(ctx)); err != nil {
		return nil, err
	}
	var o *clone.Origin
	if req.Snapshot != "" {
		if o, err = e.snaps.Open(ctx, &req); err != nil {
			return nil, err
		}
		defer o.Done()
		// (Its files are on the host of the sandbox it was taken of.)
		if h, err := e.hosts.SnapshotElsewhere(ctx, req.Snapshot); err != nil || h != nil {
			if err != nil {
				return nil, err
			}
			return nil, elsewhereErr("snapshot "+req.Snapshot, h.Name)
		}
	}
	created = true
	return e.create(ctx, req, o)
}

// create makes a sandbox: booted from its image, or restored from o. It
// runs createSteps in order; when one fails, the undos of those before it
// run in reverse (firecracker-go-sdk's handler lists are the model). The
// audit log's entry of the create commits with its admission (the record,
// its budgets' reservation); one that fails after that gets a second
// entry, which says how it failed.
func (e *Runtime) create(ctx context.Context, req sandbox.CreateRequest, o *clone.Origin) (_ *sandbox.Sandbox, err error) {
	c := &creation{req: req, o: o, phases: newPhases(time.Now())}
	defer func() {
		if err != nil {
			e.audited(ctx, "createSandbox", c.admitted, &err)
		}
	}()
	defer c.finish()
	steps := e.createSteps()
	for i, s := range steps {
		if err = s.do(ctx, c); err != nil {
			if c.rec != nil {
				e.log.Warn("create failed", "id", c.rec.ID, "step", s.name, "err", err)
			}
			undo := context.WithoutCancel(ctx)
			for j := i - 1; j >= 0; j-- {
				if steps[j].undo != nil {
					steps[j].undo(undo, c, err)
				}
			}
			return nil, err
		}
		if s.phase != "" {
			c.phases.mark(s.phase)
		}
	}
	return e.created(c), nil
}

// creation is one create in flight: what its steps share.
type creation struct {
	req sandbox.CreateRequest
	// o is the snapshot it restores from (a golden one included), pm the
	// pool member it claims; without either, it boots.
	o       *clone.Origin
	pm      *clone.Member
	claimed bool // the box owns pm's machine
	res     sandbox.Resources
	imgName string
	img     images.Image
	rec     *store.Sandbox
	// admitted is the sandbox's ID once its admission committed.
	admitted string
	// layerings are the running writers of volumes it reads, which move
	// onto new layers before it plugs in the ones they leave.
	layerings []volume.Layering
	b         *box
	phases    *phases
	took      time.Duration // from its start until it was booted
	// finally ends what lasts until the create is over, whatever became
	// of it (a name claim, the box's lock), last first.
	finally []func()
}

func (c *creation) finish() {
	for i := len(c.finally) - 1; i >= 0; i-- {
		c.finally[i]()
	}
}

// createStep is one step of a create. Its phase, if set, is the step of
// the create's timing (sandbox.CreatePhases) its time adds to; the boot
// marks its own. undo takes back what do did, when a later step fails.
type createStep struct {
	name, phase string
	do          func(context.Context, *creation) error
	undo        func(context.Context, *creation, error)
}

func (e *Runtime) createSteps() []createStep {
	return []createStep{
		{name: "resolve", phase: "admit", do: e.resolveCreate, undo: e.unclaimMember},
		{name: "reserve", phase: "admit", do: e.reserveCreate, undo: func(_ context.Context, c *creation, _ error) { e.capacity.Release(c.res) }},
		{name: "admit", phase: "admit", do: e.admitCreate, undo: e.unadmit},
		{name: "name", phase: "admit", do: e.claimCreateName},
		{name: "layers", phase: "admit", do: e.layerWriters},
		{name: "box", phase: "admit", do: e.makeBox, undo: e.unmakeBox},
		{name: "keys", phase: "prepare", do: e.createKeys},
		{name: "environment", phase: "prepare", do: e.createEnv},
		{name: "credentials", phase: "prepare", do: e.createCredentials},
		{name: "boot", do: e.bootCreate},
		{name: "register", do: e.register},
	}
}

// resolveCreate finds the image and size, and claims an idle pool member
// of them if there is one.
func (e *Runtime) resolveCreate(_ context.Context, c *creation) (err error) {
	if c.res, c.imgName, err = c.req.Resolve(); err != nil {
		return err
	}
	// (Placement sent it here if a host of the site or country asked for
	// could take it; this host says no when it is not one.)
	if where := (sandbox.Site{Name: c.req.Site, Country: c.req.Country}); !cluster.Within(e.opts.Site, where) {
		return cluster.NoRoom(where, e.opts.Site.Name, c.res)
	}
	if e.hosts.Draining() {
		return sandbox.Errorf(sandbox.ErrCapacity, "", "host %s is draining: no new sandbox goes there (and no other host has room for it)", e.hosts.Name())
	}
	if o := c.o; o != nil {
		c.res, c.imgName = o.Snap.Size, o.Snap.Image
		if c.img, err = e.imageOf(&store.Sandbox{Sandbox: sandbox.Sandbox{Image: o.Snap.Image}, ImageDir: o.Snap.ImageDir}); err != nil {
			return sandbox.Errorf(sandbox.ErrInvalid, "snapshot", "the image build under snapshot %s is gone: %v", o.Snap.ID, err)
		}
		return nil
	}
	if c.img, err = e.catalog.Lookup(c.imgName); err != nil {
		return err
	}
	c.pm = e.clones.Claim(c.img, c.res)
	return nil
}

// unclaimMember stops a claimed member whose machine no box owns yet.
func (e *Runtime) unclaimMember(_ context.Context, c *creation, _ error) {
	if c.pm != nil && !c.claimed {
		e.clones.Discard(c.pm)
	}
}

// reserveCreate reserves the host capacity (a member's passes to the
// create), and picks a golden snapshot to restore from if there is one.
func (e *Runtime) reserveCreate(_ context.Context, c *creation) error {
	if c.pm != nil {
		return nil
	}
	if err := e.clones.Reserve(c.res); err != nil {
		return err
	}
	if c.o == nil {
		// (After the reservation: a golden boot that this starts comes
		// after the create.)
		c.o = e.goldenFor(c.imgName, c.img, c.res) // nil: it boots
	}
	return nil
}

// admitCreate writes the sandbox's record before anything is made, so a
// crash half way is cleaned up on the next start; it is placed in its
// project (budgets reserved, environment pinned) and audited in the same
// transaction.
func (e *Runtime) admitCreate(ctx context.Context, c *creation) error {
	now := time.Now().UTC()
	id := sandbox.NewID()
	if c.pm != nil {
		id = c.pm.ID
	}
	req := &c.req
	rec := &store.Sandbox{
		Sandbox: sandbox.Sandbox{
			ID: id, Name: req.Name, State: sandbox.StateCreating, Image: c.imgName, Size: c.res,
			Labels: req.Labels, NoEnv: req.NoEnv, Site: e.opts.Site, Host: e.hosts.Name(), CreatedAt: now,
			Monitoring: req.Monitoring == nil || *req.Monitoring, Snapshots: req.Snapshots == nil || *req.Snapshots,
		},
		StateDir: filepath.Join(e.machinesDir(), id),
		ImageDir: c.img.Dir,
	}
	cluster.SetAsked(rec, sandbox.Site{Name: req.Site, Country: req.Country}) // (a move keeps it there)
	if req.TTLSeconds > 0 {
		exp := now.Add(time.Duration(req.TTLSeconds) * time.Second)
		rec.ExpiresAt = &exp
	}
	rec.Served = "boot"
	switch {
	case c.pm != nil:
		rec.Served = "pool"
	case c.o != nil:
		rec.Served = "snapshot"
	}
	policy, err := firewall.Requested(req.Firewall, e.opts.DefaultFirewall)
	if err != nil {
		return err
	}
	if policy != nil {
		rec.SetExtra(firewall.RecordKey, policy)
	}
	if err := e.store.Update(ctx, func(tx store.Tx) error {
		if err := e.place(ctx, tx, req, rec); err != nil {
			return err
		}
		var err error
		if c.layerings, err = e.volumes.Claim(ctx, tx, rec, req.Volumes); err != nil {
			return err
		}
		if len(rec.Volumes) > 0 {
			// (The record names its volumes from the first: a create cut
			// short gives them back when the next start cleans it up.)
			if err := tx.PutSandbox(ctx, rec); err != nil {
				return err
			}
		}
		if c.o != nil && !c.o.Golden && rec.AccountID != c.o.Snap.AccountID {
			return sandbox.Errorf(sandbox.ErrInvalid, "snapshot", "snapshot %s belongs to another account", c.o.Snap.ID)
		}
		return e.audit.RecordIn(ctx, tx, "createSandbox", rec.AccountID, rec.ID, nil)
	}); err != nil {
		return err
	}
	c.rec, c.admitted = rec, rec.ID
	return nil
}

// unadmit takes back an admission nothing was made for: the record and
// what its budgets reserved go. Once a box was made, its record stays,
// deleted, with why (unmakeBox).
func (e *Runtime) unadmit(ctx context.Context, c *creation, _ error) {
	if c.b != nil {
		return
	}
	e.meter.Release(ctx, c.rec)
	e.mesh.Leave(ctx, c.rec.ID)
	e.volumes.Release(ctx, c.rec)
	e.store.DeleteSandbox(ctx, c.rec.ID)
}

// layerWriters moves the writers of the volumes the sandbox reads onto
// new layers, so that it can plug in the layers they wrote (now clean,
// and no longer written). A writer no longer running here opens its new
// layer at its next boot. A move another create started is waited for,
// then made sure of (a move done already is no change).
func (e *Runtime) layerWriters(ctx context.Context, c *creation) error {
	for _, l := range c.layerings {
		if l.Share {
			if err := e.volumes.Await(ctx, l); err != nil {
				return err
			}
			if err := e.layerWriter(ctx, l); err != nil {
				return err
			}
			continue
		}
		e.opts.Step("layers-claimed", l.Writer)
		err := e.layerWriter(ctx, l)
		e.opts.Step("layers-moved", l.Writer)
		if lerr := e.volumes.Layered(ctx, l); err == nil {
			err = lerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (e *Runtime) layerWriter(ctx context.Context, l volume.Layering) error {
	b := e.boxes.get(l.Writer)
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.gone != nil || b.rec.State == sandbox.StateStopped || b.rec.State == sandbox.StateHibernated:
		return nil
	case b.rec.State != sandbox.StateRunning:
		return sandbox.Errorf(sandbox.ErrState, "volumes", "sandbox %s, which writes a volume this one reads, is %s: a reader attaches beside a writer that runs or is stopped", l.Writer, b.rec.State)
	}
	ac, err := b.client(ctx, e)
	if err == nil {
		err = e.volumes.Layer(ctx, l, b.m, ac)
	}
	if err != nil {
		// (The cause can name host paths, or be the writer's guest's
		// words: the log has it.)
		e.log.Warn("a writer did not move onto a new layer for a reader", "volume", l.Volume, "writer", l.Writer, "err", err)
		return sandbox.Errorf(sandbox.ErrUnavailable, "volumes", "sandbox %s, which writes a volume this one reads, could not give it the volume as it is now (its guest must answer and freeze the volume's filesystem for a moment): try again", l.Writer)
	}
	return nil
}

// claimCreateName claims the sandbox's name in its account until the box
// (which carries the name) is registered.
func (e *Runtime) claimCreateName(_ context.Context, c *creation) error {
	if c.req.Name == "" {
		return nil
	}
	release, err := e.boxes.claimName(c.rec.AccountID, c.req.Name)
	if err != nil {
		return err
	}
	c.finally = append(c.finally, release)
	return nil
}

// makeBox makes the sandbox's box, locked until the create is over (so a
// Delete that races with it waits its turn), and meters the sandbox while
// it boots (see meter.Service.SettleAll).
func (e *Runtime) makeBox(_ context.Context, c *creation) error {
	id := c.rec.ID
	snap := *c.rec
	e.boxes.creatingStarts(&snap)
	b := &box{rec: c.rec, deleting: make(chan struct{}), phases: c.phases}
	b.mu.Lock()
	c.b = b
	c.finally = append(c.finally, func() {
		e.boxes.creatingEnds(id) // (registered or failed by now)
	}, b.mu.Unlock)
	return nil
}

// unmakeBox destroys what the create made on the host; what it held while
// it tried is charged (a failed boot ran). The record stays, deleted,
// with why.
func (e *Runtime) unmakeBox(ctx context.Context, c *creation, why error) {
	e.meter.Final(ctx, c.b.rec)
	e.destroy(ctx, c.b)
	c.rec.State = sandbox.StateDeleted
	c.rec.Error = why.Error()
	e.store.PutSandbox(ctx, c.rec)
}

// createKeys gives the sandbox its keys when crypto-erase is on, only in
// the secret store (a claimed member keeps its own: its disk is written
// under them).
func (e *Runtime) createKeys(ctx context.Context, c *creation) error {
	var keys sandboxkeys.Keys
	switch {
	case c.pm != nil && c.pm.Keys.Data != nil:
		keys = c.pm.Keys
	case !e.encrypt:
		return nil
	default:
		var err error
		if keys, err = sandboxkeys.New(); err != nil {
			return err
		}
	}
	if err := sandboxkeys.Keep(ctx, e.sec, c.b.rec.ID, keys); err != nil {
		return err
	}
	c.b.keys = keys
	return nil
}

// createEnv seals the request's variables (or, restored, the source's
// own) and loads the pinned environment's.
func (e *Runtime) createEnv(ctx context.Context, c *creation) error {
	vars := c.req.Env
	if vars == nil && c.o != nil {
		vars = c.o.Env
	}
	return e.guests.PrepareEnv(ctx, c.b.guest(), vars)
}

// createCredentials makes the sandbox's CA and loads its credential rules
// for the proxy.
func (e *Runtime) createCredentials(ctx context.Context, c *creation) error {
	return e.guests.PrepareCredentials(ctx, c.b.guest())
}

// bootCreate boots the machine, restores it from c.o, or takes over the
// claimed member's.
func (e *Runtime) bootCreate(ctx context.Context, c *creation) error {
	if c.pm != nil {
		c.claimed = true
		return e.claimBoot(ctx, c.b, c.pm)
	}
	return e.boot(ctx, c.b, c.img, false, c.o)
}

// register makes the box live and stores its record as running.
func (e *Runtime) register(ctx context.Context, c *creation) error {
	c.took = time.Since(c.phases.began)
	c.rec.CreatePhases = c.phases.ms
	c.rec.CreatePhases["total"] = float64(c.took.Microseconds()) / 1000
	e.boxes.put(c.b)
	if err := e.store.PutSandbox(ctx, c.rec); err != nil {
		e.boxes.drop(c.rec.ID, nil)
		return err
	}
	return nil
}

// created watches the new sandbox's machine and counts its create.
func (e *Runtime) created(c *creation) *sandbox.Sandbox {
	b, rec := c.b, c.rec
	e.watch(b)
	took := c.took
	e.creates.add(rec.Served, took, c.phases)
	b.phases = nil
	switch {
	case c.pm != nil:
		e.log.Info("sandbox created from the pool", "id", rec.ID, "name", rec.Name, "image", rec.Image, "took", took.Round(time.Millisecond))
	case c.o != nil && rec.Served == "snapshot": // (not a golden snapshot that did not restore)
		e.log.Info("sandbox created from a snapshot", "id", rec.ID, "name", rec.Name, "snapshot", c.o.Snap.ID, "source", c.o.Snap.SandboxID, "took", took.Round(time.Millisecond))
	default:
		e.log.Info("sandbox created", "id", rec.ID, "name", rec.Name, "image", rec.Image, "vcpus", rec.Size.VCPUs, "memory_mb", rec.Size.MemoryMB)
	}
	return b.view()
}
