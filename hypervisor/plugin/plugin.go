// Package plugin serves a hypervisor.Hypervisor from a separate binary with
// hashicorp/go-plugin (gRPC only), and gives the engine a hypervisor.Hypervisor
// that drives such a binary. VMM processes do not belong to the plugin
// process: a plugin (or engine) restart re-adopts machines with Attach.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/plugin/pluginpb"
)

// Handshake is shared by the engine and every backend binary.
//
// Version 2: Spec carries data and snapshot keys; a version 1 plugin would
// ignore them and write plaintext, so it is refused.
var Handshake = goplugin.HandshakeConfig{
	ProtocolVersion:  2,
	MagicCookieKey:   "HAREBOX_HYPERVISOR_PLUGIN",
	MagicCookieValue: "c2b1f0e6-hypervisor",
}

// pluginName is the name the hypervisor is dispensed under.
const pluginName = "hypervisor"

// grpcPlugin adapts a hypervisor to go-plugin's GRPCPlugin.
type grpcPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	impl hypervisor.Hypervisor
}

func (p *grpcPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	pluginpb.RegisterHypervisorServer(s, newServer(p.impl))
	return nil
}

func (p *grpcPlugin) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, cc *grpc.ClientConn) (any, error) {
	return &Client{rpc: pluginpb.NewHypervisorClient(cc)}, nil
}

// Environment the engine gives a plugin it starts.
const (
	// ParentEnv holds the engine's pid: a plugin whose parent is not
	// that process (the engine died before the plugin started) exits.
	ParentEnv = "HAREBOX_PLUGIN_PARENT"
	// OwnerEnv names the engine's data directory, so a new engine finds
	// the plugins an earlier one on the same directory left behind.
	OwnerEnv = "HAREBOX_PLUGIN_OWNER"
)

// Serve serves h until the engine goes away. Call it from a backend
// binary's main. The plugin dies with the engine that started it (a
// parent-death signal, and a check at start for an engine that died
// before the signal was armed); the VMMs it launched do not.
func Serve(h hypervisor.Hypervisor) {
	if want := os.Getenv(ParentEnv); want != "" {
		unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0)
		if strconv.Itoa(os.Getppid()) != want {
			fmt.Fprintln(os.Stderr, "hypervisor plugin: the engine that started it is gone")
			os.Exit(1)
		}
	}
	var calls sync.WaitGroup
	count := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		calls.Add(1)
		defer calls.Done()
		return handler(ctx, req)
	}
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         goplugin.PluginSet{pluginName: &grpcPlugin{impl: h}},
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return goplugin.DefaultGRPCServer(append(opts, grpc.ChainUnaryInterceptor(count)))
		},
	})
	// The engine stops its plugin by stopping its server, which ends the
	// calls in flight: each then undoes what it had made (a restore cut
	// short removes its machine's VMM and directory) before the process
	// exits. (The engine kills a plugin that takes over 2 s.)
	drained := make(chan struct{})
	go func() { calls.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainTimeout):
	}
}

// drainTimeout bounds how long a stopped plugin waits for its calls.
const drainTimeout = 10 * time.Second

// Process is a backend binary the engine runs, and the hypervisor it
// serves. A plugin that exits (a crash, a kill) is started again by the
// next call, at most as often as an exponential backoff allows; calls in
// between fail at once with ErrUnavailable, as do calls in flight when it
// died. Machines re-attach to the new plugin from their handles on their
// next call: the VMMs outlive the plugin.
type Process struct {
	path  string
	args  []string
	owner string
	log   *slog.Logger

	mu      sync.Mutex
	pc      *goplugin.Client
	client  *Client
	closed  bool
	bo      *backoff.ExponentialBackOff
	retryAt time.Time
	lastErr error
	// tmpDir holds the plugin's socket when it has no directory under
	// its owner: removed once the plugin has exited.
	tmpDir string
}

var _ hypervisor.Hypervisor = (*Process)(nil)

// Launch starts the backend binary at path (with args) and connects to it.
// owner (the engine's data directory, or "") is recorded in the plugin's
// environment so that a later engine can find it. Close stops the plugin;
// the machines it launched keep running.
func Launch(ctx context.Context, path string, args []string, owner string, logger *slog.Logger) (*Process, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval, bo.MaxElapsedTime = 500*time.Millisecond, 30*time.Second, 0
	p := &Process{path: path, args: args, owner: owner, log: logger, bo: bo}
	if err := p.start(); err != nil {
		return nil, err
	}
	return p, nil
}

// start runs the binary; the caller holds mu (or owns p alone).
func (p *Process) start() error {
	cmd := exec.Command(p.path, p.args...)
	cmd.Env = append(os.Environ(), ParentEnv+"="+strconv.Itoa(os.Getpid()))
	if p.owner != "" {
		cmd.Env = append(cmd.Env, OwnerEnv+"="+p.owner)
	}
	if dir, err := p.socketDir(); err == nil {
		cmd.Env = append(cmd.Env, goplugin.EnvUnixSocketDir+"="+dir)
	}
	pc := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  Handshake,
		Plugins:          goplugin.PluginSet{pluginName: &grpcPlugin{}},
		Cmd:              cmd,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger: hclog.New(&hclog.LoggerOptions{
			Name: "plugin", Output: slogWriter{p.log}, Level: hclog.Info,
		}),
	})
	rpc, err := pc.Client()
	if err != nil {
		pc.Kill()
		p.dropTmpDir()
		return fmt.Errorf("plugin %s: %w: %w", p.path, hypervisor.ErrUnavailable, err)
	}
	raw, err := rpc.Dispense(pluginName)
	if err != nil {
		pc.Kill()
		p.dropTmpDir()
		return fmt.Errorf("plugin %s: %w: %w", p.path, hypervisor.ErrUnavailable, err)
	}
	p.pc, p.client = pc, raw.(*Client)
	return nil
}

// socketDir makes the directory the plugin puts its socket in (the
// caller holds mu). go-plugin's default is a file in /tmp, which a killed
// plugin leaves there. Under the engine's data directory, it is emptied
// whenever a plugin starts, since no other plugin of the data directory
// runs then (a stale one is killed before the first start, a crashed one
// has exited). Without an owner, or where the socket's path would be too
// long for a Unix socket, or where it cannot be made (a full disk), it is a
// directory of its own in the temporary directory, removed whenever the
// plugin has exited (a restart, Close).
func (p *Process) socketDir() (string, error) {
	p.dropTmpDir()
	if p.owner != "" {
		dir := filepath.Join(p.owner, "plugin")
		if len(dir)+len("/plugin1234567890") < 108 {
			os.RemoveAll(dir)
			if err := os.Mkdir(dir, 0o700); err == nil {
				return dir, nil
			} // (a full data directory: go-plugin's default would be a file in /tmp)
		}
	}
	dir, err := os.MkdirTemp("", "harebox-plugin-")
	p.tmpDir = dir
	return dir, err
}

func (p *Process) dropTmpDir() {
	if p.tmpDir != "" {
		os.RemoveAll(p.tmpDir)
		p.tmpDir = ""
	}
}

// current returns the live plugin, starting it again if it has exited.
func (p *Process) current() (*Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return nil, hypervisor.Errorf(hypervisor.ErrUnavailable, "plugin %s: closed", p.path)
	case !p.pc.Exited():
		return p.client, nil
	case time.Now().Before(p.retryAt):
		return nil, hypervisor.Errorf(hypervisor.ErrUnavailable, "the hypervisor plugin exited and could not be started again yet: %v", p.lastErr)
	}
	p.log.Warn("the hypervisor plugin exited; starting it again", "path", p.path)
	if err := p.start(); err != nil {
		p.lastErr = err
		p.retryAt = time.Now().Add(p.bo.NextBackOff())
		return nil, err
	}
	p.bo.Reset()
	return p.client, nil
}

func (p *Process) conn() (pluginpb.HypervisorClient, error) {
	c, err := p.current()
	if err != nil {
		return nil, err
	}
	return c.rpc, nil
}

// Capabilities implements hypervisor.Hypervisor.
func (p *Process) Capabilities(ctx context.Context) (hypervisor.Capabilities, error) {
	c, err := p.current()
	if err != nil {
		return hypervisor.Capabilities{}, err
	}
	return c.Capabilities(ctx)
}

// Launch implements hypervisor.Hypervisor.
func (p *Process) Launch(ctx context.Context, spec hypervisor.Spec) (hypervisor.Machine, error) {
	return p.machine(func(c *Client) (hypervisor.Machine, error) { return c.Launch(ctx, spec) })
}

// Attach implements hypervisor.Hypervisor.
func (p *Process) Attach(ctx context.Context, h hypervisor.Handle) (hypervisor.Machine, error) {
	return p.machine(func(c *Client) (hypervisor.Machine, error) { return c.Attach(ctx, h) })
}

// Restore implements hypervisor.Hypervisor.
func (p *Process) Restore(ctx context.Context, dir string, spec hypervisor.Spec) (hypervisor.Machine, error) {
	return p.machine(func(c *Client) (hypervisor.Machine, error) { return c.Restore(ctx, dir, spec) })
}

// machine makes a machine through the live plugin; its later calls follow
// the plugin if it is started again.
func (p *Process) machine(f func(*Client) (hypervisor.Machine, error)) (hypervisor.Machine, error) {
	c, err := p.current()
	if err != nil {
		return nil, err
	}
	m, err := f(c)
	if err != nil {
		return nil, err
	}
	m.(*remoteMachine).src = p
	return m, nil
}

// Close stops the plugin process.
func (p *Process) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.pc.Kill()
	p.dropTmpDir()
	return nil
}

// Exited reports whether the plugin process has gone (until a call
// starts it again).
func (p *Process) Exited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pc.Exited()
}

// Pid is the plugin process's pid, 0 if it has exited.
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rc := p.pc.ReattachConfig(); rc != nil && !p.pc.Exited() {
		return rc.Pid
	}
	return 0
}

// slogWriter forwards the plugin's log lines to slog.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(b []byte) (int, error) {
	w.l.Info(strings.TrimSpace(string(b)))
	return len(b), nil
}

var _ io.Writer = slogWriter{}

// Error kinds travel as gRPC codes.
var kindCodes = []struct {
	kind error
	code codes.Code
}{
	{hypervisor.ErrNotFound, codes.NotFound},
	{hypervisor.ErrInvalid, codes.InvalidArgument},
	{hypervisor.ErrUnsupported, codes.Unimplemented},
	{hypervisor.ErrExists, codes.AlreadyExists},
	{hypervisor.ErrState, codes.FailedPrecondition},
	{hypervisor.ErrUnavailable, codes.Unavailable},
}

// errNotAttached is the plugin's answer for a machine ID it does not hold
// (it restarted since); the client then re-attaches with the handle.
const notAttachedMsg = "plugin: machine not attached: "

func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	if errors.Is(err, context.Canceled) {
		return status.Error(codes.Canceled, err.Error())
	}
	for _, kc := range kindCodes {
		if errors.Is(err, kc.kind) {
			return status.Error(kc.code, err.Error())
		}
	}
	return status.Error(codes.Unknown, err.Error())
}

func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: %w", st.Message(), context.DeadlineExceeded)
	case codes.Canceled:
		return fmt.Errorf("%s: %w", st.Message(), context.Canceled)
	}
	for _, kc := range kindCodes {
		if st.Code() == kc.code {
			return &hypervisor.Error{Kind: kc.kind, Msg: st.Message()}
		}
	}
	if st.Code() == codes.Unavailable {
		return &hypervisor.Error{Kind: hypervisor.ErrUnavailable, Msg: st.Message()}
	}
	return errors.New(st.Message())
}
