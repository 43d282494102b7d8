package memhv_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/hypervisortest"
	"github.com/harebox/harebox/hypervisor/memhv"
)

func TestConformance(t *testing.T) {
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	img := memhv.Image(t.TempDir())
	hypervisortest.Run(t, hypervisortest.Harness{
		// One value stands for the restarted engine too: memhv re-adopts
		// only its own machines.
		New: func(*testing.T) hypervisor.Hypervisor { return hv },
		Spec: func(*testing.T) hypervisor.Spec {
			return hypervisor.Spec{VCPUs: 1, MemoryMB: 128, Kernel: img.Kernel, Initrd: img.Initrd, Cmdline: img.Cmdline}
		},
		BootTimeout: 5 * time.Second,
		FakeGuest:   true,
	})
}

// shortDir is a temporary directory short enough for socket paths.
func shortDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "memhv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func spec(t *testing.T, dir, id string) hypervisor.Spec {
	img := memhv.Image(dir)
	return hypervisor.Spec{ID: id, VCPUs: 1, MemoryMB: 128, Kernel: img.Kernel, Initrd: img.Initrd, StateDir: filepath.Join(dir, id)}
}

// boot launches a machine and connects to its agent.
func boot(t *testing.T, hv *memhv.Hypervisor, dir, id string) (hypervisor.Machine, *agentclient.Client) {
	t.Helper()
	ctx := context.Background()
	m, err := hv.Launch(ctx, spec(t, dir, id))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Kill(ctx); m.Cleanup(ctx) })
	return m, dial(t, m)
}

func dial(t *testing.T, m hypervisor.Machine) *agentclient.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, h, err := agentclient.DialReady(ctx, m.AgentEndpoint(), agentclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if h.Mode != "fake" {
		t.Errorf("health mode %q, want fake", h.Mode)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestExec(t *testing.T) {
	hv := memhv.New(memhv.Options{})
	dir := shortDir(t)
	_, c := boot(t, hv, dir, "exec")
	ctx := context.Background()
	if _, err := c.WriteFile(ctx, "/home/user/f", strings.NewReader("content"), agentclient.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		req            agentclient.ExecRequest
		stdout, stderr string
		code           int
	}{
		{req: agentclient.ExecRequest{Shell: "echo  hi   there"}, stdout: "hi there\n"},
		{req: agentclient.ExecRequest{Argv: []string{"echo", "a  b"}}, stdout: "a  b\n"},
		{req: agentclient.ExecRequest{Shell: "cat /home/user/f"}, stdout: "content"},
		{req: agentclient.ExecRequest{Shell: "cat f", Cwd: "/home/user"}, stdout: "content"},
		{req: agentclient.ExecRequest{Shell: "cat f", User: "root"}, stderr: "cat: /root/f: No such file or directory\n", code: 1},
		{req: agentclient.ExecRequest{Shell: "true"}},
		{req: agentclient.ExecRequest{Shell: "false"}, code: 1},
		{req: agentclient.ExecRequest{Shell: "exit 42; echo unreached"}, code: 42},
		{req: agentclient.ExecRequest{Shell: "echo out; echo err >&2\nfalse"}, stdout: "out\n", stderr: "err\n", code: 1},
		{req: agentclient.ExecRequest{Shell: "python3 -c 1"}, stderr: "fake agent: command not found: python3\n", code: 127},
		{req: agentclient.ExecRequest{Shell: "sleep 0.01"}},
		{req: agentclient.ExecRequest{Shell: "sleep x"}, stderr: "sleep: invalid time interval\n", code: 1},
	} {
		r, err := c.Exec(ctx, tc.req, nil)
		if err != nil {
			t.Fatalf("%+v: %v", tc.req, err)
		}
		if string(r.Stdout) != tc.stdout || string(r.Stderr) != tc.stderr || r.ExitCode != tc.code || r.Error != "" {
			t.Errorf("%+v: got stdout %q stderr %q code %d error %q", tc.req, r.Stdout, r.Stderr, r.ExitCode, r.Error)
		}
	}

	r, err := c.Exec(ctx, agentclient.ExecRequest{Shell: "true", User: "nobody"}, nil)
	if err != nil || r.ExitCode != 127 || r.Error == "" {
		t.Errorf("unknown user: %+v, %v", r, err)
	}
	big := bytes.Repeat([]byte("x"), 200<<10)
	if _, err := c.WriteFile(ctx, "/tmp/big", bytes.NewReader(big), agentclient.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if r, err := c.Exec(ctx, agentclient.ExecRequest{Argv: []string{"cat", "/tmp/big"}}, nil); err != nil || !bytes.Equal(r.Stdout, big) {
		t.Errorf("cat of 200 KiB: %d bytes, %v", len(r.Stdout), err)
	}

	start := time.Now()
	r, err = c.Exec(ctx, agentclient.ExecRequest{Shell: "sleep 30", Timeout: 50 * time.Millisecond}, nil)
	if err != nil || !r.TimedOut || r.ExitCode != -1 || r.Signal != 9 || time.Since(start) > 5*time.Second {
		t.Errorf("sleep past its timeout: %+v, %v after %v", r, err, time.Since(start))
	}

	sigs := make(chan int, 1)
	sigs <- 15
	st, err := c.ExecStream(ctx, agentclient.ExecRequest{Shell: "sleep 30"}, agentclient.ExecIO{Signals: sigs})
	if err != nil || st.Signal != 15 || st.ExitCode != -1 {
		t.Errorf("signalled sleep: %+v, %v", st, err)
	}

	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.Exec(cctx, agentclient.ExecRequest{Shell: "sleep 30"}, nil); agentclient.Code(err) != codes.DeadlineExceeded {
		t.Errorf("sleep past the caller's deadline: %v", err)
	}
	if _, err := c.Exec(ctx, agentclient.ExecRequest{Shell: "true", Cwd: "tmp"}, nil); agentclient.Code(err) != codes.InvalidArgument {
		t.Errorf("relative cwd: %v", err)
	}
}

func TestFiles(t *testing.T) {
	hv := memhv.New(memhv.Options{})
	dir := shortDir(t)
	_, c := boot(t, hv, dir, "files")
	ctx := context.Background()
	write := func(p, s string, o agentclient.WriteOptions) error {
		_, err := c.WriteFile(ctx, p, strings.NewReader(s), o)
		return err
	}
	code := agentclient.Code
	if err := write("/a/b/c", "x", agentclient.WriteOptions{MakeParents: true, Mode: 0o600, Owner: "root"}); err != nil {
		t.Fatal(err)
	}
	if err := write("/a/b/c", "y", agentclient.WriteOptions{Append: true}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := c.ReadFile(ctx, "/a/b/c", &buf, 1, 1); err != nil || buf.String() != "y" {
		t.Errorf("read at offset 1: %q, %v", buf.String(), err)
	}
	fi, err := c.Stat(ctx, "/a/b/c")
	if err != nil || fi.Size != 2 || fi.Mode != 0o600 || fi.UID != 0 || fi.Type != "file" {
		t.Errorf("stat after append: %+v, %v", fi, err)
	}
	fi, err = c.Stat(ctx, "/a/b")
	if err != nil || fi.Type != "dir" || fi.UID != 0 {
		t.Errorf("stat of a made parent: %+v, %v", fi, err)
	}
	if err := c.Chmod(ctx, "/a/b/c", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.Chown(ctx, "/a/b/c", "user:root"); err != nil {
		t.Fatal(err)
	}
	if fi, _ := c.Stat(ctx, "/a/b/c"); fi.Mode != 0o755 || fi.UID != 1000 || fi.GID != 0 {
		t.Errorf("after chmod and chown: %+v", fi)
	}
	if _, err := c.Mkdir(ctx, "/a/b/d/e", 0, ""); err != nil {
		t.Fatal(err)
	}
	list, truncated, err := c.ListDir(ctx, "/a/b", 0)
	if err != nil || truncated || len(list) != 2 || list[0].Name != "c" || list[1].Name != "d" {
		t.Errorf("list: %+v %v %v", list, truncated, err)
	}
	if list, truncated, _ := c.ListDir(ctx, "/a/b", 1); len(list) != 1 || !truncated {
		t.Errorf("list of 1: %+v, truncated %v", list, truncated)
	}

	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"relative path", write("tmp/x", "", agentclient.WriteOptions{}), codes.InvalidArgument},
		{"unclean path", write("/tmp/../x", "", agentclient.WriteOptions{}), codes.InvalidArgument},
		{"missing parent", write("/no/x", "", agentclient.WriteOptions{}), codes.NotFound},
		{"parent is a file", write("/a/b/c/x", "", agentclient.WriteOptions{}), codes.FailedPrecondition},
		{"write over a directory", write("/a/b", "", agentclient.WriteOptions{}), codes.FailedPrecondition},
		{"unknown owner", write("/tmp/x", "", agentclient.WriteOptions{Owner: "nobody"}), codes.InvalidArgument},
		{"read missing", func() error { _, err := c.ReadFile(ctx, "/nope", io.Discard, 0, 0); return err }(), codes.NotFound},
		{"read directory", func() error { _, err := c.ReadFile(ctx, "/a", io.Discard, 0, 0); return err }(), codes.FailedPrecondition},
		{"stat missing", func() error { _, err := c.Stat(ctx, "/nope"); return err }(), codes.NotFound},
		{"stat relative", func() error { _, err := c.Stat(ctx, "nope"); return err }(), codes.InvalidArgument},
		{"list a file", func() error { _, _, err := c.ListDir(ctx, "/a/b/c", 0); return err }(), codes.FailedPrecondition},
		{"mkdir over a file", func() error { _, err := c.Mkdir(ctx, "/a/b/c", 0, ""); return err }(), codes.AlreadyExists},
		{"mkdir under a file", func() error { _, err := c.Mkdir(ctx, "/a/b/c/d", 0, ""); return err }(), codes.FailedPrecondition},
		{"remove non-empty", c.Remove(ctx, "/a", false), codes.FailedPrecondition},
		{"remove root", c.Remove(ctx, "/", true), codes.InvalidArgument},
		{"remove missing", c.Remove(ctx, "/nope", false), codes.NotFound},
		{"chmod bad mode", c.Chmod(ctx, "/a", 0o10000), codes.InvalidArgument},
		{"chmod missing", c.Chmod(ctx, "/nope", 0o644), codes.NotFound},
		{"chown empty", c.Chown(ctx, "/a", ""), codes.InvalidArgument},
	} {
		if got := code(tc.err); got != tc.want {
			t.Errorf("%s: got %v (%v), want %v", tc.name, got, tc.err, tc.want)
		}
	}
	if err := c.Remove(ctx, "/a", true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(ctx, "/a/b/c"); code(err) != codes.NotFound {
		t.Errorf("after recursive remove: %v", err)
	}
}

func TestPauseFreezesTheAgent(t *testing.T) {
	hv := memhv.New(memhv.Options{})
	dir := shortDir(t)
	m, c := boot(t, hv, dir, "pause")
	ctx := context.Background()
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := c.Health(short)
	cancel()
	if agentclient.Code(err) != codes.DeadlineExceeded {
		t.Errorf("health while paused: %v, want a deadline error", err)
	}
	// A call made while paused is answered after Resume.
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, agentclient.ExecRequest{Shell: "echo late"}, nil)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("exec answered while paused: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Killing a paused machine fails the calls it holds.
	m.Pause(ctx)
	go func() {
		_, err := c.Health(ctx)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	m.Kill(ctx)
	if err := <-done; err == nil {
		t.Error("health answered by a killed machine")
	}
	if err := m.Resume(ctx); !errors.Is(err, hypervisor.ErrState) {
		t.Errorf("resume after kill: %v, want ErrState", err)
	}
}

func TestFaultsAndCounters(t *testing.T) {
	hv := memhv.New(memhv.Options{LaunchDelay: 20 * time.Millisecond})
	dir := shortDir(t)
	ctx := context.Background()
	if hv.Launched() != 0 {
		t.Fatal("launched before any launch")
	}
	boom := errors.New("boom")
	hv.FailNextLaunch(boom)
	if _, err := hv.Launch(ctx, spec(t, dir, "a")); !errors.Is(err, boom) {
		t.Errorf("injected failure: %v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	defer cancel()
	if _, err := hv.Launch(cctx, spec(t, dir, "a")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("launch past its deadline: %v", err)
	}
	start := time.Now()
	m, err := hv.Launch(ctx, spec(t, dir, "a"))
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 20*time.Millisecond {
		t.Errorf("launch took %v, less than the delay", d)
	}
	if _, err := hv.Launch(ctx, spec(t, dir, "a")); !errors.Is(err, hypervisor.ErrExists) {
		t.Errorf("second launch of one ID: %v, want ErrExists", err)
	}
	if n := hv.Launched(); n != 4 {
		t.Errorf("Launched() = %d, want 4", n)
	}
	if got, ok := hv.Machine("a"); !ok || got.ID() != "a" {
		t.Errorf("Machine(a) = %v, %v", got, ok)
	}
	if err := m.Cleanup(ctx); !errors.Is(err, hypervisor.ErrState) {
		t.Errorf("cleanup of a running machine: %v, want ErrState", err)
	}
	h := m.Handle()
	if _, err := hv.Attach(ctx, h); err != nil {
		t.Errorf("attach: %v", err)
	}
	if _, err := memhv.New(memhv.Options{}).Attach(ctx, h); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("attach in another instance: %v, want ErrNotFound", err)
	}
	hv.Close()
	if err := m.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := hv.Attach(ctx, h); !errors.Is(err, hypervisor.ErrNotFound) {
		t.Errorf("attach after stop: %v, want ErrNotFound", err)
	}
	if _, ok := hv.Machine("a"); ok {
		t.Error("a stopped machine is still listed")
	}
	if err := m.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); !os.IsNotExist(err) {
		t.Errorf("state dir after cleanup: %v", err)
	}
}

func TestSnapshotClonesDiverge(t *testing.T) {
	hv := memhv.New(memhv.Options{})
	dir := shortDir(t)
	m, c := boot(t, hv, dir, "orig")
	ctx := context.Background()
	write := func(c *agentclient.Client, s string) {
		t.Helper()
		if _, err := c.WriteFile(ctx, "/tmp/f", strings.NewReader(s), agentclient.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	read := func(c *agentclient.Client) string {
		t.Helper()
		r, err := c.Exec(ctx, agentclient.ExecRequest{Shell: "cat /tmp/f"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return string(r.Stdout)
	}
	write(c, "A")
	snap := filepath.Join(dir, "snap")
	if err := m.Snapshot(ctx, snap, nil); err != nil {
		t.Fatal(err)
	}
	if err := m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	cm, err := hv.Restore(ctx, snap, hypervisor.Spec{ID: "clone", StateDir: filepath.Join(dir, "clone")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cm.Kill(ctx); cm.Cleanup(ctx) })
	if cm.ID() != "clone" || cm.AgentEndpoint() == m.AgentEndpoint() {
		t.Fatalf("clone %s at %+v", cm.ID(), cm.AgentEndpoint())
	}
	cc := dial(t, cm)
	if got := read(cc); got != "A" {
		t.Fatalf("clone reads %q, want A", got)
	}
	write(cc, "B")
	write(c, "C")
	if got := read(cc); got != "B" {
		t.Errorf("clone reads %q, want B", got)
	}
	if got := read(c); got != "C" {
		t.Errorf("original reads %q, want C", got)
	}
	if _, err := hv.Restore(ctx, snap, hypervisor.Spec{ID: "net", StateDir: filepath.Join(dir, "net"), Network: &hypervisor.Network{Tap: "tap0", MAC: "02:00:00:00:00:01"}}); !errors.Is(err, hypervisor.ErrInvalid) {
		t.Errorf("restore with a network the snapshot lacks: %v, want ErrInvalid", err)
	}
}

func TestGuestShutdown(t *testing.T) {
	hv := memhv.New(memhv.Options{})
	dir := shortDir(t)
	m, c := boot(t, hv, dir, "down")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Shutdown(ctx, false); err != nil {
		t.Fatal(err)
	}
	if err := m.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if info, _ := m.Info(ctx); info.State != hypervisor.StateStopped {
		t.Errorf("state %s after the guest powered off", info.State)
	}
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Error("the agent session outlived its machine")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "down", "serial.log")); !strings.Contains(string(b), "powered off") {
		t.Errorf("serial log: %q", b)
	}
}

// Protocol 4's Rename, listing with a depth and Input, as the real agent
// answers them.
func TestProtocol4(t *testing.T) {
	hv := memhv.New(memhv.Options{})
	_, c := boot(t, hv, shortDir(t), "p4")
	ctx := context.Background()
	for _, p := range []string{"/t/a", "/t/d/b", "/t/d/e/c", "/u/x"} {
		if _, err := c.WriteFile(ctx, p, strings.NewReader("x"), agentclient.WriteOptions{MakeParents: true}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Rename(ctx, "/t/d", "/u"); agentclient.Code(err) != codes.FailedPrecondition {
		t.Errorf("a directory over a non-empty one: %v", err)
	}
	if fi, err := c.Rename(ctx, "/t/d", "/t/moved"); err != nil || fi.Type != "dir" {
		t.Fatalf("rename: %+v %v", fi, err)
	}
	l, trunc, err := c.ListTree(ctx, "/t", 2, 0)
	var got []string
	for _, f := range l {
		got = append(got, f.Path)
	}
	if want := "/t/a /t/moved /t/moved/b /t/moved/e"; err != nil || trunc || strings.Join(got, " ") != want {
		t.Errorf("depth 2 after the move: %q %v %v, want %q", got, trunc, err, want)
	}
	if _, err := c.Rename(ctx, "/t/nothing", "/t/x"); agentclient.Code(err) != codes.NotFound {
		t.Errorf("rename of nothing: %v", err)
	}
	if _, err := c.Start(ctx, "cat", agentclient.ExecRequest{Argv: []string{"cat"}, KeepStdin: true}, nil, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Input(ctx, "cat", []byte("in")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseInput(ctx, "cat"); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	st, err := c.Attach(ctx, "cat", [2]uint64{}, true, func(_ bool, _ uint64, b []byte) error { out.Write(b); return nil })
	if err != nil || st == nil || out.String() != "in" {
		t.Errorf("cat with input: %q %+v %v", out.String(), st, err)
	}
}
