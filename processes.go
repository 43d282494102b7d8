package harebox

import (
	"context"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/processes"
)

// Background processes are package processes': it answers their calls
// (the REST API calls it directly), authorized and audited on their
// sandbox; the engine gives it its running sandboxes (sandboxView.Running)
// with their agents' errors translated (procAgent), and has it forget a
// sandbox's processes when its machine goes.

// Processes runs the sandboxes' background processes, for the principal
// in the context.
func (e *Engine) Processes() *processes.Service { return e.processes }

// Running implements processes.Sandboxes.
func (s sandboxView) Running(ctx context.Context, id string) (*processes.Sandbox, error) {
	b, c, err := s.e.connect(ctx, id)
	if err != nil {
		return nil, err
	}
	return &processes.Sandbox{ID: b.rec.ID, Agent: procAgent{c}, Request: b.agentRequest, History: b.historyRef()}, nil
}

// procAgent is a sandbox's agent as package processes sees it: its errors
// translated (agentErr) at this boundary.
type procAgent struct{ c *agentclient.Client }

func (a procAgent) Start(ctx context.Context, id string, req agentclient.ExecRequest, stdin []byte, ringBytes int) (agentclient.Command, error) {
	cmd, err := a.c.Start(ctx, id, req, stdin, ringBytes)
	return cmd, translated(err)
}

func (a procAgent) Commands(ctx context.Context) ([]agentclient.Command, error) {
	cmds, err := a.c.Commands(ctx)
	return cmds, translated(err)
}

func (a procAgent) Attach(ctx context.Context, id string, offsets [2]uint64, follow bool, out agentclient.Output) (*agentclient.ExitStatus, error) {
	st, err := a.c.Attach(ctx, id, offsets, follow, out)
	return st, translated(err)
}

func (a procAgent) Signal(ctx context.Context, id string, sig int) error {
	return translated(a.c.Signal(ctx, id, sig))
}
