package sandboxrt

import (
	"context"

	"github.com/harebox/harebox/processes"
)

// Background processes are package processes': it answers their calls
// (the REST API calls it directly), authorized and audited on their
// sandbox; the engine gives it its running sandboxes (sandboxView.Running)
// and their agents (whose errors are the API's kinds), and has it forget a
// sandbox's processes when its machine goes.

// Running implements processes.Sandboxes.
func (s sandboxView) Running(ctx context.Context, id string) (*processes.Sandbox, error) {
	b, c, err := s.e.connect(ctx, id)
	if err != nil {
		return nil, err
	}
	return &processes.Sandbox{ID: b.rec.ID, Agent: c, Request: b.agentRequest, History: b.historyRef()}, nil
}
