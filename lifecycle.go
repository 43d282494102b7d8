package harebox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"filippo.io/age"
	"github.com/cenkalti/backoff/v4"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/firewall/credproxy"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/mounts"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// box is a live sandbox: its record, its machine and its agent connection.
type box struct {
	// mu serialises lifecycle changes (pause, resume, delete) of one box.
	mu  sync.Mutex
	rec *store.Sandbox
	m   hypervisor.Machine

	amu   sync.Mutex
	agent *agentclient.Client
	// hangup is why the host hung up on the agent for good (a delete,
	// stop or hibernate under way): no call dials it again until a new
	// machine runs (useMachine).
	hangup error

	procs procNotes
	// env is what every exec gets: the pinned environment's variables
	// (secrets as placeholders) and the create request's own env.
	env map[string]string
	// creds are what the credential proxy needs; an atomic, so the proxy
	// never waits on the agent's lock (held during a slow redial).
	creds atomic.Pointer[credproxy.Sandbox]
	// health is the agent's last known health (a string); misses counts
	// the checks in a row it failed (only the health checker uses it).
	health atomic.Value
	misses int
	// key is the sandbox's data key and console the identity that reads
	// its console log (see datakey.go); nil without crypto-erase.
	key     []byte
	console *age.X25519Identity
	// deleting is closed when Delete starts, so the exit watcher knows the
	// VM's exit is expected.
	deleting     chan struct{}
	deletingOnce sync.Once
	// phases times a create's steps (nil otherwise).
	phases *phases
}

func (b *box) view() *sandbox.Sandbox {
	s := b.rec.Sandbox
	if h, ok := b.health.Load().(string); ok && s.State == sandbox.StateRunning {
		s.Agent = h
	}
	return &s
}

// client returns a live agent connection, redialling when the last one
// died (agent restart, VM restore, keepalive timeout).
func (b *box) client(ctx context.Context, e *Engine) (*agentclient.Client, error) {
	b.amu.Lock()
	defer b.amu.Unlock()
	if b.hangup != nil {
		return nil, b.hangup
	}
	if b.agent != nil {
		select {
		case <-b.agent.Done():
			// (Why, for the record: a session's end is rare, and its
			// cause otherwise lost; one line per session.)
			e.log.Info("agent session ended; redialling", "sandbox", b.m.ID(), "reason", b.agent.EndReason())
			b.agent.Close()
			b.agent = nil
		default:
			return b.agent, nil
		}
	}
	// A boot passes its own (long) deadline; other callers get 30 s.
	dctx, cancel := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok {
		dctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	}
	defer cancel()
	c, _, err := agentclient.DialReady(dctx, b.m.AgentEndpoint(), e.agentOptions())
	if errors.Is(err, agentclient.ErrAgentTooOld) {
		return nil, agentErr(err)
	}
	if err != nil {
		return nil, &sandbox.Error{Kind: sandbox.ErrUnavailable, Msg: "the sandbox's agent does not answer", Err: err}
	}
	b.agent = c
	return c, nil
}

// roundLockWait is how long a background round waits for busy boxes, in
// all.
const roundLockWait = 500 * time.Millisecond

// lockBy locks the box if it can by deadline (one per round, shared by its
// boxes). Background rounds (metering, monitoring) use it: a short hold
// (the other round's store write) is waited out, so two rounds on the same
// tick do not keep skipping each other, while long lifecycle calls (a hung
// hypervisor, a delete) hold the round up by roundLockWait at most.
func (b *box) lockBy(deadline time.Time) bool {
	for ; ; time.Sleep(5 * time.Millisecond) {
		if b.mu.TryLock() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// closeAgent hangs up on the sandbox's agent for good: a call it cuts
// short, and any call after it, fails with why (a sandbox error).
func (b *box) closeAgent(why error) {
	b.amu.Lock()
	defer b.amu.Unlock()
	b.hangup = why
	if b.agent != nil {
		b.agent.CloseFor(why)
		b.agent = nil
	}
}

// isDeleting reports whether a Delete of the box has begun.
func (b *box) isDeleting() bool {
	select {
	case <-b.deleting:
		return true
	default:
		return false
	}
}

// useMachine makes m the box's machine; its agent may be called.
func (b *box) useMachine(m hypervisor.Machine) {
	b.m = m
	b.amu.Lock()
	b.hangup = nil
	b.amu.Unlock()
}

func (e *Engine) agentOptions() agentclient.Options {
	return agentclient.Options{MaxOutput: e.opts.MaxOutputBytes}
}

// Create boots a new sandbox and returns it once its agent answers.
func (e *Engine) Create(ctx context.Context, req sandbox.CreateRequest) (out *sandbox.Sandbox, err error) {
	created := false // (then create recorded it)
	defer func() {
		if !created {
			e.audited(ctx, "createSandbox", "", &err)
		}
	}()
	// Rights first: a key that may not create learns nothing from the
	// request's validation (which images exist, ...).
	if err := mayCreate(authz.From(ctx)); err != nil {
		return nil, err
	}
	var o *origin
	if req.Snapshot != "" {
		if o, err = e.openSnapshot(ctx, &req); err != nil {
			return nil, err
		}
		defer o.done()
		// (Its files are on the host of the sandbox it was taken of.)
		if h, err := e.SnapshotElsewhere(ctx, req.Snapshot); err != nil || h != nil {
			if err != nil {
				return nil, err
			}
			return nil, elsewhereErr("snapshot "+req.Snapshot, h.Name)
		}
	}
	created = true
	return e.create(ctx, req, o)
}

// create makes a sandbox: booted from its image, or restored from o. The
// audit log's entry of the create commits with its admission (the record,
// its budgets' reservation); one that fails after that gets a second
// entry, which says how it failed.
func (e *Engine) create(ctx context.Context, req sandbox.CreateRequest, o *origin) (_ *sandbox.Sandbox, err error) {
	admitted := "" // the sandbox's ID once its admission committed
	defer func() {
		if err != nil {
			e.audited(ctx, "createSandbox", admitted, &err)
		}
	}()
	began := time.Now()
	res, imgName, err := req.Resolve()
	if err != nil {
		return nil, err
	}
	var img images.Image
	var pm *member // a pool member this create claims
	if o != nil {
		res, imgName = o.snap.Size, o.snap.Image
		if img, err = e.imageOf(&store.Sandbox{Sandbox: sandbox.Sandbox{Image: o.snap.Image}, ImageDir: o.snap.ImageDir}); err != nil {
			return nil, sandbox.Errorf(sandbox.ErrInvalid, "snapshot", "the image build under snapshot %s is gone: %v", o.snap.ID, err)
		}
	} else if img, err = e.image(imgName); err != nil {
		return nil, err
	} else {
		pm = e.claimMember(img, res)
	}
	claimed := false // the box owns the member's machine
	if pm != nil {
		// Its host capacity passes to this create; until the box owns
		// its machine, a failure stops it.
		defer func() {
			if !claimed {
				e.discard(pm)
			}
		}()
	} else if err := e.reserveEvicting(res); err != nil {
		return nil, err
	} else if o == nil {
		// (After the reservation: a golden boot that this starts comes
		// after the create.)
		o = e.goldenFor(img, res) // nil: it boots
	}
	now := time.Now().UTC()
	id := sandbox.NewID()
	if pm != nil {
		id = pm.id
	}
	rec := &store.Sandbox{
		Sandbox: sandbox.Sandbox{
			ID: id, Name: req.Name, State: sandbox.StateCreating, Image: imgName, Size: res,
			Labels: req.Labels, NoEnv: req.NoEnv, Site: e.opts.Site, Host: e.hosts.Name(), CreatedAt: now,
			Monitoring: req.Monitoring == nil || *req.Monitoring, Snapshots: req.Snapshots == nil || *req.Snapshots,
		},
		StateDir: filepath.Join(e.machinesDir(), id),
		ImageDir: img.Dir,
	}
	if req.TTLSeconds > 0 {
		exp := now.Add(time.Duration(req.TTLSeconds) * time.Second)
		rec.ExpiresAt = &exp
	}
	rec.Served = "boot"
	switch {
	case pm != nil:
		rec.Served = "pool"
	case o != nil:
		rec.Served = "snapshot"
	}
	if err := e.initialPolicy(&req, rec); err != nil {
		e.release(res)
		return nil, err
	}
	// The record exists before anything is made, so a crash half way is
	// cleaned up on the next start; it is placed in its project in the
	// same transaction.
	if err := e.store.Update(ctx, func(tx store.Tx) error {
		if err := e.place(ctx, tx, &req, rec); err != nil {
			return err
		}
		if o != nil && !o.golden && rec.AccountID != o.snap.AccountID {
			return sandbox.Errorf(sandbox.ErrInvalid, "snapshot", "snapshot %s belongs to another account", o.snap.ID)
		}
		return e.audit.RecordIn(ctx, tx, "createSandbox", rec.AccountID, rec.ID, nil)
	}); err != nil {
		e.release(res)
		return nil, err
	}
	admitted = rec.ID
	if req.Name != "" {
		release, err := e.claimName(rec.AccountID, req.Name)
		if err != nil {
			// Nothing was made: the record and the reservation go too.
			e.release(res)
			e.releaseBudgets(context.WithoutCancel(ctx), &box{rec: rec})
			e.store.DeleteSandbox(context.WithoutCancel(ctx), rec.ID)
			return nil, err
		}
		defer release() // after the box (which carries the name) is registered
	}
	// Metered while it boots (see settleAll).
	snap := *rec
	e.mu.Lock()
	e.creating[id] = &snap
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.creating, id) // (registered or failed by now)
		e.mu.Unlock()
	}()
	// The box's lifecycle lock is held until the sandbox is registered and
	// stored as running, so a Delete that races with it waits its turn.
	b := &box{rec: rec, deleting: make(chan struct{}), phases: newPhases(began)}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.phases.mark("admit")
	if pm != nil && pm.key != nil {
		err = e.keepKeys(ctx, b, pm.key, pm.console)
	} else {
		err = e.newDataKey(ctx, b)
	}
	if err == nil {
		vars := req.Env
		if vars == nil && o != nil {
			vars = o.env // the source's own
		}
		err = e.sealEnv(ctx, b, vars)
	}
	if err == nil {
		err = e.makeCA(ctx, b)
	}
	if err == nil {
		err = e.loadEnv(ctx, b)
	}
	if err == nil {
		err = e.loadCredentials(ctx, b)
	}
	b.phases.mark("prepare")
	if err == nil && pm != nil {
		claimed = true
		err = e.claimBoot(ctx, b, pm)
	} else if err == nil {
		err = e.boot(ctx, b, img, false, o)
	}
	var took time.Duration
	if err == nil {
		took = time.Since(began)
		rec.CreatePhases = b.phases.ms
		rec.CreatePhases["total"] = float64(took.Microseconds()) / 1000
	}
	if err == nil {
		e.mu.Lock()
		e.boxes[id] = b
		e.mu.Unlock()
		if err = e.store.PutSandbox(ctx, rec); err != nil {
			e.mu.Lock()
			delete(e.boxes, id)
			e.mu.Unlock()
		}
	}
	if err != nil {
		e.log.Warn("create failed", "id", id, "err", err)
		// What it held while it tried is charged (a failed boot ran).
		e.settleFinal(context.WithoutCancel(ctx), b)
		e.destroy(context.WithoutCancel(ctx), b)
		e.release(res)
		rec.State = sandbox.StateDeleted
		rec.Error = err.Error()
		e.store.PutSandbox(context.WithoutCancel(ctx), rec)
		return nil, err
	}
	e.watch(b)
	e.creates.add(rec.Served, took, b.phases)
	b.phases = nil
	if pm != nil {
		e.log.Info("sandbox created from the pool", "id", id, "name", req.Name, "image", imgName, "took", time.Since(now).Round(time.Millisecond))
	} else if o != nil {
		e.log.Info("sandbox created from a snapshot", "id", id, "name", req.Name, "snapshot", o.snap.ID, "source", o.snap.SandboxID, "took", time.Since(now).Round(time.Millisecond))
	} else {
		e.log.Info("sandbox created", "id", id, "name", req.Name, "image", imgName, "vcpus", res.VCPUs, "memory_mb", res.MemoryMB)
	}
	return b.view(), nil
}

// boot attaches the network, launches the VM and waits for its agent.
// With reuse, the machine boots again on the disk it left (Start); with
// o, it is restored from a snapshot and given its own identity.
func (e *Engine) boot(ctx context.Context, b *box, img images.Image, reuse bool, o *origin) error {
	rec := b.rec
	policy, err := policyOf(rec.Extra[policyKey])
	if err != nil {
		return err
	}
	att, err := e.net.Attach(ctx, rec.ID, policy)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	spec := imageSpec(rec.ID, rec.StateDir, img, rec.Size, att)
	spec.SerialLog, spec.Labels = serialLog(rec.StateDir), map[string]string{"harebox.sandbox": rec.ID}
	spec.DataKey, spec.Reuse = b.key, reuse
	if b.console != nil {
		spec.ConsoleRecipient = b.console.Recipient().String()
	}
	var m hypervisor.Machine
	if o != nil {
		spec.SnapshotKey = o.key
		m, err = e.hv.Restore(ctx, o.snap.Dir, spec)
		if err != nil {
			return hvErr(fmt.Errorf("restore: %w", err))
		}
	} else if m, err = e.hv.Launch(ctx, spec); err != nil {
		return hvErr(fmt.Errorf("launch: %w", err))
	}
	if o != nil {
		b.phases.mark("restore")
	} else {
		b.phases.mark("launch")
	}
	b.useMachine(m)
	h := m.Handle()
	rec.Handle = &h
	if err := e.store.PutSandbox(ctx, rec); err != nil {
		return err
	}
	bctx, cancel := context.WithTimeout(ctx, e.opts.BootTimeout)
	defer cancel()
	c, err := b.client(bctx, e)
	if err != nil {
		return fmt.Errorf("boot: %w (serial log: %s)", err, consoleTail(b, 1500))
	}
	b.phases.mark("agent")
	if o != nil {
		if err := e.newIdentity(bctx, c, att, o.wake); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		b.phases.mark("identity")
	}
	if err := e.provision(bctx, b, c); err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	b.phases.mark("provision")
	// Create stores the running state once the box is registered.
	rec.State = sandbox.StateRunning
	return nil
}

// imageSpec is the spec of a machine that boots img at res, on its own
// overlay of the image's root disk, attached to att (if any).
func imageSpec(id, stateDir string, img images.Image, res sandbox.Resources, att *network.Attachment) hypervisor.Spec {
	spec := hypervisor.Spec{
		ID: id, VCPUs: res.VCPUs, MemoryMB: res.MemoryMB,
		Kernel: img.Kernel, Initrd: img.Initrd, Cmdline: img.Cmdline, StateDir: stateDir,
	}
	if img.RootDisk != "" {
		spec.Disks = []hypervisor.Disk{{Path: img.RootDisk, Format: img.RootDiskFormat, Overlay: true, SizeMB: int64(res.DiskGB) << 10}}
	}
	if att != nil {
		spec.Network = &hypervisor.Network{Tap: att.Tap, MAC: att.MAC}
		spec.Cmdline = strings.TrimSpace(spec.Cmdline + " " + att.Cmdline)
	}
	return spec
}

// provision gives a guest that answers what every boot gives it: the
// host's clock, its environment's files and its credentials CA.
func (e *Engine) provision(ctx context.Context, b *box, c *agentclient.Client) error {
	if err := c.SyncTime(ctx, time.Now()); err != nil {
		return err
	}
	if err := e.deliverFiles(ctx, b, c); err != nil {
		return err
	}
	return e.installCA(ctx, b, c)
}

// destroy stops the VM and removes everything the sandbox had on the host.
// It is used on failed creates, deletes and stray records; it is
// idempotent.
func (e *Engine) destroy(ctx context.Context, b *box) error {
	var errs []error
	// The key goes first: whatever is left behind after this point is
	// ciphertext without a key.
	if err := e.eraseDataKey(ctx, b); err != nil {
		errs = append(errs, err)
	}
	b.closeAgent(sandbox.Errorf(sandbox.ErrState, "", "sandbox %s was deleted during the call", b.rec.ID))
	if sb := b.creds.Swap(nil); sb != nil {
		sb.Close()
	}
	if b.m != nil {
		// (A machine that is gone, with the plugin it lived in or on its
		// own, is what a delete wants; its files go below. A plugin that
		// just died is relaunched: the call is tried again for a while.)
		if err := retryUnavailable(ctx, func() error { return b.m.Kill(ctx) }); err != nil && !errors.Is(err, hypervisor.ErrState) && !errors.Is(err, hypervisor.ErrNotFound) {
			errs = append(errs, err)
		}
		if err := retryUnavailable(ctx, func() error { return b.m.Cleanup(ctx) }); err != nil && !errors.Is(err, hypervisor.ErrNotFound) {
			errs = append(errs, err)
		}
	} else if b.rec.Handle != nil {
		if m, err := e.hv.Attach(ctx, *b.rec.Handle); err == nil {
			m.Kill(ctx)
			m.Cleanup(ctx)
		}
	}
	killStrays(b.rec.StateDir)
	if err := mounts.RemoveAll(b.rec.StateDir); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(e.hibernateDir(b.rec.ID)); err != nil {
		errs = append(errs, err)
	}
	if err := e.net.Detach(ctx, b.rec.ID); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, e.forgetStored(ctx, b))
	return errors.Join(errs...)
}

// retryUnavailable calls f until it fails for another reason than an
// unavailable hypervisor (a plugin being relaunched), for up to 10 s.
func retryUnavailable(ctx context.Context, f func() error) error {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.Multiplier, bo.RandomizationFactor = 200*time.Millisecond, 200*time.Millisecond, 1, 0
	bo.MaxElapsedTime = 10 * time.Second
	return backoff.Retry(func() error {
		err := f()
		if errors.Is(err, hypervisor.ErrUnavailable) && ctx.Err() == nil {
			return err
		}
		return backoff.Permanent(err) // (nil: done)
	}, bo)
}

// forgetStored removes what a sandbox keeps in the store and the secret
// store, its data key aside (erased first, by the caller): its URLs,
// environment, command history, and what it reserved in its budgets (a
// settled sandbox has nothing left to release).
func (e *Engine) forgetStored(ctx context.Context, b *box) error {
	return errors.Join(e.urls.Forget(ctx, b.rec.ID), e.eraseEnv(ctx, b.rec.ID), e.history.Erase(ctx, b.rec.ID),
		e.releaseBudgets(ctx, b))
}

// Get returns a sandbox, including deleted ones.
func (e *Engine) Get(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	if err := e.check(ctx, "getSandbox", id); err != nil {
		return nil, err
	}
	if b := e.live(id); b != nil {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.view(), nil
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	return &rec.Sandbox, nil
}

// List returns the sandboxes that match f, oldest first. Deleted
// sandboxes are listed only when f.State asks for them.
func (e *Engine) List(ctx context.Context, f sandbox.ListFilter) ([]*sandbox.Sandbox, error) {
	p := authz.From(ctx)
	if err := authz.Allowed(p, "listSandboxes"); err != nil {
		return nil, err
	}
	var accountID, projectID, fleetID string
	if f.Account != "" || f.Project != "" || f.Fleet != "" {
		err := e.store.Update(ctx, func(tx store.Tx) error {
			if f.Project == "" && f.Fleet == "" {
				acc, err := e.tenants.Account(ctx, tx, f.Account)
				if err != nil {
					return sandbox.Errorf(sandbox.ErrInvalid, "account", "%v", err)
				}
				accountID = acc.ID
				return nil
			}
			acc, proj, err := e.tenants.ProjectIn(ctx, tx, f.Account, f.Project)
			if err != nil {
				field := "project"
				if acc == nil {
					field = "account"
				}
				return sandbox.Errorf(sandbox.ErrInvalid, field, "%v", err)
			}
			accountID = acc.ID
			projectID = proj.ID
			if f.Fleet != "" {
				fl, err := e.tenants.Fleet(ctx, tx, proj, f.Fleet)
				if err != nil {
					return sandbox.Errorf(sandbox.ErrInvalid, "fleet", "%v", err)
				}
				fleetID = fl.ID
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	recs, err := e.store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	out := []*sandbox.Sandbox{}
	for _, r := range recs {
		s := &r.Sandbox
		if b := e.live(r.ID); b != nil {
			b.mu.Lock()
			s = b.view()
			b.mu.Unlock()
		}
		if s.State == sandbox.StateDeleted && f.State != sandbox.StateDeleted {
			continue
		}
		if (accountID != "" && s.AccountID != accountID) || (projectID != "" && s.ProjectID != projectID) ||
			(fleetID != "" && s.FleetID != fleetID) || !authz.Visible(p, targetOf(s)) {
			continue
		}
		if f.Match(s) {
			out = append(out, s)
		}
	}
	return out, nil
}

// Delete destroys a sandbox: its VM, disks and network. Deleting a deleted
// sandbox is an error; the record stays, with state deleted.
func (e *Engine) Delete(ctx context.Context, id string) (err error) {
	defer e.audited(ctx, "deleteSandbox", id, &err)
	if err := e.check(ctx, "deleteSandbox", id); err != nil {
		return err
	}
	b := e.live(id)
	if b == nil {
		rec, err := e.record(ctx, id)
		if err != nil {
			return err
		}
		switch rec.State {
		case sandbox.StateDeleted:
			return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is already deleted", id)
		case sandbox.StateCreating:
			// Its Create is in flight in this engine (a crashed engine's
			// creates are cleaned up at start).
			return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is being created; delete it once it is running", id)
		}
		// A stopped sandbox: nothing runs, but clean up what is left. Its
		// box is registered while it goes, so a Start (or a second
		// Delete) waits for it instead of racing it.
		nb := &box{rec: rec, deleting: make(chan struct{})}
		e.mu.Lock()
		if b = e.boxes[id]; b == nil {
			b = nb
			e.boxes[id] = b
		}
		e.mu.Unlock()
	}
	b.deletingOnce.Do(func() { close(b.deleting) })
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := sandbox.CanTransition(b.rec.State, sandbox.StateDeleted); err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx) // a delete that started finishes
	e.settleFinal(ctx, b)
	err = e.destroy(ctx, b)
	if b.rec.State == sandbox.StateRunning || b.rec.State == sandbox.StatePaused {
		e.release(b.rec.Size)
	}
	b.rec.State = sandbox.StateDeleted
	e.mu.Lock()
	delete(e.boxes, id)
	delete(e.kept, id)
	e.mu.Unlock()
	if perr := e.store.PutSandbox(ctx, b.rec); perr != nil {
		err = errors.Join(err, perr)
	}
	// A URL published while the sandbox was being destroyed (CreateURL
	// checks the state again after its own write) goes too.
	if ferr := e.urls.Forget(ctx, id); ferr != nil {
		err = errors.Join(err, ferr)
	}
	e.log.Info("sandbox deleted", "id", id)
	return err
}

// Pause freezes a running sandbox's VM.
func (e *Engine) Pause(ctx context.Context, id string) (_ *sandbox.Sandbox, err error) {
	defer e.audited(ctx, "pauseSandbox", id, &err)
	if err := e.check(ctx, "pauseSandbox", id); err != nil {
		return nil, err
	}
	return e.transition(ctx, id, sandbox.StatePaused, func(b *box) error {
		if err := b.m.Pause(ctx); err != nil {
			return err
		}
		// (It is paused whatever the caller does now: so is its meter.)
		e.settle(context.WithoutCancel(ctx), b, sandbox.StatePaused, false)
		return nil
	})
}

// Resume continues a paused sandbox.
func (e *Engine) Resume(ctx context.Context, id string) (_ *sandbox.Sandbox, err error) {
	defer e.audited(ctx, "resumeSandbox", id, &err)
	if err := e.check(ctx, "resumeSandbox", id); err != nil {
		return nil, err
	}
	if e.live(id) == nil {
		if rec, err := e.record(ctx, id); err == nil && rec.State == sandbox.StateHibernated {
			return e.wake(ctx, rec)
		}
	}
	box, err := e.transition(ctx, id, sandbox.StateRunning, func(b *box) error {
		// Its budgets must have room for it to run again.
		if err := e.settle(ctx, b, sandbox.StateRunning, true); err != nil {
			return err
		}
		return b.m.Resume(ctx)
	})
	if err != nil {
		return nil, err
	}
	// The guest clock stood still while paused. Best effort, and outside the
	// sandbox's lock: a stalling guest must not hold up its lifecycle.
	if b := e.live(id); b != nil {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if c, err := b.client(sctx, e); err == nil {
			c.SyncTime(sctx, time.Now())
		}
	}
	return box, nil
}

func (e *Engine) transition(ctx context.Context, id string, to sandbox.State, f func(*box) error) (*sandbox.Sandbox, error) {
	b, err := e.liveOrErr(ctx, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := sandbox.CanTransition(b.rec.State, to); err != nil {
		return nil, err
	}
	if err := f(b); err != nil {
		return nil, hvErr(err)
	}
	b.rec.State = to
	if err := e.store.PutSandbox(ctx, b.rec); err != nil {
		return nil, err
	}
	return b.view(), nil
}

// live returns the live box for id, or nil.
func (e *Engine) live(id string) *box {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.boxes[id]
}

// liveBoxes returns the live boxes now, for a loop that must not hold
// e.mu while it takes each box's lock (the order is box, then engine).
func (e *Engine) liveBoxes() []*box {
	e.mu.Lock()
	defer e.mu.Unlock()
	boxes := make([]*box, 0, len(e.boxes))
	for _, b := range e.boxes {
		boxes = append(boxes, b)
	}
	return boxes
}

// liveOrErr returns a live box or the error that explains why there is none.
func (e *Engine) liveOrErr(ctx context.Context, id string) (*box, error) {
	if b := e.live(id); b != nil {
		return b, nil
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is %s", id, rec.State)
}

func (e *Engine) record(ctx context.Context, id string) (*store.Sandbox, error) {
	if !sandbox.ValidID(id) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no sandbox %q", id)
	}
	rec, err := e.store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no sandbox %q", id)
	}
	return rec, err
}

// claimName refuses a name that a live sandbox of the account, or a create
// in flight there, already has; release ends the claim. Names are per
// account, so a taken name says nothing about other accounts.
func (e *Engine) claimName(accountID, name string) (release func(), err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, b := range e.boxes {
		if b.rec.AccountID == accountID && b.rec.Name == name {
			return nil, sandbox.Errorf(sandbox.ErrExists, "name", "sandbox %s is already named %q", b.rec.ID, name)
		}
	}
	// A stopped sandbox keeps its name: it starts again under it.
	for _, r := range e.kept {
		if r.AccountID == accountID && r.Name == name {
			return nil, sandbox.Errorf(sandbox.ErrExists, "name", "sandbox %s (stopped) is already named %q", r.ID, name)
		}
	}
	claim := accountID + "/" + name
	if e.claimed[claim] {
		return nil, sandbox.Errorf(sandbox.ErrExists, "name", "a sandbox named %q is being created", name)
	}
	if e.claimed == nil {
		e.claimed = map[string]bool{}
	}
	e.claimed[claim] = true
	return func() {
		e.mu.Lock()
		delete(e.claimed, claim)
		e.mu.Unlock()
	}, nil
}

// reserve admits res against the host's limits.
func (e *Engine) reserve(res sandbox.Resources) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.used.VCPUs+res.VCPUs > e.limit.VCPUs {
		return sandbox.Errorf(sandbox.ErrCapacity, "size.vcpus", "host is full: %d of %d vCPUs reserved, %d more asked", e.used.VCPUs, e.limit.VCPUs, res.VCPUs)
	}
	if e.used.MemoryMB+res.MemoryMB > e.limit.MemoryMB {
		return sandbox.Errorf(sandbox.ErrCapacity, "size.memory_mb", "host is full: %d of %d MB reserved, %d more asked", e.used.MemoryMB, e.limit.MemoryMB, res.MemoryMB)
	}
	if e.used.DiskGB+res.DiskGB > e.limit.DiskGB {
		return sandbox.Errorf(sandbox.ErrCapacity, "size.disk_gb", "host is full: %d of %d GB of disk reserved, %d more asked", e.used.DiskGB, e.limit.DiskGB, res.DiskGB)
	}
	e.used.VCPUs += res.VCPUs
	e.used.MemoryMB += res.MemoryMB
	e.used.DiskGB += res.DiskGB
	e.usedChanged()
	return nil
}

func (e *Engine) release(res sandbox.Resources) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.used.VCPUs -= res.VCPUs
	e.used.MemoryMB -= res.MemoryMB
	e.used.DiskGB -= res.DiskGB
	e.usedChanged()
}

// hostMemoryMB reads MemTotal from /proc/meminfo.
func hostMemoryMB() int {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if f := strings.Fields(s.Text()); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.Atoi(f[1])
			return kb / 1024
		}
	}
	return 0
}

// serialLog is where a sandbox's console goes (the engine names it, so it
// can bound it).
func serialLog(stateDir string) string { return filepath.Join(stateDir, "serial.log") }

// MaxSerialLogBytes bounds a console log: the guest writes to its serial
// port as fast as it likes, for as long as it lives.
const MaxSerialLogBytes = 8 << 20

// serialTail returns the end of a console log, reading only that.
func serialTail(stateDir string, n int) string {
	f, err := os.Open(serialLog(stateDir))
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > int64(n) {
		f.Seek(fi.Size()-int64(n), io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, int64(n)))
	return strings.TrimSpace(string(b))
}

// boundSerialLogs truncates console logs that grew past the bound.
func (e *Engine) boundSerialLogs() {
	e.mu.Lock()
	dirs := make([]string, 0, len(e.boxes))
	for _, b := range e.boxes {
		dirs = append(dirs, b.rec.StateDir)
	}
	e.mu.Unlock()
	for _, d := range dirs {
		if fi, err := os.Stat(serialLog(d)); err == nil && fi.Size() > MaxSerialLogBytes {
			os.Truncate(serialLog(d), 0)
		}
	}
}
