package guest

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/agent/transport"
)

// env is one agent served in-process over a real yamux session on a
// socketpair, with a fake /etc and hooks that record instead of touching
// the host.
type env struct {
	root   string // fake filesystem root holding etc/
	home   string // the default user's home
	client agentpb.AgentClient
	srv    *Server

	mu        sync.Mutex
	hostnames []string
	networks  []*NetworkConfig
	entropy   [][]byte
	clock     []time.Time
	powerOff  chan bool
}

func newEnv(t *testing.T) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the guest agent tests run as root (they switch users and chown)")
	}
	root, err := os.MkdirTemp("", "harebox-guest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	// Processes run as other users must be able to reach their home in here.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	e := &env{root: root, home: filepath.Join(root, "home/user"), powerOff: make(chan bool, 1)}
	mustMkdir(t, filepath.Join(root, "etc"))
	mustMkdir(t, e.home)
	if err := os.Chown(e.home, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, filepath.Join(root, "etc/passwd"), ""+
		"root:x:0:0:root:/root:/bin/sh\n"+
		"user:x:1000:1000::"+e.home+":/bin/sh\n"+
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
	writeTestFile(t, filepath.Join(root, "etc/group"), ""+
		"root:x:0:\nuser:x:1000:\nextra:x:2000:someone,user\nnogroup:x:65534:\n")

	srv := New(Options{
		Mode: "service",
		Root: root,
		Logf: t.Logf,
		SetHostname: func(n string) error {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.hostnames = append(e.hostnames, n)
			return nil
		},
		SetClock: func(tm time.Time) error {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.clock = append(e.clock, tm)
			return nil
		},
		AddEntropy: func(b []byte) error {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.entropy = append(e.entropy, b)
			return nil
		},
		PowerOff: func(reboot bool) error {
			e.powerOff <- reboot
			return nil
		},
		SetNetwork: func(_ context.Context, cfg *NetworkConfig) error {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.networks = append(e.networks, cfg)
			return nil
		},
	})
	e.srv = srv
	e.client = dialAgent(t, srv)
	return e
}

// dialAgent connects a real gRPC client to srv through transport over a
// socketpair, as the host does over virtio-serial.
func dialAgent(t *testing.T, srv agentpb.AgentServer) agentpb.AgentClient {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	guestConn := fileConn(t, fds[0])
	hostConn := fileConn(t, fds[1])

	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		ServeConn(ctx, guestConn, srv)
	}()
	sess, err := transport.Client(hostConn)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("passthrough:///agent",
		grpc.WithContextDialer(transport.Dialer(sess)),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMsgSize), grpc.MaxCallSendMsgSize(MaxMsgSize)),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		sess.Close()
		cancel()
		<-served
	})
	return agentpb.NewAgentClient(cc)
}

func fileConn(t *testing.T, fd int) net.Conn {
	t.Helper()
	f := os.NewFile(uintptr(fd), "socketpair")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustMkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func writeTestFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got error %v, want code %v", err, code)
	}
}

func TestHealth(t *testing.T) {
	e := newEnv(t)
	h, err := e.client.Health(testCtx(t), &agentpb.HealthRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var u unix.Utsname
	unix.Uname(&u)
	if h.Version != Version || h.Mode != "service" || h.Kernel != unix.ByteSliceToString(u.Release[:]) || h.UptimeSeconds < 0 {
		t.Fatalf("health = %+v", h)
	}
}

func TestModeFromEnv(t *testing.T) {
	t.Setenv(ModeEnv, "init")
	if m := New(Options{}).opts.Mode; m != "init" {
		t.Fatalf("mode = %q, want init", m)
	}
	t.Setenv(ModeEnv, "")
	if m := New(Options{}).opts.Mode; m != "service" {
		t.Fatalf("mode = %q, want service", m)
	}
}

func TestSyncTimeAndShutdown(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	want := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	if _, err := e.client.SyncTime(ctx, &agentpb.SyncTimeRequest{UnixNano: want.UnixNano()}); err != nil {
		t.Fatal(err)
	}
	_, err := e.client.SyncTime(ctx, &agentpb.SyncTimeRequest{})
	wantCode(t, err, codes.InvalidArgument)
	e.mu.Lock()
	if len(e.clock) != 1 || !e.clock[0].Equal(want) {
		t.Errorf("clock set to %v, want %v", e.clock, want)
	}
	e.mu.Unlock()

	if _, err := e.client.Shutdown(ctx, &agentpb.ShutdownRequest{Reboot: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case reboot := <-e.powerOff:
		if !reboot {
			t.Error("power off, want reboot")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("shutdown did not power off")
	}
}

func TestSetNetwork(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	for _, bad := range []string{
		"", // no network
		"harebox.ip=10.0.0.6 harebox.gw=10.0.0.5",    // no prefix
		"harebox.ip=10.0.0.6/30 harebox.gw=10.9.0.5", // gateway outside
		"harebox.ip=10.0.0.6/30 harebox.gw=10.0.0.5 harebox.mac=zz",
		"harebox.ip=10.0.0.6/30 harebox.gw=10.0.0.5 " + strings.Repeat("x", 1100),
	} {
		_, err := e.client.SetNetwork(ctx, &agentpb.SetNetworkRequest{Cmdline: bad})
		wantCode(t, err, codes.InvalidArgument)
	}
	if len(e.networks) != 0 {
		t.Fatalf("invalid requests reached the interface: %v", e.networks)
	}
	good := "harebox.ip=10.0.0.6/30 harebox.gw=10.0.0.5 harebox.dns=10.0.0.5 harebox.mac=02:00:0a:00:00:06"
	if _, err := e.client.SetNetwork(ctx, &agentpb.SetNetworkRequest{Cmdline: good}); err != nil {
		t.Fatal(err)
	}
	if len(e.networks) != 1 || e.networks[0].Addr.String() != "10.0.0.6/30" || e.networks[0].MAC.String() != "02:00:0a:00:00:06" {
		t.Fatalf("applied %+v", e.networks)
	}
}

func TestReseed(t *testing.T) {
	e := newEnv(t)
	ctx := testCtx(t)
	ent := make([]byte, 64)
	for i := range ent {
		ent[i] = byte(i)
	}
	id := strings.Repeat("0123456789abcdef", 2)

	bad := []*agentpb.ReseedRequest{
		{Entropy: ent[:31], MachineId: id},
		{Entropy: make([]byte, 513), MachineId: id},
		{Entropy: ent, MachineId: strings.ToUpper(id)},
		{Entropy: ent, MachineId: id[:31]},
		{Entropy: ent, MachineId: id, Hostname: "Bad_Host"},
		{Entropy: ent, MachineId: id, Hostname: strings.Repeat("a", 64)},
	}
	for _, req := range bad {
		_, err := e.client.Reseed(ctx, req)
		wantCode(t, err, codes.InvalidArgument)
	}
	if _, err := os.Stat(filepath.Join(e.root, "etc/machine-id")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("invalid reseed wrote machine-id: %v", err)
	}

	// /etc is created when the image has none.
	os.RemoveAll(filepath.Join(e.root, "etc"))
	resp, err := e.client.Reseed(ctx, &agentpb.ReseedRequest{Entropy: ent, MachineId: id, Hostname: "fork-1"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.MachineId != id {
		t.Errorf("machine id = %q", resp.MachineId)
	}
	b, err := os.ReadFile(filepath.Join(e.root, "etc/machine-id"))
	if err != nil || string(b) != id+"\n" {
		t.Fatalf("machine-id = %q, %v", b, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.entropy) != 1 || string(e.entropy[0]) != string(ent) {
		t.Errorf("entropy added = %v", e.entropy)
	}
	if len(e.hostnames) != 1 || e.hostnames[0] != "fork-1" {
		t.Errorf("hostnames = %v", e.hostnames)
	}
	left, _ := filepath.Glob(filepath.Join(e.root, "etc/.machine-id*"))
	if len(left) != 0 {
		t.Errorf("temp files left: %v", left)
	}
}

func TestUsers(t *testing.T) {
	e := newEnv(t)
	srv := New(Options{Root: e.root})
	a, err := srv.lookupUser("")
	if err != nil || a.UID != 1000 || a.GID != 1000 || a.Home != e.home {
		t.Fatalf("default user = %+v, %v", a, err)
	}
	if len(a.Groups) != 2 || a.Groups[1] != 2000 {
		t.Errorf("groups = %v, want [1000 2000]", a.Groups)
	}
	if a, err := srv.lookupUser("65534"); err != nil || a.Name != "nobody" || a.GID != 65534 {
		t.Errorf("65534 = %+v, %v", a, err)
	}
	if a, err := srv.lookupUser("4242"); err != nil || a.UID != 4242 || a.GID != 4242 || a.Home != "/" {
		t.Errorf("unknown uid = %+v, %v", a, err)
	}
	if _, err := srv.lookupUser("nosuch"); !errors.Is(err, errUnknownUser) {
		t.Errorf("nosuch: %v", err)
	}
	if u, g, err := srv.lookupOwner("nobody:user"); err != nil || u != 65534 || g != 1000 {
		t.Errorf("nobody:user = %d:%d, %v", u, g, err)
	}
	if _, _, err := srv.lookupOwner("user:nosuch"); !errors.Is(err, errUnknownGroup) {
		t.Errorf("user:nosuch: %v", err)
	}

	// An image without "user" runs commands as root.
	writeTestFile(t, filepath.Join(e.root, "etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")
	if a, err := srv.lookupUser(""); err != nil || a.UID != 0 || a.Name != "root" {
		t.Errorf("fallback = %+v, %v", a, err)
	}
	// Nor does it need a passwd at all.
	os.Remove(filepath.Join(e.root, "etc/passwd"))
	if a, err := srv.lookupUser(""); err != nil || a.UID != 0 || a.Home != "/root" {
		t.Errorf("no passwd = %+v, %v", a, err)
	}
}

func TestServeConnEndsWithSession(t *testing.T) {
	a, b := net.Pipe()
	done := make(chan error, 1)
	go func() { done <- ServeConn(context.Background(), a, New(Options{Mode: "service"})) }()
	b.Close() // the host went away
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("ServeConn did not return after the peer closed")
	}
}

func TestFindSerialPort(t *testing.T) {
	dir := t.TempDir()
	sys, dev := filepath.Join(dir, "sys"), filepath.Join(dir, "dev")
	for _, p := range []struct{ port, name string }{{"vport0p1", "org.other"}, {"vport1p2", "org.harebox.agent"}} {
		d := filepath.Join(sys, "class/virtio-ports", p.port)
		mustMkdir(t, d)
		writeTestFile(t, filepath.Join(d, "name"), p.name+"\n")
		writeTestFile(t, filepath.Join(d, "dev"), "244:2\n")
	}
	mustMkdir(t, dev)
	writeTestFile(t, filepath.Join(dev, "vport1p2"), "") // devtmpfs already made it
	opts := ServeOptions{SysDir: sys, DevDir: dev}
	got, err := FindSerialPort(opts, "org.harebox.agent")
	if err != nil || got != filepath.Join(dev, "vport1p2") {
		t.Fatalf("FindSerialPort = %q, %v", got, err)
	}
	if _, err := FindSerialPort(opts, "org.absent"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("absent port: %v", err)
	}
	// The udev symlink wins.
	mustMkdir(t, filepath.Join(dev, "virtio-ports"))
	if err := os.Symlink("../vport1p2", filepath.Join(dev, "virtio-ports/org.harebox.agent")); err != nil {
		t.Fatal(err)
	}
	if got, _ := FindSerialPort(opts, "org.harebox.agent"); got != filepath.Join(dev, "virtio-ports/org.harebox.agent") {
		t.Fatalf("with udev link = %q", got)
	}
	if _, _, err := ParseDevNumbers("x:1"); err == nil {
		t.Error("bad dev numbers accepted")
	}
	if ma, mi, err := ParseDevNumbers("13:64\n"); err != nil || ma != 13 || mi != 64 {
		t.Errorf("13:64 = %d:%d, %v", ma, mi, err)
	}
}
