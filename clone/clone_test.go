package clone

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
)

// host is a Host with a vCPU limit, naming machines under dir as the
// engine does.
type host struct {
	dir   string
	limit int

	mu   sync.Mutex
	used int
}

func (h *host) Reserve(res sandbox.Resources) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.used+res.VCPUs > h.limit {
		return sandbox.Errorf(sandbox.ErrCapacity, "size.vcpus", "host is full")
	}
	h.used += res.VCPUs
	return nil
}

func (h *host) Release(res sandbox.Resources) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.used -= res.VCPUs
}

func (h *host) inUse() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.used
}

func (h *host) BootSpec(id, stateDir string, img images.Image, res sandbox.Resources, _ *network.Attachment) hypervisor.Spec {
	return hypervisor.Spec{ID: id, VCPUs: res.VCPUs, MemoryMB: res.MemoryMB, Kernel: img.Kernel, Initrd: img.Initrd, Cmdline: img.Cmdline, StateDir: stateDir}
}

func (h *host) SandboxSpec(id string) hypervisor.Spec {
	dir := filepath.Join(h.dir, "m", id)
	return hypervisor.Spec{ID: id, StateDir: dir, SerialLog: filepath.Join(dir, "serial.log"), Labels: map[string]string{"harebox.sandbox": id}}
}

type catalog map[string]images.Image

func (c catalog) Lookup(name string) (images.Image, error) {
	if img, ok := c[name]; ok {
		return img, nil
	}
	return images.Image{}, sandbox.Errorf(sandbox.ErrNotFound, "image", "no image %q", name)
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestGoldenAndPool, over memhv: the first ask for a golden snapshot
// starts one and returns none; the pool fills from it within the host's
// capacity; a claim takes a member (its capacity and machine pass to the
// caller) and the pool refills; a reservation on a full host stops idle
// members, and fails once there are none; Close stops the idle members,
// releases their capacity and keeps the golden snapshot.
func TestGoldenAndPool(t *testing.T) {
	t.Parallel() // (it waits on the golden boot's timers)
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	dir, err := os.MkdirTemp("", "hbc") // short: socket paths live under it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	img := memhv.Image(dir)
	small, medium := sandbox.Presets["small"], sandbox.Presets["medium"]
	pool, err := ParsePool(map[string]int{"memhv:small": 2})
	if err != nil {
		t.Fatal(err)
	}
	h := &host{dir: dir, limit: 3}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := New(ctx, Options{Hypervisor: hv, Network: network.None{}, Images: catalog{"memhv": img}, Host: h,
		Dir: filepath.Join(dir, "golden"), Seal: masterKey(t), Golden: true, Encrypt: true, Pool: pool, BootTimeout: 10 * time.Second})

	if snap, _ := s.Golden("memhv", img, small); snap != nil {
		t.Fatal("a golden snapshot before one was made")
	}
	if goldens, _ := s.Held(); len(goldens) != 1 || goldens[0] != img.Dir {
		t.Fatalf("held while a golden snapshot is made: %v", goldens)
	}
	ran := make(chan struct{})
	go func() { defer close(ran); s.Run(ctx) }()
	waitFor(t, "a full pool", func() bool { return s.Idle() == 2 })
	if !s.Ready(img.Dir) || s.Ready(filepath.Join(dir, "other")) {
		t.Error("Ready does not tell the golden snapshot's image build")
	}
	if got := h.inUse(); got != 2 {
		t.Errorf("%d vCPUs reserved by two idle members (the golden boot's released)", got)
	}
	if snap, key := s.Golden("memhv", img, small); snap == nil || len(key) != hypervisor.KeySize {
		t.Fatalf("golden snapshot: %+v, key of %d bytes", snap, len(key))
	}

	if s.Claim(img, medium) != nil {
		t.Error("a member of a size the pool does not keep")
	}
	pm := s.Claim(img, small)
	if pm == nil || !sandbox.ValidID(pm.ID) || len(pm.Keys.Data) != hypervisor.KeySize || pm.Keys.Console == nil {
		t.Fatalf("claimed: %+v", pm)
	}
	r, err := pm.Agent.Exec(ctx, agentclient.ExecRequest{Argv: []string{"echo", "warm"}}, nil)
	if err != nil || string(r.Stdout) != "warm\n" {
		t.Fatalf("the claimed member's agent: %+v %v", r, err)
	}
	if s.Idle() != 1 || h.inUse() != 2 {
		t.Errorf("after a claim: %d idle, %d vCPUs reserved", s.Idle(), h.inUse())
	}
	waitFor(t, "the refill", func() bool { return s.Idle() == 2 })

	// The host is full (3 of 3): creates come before the pool.
	for i := range 2 {
		if err := s.Reserve(small); err != nil {
			t.Fatalf("reserve %d on a full host with idle members: %v", i, err)
		}
		if s.Idle() != 1-i || h.inUse() != 3 {
			t.Fatalf("reserve %d: %d idle, %d vCPUs reserved", i, s.Idle(), h.inUse())
		}
	}
	if err := s.Reserve(small); !errors.Is(err, sandbox.ErrCapacity) {
		t.Fatalf("reserve with no member left: %v", err)
	}
	h.Release(small)
	waitFor(t, "a refill into the room freed", func() bool { return s.Idle() == 1 })

	cancel()
	<-ran
	s.Close()
	if s.Idle() != 0 || h.inUse() != 2 { // the claimed member and one reservation
		t.Errorf("after Close: %d idle, %d vCPUs reserved", s.Idle(), h.inUse())
	}
	if g := goldens(t, filepath.Join(dir, "golden")); len(g) != 1 {
		t.Errorf("golden snapshots kept after Close: %v", g)
	}
	if goldens, pooled := s.Held(); len(goldens)+len(pooled) != 0 {
		t.Errorf("held after Close: %v %v", goldens, pooled)
	}
	// The claimed member is the caller's: it still answers.
	if _, err := pm.Agent.Exec(context.Background(), agentclient.ExecRequest{Argv: []string{"true"}}, nil); err != nil {
		t.Errorf("the claimed member after Close: %v", err)
	}
	s.Discard(pm)
}

// AutoPool keeps one default:small member per 8 small sandboxes the host
// admits, 1 to 4, and none on a host that admits fewer than 4 (whichever
// of CPU, memory and disk admits fewest).
func TestAutoPool(t *testing.T) {
	for _, c := range []struct {
		limit sandbox.Resources
		want  int
	}{
		{sandbox.Resources{VCPUs: 8, MemoryMB: 23081, DiskGB: 90}, 1}, // this project's 2-core machine
		{sandbox.Resources{VCPUs: 3, MemoryMB: 64000, DiskGB: 1000}, 0},
		{sandbox.Resources{VCPUs: 64, MemoryMB: 1500, DiskGB: 1000}, 0},
		{sandbox.Resources{VCPUs: 64, MemoryMB: 64000, DiskGB: 15}, 0},
		{sandbox.Resources{VCPUs: 4, MemoryMB: 2048, DiskGB: 20}, 1},
		{sandbox.Resources{VCPUs: 128, MemoryMB: 8192, DiskGB: 1000}, 2},
		{sandbox.Resources{VCPUs: 256, MemoryMB: 512000, DiskGB: 4000}, 4},
		{sandbox.Resources{}, 0},
	} {
		got := AutoPool(c.limit)
		if c.want == 0 && got != nil || c.want > 0 && (len(got) != 1 || got["default:small"] != c.want) {
			t.Errorf("AutoPool(%+v) = %v, want %d", c.limit, got, c.want)
		}
		if _, err := ParsePool(got); err != nil {
			t.Errorf("AutoPool(%+v) = %v: %v", c.limit, got, err)
		}
	}
}
