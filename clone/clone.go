// Package clone holds the engine's clone paths: the snapshots it keeps
// (Snapshots: their records, keys and the source's env sealed under
// them, their files, the creates that restore from each), golden
// snapshots (one boot of an image at a size, snapshotted for the creates
// after it to restore from), the warm pool (machines restored from them,
// idle until a create claims one), a hibernated sandbox's files
// (Hibernation) and a restored guest's new identity. The engine still
// takes a sandbox's snapshot and hibernates it, under the sandbox's lock,
// and makes, admits and registers every sandbox: it opens a snapshot, a
// golden one or a hibernated sandbox's files to restore from, or claims a
// pool member and takes its machine over. What the package needs of the
// engine is Host (the host's capacity and the engine's naming of
// machines) and Hosts (whether another host has a snapshot's files).
package clone

import (
	"context"
	"crypto/cipher"
	"log/slog"
	"sync"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/stall"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
)

// Host is what the clone paths need of the engine.
type Host interface {
	// Reserve admits res against the host's capacity (sandbox.ErrCapacity:
	// the host is full); Release gives it back. A golden boot holds its
	// size while it runs, and a pool member for as long as it is idle.
	Reserve(res sandbox.Resources) error
	Release(res sandbox.Resources)
	// BootSpec is the spec of machine id booting img at res in stateDir,
	// attached to att (nil: no network), as the engine boots its own.
	BootSpec(id, stateDir string, img images.Image, res sandbox.Resources, att *network.Attachment) hypervisor.Spec
	// SandboxSpec is the spec of sandbox id's machine as far as the
	// engine names it: its state directory, console log and labels (a
	// pool member becomes that sandbox when it is claimed).
	SandboxSpec(id string) hypervisor.Spec
}

// Images looks image builds up by name (images/catalog).
type Images interface {
	Lookup(name string) (images.Image, error)
}

// Options are a Service's parts.
type Options struct {
	Hypervisor hypervisor.Hypervisor
	Network    network.Network
	Images     Images
	Host       Host
	// Dir holds the golden snapshots (the engine's GoldenDir).
	Dir string
	// Seal (the golden key) seals each golden snapshot's key in its
	// manifest: they are kept across restarts, and shared with the other
	// engines on Dir that have the same golden key (golden.go). Golden
	// needs it.
	Seal cipher.AEAD
	// Backend names the backend, its version and the kind of network
	// machines get (a golden snapshot has a network device exactly when
	// its clones do): a kept golden snapshot another one made is not used.
	Backend string
	// Golden makes golden snapshots (the engine's GoldenSnapshots, with a
	// backend that snapshots); without it Golden returns none, and the
	// pool never fills.
	Golden bool
	// SharedMemory has the sandboxes restored from a golden snapshot, pool
	// members included, share its memory copy-on-write where the backend
	// can (hypervisor.Spec.SharedMemory): far less memory per idle
	// sandbox, slower guests while they first write their pages.
	SharedMemory bool
	// Encrypt gives golden snapshots and pool members keys of their own
	// (the backend encrypts: crypto-erase is on).
	Encrypt bool
	// Pool is what the warm pool keeps (ParsePool).
	Pool []PoolEntry
	// BootTimeout bounds a boot or restore until the agent answers.
	BootTimeout time.Duration
	// Stall says when a golden boot has stalled (launched again, once).
	Stall stall.Rule
	Agent agentclient.Options
	// Step, if set, is called at each step of a golden boot and of a pool
	// refill with the directory it concerns (the crash tests' hook).
	Step func(step, dir string)
	Log  *slog.Logger
}

// Service makes and keeps golden snapshots and pool members.
type Service struct {
	o     Options
	keyID string          // the golden key's (keyID)
	ctx   context.Context // the golden builds', until the engine closes
	wg    sync.WaitGroup  // the golden builds

	mu sync.Mutex
	// goldens are the golden snapshots, by image build and size.
	goldens map[string]*golden
	// pool holds the idle members by image build and size; refill asks
	// the pool loop to fill it up.
	pool   map[string][]*Member
	refill chan struct{}
	// lastClaim is when a member was last claimed: refills wait until
	// the pool has been quiet for poolQuiet.
	lastClaim time.Time
}

// New returns a Service whose golden builds run under ctx (canceled when
// the engine closes, before Close).
func New(ctx context.Context, o Options) *Service {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Seal == nil {
		o.Golden = false // (nothing to seal their keys under)
	}
	return &Service{o: o, keyID: keyID(o.Seal), ctx: ctx, goldens: map[string]*golden{}, pool: map[string][]*Member{}, refill: make(chan struct{}, 1)}
}

// Close waits for the golden builds and stops every idle member (its
// host capacity released); the golden snapshots are kept for the next
// start.
func (s *Service) Close() {
	s.wg.Wait()
	s.drain()
	s.mu.Lock()
	s.goldens = map[string]*golden{}
	s.mu.Unlock()
}

// Held are the image builds of the golden snapshots (made or being made)
// and of the idle members: images/catalog keeps them.
func (s *Service) Held() (goldens, pooled []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.goldens {
		goldens = append(goldens, g.imageDir)
	}
	for _, ms := range s.pool {
		for _, m := range ms {
			pooled = append(pooled, m.img.Dir)
		}
	}
	return goldens, pooled
}

// Idle is how many members the pool holds now.
func (s *Service) Idle() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range s.pool {
		n += len(l)
	}
	return n
}

func (s *Service) step(step, dir string) {
	if s.o.Step != nil {
		s.o.Step(step, dir)
	}
}
