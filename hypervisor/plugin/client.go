package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/plugin/pluginpb"
)

// Client is a hypervisor.Hypervisor served by a plugin process.
type Client struct {
	rpc pluginpb.HypervisorClient
}

var _ hypervisor.Hypervisor = (*Client)(nil)

// Capabilities implements hypervisor.Hypervisor.
func (c *Client) Capabilities(ctx context.Context) (hypervisor.Capabilities, error) {
	var caps hypervisor.Capabilities
	r, err := c.rpc.Capabilities(ctx, &pluginpb.Empty{})
	if err != nil {
		return caps, fromStatus(err)
	}
	if err := json.Unmarshal(r.Json, &caps); err != nil {
		return caps, fmt.Errorf("plugin: capabilities: %w", err)
	}
	return caps, nil
}

// Launch implements hypervisor.Hypervisor.
func (c *Client) Launch(ctx context.Context, spec hypervisor.Spec) (hypervisor.Machine, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	return c.machine(c.rpc.Launch(ctx, &pluginpb.JSON{Json: b}))
}

// Attach implements hypervisor.Hypervisor.
func (c *Client) Attach(ctx context.Context, h hypervisor.Handle) (hypervisor.Machine, error) {
	b, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	return c.machine(c.rpc.Attach(ctx, &pluginpb.JSON{Json: b}))
}

// Restore implements hypervisor.Hypervisor.
func (c *Client) Restore(ctx context.Context, dir string, spec hypervisor.Spec) (hypervisor.Machine, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	return c.machine(c.rpc.Restore(ctx, &pluginpb.RestoreRequest{SnapshotDir: dir, SpecJson: b}))
}

func (c *Client) machine(r *pluginpb.MachineRef, err error) (hypervisor.Machine, error) {
	return newMachine(c, r, err)
}

// conn returns the plugin connection; a Client's never changes.
func (c *Client) conn() (pluginpb.HypervisorClient, error) { return c.rpc, nil }

// source is where a machine's calls go: a Client, or a Process whose
// plugin may have been started again since the machine was made.
type source interface {
	conn() (pluginpb.HypervisorClient, error)
	Attach(ctx context.Context, h hypervisor.Handle) (hypervisor.Machine, error)
}

func newMachine(src source, r *pluginpb.MachineRef, err error) (hypervisor.Machine, error) {
	if err != nil {
		return nil, fromStatus(err)
	}
	m := &remoteMachine{src: src, id: r.Id}
	if err := json.Unmarshal(r.HandleJson, &m.handle); err != nil {
		return nil, fmt.Errorf("plugin: handle: %w", err)
	}
	if err := json.Unmarshal(r.EndpointJson, &m.endpoint); err != nil {
		return nil, fmt.Errorf("plugin: endpoint: %w", err)
	}
	return m, nil
}

// remoteMachine is a machine held by the plugin process.
type remoteMachine struct {
	src      source
	id       string
	handle   hypervisor.Handle
	endpoint hypervisor.AgentEndpoint
}

func (m *remoteMachine) ID() string                              { return m.id }
func (m *remoteMachine) Handle() hypervisor.Handle               { return m.handle }
func (m *remoteMachine) AgentEndpoint() hypervisor.AgentEndpoint { return m.endpoint }

// do runs a machine call; if the plugin no longer holds the machine (it was
// restarted), it re-attaches with the handle and tries once more.
func (m *remoteMachine) do(ctx context.Context, f func(pluginpb.HypervisorClient) error) error {
	rpc, err := m.src.conn()
	if err != nil {
		return err
	}
	err = f(rpc)
	if st, ok := status.FromError(err); ok && st.Code() == codes.NotFound && strings.HasPrefix(st.Message(), notAttachedMsg) {
		if _, aerr := m.src.Attach(ctx, m.handle); aerr != nil {
			return aerr
		}
		if rpc, err = m.src.conn(); err != nil {
			return err
		}
		err = f(rpc)
	}
	return fromStatus(err)
}

type machineCall func(pluginpb.HypervisorClient, context.Context, *pluginpb.MachineID, ...grpc.CallOption) (*pluginpb.Empty, error)

func (m *remoteMachine) simple(ctx context.Context, call machineCall) error {
	return m.do(ctx, func(rpc pluginpb.HypervisorClient) error {
		_, err := call(rpc, ctx, &pluginpb.MachineID{Id: m.id})
		return err
	})
}

func (m *remoteMachine) Info(ctx context.Context) (hypervisor.Info, error) {
	var info hypervisor.Info
	err := m.do(ctx, func(rpc pluginpb.HypervisorClient) error {
		r, err := rpc.Info(ctx, &pluginpb.MachineID{Id: m.id})
		if err != nil {
			return err
		}
		return json.Unmarshal(r.Json, &info)
	})
	return info, err
}

func (m *remoteMachine) Pause(ctx context.Context) error {
	return m.simple(ctx, pluginpb.HypervisorClient.Pause)
}
func (m *remoteMachine) Resume(ctx context.Context) error {
	return m.simple(ctx, pluginpb.HypervisorClient.Resume)
}
func (m *remoteMachine) Shutdown(ctx context.Context) error {
	return m.simple(ctx, pluginpb.HypervisorClient.Shutdown)
}
func (m *remoteMachine) Kill(ctx context.Context) error {
	return m.simple(ctx, pluginpb.HypervisorClient.Kill)
}
func (m *remoteMachine) Wait(ctx context.Context) error {
	return m.simple(ctx, pluginpb.HypervisorClient.Wait)
}
func (m *remoteMachine) Cleanup(ctx context.Context) error {
	return m.simple(ctx, pluginpb.HypervisorClient.Cleanup)
}

func (m *remoteMachine) Snapshot(ctx context.Context, dir string, key []byte) error {
	return m.do(ctx, func(rpc pluginpb.HypervisorClient) error {
		_, err := rpc.Snapshot(ctx, &pluginpb.SnapshotRequest{Id: m.id, Dir: dir, Key: key})
		return err
	})
}

func (m *remoteMachine) PlugVolume(ctx context.Context, v hypervisor.Volume) error {
	b, err := json.Marshal(v) // the key is not in the JSON
	if err != nil {
		return err
	}
	return m.do(ctx, func(rpc pluginpb.HypervisorClient) error {
		_, err := rpc.PlugVolume(ctx, &pluginpb.PlugVolumeRequest{Id: m.id, VolumeJson: b, Key: v.Key})
		return err
	})
}

func (m *remoteMachine) LayerVolume(ctx context.Context, id, path string) error {
	return m.do(ctx, func(rpc pluginpb.HypervisorClient) error {
		_, err := rpc.LayerVolume(ctx, &pluginpb.LayerVolumeRequest{Id: m.id, VolumeId: id, Path: path})
		return err
	})
}

func (m *remoteMachine) UnplugVolume(ctx context.Context, id string) error {
	return m.do(ctx, func(rpc pluginpb.HypervisorClient) error {
		_, err := rpc.UnplugVolume(ctx, &pluginpb.UnplugVolumeRequest{Id: m.id, VolumeId: id})
		return err
	})
}
