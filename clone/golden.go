package clone

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/stall"
	"github.com/harebox/harebox/monitor"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Golden snapshots (the engine's Options.GoldenSnapshots). The first
// create of an image build at a size boots cold, and starts, in the
// background, a golden boot of that image and size: a machine of no
// tenant that boots, waits for its agent and for systemd (where there is
// one) to settle, and is snapshotted under a random key of its own, then
// stopped. Later creates of that image and size restore from it as a
// fork's clones do, each with its own data key, machine-id, kernel
// entropy and network, and fall back to a cold boot while there is none.
//
// They are kept across restarts, and shared by the engines on one Dir
// with the same golden key: goldendir.go.

// golden is one image build's golden snapshot at one size.
type golden struct {
	name     string // its directory under Dir
	image    string // the image's name, as creates ask for it
	imageDir string
	res      sandbox.Resources
	snap     *store.Snapshot
	key      []byte
	ready    chan struct{} // closed once built, found, or failed
	err      error
	cancel   context.CancelFunc // stops its build (an image's delete)
	touched  time.Time          // when it was last marked used (touch)
}

const (
	// goldenMachine is the golden machine's own state directory in its
	// golden directory (beside "snap", the snapshot).
	goldenMachine = "m"
	// goldenManifest is a kept golden snapshot's record, written last.
	goldenManifest = "golden.json"
	// goldenFormat changes when what a golden snapshot holds does: kept
	// ones of another format are removed.
	goldenFormat = 1
)

func goldenID(img images.Image, res sandbox.Resources) string {
	return fmt.Sprintf("%s|%d|%d|%d", img.Dir, res.VCPUs, res.MemoryMB, res.DiskGB)
}

// SnapshotFault reports whether a restore's err is the snapshot's own
// fault (its files gone, damaged or of another backend), not the host's
// (capacity, a device): a golden snapshot is dropped only for those.
func SnapshotFault(err error) bool {
	return errors.Is(err, hypervisor.ErrNotFound) || errors.Is(err, hypervisor.ErrInvalid) || errors.Is(err, hypervisor.ErrUnsupported)
}

// SharedMemory says whether restores from golden snapshots share their
// memory (Options.SharedMemory).
func (s *Service) SharedMemory() bool { return s.o.SharedMemory }

// Golden returns the ready golden snapshot of img (the build the image
// called name is) at res and its key, or nil; with none made yet (here or
// by another engine on Dir), it starts making one in the background.
func (s *Service) Golden(name string, img images.Image, res sandbox.Resources) (*store.Snapshot, []byte) {
	if !s.o.Golden {
		return nil, nil
	}
	id := goldenID(img, res)
	s.mu.Lock()
	g := s.goldens[id]
	if g == nil {
		g = &golden{name: s.goldenName(img.Dir, res), image: name, imageDir: img.Dir, res: res, ready: make(chan struct{}), cancel: func() {}}
		if s.find(g) == nil {
			// Made by another engine on Dir since this one started.
			close(g.ready)
			s.o.Log.Info("golden snapshot ready", "image", name, "size", res, "found", true)
		} else {
			ctx, cancel := context.WithCancel(s.ctx)
			g.cancel = cancel
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer cancel()
				s.buildGolden(ctx, g, img, res)
			}()
		}
		s.goldens[id] = g
	}
	ready := g.done() && g.err == nil
	if ready {
		s.touch(g)
	}
	s.mu.Unlock()
	if !ready {
		return nil, nil // being made (this create boots), or failed
	}
	return g.snap, g.key
}

// Failed drops golden snapshot snap of img at res after a restore from
// it failed for a reason of its own (its files gone or damaged, or made
// by a backend that no longer restores them): the next ask makes another.
// One that another engine on Dir made since is taken instead.
func (s *Service) Failed(img images.Image, res sandbox.Resources, snap *store.Snapshot, err error) {
	s.mu.Lock()
	g := s.goldens[goldenID(img, res)]
	if g == nil || !g.done() || g.snap == nil || g.snap.ID != snap.ID {
		s.mu.Unlock()
		return // (another ask dropped it already)
	}
	delete(s.goldens, goldenID(img, res))
	s.mu.Unlock()
	if s.removeIf(g.name, snap.ID) {
		s.o.Log.Warn("a golden snapshot did not restore; it is made again", "image", img.Name, "size", res, "err", err)
	}
}

// DropImage removes the golden snapshots of the image build in imageDir,
// made here, kept or another engine's on Dir, before the build is
// deleted: one being made here is stopped first.
func (s *Service) DropImage(imageDir string) {
	s.mu.Lock()
	var drop []*golden
	for id, g := range s.goldens {
		if g.imageDir == imageDir {
			drop = append(drop, g)
			delete(s.goldens, id)
		}
	}
	s.mu.Unlock()
	for _, g := range drop {
		g.cancel()
		<-g.ready
		s.remove(g.name)
	}
	// And those of other engines on Dir (any kind) that this one does
	// not hold. (One another engine is making now is removed by the next
	// start: its build will be gone.)
	ents, _ := os.ReadDir(s.o.Dir)
	for _, ent := range ents {
		if !ent.IsDir() || !strings.HasPrefix(ent.Name(), "g-") {
			continue
		}
		var m manifest
		b, err := os.ReadFile(filepath.Join(s.o.Dir, ent.Name(), goldenManifest))
		if err == nil && json.Unmarshal(b, &m) == nil && m.Snapshot.ImageDir == imageDir {
			s.remove(ent.Name())
		}
	}
}

func (g *golden) done() bool {
	select {
	case <-g.ready:
		return true
	default:
		return false
	}
}

// Warm is what the service keeps warm of the image build in imageDir:
// its golden snapshots, by size (made, being made, or failed), and how
// many idle members the pool holds.
func (s *Service) Warm(imageDir string) (goldens []sandbox.GoldenSnapshot, idle int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.goldens {
		if g.imageDir != imageDir {
			continue
		}
		st := sandbox.GoldenMaking
		if g.done() {
			st = sandbox.GoldenReady
			if g.err != nil {
				st = sandbox.GoldenFailed
			}
		}
		goldens = append(goldens, sandbox.GoldenSnapshot{Resources: g.res, State: st})
	}
	slices.SortFunc(goldens, func(a, b sandbox.GoldenSnapshot) int {
		return cmp.Or(cmp.Compare(a.VCPUs, b.VCPUs), cmp.Compare(a.MemoryMB, b.MemoryMB), cmp.Compare(a.DiskGB, b.DiskGB))
	})
	for _, ms := range s.pool {
		for _, m := range ms {
			if m.img.Dir == imageDir {
				idle++
			}
		}
	}
	return goldens, idle
}

// Ready reports whether a golden snapshot of the image build in imageDir
// is ready, at any size (without starting one).
func (s *Service) Ready(imageDir string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.goldens {
		if g.done() && g.err == nil && g.imageDir == imageDir {
			return true
		}
	}
	return false
}

// buildGolden boots img at res, lets it settle and snapshots it. A build
// that fails is not retried until the engine restarts (creates boot). One
// that another engine on Dir is making is looked for again at the next
// ask.
func (s *Service) buildGolden(ctx context.Context, g *golden, img images.Image, res sandbox.Resources) {
	defer close(g.ready)
	start := time.Now()
	unlock, err := s.lock(g.name)
	if err == nil {
		defer unlock()
		// (Made by another engine since Golden looked: found into a copy,
		// since Held and Warm read g's other fields meanwhile.)
		if found := (&golden{name: g.name}); s.find(found) == nil {
			g.snap, g.key = found.snap, found.key
		} else {
			g.err = s.makeGolden(ctx, g, img, res)
		}
	} else {
		g.err = err
	}
	if errors.Is(g.err, sandbox.ErrCapacity) || errors.Is(g.err, errBusy) {
		// The host was full, or another engine makes it: a later create
		// tries again.
		s.mu.Lock()
		if s.goldens[goldenID(img, res)] == g {
			delete(s.goldens, goldenID(img, res))
		}
		s.mu.Unlock()
		return
	}
	if g.err != nil {
		s.o.Log.Warn("golden snapshot failed; creates of this image and size boot", "image", img.Name, "size", res, "err", g.err)
		return
	}
	s.o.Log.Info("golden snapshot ready", "image", img.Name, "size", res, "took", time.Since(start).Round(time.Millisecond), "bytes", monitor.DiskUse(g.snap.Dir))
}

func (s *Service) makeGolden(ctx context.Context, g *golden, img images.Image, res sandbox.Resources) (err error) {
	// It holds host capacity while it boots, as a sandbox would.
	if err := s.o.Host.Reserve(res); err != nil {
		return err
	}
	defer s.o.Host.Release(res)
	raw := make([]byte, 6)
	rand.Read(raw)
	id := "golden-" + hex.EncodeToString(raw)
	dir := filepath.Join(s.o.Dir, g.name)
	// (What a crash left of an earlier try, under the lock.)
	if err := s.clear(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	if s.o.Encrypt {
		g.key = make([]byte, hypervisor.KeySize)
		rand.Read(g.key)
	}
	// No traffic at all: nothing it does is anyone's.
	att, err := s.o.Network.Attach(ctx, id, &firewall.Policy{DefaultOutbound: firewall.Deny})
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	defer s.o.Network.Detach(context.WithoutCancel(ctx), id)
	spec := s.o.Host.BootSpec(id, filepath.Join(dir, goldenMachine), img, res, att)
	spec.Labels, spec.DataKey = map[string]string{"harebox.golden": img.Name}, g.key
	s.step("golden-launch", dir)
	m, err := s.o.Hypervisor.Launch(ctx, spec)
	if err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	s.step("golden-booting", dir)
	defer func() {
		bg := context.WithoutCancel(ctx)
		m.Kill(bg)
		m.Wait(bg)
		m.Cleanup(bg)
	}()
	bctx, cancel := context.WithTimeout(ctx, s.o.BootTimeout)
	defer cancel()
	c, err := s.awaitGolden(bctx, &m, spec, img.Name)
	if err != nil {
		return fmt.Errorf("boot: %w", err)
	}
	defer c.Close()
	// Settled: systemd's boot jobs done (where there is a systemd), the
	// page cache flushed, so that no clone starts with their work.
	settle := `if command -v systemctl >/dev/null; then systemctl is-system-running --wait >/dev/null 2>&1; fi; sync`
	if _, err := c.Exec(bctx, agentclient.ExecRequest{Shell: settle, User: "root", Timeout: 2 * time.Minute}, nil); err != nil {
		return fmt.Errorf("settle: %w", err)
	}
	s.step("golden-settled", dir)
	// The host hangs up first, and the guest's agent sees it (its port
	// reads end of file within a few hundred ms) and waits for the next
	// host: every clone then starts a fresh agent session at once when
	// its host connects. Snapshotted mid-session, a clone's agent would
	// answer its new host only after that host gave up on a stale session
	// (5 s, measured with create_phases_ms).
	c.Close()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Second):
	}
	snapDir := filepath.Join(dir, "snap")
	s.step("golden-snapshot", snapDir)
	if err := m.Snapshot(ctx, snapDir, g.key); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	s.step("golden-written", dir)
	g.snap = &store.Snapshot{
		Snapshot: sandbox.Snapshot{ID: id, Image: g.image, Size: res, CreatedAt: time.Now().UTC()},
		Dir:      snapDir, ImageDir: img.Dir,
		Source: store.SnapshotSource{Monitoring: true},
	}
	return s.keep(g)
}

// awaitGolden dials the agent of *m, a golden machine just launched. One
// whose VMM stalls (package stall) is paused and resumed, then launched
// again once, into *m, as a sandbox's fresh boot is.
func (s *Service) awaitGolden(ctx context.Context, m *hypervisor.Machine, spec hypervisor.Spec, image string) (c *agentclient.Client, err error) {
	dial := func(ctx context.Context) (err error) {
		c, _, err = agentclient.DialReady(ctx, (*m).AgentEndpoint(), s.o.Agent)
		return err
	}
	err = s.o.Stall.Await(ctx, *m, dial)
	var stalled *stall.Error
	if !errors.As(err, &stalled) {
		return c, err
	}
	s.o.Log.Warn("a golden boot stalled: pausing and resuming it", "image", image, "stall", stalled)
	nm, woke, err := stall.Recover(ctx, s.o.Hypervisor, *m, spec, dial)
	if woke {
		s.o.Log.Warn("the stalled golden boot woke when paused and resumed", "image", image)
		return c, nil
	}
	s.o.Log.Warn("the stalled golden boot is launched again", "image", image)
	if err != nil {
		return nil, err
	}
	*m = nm
	err = dial(ctx)
	return c, err
}
