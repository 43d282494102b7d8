package harebox

import (
	"bytes"
	"context"
	"io"

	agentclient "github.com/harebox/harebox/agent/client"
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

// agentFor authorizes action on a sandbox and returns it, running, with a
// live connection to its agent.
func (e *Engine) agentFor(ctx context.Context, action, id string) (*box, *agentclient.Client, error) {
	if err := e.check(ctx, action, id); err != nil {
		return nil, nil, err
	}
	return e.connect(ctx, id)
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

// execTarget validates an exec request and finds where it runs.
func (e *Engine) execTarget(ctx context.Context, action, id string, r *sandbox.ExecRequest) (*box, *agentclient.Client, error) {
	if err := e.check(ctx, action, id); err != nil {
		return nil, nil, err
	}
	if err := r.Check(); err != nil {
		return nil, nil, err
	}
	return e.connect(ctx, id)
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

// Exec runs a command and waits for it. Output beyond the engine's cap is
// dropped and flagged.
func (e *Engine) Exec(ctx context.Context, id string, r sandbox.ExecRequest) (_ *sandbox.ExecResult, err error) {
	defer e.audited(ctx, "exec", id, &err)
	b, c, err := e.execTarget(ctx, "exec", id, &r)
	if err != nil {
		return nil, err
	}
	var stdin io.Reader
	if r.Stdin != nil {
		stdin = bytes.NewReader(r.Stdin)
	}
	started := e.opts.Now()
	res, err := c.Exec(ctx, b.agentRequest(&r), stdin)
	if err != nil {
		return nil, err
	}
	out := res.Result()
	e.history.Record(ctx, b.historyRef(), "exec", &r, started, out)
	return out, nil
}

// ExecStream runs a command and writes its output as it comes. Stdin, if
// not nil, is fed to the command.
func (e *Engine) ExecStream(ctx context.Context, id string, r sandbox.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (_ *sandbox.ExecResult, err error) {
	defer e.audited(ctx, "execStream", id, &err)
	b, c, err := e.execTarget(ctx, "execStream", id, &r)
	if err != nil {
		return nil, err
	}
	if stdin == nil && r.Stdin != nil {
		stdin = bytes.NewReader(r.Stdin)
	}
	started := e.opts.Now()
	ho, he, stdout, stderr := history.Writers(stdout, stderr)
	st, err := c.ExecStream(ctx, b.agentRequest(&r), agentclient.ExecIO{Stdin: stdin, Stdout: stdout, Stderr: stderr})
	if err != nil {
		return nil, err
	}
	out := agentclient.ExecResult{ExitStatus: st}.Result()
	kept := *out
	kept.Stdout, kept.StdoutTruncated = string(ho.Bytes()), ho.Truncated()
	kept.Stderr, kept.StderrTruncated = string(he.Bytes()), he.Truncated()
	e.history.Record(ctx, b.historyRef(), "stream", &r, started, &kept)
	return out, nil
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
