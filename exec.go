package harebox

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/sandbox"
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
	c, err := b.client(ctx, e.agentOptions())
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
	for k, v := range b.env {
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
		return nil, agentErr(err)
	}
	out := result(res)
	e.remember(ctx, b, "exec", &r, started, out)
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
	ho, he, stdout, stderr := historyWriters(stdout, stderr)
	st, err := c.ExecStream(ctx, b.agentRequest(&r), agentclient.ExecIO{Stdin: stdin, Stdout: stdout, Stderr: stderr})
	if err != nil {
		return nil, agentErr(err)
	}
	out := result(agentclient.ExecResult{ExitStatus: st})
	kept := *out
	kept.Stdout, kept.StdoutTruncated = string(ho.Bytes()), ho.Truncated()
	kept.Stderr, kept.StderrTruncated = string(he.Bytes()), he.Truncated()
	e.remember(ctx, b, "stream", &r, started, &kept)
	return out, nil
}

func result(r agentclient.ExecResult) *sandbox.ExecResult {
	return &sandbox.ExecResult{
		ExitCode: r.ExitCode, Signal: r.Signal, TimedOut: r.TimedOut, Error: r.Error,
		Stdout: string(r.Stdout), Stderr: string(r.Stderr),
		StdoutTruncated: r.StdoutTruncated, StderrTruncated: r.StderrTruncated,
		DurationMS: r.Duration.Milliseconds(),
	}
}

// procTable holds a sandbox's background processes.
type procTable struct {
	mu    sync.Mutex
	procs map[string]*proc
}

type proc struct {
	view    sandbox.Process
	done    chan struct{}
	signals chan int
	cancel  context.CancelFunc
}

func (t *procTable) add(p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs == nil {
		t.procs = map[string]*proc{}
	}
	t.procs[p.view.ID] = p
}

func (t *procTable) get(id string) *proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.procs[id]
}

func (t *procTable) list() []sandbox.Process {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := []sandbox.Process{}
	for _, p := range t.procs {
		out = append(out, p.view)
	}
	return out
}

// closeAll stops every process's stream (the guest kills their groups).
func (t *procTable) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.procs {
		p.cancel()
	}
}

// StartProcess runs a command in the background and returns at once. Its
// output is collected (capped) until it exits. Background processes live
// as long as the engine: an engine restart ends them.
func (e *Engine) StartProcess(ctx context.Context, id string, r sandbox.ExecRequest) (_ *sandbox.Process, err error) {
	defer e.audited(ctx, "startProcess", id, &err)
	b, c, err := e.execTarget(ctx, "startProcess", id, &r)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithCancel(e.ctx)
	p := &proc{
		view:    sandbox.Process{ID: "proc_" + strings.TrimPrefix(sandbox.NewID(), sandbox.IDPrefix), SandboxID: id, Cmd: r.Cmd, Argv: r.Argv, Running: true, StartedAt: time.Now().UTC()},
		done:    make(chan struct{}),
		signals: make(chan int, 4),
		cancel:  cancel,
	}
	started := make(chan int, 1)
	var stdin io.Reader
	if r.Stdin != nil {
		stdin = bytes.NewReader(r.Stdin)
	}
	out, errw := agentclient.NewCapBuffer(e.opts.MaxOutputBytes), agentclient.NewCapBuffer(e.opts.MaxOutputBytes)
	go func() {
		defer close(p.done)
		st, err := c.ExecStream(pctx, b.agentRequest(&r), agentclient.ExecIO{
			Stdin: stdin, Stdout: out, Stderr: errw, Signals: p.signals,
			Started: func(pid int) {
				select { // never block the stream on a misbehaving guest
				case started <- pid:
				default:
				}
			},
		})
		res := result(agentclient.ExecResult{ExitStatus: st})
		if err != nil {
			res.ExitCode, res.Error = -1, err.Error()
		}
		res.Stdout, res.StdoutTruncated = string(out.Bytes()), out.Truncated()
		res.Stderr, res.StderrTruncated = string(errw.Bytes()), errw.Truncated()
		b.procs.mu.Lock()
		p.view.Running, p.view.Result = false, res
		b.procs.mu.Unlock()
		e.remember(ctx, b, "background", &r, p.view.StartedAt, res)
	}()
	select {
	case pid := <-started:
		b.procs.mu.Lock()
		p.view.PID = pid
		b.procs.mu.Unlock()
	case <-p.done:
	case <-ctx.Done():
		cancel()
		return nil, ctx.Err()
	}
	b.procs.add(p)
	b.procs.mu.Lock()
	v := p.view
	b.procs.mu.Unlock()
	return &v, nil
}

// WaitProcess waits until a background process exits (or ctx is done)
// and returns it with its result.
func (e *Engine) WaitProcess(ctx context.Context, id, procID string) (_ *sandbox.Process, err error) {
	defer e.audited(ctx, "getProcess", id, &err)
	b, p, err := e.process(ctx, "getProcess", id, procID)
	if err != nil {
		return nil, err
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return nil, &sandbox.Error{Kind: sandbox.ErrTimeout, Msg: "process still running", Err: ctx.Err()}
	}
	b.procs.mu.Lock()
	defer b.procs.mu.Unlock()
	v := p.view
	return &v, nil
}

// KillProcess sends a signal (default SIGKILL) to a background process's
// process group.
func (e *Engine) KillProcess(ctx context.Context, id, procID string, signal int) (err error) {
	defer e.audited(ctx, "killProcess", id, &err)
	_, p, err := e.process(ctx, "killProcess", id, procID)
	if err != nil {
		return err
	}
	if signal == 0 {
		signal = 9
	}
	if signal < 1 || signal > 64 {
		return sandbox.Errorf(sandbox.ErrInvalid, "signal", "must be 1-64")
	}
	select {
	case p.signals <- signal:
		return nil
	case <-p.done:
		return sandbox.Errorf(sandbox.ErrState, "", "process %s has exited", procID)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ListProcesses returns a sandbox's background processes.
func (e *Engine) ListProcesses(ctx context.Context, id string) ([]sandbox.Process, error) {
	if err := e.check(ctx, "listProcesses", id); err != nil {
		return nil, err
	}
	b, err := e.liveOrErr(ctx, id)
	if err != nil {
		return nil, err
	}
	return b.procs.list(), nil
}

func (e *Engine) process(ctx context.Context, action, id, procID string) (*box, *proc, error) {
	if err := e.check(ctx, action, id); err != nil {
		return nil, nil, err
	}
	b, err := e.liveOrErr(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	p := b.procs.get(procID)
	if p == nil {
		return nil, nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no process %q in sandbox %s", procID, id)
	}
	return b, p, nil
}

// GetProcess returns a background process as it is now.
func (e *Engine) GetProcess(ctx context.Context, id, procID string) (_ *sandbox.Process, err error) {
	defer e.audited(ctx, "getProcess", id, &err)
	b, p, err := e.process(ctx, "getProcess", id, procID)
	if err != nil {
		return nil, err
	}
	b.procs.mu.Lock()
	defer b.procs.mu.Unlock()
	v := p.view
	return &v, nil
}
