package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/plugin/pluginpb"
)

// server is the plugin side: it holds the machines it launched or
// attached, by ID.
type server struct {
	pluginpb.UnimplementedHypervisorServer
	h hypervisor.Hypervisor

	mu       sync.Mutex
	machines map[string]hypervisor.Machine
}

func newServer(h hypervisor.Hypervisor) *server {
	return &server{h: h, machines: map[string]hypervisor.Machine{}}
}

func (s *server) Capabilities(ctx context.Context, _ *pluginpb.Empty) (*pluginpb.JSON, error) {
	c, err := s.h.Capabilities(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return jsonMsg(c)
}

func (s *server) Launch(ctx context.Context, r *pluginpb.JSON) (*pluginpb.MachineRef, error) {
	var spec hypervisor.Spec
	if err := strictJSON(r.Json, &spec); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "plugin: bad spec: %v", err)
	}
	return s.adopt(s.h.Launch(ctx, spec))
}

func (s *server) Attach(ctx context.Context, r *pluginpb.JSON) (*pluginpb.MachineRef, error) {
	var h hypervisor.Handle
	if err := json.Unmarshal(r.Json, &h); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "plugin: bad handle: %v", err)
	}
	return s.adopt(s.h.Attach(ctx, h))
}

func (s *server) Restore(ctx context.Context, r *pluginpb.RestoreRequest) (*pluginpb.MachineRef, error) {
	var spec hypervisor.Spec
	if err := strictJSON(r.SpecJson, &spec); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "plugin: bad spec: %v", err)
	}
	return s.adopt(s.h.Restore(ctx, r.SnapshotDir, spec))
}

func (s *server) adopt(m hypervisor.Machine, err error) (*pluginpb.MachineRef, error) {
	if err != nil {
		return nil, toStatus(err)
	}
	hb, err := json.Marshal(m.Handle())
	if err != nil {
		return nil, toStatus(err)
	}
	eb, err := json.Marshal(m.AgentEndpoint())
	if err != nil {
		return nil, toStatus(err)
	}
	s.mu.Lock()
	s.machines[m.ID()] = m
	s.mu.Unlock()
	return &pluginpb.MachineRef{Id: m.ID(), HandleJson: hb, EndpointJson: eb}, nil
}

func (s *server) machine(id string) (hypervisor.Machine, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.machines[id]
	if !ok {
		return nil, status.Error(codes.NotFound, notAttachedMsg+id)
	}
	return m, nil
}

// call runs f on machine r.Id and maps its error.
func (s *server) call(r *pluginpb.MachineID, f func(hypervisor.Machine) error) (*pluginpb.Empty, error) {
	m, err := s.machine(r.Id)
	if err != nil {
		return nil, err
	}
	if err := f(m); err != nil {
		return nil, toStatus(err)
	}
	return &pluginpb.Empty{}, nil
}

func (s *server) Info(ctx context.Context, r *pluginpb.MachineID) (*pluginpb.JSON, error) {
	m, err := s.machine(r.Id)
	if err != nil {
		return nil, err
	}
	info, err := m.Info(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return jsonMsg(info)
}

func (s *server) Pause(ctx context.Context, r *pluginpb.MachineID) (*pluginpb.Empty, error) {
	return s.call(r, func(m hypervisor.Machine) error { return m.Pause(ctx) })
}

func (s *server) Resume(ctx context.Context, r *pluginpb.MachineID) (*pluginpb.Empty, error) {
	return s.call(r, func(m hypervisor.Machine) error { return m.Resume(ctx) })
}

func (s *server) Snapshot(ctx context.Context, r *pluginpb.SnapshotRequest) (*pluginpb.Empty, error) {
	return s.call(&pluginpb.MachineID{Id: r.Id}, func(m hypervisor.Machine) error { return m.Snapshot(ctx, r.Dir, r.Key) })
}

func (s *server) PlugVolume(ctx context.Context, r *pluginpb.PlugVolumeRequest) (*pluginpb.Empty, error) {
	var v hypervisor.Volume
	if err := json.Unmarshal(r.VolumeJson, &v); err != nil {
		return nil, toStatus(hypervisor.Errorf(hypervisor.ErrInvalid, "plugin: volume: %v", err))
	}
	v.Key = r.Key
	return s.call(&pluginpb.MachineID{Id: r.Id}, func(m hypervisor.Machine) error { return m.PlugVolume(ctx, v) })
}

func (s *server) LayerVolume(ctx context.Context, r *pluginpb.LayerVolumeRequest) (*pluginpb.Empty, error) {
	return s.call(&pluginpb.MachineID{Id: r.Id}, func(m hypervisor.Machine) error { return m.LayerVolume(ctx, r.VolumeId, r.Path) })
}

func (s *server) UnplugVolume(ctx context.Context, r *pluginpb.UnplugVolumeRequest) (*pluginpb.Empty, error) {
	return s.call(&pluginpb.MachineID{Id: r.Id}, func(m hypervisor.Machine) error { return m.UnplugVolume(ctx, r.VolumeId) })
}

func (s *server) Shutdown(ctx context.Context, r *pluginpb.MachineID) (*pluginpb.Empty, error) {
	return s.call(r, func(m hypervisor.Machine) error { return m.Shutdown(ctx) })
}

func (s *server) Kill(ctx context.Context, r *pluginpb.MachineID) (*pluginpb.Empty, error) {
	return s.call(r, func(m hypervisor.Machine) error { return m.Kill(ctx) })
}

func (s *server) Wait(ctx context.Context, r *pluginpb.MachineID) (*pluginpb.Empty, error) {
	return s.call(r, func(m hypervisor.Machine) error { return m.Wait(ctx) })
}

func (s *server) Cleanup(ctx context.Context, r *pluginpb.MachineID) (*pluginpb.Empty, error) {
	e, err := s.call(r, func(m hypervisor.Machine) error { return m.Cleanup(ctx) })
	if err == nil {
		s.mu.Lock()
		delete(s.machines, r.Id)
		s.mu.Unlock()
	}
	return e, err
}

func jsonMsg(v any) (*pluginpb.JSON, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pluginpb.JSON{Json: b}, nil
}

// strictJSON decodes a spec refusing fields this plugin does not know: a
// field it ignored could be a security property (a disk key) the engine
// relies on.
func strictJSON(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	return d.Decode(v)
}
