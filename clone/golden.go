package clone

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/mounts"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/monitor"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Golden snapshots (the engine's Options.GoldenSnapshots). The first
// create of an image build at a size boots cold, and starts, in the
// background, a golden boot of that image and size: a machine of no
// tenant that boots, waits for its agent and for systemd (where there is
// one) to settle, and is snapshotted under a random key held in memory
// only, then stopped. Later creates of that image and size restore from
// it as a fork's clones do, each with its own data key, machine-id,
// kernel entropy and network, and fall back to a cold boot while there is
// none. The files are removed at Close and at start: without their key
// they are of no use. A golden machine a crash left running (the engine
// died during a golden boot: it has no record, and its key died with the
// engine) is stopped at start, before its files go.

// golden is one image build's golden snapshot at one size.
type golden struct {
	imageDir string
	res      sandbox.Resources
	snap     *store.Snapshot
	key      []byte
	ready    chan struct{} // closed once built or failed
	err      error
}

// goldenMachine is the golden machine's own state directory in its golden
// directory (beside "snap", the snapshot).
const goldenMachine = "m"

func goldenID(img images.Image, res sandbox.Resources) string {
	return fmt.Sprintf("%s|%d|%d|%d", img.Dir, res.VCPUs, res.MemoryMB, res.DiskGB)
}

// Golden returns the ready golden snapshot of img at res and its key, or
// nil; with none made yet, it starts making one in the background.
func (s *Service) Golden(img images.Image, res sandbox.Resources) (*store.Snapshot, []byte) {
	if !s.o.Golden {
		return nil, nil
	}
	id := goldenID(img, res)
	s.mu.Lock()
	g := s.goldens[id]
	if g == nil {
		g = &golden{imageDir: img.Dir, res: res, ready: make(chan struct{})}
		s.goldens[id] = g
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.buildGolden(g, img, res)
		}()
	}
	s.mu.Unlock()
	select {
	case <-g.ready:
		if g.err != nil {
			return nil, nil
		}
		return g.snap, g.key
	default:
		return nil, nil // being made: this create boots
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
		select {
		case <-g.ready:
			st = sandbox.GoldenReady
			if g.err != nil {
				st = sandbox.GoldenFailed
			}
		default:
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
		select {
		case <-g.ready:
			if g.err == nil && g.imageDir == imageDir {
				return true
			}
		default:
		}
	}
	return false
}

// buildGolden boots img at res, lets it settle and snapshots it. A build
// that fails is not retried until the engine restarts (creates boot).
func (s *Service) buildGolden(g *golden, img images.Image, res sandbox.Resources) {
	defer close(g.ready)
	start := time.Now()
	g.err = s.makeGolden(s.ctx, g, img, res)
	if errors.Is(g.err, sandbox.ErrCapacity) {
		// The host was full: a later create tries again.
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
	dir := filepath.Join(s.o.Dir, id)
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
	c, _, err := agentclient.DialReady(bctx, m.AgentEndpoint(), s.o.Agent)
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
		Snapshot: sandbox.Snapshot{ID: id, Image: img.Name, Size: res, CreatedAt: time.Now().UTC()},
		Dir:      snapDir, ImageDir: img.Dir,
		Source: store.SnapshotSource{Monitoring: true},
	}
	return nil
}

// DropGoldens removes every golden snapshot's files (at Close, after the
// builds ended, and at start), and stops any golden machine still running
// on them: at start, one whose boot the engine died in.
func (s *Service) DropGoldens() {
	s.mu.Lock()
	s.goldens = map[string]*golden{}
	s.mu.Unlock()
	ents, _ := os.ReadDir(s.o.Dir)
	for _, ent := range ents {
		// Its own machine directory only: a sandbox restored from the
		// golden snapshot names the snapshot's disk on its command line
		// (the backing of its overlay), and lives on.
		dir := filepath.Join(s.o.Dir, ent.Name(), goldenMachine)
		if n := procs.KillVMMs(dir); n > 0 {
			s.o.Log.Warn("stopped a golden machine left running", "dir", dir, "vmms", n)
		}
		if err := mounts.RemoveAll(filepath.Dir(dir)); err != nil {
			s.o.Log.Warn("cannot remove a golden snapshot's files", "dir", filepath.Dir(dir), "err", err)
		}
	}
	os.RemoveAll(s.o.Dir)
}
