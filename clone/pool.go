package clone

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
)

// The warm pool (the engine's Options.Pool). For each image and size it
// names, the pool keeps that many sandboxes restored from the golden
// snapshot, idle and ready: a machine with its sandbox ID, data key,
// console identity and network (traffic denied) already made, but no
// record, no tenant and no budget. A create of that image and size claims
// one: it is placed and admitted as any create (its host capacity passes
// to it), its keys are stored, its firewall policy is put in force, and
// the guest gets a new machine-id and fresh entropy before the create
// returns (the engine does all that). The pool is refilled in the
// background within admission limits, once a second has passed without a
// claim (5 s at most), and each member is warmed (it runs a claim's calls
// and a command once) before it joins. Members are not kept across
// restarts: at start their leftovers are pruned like any machine without
// a record, and Close stops them.

// Member is an idle pool sandbox, and what a create that claims it takes
// over: its sandbox ID, machine, agent connection and keys.
type Member struct {
	ID      string
	Machine hypervisor.Machine
	Agent   *agentclient.Client
	Keys    sandboxkeys.Keys // its data key and console identity (none without crypto-erase)
	// ClockSet is when its guest's clock was set to the host's.
	ClockSet time.Time

	stateDir string
	img      images.Image
	res      sandbox.Resources
}

// ClockFresh is how long a member's clock, once set, is taken to be the
// host's: its claim does not set it again before then. A guest's clock
// runs at its host's rate within parts per million (under TCG as under
// KVM), so a minute leaves it a few milliseconds off at most; the call
// saved was most of what a claim took then (about 5 of 8 ms under TCG
// here).
const ClockFresh = time.Minute

// PoolEntry is one image and size the pool keeps warm.
type PoolEntry struct {
	Image string
	Size  sandbox.Resources
	N     int
}

// AutoPool is the pool of a server that was not told what to keep
// (hareboxd without --pool), sized to what the host admits (limit): one
// idle sandbox of the default image at the small size for every 8 small
// sandboxes the host admits, 1 to 4 of them, and none on a host that
// admits fewer than 4. A member holds its capacity only until a create
// needs it (a create that finds the host full stops idle members), so
// the pool never keeps a create out; what it costs is its memory and an
// idle guest's few ticks (docs/snapshots.md).
func AutoPool(limit sandbox.Resources) map[string]int {
	small := sandbox.Presets["small"]
	n := min(limit.VCPUs/small.VCPUs, limit.MemoryMB/small.MemoryMB, limit.DiskGB/small.DiskGB)
	if n < 4 {
		return nil
	}
	return map[string]int{sandbox.DefaultImage + ":small": min(4, max(1, n/8))}
}

// ParsePool reads the engine's Options.Pool: "IMAGE:PRESET" -> count.
func ParsePool(p map[string]int) ([]PoolEntry, error) {
	var out []PoolEntry
	for k, n := range p {
		img, preset, ok := strings.Cut(k, ":")
		res, known := sandbox.Presets[preset]
		if !ok || img == "" || !known || n < 0 || n > 64 {
			return nil, sandbox.Errorf(sandbox.ErrInvalid, "pool", "%q=%d: want IMAGE:PRESET (small, medium or large) = 0 to 64", k, n)
		}
		out = append(out, PoolEntry{Image: img, Size: res, N: n})
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Image+fmt.Sprint(out[i].Size) < out[j].Image+fmt.Sprint(out[j].Size)
	})
	return out, nil
}

func poolKey(img images.Image, res sandbox.Resources) string { return goldenID(img, res) }

// Claim takes an idle member of img at res out of the pool, or returns
// nil. Its host capacity passes to the caller, and so does its machine:
// the caller discards it (Discard) if it does not take it over.
func (s *Service) Claim(img images.Image, res sandbox.Resources) *Member {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := poolKey(img, res)
	l := s.pool[k]
	if len(l) == 0 {
		return nil
	}
	pm := l[0]
	s.pool[k] = l[1:]
	s.lastClaim = time.Now()
	select {
	case s.refill <- struct{}{}:
	default:
	}
	return pm
}

// Reserve reserves res on the host, stopping idle members while the host
// is too full for it: creates come before the pool.
func (s *Service) Reserve(res sandbox.Resources) error {
	for {
		err := s.o.Host.Reserve(res)
		if err == nil || !errors.Is(err, sandbox.ErrCapacity) {
			return err
		}
		pm := s.takeAny()
		if pm == nil {
			return err
		}
		s.o.Log.Info("pool: stopping an idle member to make room for a create", "id", pm.ID)
		s.Discard(pm)
		s.o.Host.Release(pm.res)
	}
}

// takeAny takes an idle member of any image and size out of the pool, or
// returns nil.
func (s *Service) takeAny() *Member {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, l := range s.pool {
		if len(l) > 0 {
			s.pool[k] = l[1:]
			return l[0]
		}
	}
	return nil
}

// Discard stops a member's machine and gives up what it had on the host
// (not its host capacity: whoever holds it releases that).
func (s *Service) Discard(pm *Member) {
	ctx := context.Background()
	if pm.Agent != nil {
		pm.Agent.Close()
	}
	pm.Machine.Kill(ctx)
	pm.Machine.Wait(ctx)
	pm.Machine.Cleanup(ctx)
	procs.KillVMMs(pm.stateDir)
	s.o.Network.Detach(ctx, pm.ID)
}

// Run keeps the pool full until ctx ends: at start, after every claim,
// and every few seconds (capacity freed, a golden snapshot that became
// ready).
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(3 * time.Second)
	defer t.Stop()
	for {
		s.fill(ctx)
		select {
		case <-ctx.Done():
			return
		case <-s.refill:
		case <-t.C:
		}
	}
}

// SetPool makes entries what the pool keeps from now on: idle members
// beyond them are stopped at once (their host capacity released), and the
// pool fills up to them in the background.
func (s *Service) SetPool(entries []PoolEntry) {
	s.mu.Lock()
	s.o.Pool = entries
	s.mu.Unlock()
	s.trim()
	select {
	case s.refill <- struct{}{}:
	default:
	}
}

// Pool is what the pool keeps now.
func (s *Service) Pool() []PoolEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.o.Pool
}

// trim stops the idle members beyond what the pool keeps now: of an image
// and size it no longer names, or of an image build that is no longer the
// image's.
func (s *Service) trim() {
	want := map[string]int{}
	for _, pe := range s.Pool() {
		if img, err := s.o.Images.Lookup(pe.Image); err == nil {
			want[poolKey(img, pe.Size)] += pe.N
		}
	}
	s.mu.Lock()
	var extra []*Member
	for k, l := range s.pool {
		if n := want[k]; len(l) > n {
			extra = append(extra, l[n:]...)
			s.pool[k] = l[:n:n]
		}
	}
	s.mu.Unlock()
	for _, pm := range extra {
		s.o.Log.Info("pool: stopping an idle member the pool no longer keeps", "id", pm.ID, "image", pm.img.Name)
		s.Discard(pm)
		s.o.Host.Release(pm.res)
	}
}

func (s *Service) fill(ctx context.Context) {
	s.trim() // (a fill that was under way when the pool shrank)
	for _, pe := range s.Pool() {
		img, err := s.o.Images.Lookup(pe.Image)
		if err != nil {
			continue
		}
		snap, key := s.Golden(pe.Image, img, pe.Size) // (started if none: ready later)
		if snap == nil {
			continue
		}
		for s.waitQuiet(ctx) {
			s.mu.Lock()
			have := len(s.pool[poolKey(img, pe.Size)])
			s.mu.Unlock()
			if have >= pe.N {
				break
			}
			if err := s.o.Host.Reserve(pe.Size); err != nil {
				break // full: creates come first
			}
			start := time.Now()
			pm, err := s.newMember(ctx, snap, key, img, pe.Size)
			if err != nil {
				s.o.Host.Release(pe.Size)
				s.o.Log.Warn("pool: making a member failed", "image", img.Name, "err", err)
				break
			}
			s.mu.Lock()
			k := poolKey(img, pe.Size)
			s.pool[k] = append(s.pool[k], pm)
			s.mu.Unlock()
			s.step("pool-idle", pm.stateDir)
			s.o.Log.Info("pool member ready", "id", pm.ID, "image", img.Name, "took", time.Since(start).Round(time.Millisecond))
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

// waitQuiet waits until no member was claimed for poolQuiet, or
// poolQuietMax; false when ctx ends.
func (s *Service) waitQuiet(ctx context.Context) bool {
	latest := time.Now().Add(poolQuietMax)
	for {
		s.mu.Lock()
		d := min(time.Until(s.lastClaim.Add(poolQuiet)), time.Until(latest))
		s.mu.Unlock()
		if d <= 0 {
			return ctx.Err() == nil
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
		}
	}
}

// newMember restores a machine from the golden snapshot snap (under key)
// with a new sandbox ID, its own keys and network, and waits for its
// agent.
func (s *Service) newMember(ctx context.Context, snap *store.Snapshot, key []byte, img images.Image, res sandbox.Resources) (_ *Member, err error) {
	pm := &Member{ID: sandbox.NewID(), img: img, res: res}
	if s.o.Encrypt {
		if pm.Keys, err = sandboxkeys.New(); err != nil {
			return nil, err
		}
	}
	att, err := s.o.Network.Attach(ctx, pm.ID, &firewall.Policy{DefaultOutbound: firewall.Deny})
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	spec := s.o.Host.SandboxSpec(pm.ID)
	spec.DataKey, spec.SnapshotKey, spec.SharedMemory = pm.Keys.Data, key, s.o.SharedMemory
	pm.stateDir = spec.StateDir
	if pm.Keys.Console != nil {
		spec.ConsoleRecipient = pm.Keys.Console.Recipient().String()
	}
	if att != nil {
		spec.Network = &hypervisor.Network{Tap: att.Tap, MAC: att.MAC}
	}
	s.step("pool-restore", pm.stateDir)
	if pm.Machine, err = s.o.Hypervisor.Restore(ctx, snap.Dir, spec); err != nil {
		// (A restore its caller gave up on, as a server that stops does,
		// can have finished in its backend all the same: a VMM whose
		// handle never came back.)
		procs.KillVMMs(pm.stateDir)
		s.o.Network.Detach(context.WithoutCancel(ctx), pm.ID)
		if ctx.Err() == nil && SnapshotFault(err) {
			s.Failed(img, res, snap, err) // (made again for the next fill)
		}
		return nil, fmt.Errorf("restore: %w", err)
	}
	s.step("pool-restored", pm.stateDir)
	defer func() {
		if err != nil {
			s.Discard(pm)
		}
	}()
	bctx, cancel := context.WithTimeout(ctx, s.o.BootTimeout)
	defer cancel()
	if pm.Agent, _, err = agentclient.DialReady(bctx, pm.Machine.AgentEndpoint(), s.o.Agent); err != nil {
		return nil, err
	}
	// Its own address, then its own machine-id and entropy: until here it
	// has the golden snapshot's, as every member does. A claim does not
	// give them again (nothing runs on a member before its claim).
	if att != nil && att.Cmdline != "" {
		if err := pm.Agent.SetNetwork(bctx, att.Cmdline); err != nil {
			return nil, err
		}
	}
	if err := NewIdentity(bctx, pm.Agent, nil, false); err != nil {
		return nil, err
	}
	// Warm it: a restored guest runs every code path cold the first time
	// (under TCG each is translated again: a claim's first agent call and
	// first command took 120 and 250 ms, warm 20 and 15 ms). A member
	// goes through a claim's calls once.
	if err := pm.Agent.SyncTime(bctx, time.Now()); err != nil {
		return nil, err
	}
	pm.ClockSet = time.Now()
	// (Best effort: an image without a shell is still served.)
	pm.Agent.Exec(bctx, agentclient.ExecRequest{Argv: []string{"/bin/sh", "-c", "true"}, Timeout: 10 * time.Second}, nil)
	s.step("pool-warm", pm.stateDir)
	return pm, nil
}

// drain stops every idle member and releases its host capacity.
func (s *Service) drain() {
	s.mu.Lock()
	var all []*Member
	for _, l := range s.pool {
		all = append(all, l...)
	}
	s.pool = map[string][]*Member{}
	s.mu.Unlock()
	for _, pm := range all {
		s.Discard(pm)
		s.o.Host.Release(pm.res)
	}
}
