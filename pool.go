package harebox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"filippo.io/age"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/consolelog"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/sandbox"
)

// The warm pool (Options.Pool). For each image and size it names, the
// engine keeps that many sandboxes restored from the golden snapshot,
// idle and ready: a machine with its sandbox ID, data key, console
// identity and network (traffic denied) already made, but no record, no
// tenant and no budget. A create of that image and size claims one: it is
// placed and admitted as any create (its host capacity passes to it), its
// keys are stored, its firewall policy is put in force, and the guest gets
// a new machine-id and fresh entropy before the create returns. The pool
// is refilled in the background within admission limits, once a second
// has passed without a claim (5 s at most), and each member is warmed (it runs a
// claim's calls and a command once) before it joins. Members are not
// kept across restarts: at start their leftovers are pruned like any
// machine without a record, and Close stops them.

// member is an idle pool sandbox.
type member struct {
	id      string
	m       hypervisor.Machine
	c       *agentclient.Client
	key     []byte
	console *age.X25519Identity
	img     images.Image
	res     sandbox.Resources
}

// poolEntry is one image and size the pool keeps warm.
type poolEntry struct {
	image string
	size  sandbox.Resources
	n     int
}

// parsePool reads Options.Pool: "IMAGE:PRESET" -> count.
func parsePool(p map[string]int) ([]poolEntry, error) {
	var out []poolEntry
	for k, n := range p {
		img, preset, ok := strings.Cut(k, ":")
		res, known := sandbox.Presets[preset]
		if !ok || img == "" || !known || n < 0 || n > 64 {
			return nil, sandbox.Errorf(sandbox.ErrInvalid, "pool", "%q=%d: want IMAGE:PRESET (small, medium or large) = 0 to 64", k, n)
		}
		out = append(out, poolEntry{image: img, size: res, n: n})
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].image+fmt.Sprint(out[i].size) < out[j].image+fmt.Sprint(out[j].size)
	})
	return out, nil
}

func poolKey(img images.Image, res sandbox.Resources) string { return goldenID(img, res) }

// claimMember takes an idle member of img at res out of the pool, or
// returns nil. Its host capacity passes to the caller.
func (e *Engine) claimMember(img images.Image, res sandbox.Resources) *member {
	e.mu.Lock()
	defer e.mu.Unlock()
	k := poolKey(img, res)
	l := e.pool[k]
	if len(l) == 0 {
		return nil
	}
	pm := l[0]
	e.pool[k] = l[1:]
	e.lastClaim = time.Now()
	select {
	case e.refill <- struct{}{}:
	default:
	}
	return pm
}

// reserveEvicting reserves res, stopping idle pool members while the host
// is too full for it: creates come before the pool.
func (e *Engine) reserveEvicting(res sandbox.Resources) error {
	for {
		err := e.reserve(res)
		if err == nil || !errors.Is(err, sandbox.ErrCapacity) {
			return err
		}
		pm := e.takeAnyMember()
		if pm == nil {
			return err
		}
		e.log.Info("pool: stopping an idle member to make room for a create", "id", pm.id)
		e.discard(pm)
		e.release(pm.res)
	}
}

// takeAnyMember takes an idle member of any image and size out of the
// pool, or returns nil.
func (e *Engine) takeAnyMember() *member {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, l := range e.pool {
		if len(l) > 0 {
			e.pool[k] = l[1:]
			return l[0]
		}
	}
	return nil
}

// discard stops a member's machine and gives up what it had on the host
// (not its host capacity: whoever holds it releases that).
func (e *Engine) discard(pm *member) {
	ctx := context.Background()
	if pm.c != nil {
		pm.c.Close()
	}
	pm.m.Kill(ctx)
	pm.m.Wait(ctx)
	pm.m.Cleanup(ctx)
	procs.KillVMMs(filepath.Join(e.machinesDir(), pm.id))
	e.net.Detach(ctx, pm.id)
}

// poolLoop keeps the pool full: at start, after every claim, and every
// few seconds (capacity freed, a golden snapshot that became ready).
func (e *Engine) poolLoop(entries []poolEntry) {
	defer e.wg.Done()
	t := time.NewTicker(3 * time.Second)
	defer t.Stop()
	for {
		e.fillPool(entries)
		select {
		case <-e.ctx.Done():
			return
		case <-e.refill:
		case <-t.C:
		}
	}
}

func (e *Engine) fillPool(entries []poolEntry) {
	for _, pe := range entries {
		img, err := e.catalog.Lookup(pe.image)
		if err != nil {
			continue
		}
		o := e.goldenFor(img, pe.size) // (started if none: ready later)
		if o == nil {
			continue
		}
		for e.waitPoolQuiet() {
			e.mu.Lock()
			have := len(e.pool[poolKey(img, pe.size)])
			e.mu.Unlock()
			if have >= pe.n {
				break
			}
			if err := e.reserve(pe.size); err != nil {
				break // full: creates come first
			}
			start := time.Now()
			pm, err := e.newMember(e.ctx, o, img, pe.size)
			if err != nil {
				e.release(pe.size)
				e.log.Warn("pool: making a member failed", "image", img.Name, "err", err)
				break
			}
			e.mu.Lock()
			k := poolKey(img, pe.size)
			e.pool[k] = append(e.pool[k], pm)
			e.mu.Unlock()
			atStep("pool-idle", filepath.Join(e.machinesDir(), pm.id))
			e.log.Info("pool member ready", "id", pm.id, "image", img.Name, "took", time.Since(start).Round(time.Millisecond))
		}
	}
}

// poolQuiet is how long after a claim the pool waits before restoring
// members: a restore takes the host's CPUs for a while (under TCG most of
// a second of both cores), and a claimed sandbox's first commands come
// first. Under a stream of claims it waits poolQuietMax at most, or it
// would never refill when it is needed most.
const (
	poolQuiet    = time.Second
	poolQuietMax = 5 * time.Second
)

// waitPoolQuiet waits until no member was claimed for poolQuiet, or
// poolQuietMax; false when the engine closes.
func (e *Engine) waitPoolQuiet() bool {
	latest := time.Now().Add(poolQuietMax)
	for {
		e.mu.Lock()
		d := min(time.Until(e.lastClaim.Add(poolQuiet)), time.Until(latest))
		e.mu.Unlock()
		if d <= 0 {
			return e.ctx.Err() == nil
		}
		select {
		case <-e.ctx.Done():
			return false
		case <-time.After(d):
		}
	}
}

// newMember restores a machine from the golden snapshot o under a new
// sandbox ID, with its own keys and network, and waits for its agent.
func (e *Engine) newMember(ctx context.Context, o *origin, img images.Image, res sandbox.Resources) (_ *member, err error) {
	pm := &member{id: sandbox.NewID(), img: img, res: res}
	if e.encrypt {
		pm.key = make([]byte, hypervisor.KeySize)
		rand.Read(pm.key)
		if pm.console, err = consolelog.NewIdentity(); err != nil {
			return nil, err
		}
	}
	att, err := e.net.Attach(ctx, pm.id, &firewall.Policy{DefaultOutbound: firewall.Deny})
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	stateDir := filepath.Join(e.machinesDir(), pm.id)
	spec := hypervisor.Spec{
		ID: pm.id, StateDir: stateDir, SerialLog: serialLog(stateDir),
		Labels: map[string]string{"harebox.sandbox": pm.id}, DataKey: pm.key, SnapshotKey: o.key,
	}
	if pm.console != nil {
		spec.ConsoleRecipient = pm.console.Recipient().String()
	}
	if att != nil {
		spec.Network = &hypervisor.Network{Tap: att.Tap, MAC: att.MAC}
	}
	atStep("pool-restore", stateDir)
	if pm.m, err = e.hv.Restore(ctx, o.snap.Dir, spec); err != nil {
		e.net.Detach(context.WithoutCancel(ctx), pm.id)
		return nil, fmt.Errorf("restore: %w", err)
	}
	atStep("pool-restored", stateDir)
	defer func() {
		if err != nil {
			e.discard(pm)
		}
	}()
	bctx, cancel := context.WithTimeout(ctx, e.opts.BootTimeout)
	defer cancel()
	if pm.c, _, err = agentclient.DialReady(bctx, pm.m.AgentEndpoint(), e.agentOptions()); err != nil {
		return nil, err
	}
	// Its own address now; its own machine-id and entropy when claimed.
	if att != nil && att.Cmdline != "" {
		if err := pm.c.SetNetwork(bctx, att.Cmdline); err != nil {
			return nil, err
		}
	}
	// Warm it: a restored guest runs every code path cold the first time
	// (under TCG each is translated again: a claim's reseed and first
	// command took 120 and 250 ms, warm 20 and 15 ms). A member goes
	// through a claim's calls once, and gets a machine-id and entropy of
	// its own on the way (a claim gives it new ones again).
	if err := e.newIdentity(bctx, pm.c, nil, false); err != nil {
		return nil, err
	}
	if err := pm.c.SyncTime(bctx, time.Now()); err != nil {
		return nil, err
	}
	// (Best effort: an image without a shell is still served.)
	pm.c.Exec(bctx, agentclient.ExecRequest{Argv: []string{"/bin/sh", "-c", "true"}, Timeout: 10 * time.Second}, nil)
	atStep("pool-warm", stateDir)
	return pm, nil
}

// claimBoot makes a claimed member the sandbox b: b's firewall policy in
// force, the machine and agent connection taken over, a new machine-id
// and fresh entropy, the clock, files and CA as a boot gives them.
func (e *Engine) claimBoot(ctx context.Context, b *box, pm *member) error {
	rec := b.rec
	// The box owns the machine from here: a failure destroys it.
	b.useMachine(pm.m)
	b.amu.Lock()
	b.agent = pm.c
	b.amu.Unlock()
	policy, err := policyOf(rec.Extra[policyKey])
	if err != nil {
		return err
	}
	// (Its attachment exists: this puts the policy in force.)
	if _, err := e.net.Attach(ctx, rec.ID, policy); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	h := pm.m.Handle()
	rec.Handle = &h
	if err := e.store.PutSandbox(ctx, rec); err != nil {
		return err
	}
	b.phases.mark("claim")
	bctx, cancel := context.WithTimeout(ctx, e.opts.BootTimeout)
	defer cancel()
	c, err := b.client(bctx, e)
	if err != nil {
		return err
	}
	if err := e.newIdentity(bctx, c, nil, false); err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	b.phases.mark("identity")
	if err := e.provision(bctx, b, c); err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	b.phases.mark("provision")
	rec.State = sandbox.StateRunning
	return nil
}

// drainPool stops every idle member and releases its host capacity.
func (e *Engine) drainPool() {
	e.mu.Lock()
	var all []*member
	for _, l := range e.pool {
		all = append(all, l...)
	}
	e.pool = map[string][]*member{}
	e.mu.Unlock()
	for _, pm := range all {
		e.discard(pm)
		e.release(pm.res)
	}
}
