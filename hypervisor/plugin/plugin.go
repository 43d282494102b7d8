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
	"os/exec"
	"strings"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/plugin/pluginpb"
)

// Handshake is shared by the engine and every backend binary.
var Handshake = goplugin.HandshakeConfig{
	ProtocolVersion:  1,
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

// Serve serves h until the engine goes away. Call it from a backend
// binary's main.
func Serve(h hypervisor.Hypervisor) {
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         goplugin.PluginSet{pluginName: &grpcPlugin{impl: h}},
		GRPCServer:      goplugin.DefaultGRPCServer,
	})
}

// Process is a running backend binary and the hypervisor it serves.
type Process struct {
	*Client
	pc *goplugin.Client
}

// Launch starts the backend binary at path (with args) and connects to it.
// Close stops the plugin process; the machines it launched keep running.
func Launch(ctx context.Context, path string, args []string, logger *slog.Logger) (*Process, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	pc := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  Handshake,
		Plugins:          goplugin.PluginSet{pluginName: &grpcPlugin{}},
		Cmd:              exec.Command(path, args...),
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		Logger: hclog.New(&hclog.LoggerOptions{
			Name: "plugin", Output: slogWriter{logger}, Level: hclog.Info,
		}),
	})
	rpc, err := pc.Client()
	if err != nil {
		pc.Kill()
		return nil, fmt.Errorf("plugin %s: %w: %w", path, hypervisor.ErrUnavailable, err)
	}
	raw, err := rpc.Dispense(pluginName)
	if err != nil {
		pc.Kill()
		return nil, fmt.Errorf("plugin %s: %w: %w", path, hypervisor.ErrUnavailable, err)
	}
	return &Process{Client: raw.(*Client), pc: pc}, nil
}

// Close stops the plugin process.
func (p *Process) Close() error {
	p.pc.Kill()
	return nil
}

// Exited reports whether the plugin process has gone.
func (p *Process) Exited() bool { return p.pc.Exited() }

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
