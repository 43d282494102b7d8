package harebox_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

func readString(t *testing.T, eng *harebox.Engine, id, path string) string {
	t.Helper()
	var buf bytes.Buffer
	if _, err := eng.ReadFile(context.Background(), id, path, &buf); err != nil {
		t.Fatalf("read %s in %s: %v", path, id, err)
	}
	return buf.String()
}

// TestSnapshotsAndFork: a fork's clones carry the source's state at the
// moment of the fork and nothing after; a named snapshot outlives its
// source, a create from it works afterwards, and its delete erases its
// key; snapshots:false and bad requests are refused before anything is
// made; a failed clone takes its siblings with it. (Entropy, machine-id,
// network and disk run on real VMs in the e2e suite.)
func TestSnapshotsAndFork(t *testing.T) {
	ctx := context.Background()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { eng.Close() }()

	src, err := eng.Create(ctx, sandbox.CreateRequest{Labels: map[string]string{"team": "red"}, Env: map[string]string{"OWN": "source-env"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.WriteFile(ctx, src.ID, "/tmp/state", strings.NewReader("before"), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}

	// Refusals first: none reaches the hypervisor.
	launched := hv.Launched()
	off := false
	noSnaps, err := eng.Create(ctx, sandbox.CreateRequest{Snapshots: &off})
	if err != nil {
		t.Fatal(err)
	}
	launched++
	var se *sandbox.Error
	if _, err := eng.Snapshots().Fork(ctx, noSnaps.ID, sandbox.ForkRequest{}); !errors.As(err, &se) || se.Kind != sandbox.ErrInvalid || se.Field != "snapshots" {
		t.Errorf("fork of a sandbox with snapshots off: %v", err)
	}
	if _, err := eng.Snapshots().Take(ctx, noSnaps.ID, sandbox.SnapshotRequest{}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("snapshot of a sandbox with snapshots off: %v", err)
	}
	if _, err := eng.Snapshots().Fork(ctx, src.ID, sandbox.ForkRequest{Count: sandbox.MaxFork + 1}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("fork of %d: %v", sandbox.MaxFork+1, err)
	}
	if _, err := eng.Snapshots().Take(ctx, src.ID, sandbox.SnapshotRequest{Name: "Not A Name"}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("snapshot with a bad name: %v", err)
	}
	if _, err := eng.Create(ctx, sandbox.CreateRequest{Snapshot: "snap_01jzzzzzzzzzzzzzzzzzzzzzzz"}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("create from a missing snapshot: %v", err)
	}
	if n := hv.Launched(); n != launched {
		t.Fatalf("refused requests launched %d machines", n-launched)
	}

	// Fork: two clones with the source's files, labels and firewall
	// policy, their own IDs and data keys.
	policy, err := firewall.Parse([]byte(`{"default_outbound":"deny","outbound":[{"action":"allow","protocol":"tcp","ports":"443","cidrs":["192.0.2.0/24"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.SetFirewall(ctx, src.ID, policy); err != nil {
		t.Fatal(err)
	}
	clones, err := eng.Snapshots().Fork(ctx, src.ID, sandbox.ForkRequest{Count: 2, Name: "kid", Labels: map[string]string{"fork": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(clones) != 2 || clones[0].ID == clones[1].ID || clones[0].ID == src.ID {
		t.Fatalf("clones %+v", clones)
	}
	srcSpec, _ := hv.Spec(src.ID)
	keys := map[string]bool{string(srcSpec.DataKey): true}
	for i, c := range clones {
		got, err := eng.Firewall(ctx, c.ID)
		if err != nil || !reflect.DeepEqual(got, policy) {
			t.Errorf("clone %d's firewall: %+v, %v; want the source's %+v", i, got, err, policy)
		}
		spec, ok := hv.Spec(c.ID)
		if !ok || len(spec.DataKey) == 0 || keys[string(spec.DataKey)] {
			t.Errorf("clone %d's data key is missing or not its own (%v, %d bytes; source %d bytes)", i, ok, len(spec.DataKey), len(srcSpec.DataKey))
		}
		keys[string(spec.DataKey)] = true
	}
	if _, err := eng.WriteFile(ctx, src.ID, "/tmp/state", strings.NewReader("after"), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, c := range clones {
		if c.State != sandbox.StateRunning || c.Name != "kid-"+string(rune('1'+i)) || c.Labels["team"] != "red" || c.Labels["fork"] != "yes" {
			t.Errorf("clone %d: %+v", i, c)
		}
		if got := readString(t, eng, c.ID, "/tmp/state"); got != "before" {
			t.Errorf("clone %d has %q, want the state at the fork", i, got)
		}
		r, err := eng.Exec(ctx, c.ID, sandbox.ExecRequest{Cmd: "printenv OWN"})
		if err != nil || r.Stdout != "source-env\n" {
			t.Errorf("clone %d env: %+v, %v", i, r, err)
		}
	}
	// A clone forks like any sandbox.
	grand, err := eng.Snapshots().Fork(ctx, clones[0].ID, sandbox.ForkRequest{})
	if err != nil {
		t.Fatal("fork of a clone:", err)
	}
	if got := readString(t, eng, grand[0].ID, "/tmp/state"); got != "before" {
		t.Errorf("the clone's clone has %q", got)
	}
	if err := eng.Delete(ctx, grand[0].ID); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(opts.DataDir, "snapshots")); len(ents) != 0 {
		t.Errorf("a fork left snapshot files: %v", ents)
	}
	if l, _ := eng.Snapshots().List(ctx, ""); len(l) != 0 {
		t.Errorf("a fork left snapshots: %+v", l)
	}

	// A failed clone takes its siblings with it.
	before, _ := eng.List(ctx, sandbox.ListFilter{})
	hv.FailNextLaunch(errors.New("boom"))
	if _, err := eng.Snapshots().Fork(ctx, src.ID, sandbox.ForkRequest{Count: 2}); err == nil {
		t.Error("a fork with a failed clone succeeded")
	}
	if after, _ := eng.List(ctx, sandbox.ListFilter{}); len(after) != len(before) {
		t.Errorf("a failed fork left %d sandboxes", len(after)-len(before))
	}

	// A named snapshot outlives its source.
	snap, err := eng.Snapshots().Take(ctx, src.ID, sandbox.SnapshotRequest{Name: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if snap.SandboxID != src.ID || snap.Bytes <= 0 || snap.Labels["team"] != "red" {
		t.Errorf("snapshot %+v", snap)
	}
	if _, err := eng.Snapshots().Take(ctx, src.ID, sandbox.SnapshotRequest{Name: "base"}); !errors.Is(err, sandbox.ErrExists) {
		t.Errorf("a second snapshot named base: %v", err)
	}
	if s, err := eng.Get(ctx, src.ID); err != nil || s.State != sandbox.StateRunning {
		t.Fatalf("the source after its snapshot: %+v, %v", s, err)
	}
	// The snapshot has its own key, not a copy of its source's.
	func() {
		db, err := store.OpenSQLite(ctx, filepath.Join(opts.DataDir, "harebox.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		master, err := secrets.NewSealed(db, filepath.Join(opts.DataDir, "master.key"))
		if err != nil {
			t.Fatal(err)
		}
		sk, err1 := secrets.DataKey(ctx, master, "snapshot/"+snap.ID)
		bk, err2 := secrets.DataKey(ctx, master, "sandbox/"+src.ID)
		if err1 != nil || err2 != nil || bytes.Equal(sk, bk) {
			t.Errorf("snapshot key %x (%v), source key %x (%v): want two different keys", sk, err1, bk, err2)
		}
	}()
	if err := eng.Delete(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Create(ctx, sandbox.CreateRequest{Snapshot: snap.ID, Size: sandbox.Size{Preset: "large"}}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("create from a snapshot with a size: %v", err)
	}
	late, err := eng.Create(ctx, sandbox.CreateRequest{Snapshot: snap.ID})
	if err != nil {
		t.Fatal("create from the snapshot of a deleted sandbox:", err)
	}
	if got := readString(t, eng, late.ID, "/tmp/state"); got != "after" {
		t.Errorf("made from the snapshot: %q", got)
	}
	if late.Size != src.Size || late.Image != src.Image {
		t.Errorf("made from the snapshot: %+v", late)
	}
	// The snapshot goes; its clone stays.
	if err := eng.Snapshots().Delete(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Snapshots().Get(ctx, snap.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a deleted snapshot: %v", err)
	}
	if err := eng.Snapshots().Delete(ctx, snap.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a second delete: %v", err)
	}
	if _, err := eng.Exec(ctx, late.ID, sandbox.ExecRequest{Cmd: "true"}); err != nil {
		t.Errorf("the clone after its snapshot's delete: %v", err)
	}
	eng.Close()

	// Its key is gone from the secret store, and its files from the disk.
	db, err := store.OpenSQLite(ctx, filepath.Join(opts.DataDir, "harebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	master, err := secrets.NewSealed(db, filepath.Join(opts.DataDir, "master.key"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.DataKey(ctx, master, "snapshot/"+snap.ID); !errors.Is(err, secrets.ErrNotFound) {
		t.Errorf("the deleted snapshot's key: %v", err)
	}
	db.Close()
	if ents, _ := os.ReadDir(filepath.Join(opts.DataDir, "snapshots")); len(ents) != 0 {
		t.Errorf("snapshot files left: %v", ents)
	}
	eng, err = harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
}

// TestHibernate: a hibernated sandbox holds no machine and no host
// capacity, refuses what needs one, survives an engine restart with every
// machine gone, and resumes with its files; a delete takes its hibernation
// files; snapshots:false refuses it.
func TestHibernate(t *testing.T) {
	ctx := context.Background()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { eng.Close() }()
	box, err := eng.Create(ctx, sandbox.CreateRequest{Name: "sleepy"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.WriteFile(ctx, box.ID, "/tmp/state", strings.NewReader("kept"), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := eng.Hibernate(ctx, box.ID)
	if err != nil {
		t.Fatal(err)
	}
	if s.State != sandbox.StateHibernated {
		t.Fatalf("hibernated: %+v", s)
	}
	if _, ok := hv.Machine(box.ID); ok {
		t.Error("a hibernated sandbox's machine still runs")
	}
	if st, err := eng.Stats(ctx); err != nil || st.Reserved.MemoryMB != 0 || st.Sandboxes[sandbox.StateHibernated] != 1 {
		t.Errorf("stats while hibernated: %+v, %v", st, err)
	}
	for name, f := range map[string]func() error{
		"exec":      func() error { _, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "true"}); return err },
		"pause":     func() error { _, err := eng.Pause(ctx, box.ID); return err },
		"hibernate": func() error { _, err := eng.Hibernate(ctx, box.ID); return err },
		"fork":      func() error { _, err := eng.Snapshots().Fork(ctx, box.ID, sandbox.ForkRequest{}); return err },
	} {
		if err := f(); !errors.Is(err, sandbox.ErrState) {
			t.Errorf("%s of a hibernated sandbox: %v, want ErrState", name, err)
		}
	}
	if _, err := eng.Create(ctx, sandbox.CreateRequest{Name: "sleepy"}); !errors.Is(err, sandbox.ErrExists) {
		t.Errorf("a hibernated sandbox's name was free: %v", err)
	}

	// The engine restarts with no machine left at all.
	eng.Close()
	hv.Close()
	hv = memhv.New(memhv.Options{})
	opts.Hypervisor = hv
	if eng, err = harebox.New(ctx, opts); err != nil {
		t.Fatal(err)
	}
	if s, err := eng.Get(ctx, box.ID); err != nil || s.State != sandbox.StateHibernated {
		t.Fatalf("after a restart: %+v, %v", s, err)
	}
	s, err = eng.Resume(ctx, box.ID)
	if err != nil {
		t.Fatal(err)
	}
	if s.State != sandbox.StateRunning || s.Name != "sleepy" {
		t.Fatalf("resumed: %+v", s)
	}
	if got := readString(t, eng, box.ID, "/tmp/state"); got != "kept" {
		t.Errorf("after the resume: %q", got)
	}
	if ents, _ := os.ReadDir(filepath.Join(opts.DataDir, "hibernated")); len(ents) != 0 {
		t.Errorf("a resume left hibernation files: %v", ents)
	}
	// Hibernated again, then deleted: nothing is left.
	if _, err := eng.Hibernate(ctx, box.ID); err != nil {
		t.Fatal(err)
	}
	if err := eng.Delete(ctx, box.ID); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(opts.DataDir, "hibernated")); len(ents) != 0 {
		t.Errorf("a delete left hibernation files: %v", ents)
	}
	off := false
	ns, err := eng.Create(ctx, sandbox.CreateRequest{Snapshots: &off})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Hibernate(ctx, ns.ID); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("hibernate with snapshots off: %v", err)
	}
}

// TestGoldenSnapshots: with GoldenSnapshots, the first create boots and
// makes a golden snapshot in the background; later creates restore from
// it, each its own sandbox (none of another's files, its own env); the
// golden snapshots outlive Close, and the next start's first create
// restores from one; one that does not restore is made again while the
// create boots.
func TestGoldenSnapshots(t *testing.T) {
	ctx := context.Background()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	opts.GoldenSnapshots = true
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { eng.Close() }()
	first, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if first.Served != "boot" {
		t.Fatalf("the first create was served by %q", first.Served)
	}
	if _, err := eng.WriteFile(ctx, first.ID, "/tmp/mine", strings.NewReader("first's"), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *sandbox.Sandbox
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		s, err := eng.Create(ctx, sandbox.CreateRequest{Env: map[string]string{"WHO": "second"}})
		if err != nil {
			t.Fatal(err)
		}
		if s.Served == "snapshot" {
			got = s
			break
		}
		eng.Delete(ctx, s.ID)
		if time.Now().After(deadline) {
			t.Fatal("no create was served from a golden snapshot")
		}
	}
	if got.ID == first.ID || got.State != sandbox.StateRunning {
		t.Fatalf("served from the golden snapshot: %+v", got)
	}
	if p := got.CreatePhases; p["restore"] <= 0 || p["launch"] != 0 || first.CreatePhases["launch"] <= 0 {
		t.Errorf("steps: restored %v, booted %v", p, first.CreatePhases)
	}
	if _, err := eng.ReadFile(ctx, got.ID, "/tmp/mine", io.Discard); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("another sandbox's file in a golden clone: %v", err)
	}
	if r, err := eng.Exec(ctx, got.ID, sandbox.ExecRequest{Cmd: "printenv WHO"}); err != nil || r.Stdout != "second\n" {
		t.Errorf("a golden clone's own env: %+v %v", r, err)
	}
	// The image's list entry says which sizes have a golden snapshot.
	if g := warmOf(t, eng).Golden; len(g) != 1 || g[0].State != sandbox.GoldenReady || g[0].Resources != first.Size {
		t.Errorf("the image's golden snapshots: %+v, want one ready at %+v", g, first.Size)
	}
	// Another size has none yet: it boots.
	other, err := eng.Create(ctx, sandbox.CreateRequest{Size: sandbox.Size{Preset: "medium"}})
	if err != nil || other.Served != "boot" {
		t.Fatalf("another size: %+v %v", other, err)
	}
	if g := warmOf(t, eng).Golden; len(g) != 2 || g[1].Resources != other.Size || g[1].State == sandbox.GoldenFailed {
		t.Errorf("the image's golden snapshots after a medium create: %+v", g)
	}
	if ents, _ := os.ReadDir(filepath.Join(opts.DataDir, "golden")); len(ents) == 0 {
		t.Error("no golden files while the engine runs")
	}
	eng.Close()
	if eng, err = harebox.New(ctx, opts); err != nil {
		t.Fatal(err)
	}
	again, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil || again.Served != "snapshot" {
		t.Fatalf("the first create after a restart: %+v %v", again, err)
	}
	// Its files gone (a backend that no longer restores it would do
	// the same): the create boots, and another is made.
	snaps, _ := filepath.Glob(filepath.Join(opts.DataDir, "golden", "*", "snap"))
	for _, d := range snaps {
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
	}
	booted, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil || booted.Served != "boot" || booted.CreatePhases["launch"] <= 0 {
		t.Fatalf("a create whose golden snapshot does not restore: %+v %v", booted, err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		s, err := eng.Create(ctx, sandbox.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Served == "snapshot" {
			break
		}
		eng.Delete(ctx, s.ID)
		if time.Now().After(deadline) {
			t.Fatal("no golden snapshot made again")
		}
	}
}

// TestPool: the pool fills up to its size without charging anyone; a
// create of its image and size claims a member (a new sandbox with its own
// env, admitted and charged from then on) and the pool refills; Close
// stops the idle members and leaves the claimed sandbox running.
func TestPool(t *testing.T) {
	ctx := context.Background()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	opts.Pool = map[string]int{"default:small": 2}
	// Room for the pool and one small sandbox: 3 vCPUs.
	opts.Capacity = harebox.Capacity{VCPUs: 3, MemoryMB: 8192, DiskGB: 100}
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { eng.Close() }()
	poolOf := func() int {
		st, err := eng.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.Pool
	}
	waitPool := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); poolOf() != n; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the pool holds %d, want %d", poolOf(), n)
			}
		}
	}
	// The first golden boot is started by the pool itself.
	waitPool(2)
	if w := warmOf(t, eng); w.PoolIdle != 2 || len(w.Golden) != 1 || w.Golden[0].State != sandbox.GoldenReady {
		t.Errorf("the image's warm state: pool %d, golden %+v", w.PoolIdle, w.Golden)
	}
	b := newBudget(t, eng, ctx, budget.CreateRequest{Scope: store.BudgetScope{Kind: budget.ScopeAccount}, Limit: 1000 * dollar, Action: budget.Notify})
	if got, _ := eng.Budgets().Get(ctx, b.ID); got.Reserved != 0 {
		t.Errorf("idle pool members are charged: %s reserved", got.Reserved)
	}
	claimed := time.Now()
	s, err := eng.Create(ctx, sandbox.CreateRequest{Name: "warm", Env: map[string]string{"WHO": "claimer"}, Labels: map[string]string{"team": "blue"}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Served != "pool" || s.State != sandbox.StateRunning || s.Name != "warm" || s.Labels["team"] != "blue" {
		t.Fatalf("claimed: %+v", s)
	}
	// The refill waits for a second without claims (the claimed
	// sandbox's first commands come before restores).
	for ; time.Since(claimed) < 800*time.Millisecond; time.Sleep(20 * time.Millisecond) {
		if n := poolOf(); n != 1 {
			t.Fatalf("the pool holds %d %v after a claim", n, time.Since(claimed))
		}
	}
	// (A member got its own identity when the pool restored it: a claim
	// off the mesh does not give it again.)
	if p := s.CreatePhases; p["claim"] <= 0 || p["total"] < p["claim"] || p["launch"] != 0 {
		t.Errorf("a claim's steps: %v", p)
	} else if _, again := p["identity"]; again {
		t.Errorf("a claim gave its member an identity again: %v", p)
	}
	if r, err := eng.Exec(ctx, s.ID, sandbox.ExecRequest{Cmd: "printenv WHO"}); err != nil || r.Stdout != "claimer\n" {
		t.Errorf("the claimed sandbox's env: %+v %v", r, err)
	}
	if got, _ := eng.Budgets().Get(ctx, b.ID); got.Reserved == 0 {
		t.Error("a claimed sandbox is not charged")
	}
	waitPool(2) // refilled
	// Another size is not in the pool: it boots, and the idle members
	// make room for it (2 vCPUs: both go).
	if o, err := eng.Create(ctx, sandbox.CreateRequest{Size: sandbox.Size{Preset: "medium"}}); err != nil || o.Served == "pool" {
		t.Errorf("another size on a host the pool fills: %+v %v", o, err)
	}
	if n := poolOf(); n != 0 {
		t.Errorf("the pool holds %d on a full host", n)
	}
	eng.Close()
	ents, _ := os.ReadDir(filepath.Join(opts.DataDir, "m"))
	if len(ents) != 2 { // the claimed one and the medium one
		t.Errorf("machine directories after Close: %d, want the 2 sandboxes'", len(ents))
	}
	if eng, err = harebox.New(ctx, opts); err != nil {
		t.Fatal(err)
	}
	if got, err := eng.Get(ctx, s.ID); err != nil || got.State != sandbox.StateRunning {
		t.Errorf("the claimed sandbox after a restart: %+v %v", got, err)
	}
}

// warmOf is the default image's entry in the engine's image list.
func warmOf(t *testing.T, eng *harebox.Engine) sandbox.Image {
	t.Helper()
	l, err := eng.Images().List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range l {
		if img.Name == sandbox.DefaultImage {
			return img
		}
	}
	t.Fatalf("no %s image in %+v", sandbox.DefaultImage, l)
	return sandbox.Image{}
}

// TestGoldenSharedMemory: with GoldenSharedMemory, creates restored from
// a golden snapshot and warm-pool members ask the backend to share the
// snapshot's memory; without it (the default) none does, and a boot never.
func TestGoldenSharedMemory(t *testing.T) {
	ctx := context.Background()
	for _, shared := range []bool{false, true} {
		eng, hv := memhvEngine(t, func(o *harebox.Options) {
			o.GoldenSnapshots, o.GoldenSharedMemory = true, shared
			o.Pool = map[string]int{"default:medium": 1}
			o.Capacity = harebox.Capacity{VCPUs: 64, MemoryMB: 1 << 17, DiskGB: 1000}
		})
		asked := func(id string) bool {
			spec, ok := hv.Spec(id)
			if !ok {
				t.Fatalf("no machine %s", id)
			}
			return spec.SharedMemory
		}
		first, err := eng.Create(ctx, sandbox.CreateRequest{})
		if err != nil || first.Served != "boot" || asked(first.ID) {
			t.Fatalf("shared %v: the first create: %+v %v (shared: %v)", shared, first, err, err == nil && asked(first.ID))
		}
		// (Creates until one is served so: the golden snapshot and the
		// pool are made in the background.)
		servedBy := func(req sandbox.CreateRequest, served string) *sandbox.Sandbox {
			t.Helper()
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				s, err := eng.Create(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				if s.Served == served {
					return s
				}
				eng.Delete(ctx, s.ID)
				if time.Now().After(deadline) {
					t.Fatalf("no create was served by %s", served)
				}
			}
		}
		if s := servedBy(sandbox.CreateRequest{}, "snapshot"); asked(s.ID) != shared {
			t.Errorf("shared %v: a golden restore asked for shared memory: %v", shared, asked(s.ID))
		}
		if s := servedBy(sandbox.CreateRequest{Size: sandbox.Size{Preset: "medium"}}, "pool"); asked(s.ID) != shared {
			t.Errorf("shared %v: a pool member asked for shared memory: %v", shared, asked(s.ID))
		}
	}
}
