package sandboxrt

import (
	"context"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/commands"
	"github.com/harebox/harebox/history"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets/sandboxkeys"
)

// running returns a live box that can run commands.
func (e *Runtime) running(ctx context.Context, id string) (*box, error) {
	b, err := e.liveOrErr(ctx, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	st := b.rec.State
	b.mu.Unlock()
	if st != sandbox.StateRunning {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is %s; it must be running", id, st)
	}
	return b, nil
}

// connect returns a running sandbox and a live connection to its agent
// (the caller has authorized the call).
func (e *Runtime) connect(ctx context.Context, id string) (*box, *agentclient.Client, error) {
	b, err := e.running(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	c, err := b.client(ctx, e)
	if err != nil {
		return nil, nil, err
	}
	return b, c, nil
}

// agentRequest merges the sandbox's environment under the request's.
func (b *box) agentRequest(r *sandbox.ExecRequest) agentclient.ExecRequest {
	env := map[string]string{}
	for k, v := range b.given.Env() {
		env[k] = v
	}
	for k, v := range r.Env {
		env[k] = v
	}
	ar := agentclient.ExecRequest{Env: env, Cwd: r.Cwd, User: r.User, Timeout: r.Timeout()}
	if r.Cmd != "" {
		ar.Shell = r.Cmd
	} else {
		ar.Argv = r.Argv
	}
	return ar
}

// commandView implements commands.Sandboxes.
type commandView struct{ sandboxView }

func (v commandView) Running(ctx context.Context, id string) (*commands.Sandbox, error) {
	b, c, err := v.e.connect(ctx, id)
	if err != nil {
		return nil, err
	}
	return &commands.Sandbox{Agent: c, Request: b.agentRequest, History: b.historyRef()}, nil
}

// DataKey returns a sandbox's data key for its history: the live box's,
// or the stored one; nil for a sandbox without one.
func (e *Runtime) DataKey(ctx context.Context, id string) ([]byte, error) {
	if b := e.boxes.get(id); b != nil && b.keys.Data != nil {
		return b.keys.Data, nil
	}
	return sandboxkeys.DataKey(ctx, e.sec, id)
}

// historyRef is what the command history needs of the box (read without
// its lock: these are set before the box runs commands).
func (b *box) historyRef() history.Sandbox {
	return history.Sandbox{ID: b.rec.ID, AccountID: b.rec.AccountID, Monitoring: b.rec.Monitoring, Key: b.keys.Data, Deleting: b.isDeleting}
}
