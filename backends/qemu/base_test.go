package qemu

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/internal/testimage"
	"golang.org/x/sys/unix"
)

// TestSharedMemory restores two machines from one snapshot with
// SharedMemory and checks, from the host, what the conformance suite
// cannot see: both map the snapshot's base copy-on-write and share the
// pages they only read, the base is unchanged by what they write, a
// snapshot made again gets a base of its own, a wrong key gets nothing,
// and a base that does not load leaves the restore loading everything.
func TestSharedMemory(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps installs it)")
	}
	img := testimage.Image(t, "minimal")
	d, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	key := func() []byte {
		k := make([]byte, hypervisor.KeySize)
		rand.Read(k)
		return k
	}
	var machines []hypervisor.Machine
	t.Cleanup(func() {
		for _, m := range machines {
			m.Kill(ctx)
			m.Cleanup(ctx)
		}
	})
	spec := hypervisor.Spec{ID: "shm-src", VCPUs: 1, MemoryMB: 256, Kernel: img.Kernel, Initrd: img.Initrd, Cmdline: img.Cmdline,
		StateDir: filepath.Join(dir, "src"), DataKey: key()}
	src, err := d.Launch(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	machines = append(machines, src)
	agent := func(m hypervisor.Machine) *agentclient.Client {
		t.Helper()
		actx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		c, _, err := agentclient.DialReady(actx, m.AgentEndpoint(), agentclient.Options{})
		if err != nil {
			t.Fatalf("agent of %s: %v", m.ID(), err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	sh := func(c *agentclient.Client, shell string) string {
		t.Helper()
		r, err := c.Exec(ctx, agentclient.ExecRequest{Shell: shell, User: "root", Timeout: time.Minute}, nil)
		if err != nil || r.Error != "" || r.ExitCode != 0 {
			t.Fatalf("%q: %v %s %s", shell, err, r.Error, r.Stderr)
		}
		return string(r.Stdout)
	}
	sh(agent(src), "mkdir -p /run/mem && mount -t tmpfs tmpfs /run/mem && echo golden > /run/mem/state")
	snap, snapKey := filepath.Join(dir, "snap"), key()
	if err := src.Snapshot(ctx, snap, snapKey); err != nil {
		t.Fatal(err)
	}
	src.Kill(ctx)

	// A restore whose caller gives up while the base is made (a server
	// that closes) leaves no VMM and no directory, at whichever step.
	for i, after := range []time.Duration{100 * time.Millisecond, 600 * time.Millisecond, 1500 * time.Millisecond} {
		id := fmt.Sprintf("shm-x%d", i)
		cctx, cancel := context.WithTimeout(ctx, after)
		m, err := d.Restore(cctx, snap, hypervisor.Spec{ID: id, StateDir: filepath.Join(dir, id), DataKey: key(), SnapshotKey: snapKey, SharedMemory: true})
		cancel()
		if err == nil {
			m.Kill(ctx)
			m.Cleanup(ctx)
			continue
		}
		time.Sleep(200 * time.Millisecond) // (a VMM started late would show by now)
		if _, serr := os.Stat(filepath.Join(dir, id)); !os.IsNotExist(serr) {
			ents, _ := os.ReadDir(filepath.Join(dir, id))
			t.Errorf("a restore cut short after %v (%v) left its directory: %v", after, err, ents)
		}
		if ps := procs.Naming(filepath.Join(dir, id) + "/"); len(ps) > 0 {
			t.Errorf("a restore cut short after %v left %v", after, ps)
			for _, p := range ps {
				syscall.Kill(p.PID, syscall.SIGKILL)
			}
		}
	}
	d.bases.sweep()
	for path := range d.bases.m {
		d.bases.mu.Lock()
		d.bases.dropLocked(path)
		d.bases.mu.Unlock()
	}

	restore := func(id string, k []byte) (hypervisor.Machine, error) {
		m, err := d.Restore(ctx, snap, hypervisor.Spec{ID: id, StateDir: filepath.Join(dir, id), DataKey: key(), SnapshotKey: k, SharedMemory: true})
		if err == nil {
			machines = append(machines, m)
		}
		return m, err
	}
	c1, err := restore("shm-c1", snapKey)
	if err != nil {
		t.Fatal(err)
	}
	b := d.bases.m[filepath.Join(snap, memoryFile)]
	if b == nil || b.b == nil {
		t.Fatalf("no base after a shared restore: %+v", b.err)
	}
	sum := func() [32]byte {
		h := sha256.New()
		if _, err := io.Copy(h, io.NewSectionReader(b.b.mem, 0, 256<<20)); err != nil {
			t.Fatal(err)
		}
		return [32]byte(h.Sum(nil))
	}
	// Only the golden guest's pages that are not zeros hold memory.
	var fst unix.Stat_t
	if err := unix.Fstat(int(b.b.mem.Fd()), &fst); err != nil {
		t.Fatal(err)
	}
	t.Logf("the base holds %d MiB of the guest's 256", fst.Blocks*512>>20)
	if fst.Blocks*512 > 128<<20 {
		t.Errorf("the base holds %d MiB of the guest's 256: its zeros were not let go", fst.Blocks*512>>20)
	}
	before := sum()
	c2, err := restore("shm-c2", snapKey)
	if err != nil {
		t.Fatal(err)
	}
	if d.bases.m[filepath.Join(snap, memoryFile)] != b {
		t.Fatal("the second restore made a base of its own")
	}
	a1, a2 := agent(c1), agent(c2)
	// Both start from the golden memory, then write their own.
	for i, a := range []*agentclient.Client{a1, a2} {
		if got := sh(a, "cat /run/mem/state"); got != "golden\n" {
			t.Fatalf("clone %d: state %q", i+1, got)
		}
		sh(a, fmt.Sprintf("echo clone%d > /run/mem/state; dd if=/dev/urandom of=/run/mem/noise bs=1M count=32 2>/dev/null", i+1))
	}
	if got := sh(a1, "cat /run/mem/state"); got != "clone1\n" {
		t.Errorf("clone 1 reads %q after clone 2 wrote", got)
	}
	if sum() != before {
		t.Fatal("the base changed under its clones' writes")
	}
	if seals, err := unix.FcntlInt(b.b.mem.Fd(), unix.F_GET_SEALS, 0); err != nil || seals&unix.F_SEAL_WRITE == 0 {
		t.Fatalf("the base is not sealed against writes: %#x %v", seals, err)
	}
	// Each VMM maps the base, and the two share what both only read.
	for _, m := range []hypervisor.Machine{c1, c2} {
		info, err := m.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		v, err := baseMapping(info.PID)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: the base's mapping (KiB): %v", m.ID(), v)
		// The base's pages (dirty: a memfd's pages are never written
		// back) that both map, and the private copies of what it wrote.
		if shared := v["Shared_Clean"] + v["Shared_Dirty"]; shared < 4<<10 {
			t.Errorf("%s shares %d KiB of the base with its sibling, want at least 4 MiB", m.ID(), shared)
		}
		if v["Anonymous"] < 32<<10 {
			t.Errorf("%s holds %d KiB of its own, want its 32 MiB of writes at least", m.ID(), v["Anonymous"])
		}
	}

	// A wrong snapshot key gets nothing, base or not.
	if _, err := restore("shm-bad", key()); !errors.Is(err, hypervisor.ErrInvalid) {
		t.Errorf("a shared restore under a wrong key: %v, want ErrInvalid", err)
	}

	// A machine restored sharing is snapshotted whole (the conformance
	// suite restores such a snapshot): it becomes the snapshot below.
	snap2 := filepath.Join(dir, "snap2")
	if err := c1.Snapshot(ctx, snap2, snapKey); err != nil {
		t.Fatal(err)
	}
	c1.Kill(ctx)

	// The snapshot made again at the same place: a new base. Gone: no base.
	if err := os.RemoveAll(snap); err != nil {
		t.Fatal(err)
	}
	d.bases.sweep()
	if len(d.bases.m) != 0 {
		t.Errorf("a removed snapshot's base is kept: %v", d.bases.m)
	}
	if err := os.Rename(snap2, snap); err != nil {
		t.Fatal(err)
	}
	c3, err := restore("shm-c3", snapKey)
	if err != nil {
		t.Fatal(err)
	}
	if nb := d.bases.m[filepath.Join(snap, memoryFile)]; nb == nil || nb == b {
		t.Fatal("the snapshot made again got no base of its own")
	}
	if got := sh(agent(c3), "cat /run/mem/state"); got != "clone1\n" {
		t.Errorf("restored from the new base: %q", got)
	}

	// A base whose device state does not load (x-ignore-shared is
	// experimental) is given up: the restore loads all the memory, and so
	// do the next ones.
	memPath := filepath.Join(snap, memoryFile)
	nb := d.bases.m[memPath].b
	nb.device = nb.device[:len(nb.device)/2]
	c4, err := restore("shm-c4", snapKey)
	if err != nil {
		t.Fatal(err)
	}
	if c4.(*machine).st.SharedBase {
		t.Error("restored over a base that does not load")
	}
	if got := sh(agent(c4), "cat /run/mem/state"); got != "clone1\n" {
		t.Errorf("restored without a base: %q", got)
	}
	if e := d.bases.m[memPath]; e == nil || e.err == nil || e.b != nil {
		t.Errorf("the base that failed is still offered: %+v", e)
	}
}

// baseMapping sums, in KiB, the smaps fields of pid's mappings of a base.
func baseMapping(pid int) (map[string]int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	v, in, found := map[string]int64{}, false, false
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) == 0 {
			continue
		}
		if !strings.HasSuffix(fields[0], ":") { // a mapping's first line
			in = strings.Contains(s.Text(), "memfd:harebox-golden-memory")
			found = found || in
			continue
		}
		if in && len(fields) == 3 && fields[2] == "kB" {
			n, _ := strconv.ParseInt(fields[1], 10, 64)
			v[strings.TrimSuffix(fields[0], ":")] += n
		}
	}
	if !found {
		return nil, fmt.Errorf("pid %d maps no base", pid)
	}
	return v, s.Err()
}
