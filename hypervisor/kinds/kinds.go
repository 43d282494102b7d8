// Package kinds gives a hypervisor's errors the API's kinds (package
// model), once, at the hypervisor's boundary: Wrap is a Hypervisor whose
// calls, and its machines' calls, fail with a *model.Error that wraps
// what the backend said (errors.Is still finds hypervisor.ErrNotFound).
package kinds

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/model"
)

// Wrap returns h with its errors translated.
func Wrap(h hypervisor.Hypervisor) hypervisor.Hypervisor { return hv{h} }

// Of is what a hypervisor failure in op is for the API. An error with a
// kind already passes unchanged; nil is nil.
func Of(op string, err error) error {
	var me *model.Error
	if err == nil || errors.As(err, &me) {
		return err
	}
	err = fmt.Errorf("%s: %w", op, err)
	if strings.Contains(strings.ToLower(err.Error()), "no space left on device") {
		// A full data directory, said by a VMM or qemu-img behind the
		// plugin boundary, where only the message travels.
		return &model.Error{Kind: model.ErrCapacity, Msg: "the data directory's disk is full", Err: err}
	}
	for _, m := range []struct {
		kind, to error
		msg      string
	}{
		{hypervisor.ErrInvalid, model.ErrInvalid, "the hypervisor refused the request"},
		{hypervisor.ErrUnsupported, model.ErrInvalid, "the hypervisor backend cannot do this"},
		{hypervisor.ErrState, model.ErrState, "the sandbox's VM is not in a state that allows this"},
		{hypervisor.ErrExists, model.ErrExists, "the sandbox's VM already exists"},
		{hypervisor.ErrNotFound, model.ErrUnavailable, "the sandbox's VM is gone"},
	} {
		if errors.Is(err, m.kind) {
			return &model.Error{Kind: m.to, Msg: m.msg, Err: err}
		}
	}
	return &model.Error{Kind: model.ErrUnavailable, Msg: "the hypervisor failed", Err: err}
}

type hv struct{ h hypervisor.Hypervisor }

func (w hv) Capabilities(ctx context.Context) (hypervisor.Capabilities, error) {
	c, err := w.h.Capabilities(ctx)
	return c, Of("capabilities", err)
}

func (w hv) Launch(ctx context.Context, spec hypervisor.Spec) (hypervisor.Machine, error) {
	return machineOf(w.h.Launch(ctx, spec))("launch")
}

func (w hv) Attach(ctx context.Context, h hypervisor.Handle) (hypervisor.Machine, error) {
	return machineOf(w.h.Attach(ctx, h))("attach")
}

func (w hv) Restore(ctx context.Context, dir string, spec hypervisor.Spec) (hypervisor.Machine, error) {
	return machineOf(w.h.Restore(ctx, dir, spec))("restore")
}

func machineOf(m hypervisor.Machine, err error) func(op string) (hypervisor.Machine, error) {
	return func(op string) (hypervisor.Machine, error) {
		if err != nil {
			return nil, Of(op, err)
		}
		return machine{m}, nil
	}
}

// machine is a Machine whose errors are translated; the others pass.
type machine struct{ hypervisor.Machine }

func (m machine) Info(ctx context.Context) (hypervisor.Info, error) {
	i, err := m.Machine.Info(ctx)
	return i, Of("info", err)
}

func (m machine) Pause(ctx context.Context) error  { return Of("pause", m.Machine.Pause(ctx)) }
func (m machine) Resume(ctx context.Context) error { return Of("resume", m.Machine.Resume(ctx)) }

func (m machine) Snapshot(ctx context.Context, dir string, key []byte) error {
	return Of("snapshot", m.Machine.Snapshot(ctx, dir, key))
}

func (m machine) Shutdown(ctx context.Context) error { return Of("shutdown", m.Machine.Shutdown(ctx)) }
func (m machine) Kill(ctx context.Context) error     { return Of("kill", m.Machine.Kill(ctx)) }
func (m machine) Wait(ctx context.Context) error     { return Of("wait", m.Machine.Wait(ctx)) }
func (m machine) Cleanup(ctx context.Context) error  { return Of("cleanup", m.Machine.Cleanup(ctx)) }
func (m machine) PlugVolume(ctx context.Context, v hypervisor.Volume) error {
	return Of("plug volume", m.Machine.PlugVolume(ctx, v))
}
func (m machine) UnplugVolume(ctx context.Context, id string) error {
	return Of("unplug volume", m.Machine.UnplugVolume(ctx, id))
}
func (m machine) LayerVolume(ctx context.Context, id, path string) error {
	return Of("layer volume", m.Machine.LayerVolume(ctx, id, path))
}
