package harebox

import (
	"context"
	"net"

	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/codeinterp"
	"github.com/harebox/harebox/sandbox"
)

// The code interpreter of sandboxes made from an image that has one
// (images.CodeInterpreter): its server in the guest is reached through
// the agent (Connect), and package codeinterp speaks to it and bounds
// what it answers.

// interpreter authorizes action on a running sandbox and returns its
// interpreter's client.
func (e *Engine) interpreter(ctx context.Context, action, id string) (*box, *codeinterp.Client, error) {
	if err := e.check(ctx, action, id); err != nil {
		return nil, nil, err
	}
	b, err := e.running(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	b.amu.Lock()
	ci := b.code
	b.amu.Unlock()
	if ci != nil {
		return b, ci, nil
	}
	img, err := e.imageOf(b.rec)
	if err != nil {
		return nil, nil, err
	}
	if !img.CodeInterpreter {
		return nil, nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s has no code interpreter: its image (%s) has none; create one from the code-interpreter image", id, b.rec.Image)
	}
	b.amu.Lock()
	defer b.amu.Unlock()
	if b.code == nil {
		b.code = codeinterp.New(func(ctx context.Context) (net.Conn, error) {
			c, err := b.client(ctx, e)
			if err != nil {
				return nil, err
			}
			return c.Connect(ctx, layout.InterpreterPort)
		}, codeinterp.Options{MaxOutput: e.opts.MaxOutputBytes})
	}
	return b, b.code, nil
}

// RunCode runs a cell in a sandbox's code interpreter and returns how it
// ended; emit, if set, gets its output, results and errors as they come.
// The cell sees the sandbox's variables under the request's.
func (e *Engine) RunCode(ctx context.Context, id string, r sandbox.CodeRequest, emit func(sandbox.CodeEvent) error) (_ *sandbox.CodeExecution, err error) {
	defer e.audited(ctx, "runCode", id, &err)
	b, ci, err := e.interpreter(ctx, "runCode", id)
	if err != nil {
		return nil, err
	}
	if err := r.Check(); err != nil {
		return nil, err
	}
	env := map[string]string{}
	for k, v := range b.given.Env() {
		env[k] = v
	}
	for k, v := range r.Env {
		env[k] = v
	}
	started := e.opts.Now()
	x, err := ci.Run(ctx, r, env, emit)
	if err != nil {
		return nil, err
	}
	e.history.Record(ctx, b.historyRef(), "code", &sandbox.ExecRequest{Cmd: r.Code}, started, codeHistory(x))
	return x, nil
}

// codeHistory is what the command history keeps of a cell: its output,
// and its error as stderr's last line.
func codeHistory(x *sandbox.CodeExecution) *sandbox.ExecResult {
	res := &sandbox.ExecResult{Stdout: x.Stdout, Stderr: x.Stderr, DurationMS: x.DurationMS,
		StdoutTruncated: x.StdoutTruncated, StderrTruncated: x.StderrTruncated, TimedOut: x.Status == sandbox.CodeTimeout}
	if x.Error != nil {
		res.ExitCode = 1
		res.Stderr += x.Error.Name + ": " + x.Error.Value + "\n"
	}
	return res
}

// CodeContexts lists a sandbox's code interpreter contexts.
func (e *Engine) CodeContexts(ctx context.Context, id string) ([]sandbox.CodeContext, error) {
	_, ci, err := e.interpreter(ctx, "listCodeContexts", id)
	if err != nil {
		return nil, err
	}
	return ci.Contexts(ctx)
}

// CreateCodeContext starts a context (a kernel of its own).
func (e *Engine) CreateCodeContext(ctx context.Context, id string, r sandbox.CodeContextRequest) (_ *sandbox.CodeContext, err error) {
	defer e.audited(ctx, "createCodeContext", id, &err)
	_, ci, err := e.interpreter(ctx, "createCodeContext", id)
	if err != nil {
		return nil, err
	}
	return ci.CreateContext(ctx, r)
}

// RestartCodeContext gives a context a fresh kernel (its state is lost;
// a dead one comes back).
func (e *Engine) RestartCodeContext(ctx context.Context, id, contextID string) (_ *sandbox.CodeContext, err error) {
	defer e.audited(ctx, "restartCodeContext", id, &err)
	_, ci, err := e.interpreter(ctx, "restartCodeContext", id)
	if err != nil {
		return nil, err
	}
	return ci.RestartContext(ctx, contextID)
}

// DeleteCodeContext shuts a context's kernel down.
func (e *Engine) DeleteCodeContext(ctx context.Context, id, contextID string) (err error) {
	defer e.audited(ctx, "deleteCodeContext", id, &err)
	_, ci, err := e.interpreter(ctx, "deleteCodeContext", id)
	if err != nil {
		return err
	}
	return ci.DeleteContext(ctx, contextID)
}
