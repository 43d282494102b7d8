package harebox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/api"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/testpg"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/volume"
)

// refuseFiles makes the hosts' internal endpoints refuse a move's files,
// refuseVolumes its volumes' files only.
var refuseFiles, refuseVolumes atomic.Bool

// movingHosts starts hosts a and b on one PostgreSQL store (the in-memory
// hypervisor stands for their VMs), each with its internal endpoint (the
// engine's Moves behind the deployment's mutual TLS, on loopback) and the
// same image build.
func movingHosts(t *testing.T) (a, b *engineHost) {
	t.Helper()
	a, b, _ = movingHostsRestart(t)
	return a, b
}

// movingHostsRestart is movingHosts, with restart, which stops a host
// where it stands (its engine left as it is, its store connection cut)
// and starts it again on its data directory.
func movingHostsRestart(t *testing.T) (a, b *engineHost, restart func(*engineHost)) {
	t.Helper()
	return movingHostsAt(t, nil)
}

// movingHostsAt is movingHostsRestart with the hosts' sites (by name; the
// default site where none is given).
func movingHostsAt(t *testing.T, sites map[string]sandbox.Site) (a, b *engineHost, restart func(*engineHost)) {
	t.Helper()
	dsn := testpg.ForTest(t)
	certs := t.TempDir()
	if _, err := cluster.MakeCA(certs); err != nil {
		t.Fatal(err)
	}
	// The same build on both hosts, at the same path, with its manifest.
	img := memhv.Image(t.TempDir())
	manifest, _ := json.Marshal(img)
	os.WriteFile(filepath.Join(img.Dir, images.ManifestFile), manifest, 0o644)

	type endpoint struct {
		srv *httptest.Server
		tls *cluster.TLS
		mu  sync.Mutex
		h   http.Handler // (the engine's Moves, once it runs)
	}
	eps := map[string]*endpoint{}
	for _, name := range []string{"a", "b"} {
		if err := cluster.IssueHost(certs, name, []string{"127.0.0.1"}); err != nil {
			t.Fatal(err)
		}
		tc, err := cluster.LoadTLS(filepath.Join(certs, "ca.pem"), filepath.Join(certs, name+".pem"), filepath.Join(certs, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		ep := &endpoint{tls: tc, h: http.NotFoundHandler()}
		ep.srv = httptest.NewUnstartedServer(cluster.Internal(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ep.mu.Lock()
			h := ep.h
			ep.mu.Unlock()
			if r.Method == http.MethodPut && (refuseFiles.Load() || (refuseVolumes.Load() && strings.Contains(r.URL.Path, "/volumes/"))) {
				http.Error(w, "no", http.StatusServiceUnavailable)
				return
			}
			h.ServeHTTP(w, r)
		})))
		ep.srv.TLS = tc.Server
		ep.srv.StartTLS()
		t.Cleanup(ep.srv.Close)
		eps[name] = ep
	}
	a, b = &engineHost{}, &engineHost{}
	start, stop := hostsOn(t, dsn, 5*time.Second, func(o *harebox.Options) {
		name := o.Host.Name
		o.Host.Address, o.Host.TLS = eps[name].srv.URL, eps[name].tls
		if site, ok := sites[name]; ok {
			o.Site = site
		}
		o.Images = map[string]images.Image{sandbox.DefaultImage: img}
		if name == "b" {
			// The hosts share the master key (docs/several-hosts.md).
			k, err := os.ReadFile(filepath.Join(a.dir, "master.key"))
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(o.DataDir, "master.key"), k, 0o600)
		}
	})
	serve := func(name string, h *engineHost) {
		ep := eps[name]
		ep.mu.Lock()
		ep.h = h.eng.Moves()
		ep.mu.Unlock()
	}
	for _, h := range []*engineHost{a, b} {
		name := map[*engineHost]string{a: "a", b: "b"}[h]
		start(name, h)
		serve(name, h)
		t.Cleanup(func() { stop(h) })
	}
	restart = func(h *engineHost) {
		t.Helper()
		name := map[*engineHost]string{a: "a", b: "b"}[h]
		h.db.Close() // (the engine that died is left as it stood)
		start(name, h)
		serve(name, h)
	}
	return a, b, restart
}

// TestMove moves sandboxes between two hosts, running, paused and
// hibernated, and through the faults it can meet on the way: each time
// the sandbox is on exactly one host, as it was, with its files.
func TestMove(t *testing.T) {
	a, b := movingHosts(t)
	ctx := authz.WithPrincipal(context.Background(), authz.Operator)
	box, err := a.eng.Create(ctx, sandbox.CreateRequest{Name: "mover"})
	if err != nil {
		t.Fatal(err)
	}
	id := box.ID
	if _, err := a.eng.WriteFile(ctx, id, "/home/user/f", strings.NewReader("made on a"), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	read := func(h *engineHost) string {
		t.Helper()
		var buf bytes.Buffer
		if _, err := h.eng.ReadFile(ctx, id, "/home/user/f", &buf); err != nil {
			t.Fatalf("read on %s: %v", h.eng.Cluster().Name(), err)
		}
		return buf.String()
	}
	where := func(h *engineHost) (sandbox.State, string) {
		t.Helper()
		s, err := h.eng.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return s.State, s.Host
	}
	hibernated := func(h *engineHost) bool {
		_, err := os.Stat(filepath.Join(h.dir, "hibernated", id))
		return err == nil
	}

	// Refused before anything happens.
	key := authz.WithPrincipal(context.Background(), authz.Principal{AccountID: box.AccountID, KeyID: "k", Scope: authz.Scope{}})
	for _, c := range []struct {
		ctx  context.Context
		to   string
		want error
	}{
		{key, "b", sandbox.ErrForbidden},  // the operator only
		{ctx, "a", sandbox.ErrInvalid},    // this host
		{ctx, "zz", sandbox.ErrNotFound},  // no such host
		{ctx, "b\n", sandbox.ErrNotFound}, // (nor such a name)
	} {
		if _, err := a.eng.Move(c.ctx, id, c.to); !errors.Is(err, c.want) {
			t.Fatalf("move to %q: %v, want %v", c.to, err, c.want)
		}
	}
	if st, host := where(a); st != sandbox.StateRunning || host != "a" {
		t.Fatalf("after refusals: %s on %s", st, host)
	}

	// Running, a to b.
	res, err := a.eng.Move(ctx, id, "b")
	if err != nil {
		t.Fatal(err)
	}
	if res.From != "a" || res.To != "b" || res.Sandbox.Host != "b" || res.Sandbox.State != sandbox.StateRunning || res.PausedMS <= 0 {
		t.Fatalf("moved: %+v %+v", res, res.Sandbox)
	}
	if got := read(b); got != "made on a" {
		t.Fatalf("on b: %q", got)
	}
	if hibernated(a) || hibernated(b) {
		t.Fatal("hibernation files left after the move")
	}
	if _, err := os.Stat(filepath.Join(a.dir, "m", id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a keeps the sandbox's machine directory: %v", err)
	}
	// a acts on it no more: it is b's.
	if _, err := a.eng.Exec(ctx, id, sandbox.ExecRequest{Cmd: "true"}); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("a runs a command in it after the move: %v", err)
	}

	// Paused, b to a: paused there.
	if _, err := b.eng.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	if res, err := b.eng.Move(ctx, id, "a"); err != nil || res.Sandbox.State != sandbox.StatePaused {
		t.Fatalf("a paused one moved: %+v %v", res, err)
	}
	if st, host := where(b); st != sandbox.StatePaused || host != "a" {
		t.Fatalf("after the move back: %s on %s", st, host)
	}
	if _, err := a.eng.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}

	// b does not take the files: nothing moves, and it runs on a again.
	refuseFiles.Store(true)
	if _, err := a.eng.Move(ctx, id, "b"); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("a move b refuses the files of: %v", err)
	}
	refuseFiles.Store(false)
	if st, host := where(a); st != sandbox.StateRunning || host != "a" {
		t.Fatalf("after a move that failed: %s on %s", st, host)
	}
	if got := read(a); got != "made on a" {
		t.Fatalf("on a after a move that failed: %q", got)
	}

	// b has the files but cannot resume it: it stays hibernated there,
	// and a resume there brings it back.
	b.hv.FailNextLaunch(errors.New("no machine for you"))
	if _, err := a.eng.Move(ctx, id, "b"); err == nil || !strings.Contains(err.Error(), "did not resume there") {
		t.Fatalf("a move b cannot resume: %v", err)
	}
	if st, host := where(a); st != sandbox.StateHibernated || host != "b" || !hibernated(b) || hibernated(a) {
		t.Fatalf("after a move b did not resume: %s on %s", st, host)
	}
	if _, err := b.eng.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := read(b); got != "made on a" {
		t.Fatalf("on b after its resume: %q", got)
	}

	// Hibernated, b to a: hibernated there.
	if _, err := b.eng.Hibernate(ctx, id); err != nil {
		t.Fatal(err)
	}
	if res, err := b.eng.Move(ctx, id, "a"); err != nil || res.Sandbox.State != sandbox.StateHibernated || res.Sandbox.Host != "a" {
		t.Fatalf("a hibernated one moved: %+v %v", res, err)
	}
	if !hibernated(a) || hibernated(b) {
		t.Fatal("the hibernation files are not where the sandbox is")
	}
	if _, err := a.eng.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := read(a); got != "made on a" {
		t.Fatalf("on a after all: %q", got)
	}

	// Stopped, a to b: its disk goes, and it starts there on it.
	if _, err := a.eng.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if res, err := a.eng.Move(ctx, id, "b"); err != nil || res.Sandbox.State != sandbox.StateStopped || res.Sandbox.Host != "b" {
		t.Fatalf("a stopped one moved: %+v %v", res, err)
	}
	if _, err := os.Stat(filepath.Join(a.dir, "m", id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a keeps the stopped sandbox's machine directory: %v", err)
	}
	if _, err := b.eng.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	if got := read(b); got != "made on a" {
		t.Fatalf("on b after a stopped move and a start: %q", got)
	}
	if err := b.eng.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// withVolume makes a volume "data" on host h, and a sandbox there that
// holds it (read-write, at /mnt/data).
func withVolume(t *testing.T, ctx context.Context, h *engineHost) (*volume.View, *sandbox.Sandbox) {
	t.Helper()
	v, err := h.eng.Volumes().Create(ctx, "", volume.CreateRequest{Name: "data", SizeGB: 1})
	if err != nil {
		t.Fatal(err)
	}
	box, err := h.eng.Create(ctx, sandbox.CreateRequest{Volumes: []sandbox.VolumeMount{{Name: "data", Path: "/mnt/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	return v, box
}

// TestMoveVolumes: a sandbox's volumes move with it when it alone holds
// them: their files (as they were, byte for byte) go to the target and
// leave the source, their records name the target, their disk is
// reserved there and given back here. A volume another sandbox holds too keeps the sandbox where it is, and a
// move whose volume files are refused leaves everything on the source.
func TestMoveVolumes(t *testing.T) {
	needVolumeTools(t)
	a, b, restart := movingHostsRestart(t)
	ctx := authz.WithPrincipal(context.Background(), authz.Operator)
	v, box := withVolume(t, ctx, a)
	id := box.ID
	file := func(h *engineHost) string { return filepath.Join(h.dir, "volumes", v.ID+".qcow2") }
	orig, err := os.ReadFile(file(a))
	if err != nil {
		t.Fatal(err)
	}
	disk := func(h *engineHost) int {
		t.Helper()
		st, err := h.eng.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.Reserved.DiskGB
	}
	where := func(host string) {
		t.Helper()
		got, err := a.eng.Volumes().Get(ctx, "", "", "data")
		if err != nil || got.Host != host {
			t.Fatalf("the volume: %+v %v, want it on %s", got, err, host)
		}
		on, off := a, b
		if host == "b" {
			on, off = b, a
		}
		if f, err := os.ReadFile(file(on)); err != nil || !bytes.Equal(f, orig) {
			t.Fatalf("the volume's file on %s: %d bytes (was %d) %v", host, len(f), len(orig), err)
		}
		if ents, _ := os.ReadDir(filepath.Join(off.dir, "volumes")); len(ents) != 0 {
			t.Fatalf("left of the volume on the other host: %v", ents)
		}
	}
	aDisk, bDisk := disk(a), disk(b)

	// Refused: a volume files are refused of; nothing moves.
	refuseVolumes.Store(true)
	if _, err := a.eng.Move(ctx, id, "b"); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("a move whose volume is refused: %v", err)
	}
	refuseVolumes.Store(false)
	if s, err := a.eng.Get(ctx, id); err != nil || s.State != sandbox.StateRunning || s.Host != "a" {
		t.Fatalf("after a move whose volume was refused: %+v %v", s, err)
	}
	where("a")
	if _, err := os.Stat(filepath.Join(b.dir, "hibernated", id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("b keeps the files of a move that failed: %v", err)
	}

	// Moved with it, and back.
	res, err := a.eng.Move(ctx, id, "b")
	if err != nil || res.Sandbox.State != sandbox.StateRunning || res.Sandbox.Host != "b" {
		t.Fatalf("moved with its volume: %+v %v", res, err)
	}
	where("b")
	if got, want := disk(b), bDisk+box.Size.DiskGB+1; got != want {
		t.Errorf("b reserves %d GB of disk, want %d", got, want)
	}
	if got := disk(a); got != aDisk-box.Size.DiskGB-1 {
		t.Errorf("a reserves %d GB of disk after the move, want %d", got, aDisk-box.Size.DiskGB-1)
	}
	if _, err := a.eng.Volumes().Resize(ctx, "", "", "data", 2); !errors.Is(err, sandbox.ErrState) {
		t.Errorf("a volume in use resized after its move: %v", err)
	}
	if _, err := b.eng.Move(ctx, id, "a"); err != nil {
		t.Fatal(err)
	}
	where("a")
	if got := disk(a); got != aDisk {
		t.Errorf("a reserves %d GB of disk after the move back, want %d", got, aDisk)
	}
	// Files of a volume that lives on another host, which no move left
	// (a host started under a new name finds its volumes so): kept.
	if _, err := a.eng.Move(ctx, id, "b"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(file(a), orig, 0o600)
	restart(a)
	if _, err := os.Stat(file(a)); err != nil {
		t.Errorf("files of another host's volume that no move left went at a's start: %v", err)
	}
	os.Remove(file(a))
	if _, err := b.eng.Move(ctx, id, "a"); err != nil {
		t.Fatal(err)
	}
	where("a")

	// Another sandbox holds a volume too: neither moves.
	if _, err := a.eng.Volumes().Create(ctx, "", volume.CreateRequest{Name: "shared", SizeGB: 1}); err != nil {
		t.Fatal(err)
	}
	ro := []sandbox.VolumeMount{{Name: "shared", Path: "/mnt/shared", ReadOnly: true}}
	r1, err := a.eng.Create(ctx, sandbox.CreateRequest{Volumes: ro})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.eng.Create(ctx, sandbox.CreateRequest{Volumes: ro}); err != nil {
		t.Fatal(err)
	}
	_, err = a.eng.Move(ctx, r1.ID, "b")
	wantSaying(t, "a move of a sandbox whose volume another holds", err, sandbox.ErrState, "too")
	if s, err := a.eng.Get(ctx, r1.ID); err != nil || s.State != sandbox.StateRunning || s.Host != "a" {
		t.Fatalf("after a refused move: %+v %v", s, err)
	}
	if err := a.eng.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// TestDrain drains a host of its sandboxes: those that can move go to
// the other host, as they were (a running or paused one only if it has
// room there); one it has no room for stays, saying why; no new sandbox
// goes to the host until it is undrained.
func TestDrain(t *testing.T) {
	a, b := movingHosts(t)
	ctx := authz.WithPrincipal(context.Background(), authz.Operator)
	ids := map[sandbox.State]string{}
	for _, st := range []sandbox.State{sandbox.StateRunning, sandbox.StatePaused, sandbox.StateHibernated, sandbox.StateStopped} {
		box, err := a.eng.Create(ctx, sandbox.CreateRequest{Name: string(st)})
		if err != nil {
			t.Fatal(err)
		}
		switch st {
		case sandbox.StatePaused:
			_, err = a.eng.Pause(ctx, box.ID)
		case sandbox.StateHibernated:
			_, err = a.eng.Hibernate(ctx, box.ID)
		case sandbox.StateStopped:
			_, err = a.eng.Stop(ctx, box.ID)
		}
		if err != nil {
			t.Fatal(err)
		}
		ids[st] = box.ID
	}
	// b has room for one more running sandbox only (8 vCPUs, 7 taken): the
	// running one goes, the paused one stays; the hibernated and stopped
	// ones hold no capacity there, and go.
	filler, err := b.eng.Create(ctx, sandbox.CreateRequest{Size: sandbox.Size{VCPUs: 7, MemoryMB: 512}})
	if err != nil {
		t.Fatal(err)
	}
	key := authz.WithPrincipal(context.Background(), authz.Principal{AccountID: "acc", KeyID: "k"})
	if _, err := a.eng.Drain(key, "a"); !errors.Is(err, sandbox.ErrForbidden) {
		t.Fatalf("a key drains a host: %v", err)
	}
	if _, err := a.eng.Drain(ctx, "b"); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("a drains b: %v", err)
	}
	rep, err := a.eng.Drain(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Moved) != 3 || len(rep.Stayed) != 1 || rep.Stayed[0].ID != ids[sandbox.StatePaused] || !(strings.Contains(rep.Stayed[0].Error, "room") || strings.Contains(rep.Stayed[0].Error, "full")) {
		t.Fatalf("drain: %+v", rep)
	}
	for st, id := range ids {
		s, err := b.eng.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		want := "b"
		if st == sandbox.StatePaused {
			want = "a"
		}
		if s.State != st || s.Host != want {
			t.Fatalf("the %s sandbox after the drain: %s on %s", st, s.State, s.Host)
		}
	}
	// No new sandbox goes to a: placement picks b (with room again), and
	// a refuses one.
	if err := b.eng.Delete(ctx, filler.ID); err != nil {
		t.Fatal(err)
	}
	// (b's row says what it runs once it renewed after the delete.)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		h, err := a.eng.Cluster().Place(ctx, sandbox.Resources{VCPUs: 1, MemoryMB: 512, DiskGB: 1}, sandbox.Site{})
		if err == nil && h.Name == "b" {
			break
		}
		if err == nil || time.Now().After(deadline) {
			t.Fatalf("placement from a drained a: %+v %v", h, err)
		}
	}
	if _, err := a.eng.Create(ctx, sandbox.CreateRequest{}); !errors.Is(err, sandbox.ErrCapacity) || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("a create on a drained a: %v", err)
	}
	if hs, err := b.eng.Cluster().Hosts(ctx); err != nil || len(hs) != 2 || !hs[0].Draining || hs[1].Draining {
		t.Fatalf("the hosts as b sees them: %v", err)
	}
	if err := a.eng.Undrain(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	last, err := a.eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatalf("a create on a undrained: %v", err)
	}
	// a is stopping (hareboxd got SIGTERM): it starts no move, and a drain
	// moves nothing, saying why; its sandboxes stay, running.
	a.eng.Stopping()
	if _, err := a.eng.Move(ctx, last.ID, "b"); !errors.Is(err, sandbox.ErrUnavailable) || !strings.Contains(err.Error(), "shutting down") {
		t.Fatalf("a move from a stopping host: %v", err)
	}
	rep, err = a.eng.Drain(ctx, "a")
	if err != nil || len(rep.Moved) != 0 || len(rep.Stayed) == 0 || !strings.Contains(rep.Stayed[0].Error, "shutting down") {
		t.Fatalf("a drain of a stopping host: %+v %v", rep, err)
	}
	if s, err := a.eng.Get(ctx, last.ID); err != nil || s.State != sandbox.StateRunning || s.Host != "a" {
		t.Fatalf("after a drain of a stopping host: %+v %v", s, err)
	}
}

// TestMoveCrash: the source host dies during a move, before the target
// has the sandbox (it rolls the move back when it starts again: the
// sandbox runs there as it was) and after (the target takes it up on its
// own; the source, started again, removes what it had of it). A host's
// death is its engine stopped where it stands, its store connection cut
// (freeing its name), and a new engine on its data directory.
func TestMoveCrash(t *testing.T) {
	harebox.SetMoveTiming(0, 100*time.Millisecond)
	defer harebox.SetMoveTiming(30*time.Second, 10*time.Second)
	var crashAt atomic.Value
	crashAt.Store("")
	harebox.SetStepHook(func(step, _ string) {
		if step == crashAt.Load() {
			runtime.Goexit() // (nothing of the move runs after this)
		}
	})
	defer harebox.SetStepHook(nil)
	needVolumeTools(t)
	a, b, restart := movingHostsRestart(t)
	ctx := authz.WithPrincipal(context.Background(), authz.Operator)
	// It has a volume, whose files move with it.
	vol, box := withVolume(t, ctx, a)
	id := box.ID
	volumeOn := func(h *engineHost) bool {
		_, err := os.Stat(filepath.Join(h.dir, "volumes", vol.ID+".qcow2"))
		return err == nil
	}
	if _, err := a.eng.WriteFile(ctx, id, "/home/user/f", strings.NewReader("kept"), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	// A move from a to b, one of which (victim) dies at step.
	crashDuring := func(step string, victim *engineHost) {
		t.Helper()
		crashAt.Store(step)
		done := make(chan struct{})
		go func() { defer close(done); a.eng.Move(ctx, id, "b") }()
		<-done
		crashAt.Store("")
		restart(victim)
	}
	await := func(h *engineHost, host string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			s, err := h.eng.Get(ctx, id)
			if err == nil && s.State == sandbox.StateRunning && s.Host == host {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the sandbox: %+v %v, want running on %s", s, err, host)
			}
		}
		var buf bytes.Buffer
		if _, err := h.eng.ReadFile(ctx, id, "/home/user/f", &buf); err != nil || buf.String() != "kept" {
			t.Fatalf("its file on %s: %q %v", host, buf.String(), err)
		}
		if v, err := h.eng.Volumes().Get(ctx, "", "", "data"); err != nil || v.Host != host || !volumeOn(h) {
			t.Fatalf("its volume: %+v %v, want it on %s with its file there", v, err, host)
		}
	}
	// Dead once the move hibernated it, before its own mark (with its
	// target) was written: a rolls back, the sandbox runs on a.
	crashDuring("move-held", a)
	await(a, "a")
	// Dead while sending: a rolls back, the sandbox runs on a.
	crashDuring("move-sending", a)
	await(a, "a")
	// Dead once every file was sent (b has them all): a rolls back, and b
	// drops what it got, the volume's files too.
	crashDuring("move-sent", a)
	await(a, "a")
	if volumeOn(b) {
		t.Fatal("b keeps the volume's files of a move rolled back")
	}
	// Dead once handed over: b takes it up; a, started again, holds
	// nothing of it.
	crashDuring("move-handed", a)
	await(b, "b")
	if _, err := os.Stat(filepath.Join(a.dir, "hibernated", id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a keeps the moved sandbox's files: %v", err)
	}
	if volumeOn(a) {
		t.Fatal("a keeps the moved volume's files")
	}
	if _, err := b.eng.Move(ctx, id, "a"); err != nil {
		t.Fatalf("a move back: %v", err)
	}
	await(a, "a")
	// b dead as it took the sandbox up and began its resume: b, started
	// again, resumes it.
	crashDuring("move-waking", b)
	await(b, "b")
	if _, err := b.eng.Move(ctx, id, "a"); err != nil {
		t.Fatalf("a move back after all that: %v", err)
	}
	await(a, "a")
}

// TestMoveKeepsSite: a move keeps a sandbox within the site or country
// its create asked for, a drain places it within that (else within the
// draining host's site), and a sandbox moved reports the site it runs in.
func TestMoveKeepsSite(t *testing.T) {
	a, b, _ := movingHostsAt(t, map[string]sandbox.Site{"a": {Name: "fra", Country: "DE"}, "b": {Name: "ber", Country: "DE"}})
	ctx := authz.WithPrincipal(context.Background(), authz.Operator)
	create := func(req sandbox.CreateRequest) string {
		t.Helper()
		s, err := a.eng.Create(ctx, req)
		if err != nil || s.Host != "a" {
			t.Fatalf("create %+v: %+v %v", req, s, err)
		}
		return s.ID
	}
	inCountry, inSite, anywhere := create(sandbox.CreateRequest{Country: "DE"}), create(sandbox.CreateRequest{Site: "fra"}), create(sandbox.CreateRequest{})
	// Site fra asked: b (ber) is not it.
	if _, err := a.eng.Move(ctx, inSite, "b"); !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "site fra") {
		t.Fatalf("a move out of the site asked for: %v", err)
	}
	// Its fork asked for what it asked for, and stays there too.
	forks, err := a.eng.Snapshots().Fork(ctx, inSite, sandbox.ForkRequest{})
	if err != nil || len(forks) != 1 {
		t.Fatalf("fork: %v %v", forks, err)
	}
	if _, err := a.eng.Move(ctx, forks[0].ID, "b"); !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "site fra") {
		t.Fatalf("a fork's move out of the site its source asked for: %v", err)
	}
	if err := a.eng.Delete(ctx, forks[0].ID); err != nil {
		t.Fatal(err)
	}
	// A drain: the one that asked for the country goes to b, and says
	// so; the one that asked for site fra, and the one that asked for
	// nothing (created in site fra), have no other host there.
	rep, err := a.eng.Drain(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Moved) != 1 || rep.Moved[0].ID != inCountry || rep.Moved[0].To != "b" || len(rep.Stayed) != 2 {
		t.Fatalf("drain: %+v", rep)
	}
	for _, st := range rep.Stayed {
		if (st.ID != inSite && st.ID != anywhere) || !strings.Contains(st.Error, "no host of site fra") {
			t.Errorf("stayed: %+v", st)
		}
	}
	got, err := b.eng.Get(ctx, inCountry)
	if err != nil || got.Host != "b" || got.Site != (sandbox.Site{Name: "ber", Country: "DE"}) {
		t.Fatalf("the sandbox moved: %+v %v, want on b in site ber (DE)", got, err)
	}
	// Moved back by hand, it reports a's site again.
	if err := a.eng.Undrain(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if res, err := b.eng.Move(ctx, inCountry, "a"); err != nil || res.Sandbox.Site != (sandbox.Site{Name: "fra", Country: "DE"}) {
		t.Fatalf("the move back: %+v %v", res, err)
	}
}

// TestMoveKeepsCountry: a sandbox created to run in a country does not
// move to a host in another one (refused through the REST API too, with
// 400 naming both), and one created to run anywhere does, and reports its
// new host's site.
func TestMoveKeepsCountry(t *testing.T) {
	a, _, _ := movingHostsAt(t, map[string]sandbox.Site{"a": {Name: "fra", Country: "DE"}, "b": {Name: "ams", Country: "NL"}})
	ctx := authz.WithPrincipal(context.Background(), authz.Operator)
	inCountry, err := a.eng.Create(ctx, sandbox.CreateRequest{Country: "DE"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.eng.Move(ctx, inCountry.ID, "b"); !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "country DE") || !strings.Contains(err.Error(), "site ams (NL)") {
		t.Fatalf("a move out of the country asked for: %v", err)
	}

	keyDir := t.TempDir()
	key, keyPath, _, err := api.LoadOrCreateRootKey(keyDir)
	if err != nil {
		t.Fatal(err)
	}
	rootKey, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Options{Engine: a.eng, Auth: key})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	req, _ := http.NewRequest("POST", hs.URL+"/v1/sandboxes/"+inCountry.ID+"/move", strings.NewReader(`{"to": "b"}`))
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(rootKey)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "country DE") || !strings.Contains(string(body), "site ams (NL)") {
		t.Fatalf("the move through the REST API: %d %s", resp.StatusCode, body)
	}
	if got, err := a.eng.Get(ctx, inCountry.ID); err != nil || got.Host != "a" || got.State != sandbox.StateRunning {
		t.Fatalf("after the refused moves: %+v %v, want running on a", got, err)
	}

	anywhere, err := a.eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := a.eng.Move(ctx, anywhere.ID, "b")
	if err != nil || res.Sandbox.Host != "b" || res.Sandbox.Site != (sandbox.Site{Name: "ams", Country: "NL"}) {
		t.Fatalf("a move of one that asked for nothing: %+v %v, want on b in site ams (NL)", res, err)
	}
}
