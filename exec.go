package harebox

import (
	"context"
	"io"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/commands"
	"github.com/harebox/harebox/history"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets/sandboxkeys"
)

// running returns a live box that can run commands.
func (e *Engine) running(ctx context.Context, id string) (*box, error) {
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
func (e *Engine) connect(ctx context.Context, id string) (*box, *agentclient.Client, error) {
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

// Foreground commands are package commands': it authorizes, audits and
// records each in its sandbox's history, and runs it through the
// sandbox's agent, which the engine lends it (commandView). The methods
// below are the library's names for its calls.

// Commands runs foreground commands in the sandboxes, for the principal
// in the context.
func (e *Engine) Commands() *commands.Service { return e.commands }

// commandView implements commands.Sandboxes.
type commandView struct{ sandboxView }

func (v commandView) Running(ctx context.Context, id string) (*commands.Sandbox, error) {
	b, c, err := v.e.connect(ctx, id)
	if err != nil {
		return nil, err
	}
	return &commands.Sandbox{Agent: c, Request: b.agentRequest, History: b.historyRef()}, nil
}

// Exec runs a command and waits for it. Output beyond the engine's cap is
// dropped and flagged.
func (e *Engine) Exec(ctx context.Context, id string, r sandbox.ExecRequest) (*sandbox.ExecResult, error) {
	return e.commands.Exec(ctx, id, r)
}

// ExecStream runs a command and writes its output as it comes. Stdin, if
// not nil, is fed to the command.
func (e *Engine) ExecStream(ctx context.Context, id string, r sandbox.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (*sandbox.ExecResult, error) {
	return e.commands.Stream(ctx, id, r, stdin, stdout, stderr)
}

// Shell runs r as an interactive session whose input streams, on a
// terminal or not (commands.Service.Shell says how each behaves).
func (e *Engine) Shell(ctx context.Context, id string, r sandbox.ExecRequest, term *sandbox.Terminal, stdin io.Reader, stdout, stderr io.Writer) (*sandbox.ExecResult, error) {
	return e.commands.Shell(ctx, id, r, term, stdin, stdout, stderr)
}

// dataKey returns a sandbox's data key for its history: the live box's,
// or the stored one; nil for a sandbox without one.
func (e *Engine) dataKey(ctx context.Context, id string) ([]byte, error) {
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
