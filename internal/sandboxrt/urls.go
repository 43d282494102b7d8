package sandboxrt

import (
	"context"

	"github.com/harebox/harebox/sandbox"
)

// Published ports. The ingress package keeps the URLs, serves them and
// answers the calls on them (ingress.Calls: authorized on the sandbox or
// project, audited); the engine gives it its sandboxes (sandboxView) and
// unpublishes a sandbox's URLs when it is destroyed.

// sandboxView is what the domain services need of the engine's
// sandboxes: ingress.Calls' Sandboxes, monitor.Sandboxes (with
// Monitored, in monitor.go), meter.Sandboxes (in budgets.go) and
// processes.Sandboxes (with Running, in processes.go).
type sandboxView struct{ e *Runtime }

func (s sandboxView) Check(ctx context.Context, action, id string) error {
	return s.e.check(ctx, action, id)
}

func (s sandboxView) Sandbox(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	rec, err := s.e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	return &rec.Sandbox, nil
}

func (s sandboxView) AccountOf(ctx context.Context, id string) string { return s.e.accountOf(ctx, id) }
