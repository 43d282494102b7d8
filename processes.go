package harebox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/sandbox"
)

// Background processes are commands the guest's agent owns: they run on
// when hareboxd restarts or the caller goes away, with their output kept in
// the agent (a bounded ring per stream) and their exit kept until the agent
// forgets them (the oldest finished first, once 64 are kept). The host
// keeps only what the agent does not report: each process's command line,
// for as long as the engine runs.

// procNotes holds a box's background processes' command lines.
type procNotes struct {
	mu sync.Mutex
	m  map[string]procNote
}

type procNote struct {
	cmd  string
	argv []string
}

func (n *procNotes) put(id string, note procNote) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m == nil {
		n.m = map[string]procNote{}
	}
	n.m[id] = note
}

func (n *procNotes) get(id string) procNote {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.m[id]
}

// StartProcess runs a command in the background and returns once it has
// started.
func (e *Engine) StartProcess(ctx context.Context, id string, r sandbox.ExecRequest) (_ *sandbox.Process, err error) {
	defer e.audited(ctx, "startProcess", id, &err)
	b, c, err := e.execTarget(ctx, "startProcess", id, &r)
	if err != nil {
		return nil, err
	}
	procID := "proc_" + strings.TrimPrefix(sandbox.NewID(), sandbox.IDPrefix)
	b.procs.put(procID, procNote{cmd: r.Cmd, argv: r.Argv})
	cmd, err := c.Start(ctx, procID, b.agentRequest(&r), r.Stdin, 0)
	if err != nil {
		return nil, agentErr(err)
	}
	go e.recordProcess(b, c, procID, r)
	return e.processView(ctx, b, c, cmd, false)
}

// processGrace is how long past its timeout a background process may run
// before the host kills it.
const processGrace = 10 * time.Second

// recordProcess follows a process this engine started to its end, for the
// sandbox's command history (kept with the output's first MaxOutputBytes).
// One that ends while no engine runs is not recorded.
func (e *Engine) recordProcess(b *box, c *agentclient.Client, procID string, r sandbox.ExecRequest) {
	started := time.Now()
	// The agent enforces the timeout; the host kills what outlives it by
	// processGrace anyway (an agent that is wedged or was replaced by root
	// in the guest), as a synchronous exec stops waiting.
	backstop := time.AfterFunc(r.Timeout()+processGrace, func() {
		ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
		defer cancel()
		if err := c.Signal(ctx, procID, 9); err == nil {
			e.log.Warn("background process outlived its timeout; killed by the host", "sandbox", b.rec.ID, "process", procID, "timeout", r.Timeout())
		}
	})
	defer backstop.Stop()
	out, errw := agentclient.NewCapBuffer(e.opts.MaxOutputBytes), agentclient.NewCapBuffer(e.opts.MaxOutputBytes)
	st, err := c.Attach(e.ctx, procID, [2]uint64{}, true, func(stderr bool, _ uint64, data []byte) error {
		if stderr {
			errw.Write(data)
		} else {
			out.Write(data)
		}
		return nil
	})
	if err != nil || st == nil {
		return // (the engine closed, or the agent went away)
	}
	res := result(agentclient.ExecResult{ExitStatus: *st, Stdout: out.Bytes(), Stderr: errw.Bytes(),
		StdoutTruncated: out.Truncated(), StderrTruncated: errw.Truncated()})
	e.history.Record(context.Background(), b.historyRef(), "background", &r, started, res)
}

// processView is a process as the API shows it; withOutput reads its
// output from the agent (up to MaxOutputBytes of each stream) once it has
// finished.
func (e *Engine) processView(ctx context.Context, b *box, c *agentclient.Client, cmd agentclient.Command, withOutput bool) (*sandbox.Process, error) {
	note := b.procs.get(cmd.ID)
	p := &sandbox.Process{ID: cmd.ID, SandboxID: b.rec.ID, Cmd: note.cmd, Argv: note.argv, PID: cmd.PID, Running: cmd.Running, StartedAt: cmd.Started}
	if cmd.Exit == nil {
		return p, nil
	}
	res := agentclient.ExecResult{ExitStatus: *cmd.Exit}
	if withOutput {
		out, errw := agentclient.NewCapBuffer(e.opts.MaxOutputBytes), agentclient.NewCapBuffer(e.opts.MaxOutputBytes)
		if _, err := c.Attach(ctx, cmd.ID, [2]uint64{}, false, func(stderr bool, _ uint64, data []byte) error {
			if stderr {
				errw.Write(data)
			} else {
				out.Write(data)
			}
			return nil
		}); err != nil {
			return nil, agentErr(err)
		}
		res.Stdout, res.Stderr = out.Bytes(), errw.Bytes()
		// (What the agent's ring no longer held is missing too.)
		res.StdoutTruncated = out.Truncated() || uint64(len(res.Stdout)) < cmd.StdoutBytes
		res.StderrTruncated = errw.Truncated() || uint64(len(res.Stderr)) < cmd.StderrBytes
	}
	p.Result = result(res)
	return p, nil
}

// process finds a background process of a running sandbox.
func (e *Engine) process(ctx context.Context, action, id, procID string) (*box, *agentclient.Client, agentclient.Command, error) {
	b, c, err := e.agentFor(ctx, action, id)
	if err != nil {
		return nil, nil, agentclient.Command{}, err
	}
	cmds, err := c.Commands(ctx)
	if err != nil {
		return nil, nil, agentclient.Command{}, agentErr(err)
	}
	for _, cmd := range cmds {
		if cmd.ID == procID {
			return b, c, cmd, nil
		}
	}
	return nil, nil, agentclient.Command{}, sandbox.Errorf(sandbox.ErrNotFound, "", "no process %q in sandbox %s", procID, id)
}

// GetProcess returns a background process as it is now, with its output
// once it has finished.
func (e *Engine) GetProcess(ctx context.Context, id, procID string) (_ *sandbox.Process, err error) {
	defer e.audited(ctx, "getProcess", id, &err)
	b, c, cmd, err := e.process(ctx, "getProcess", id, procID)
	if err != nil {
		return nil, err
	}
	return e.processView(ctx, b, c, cmd, true)
}

// WaitProcess waits until a background process exits (or ctx is done)
// and returns it with its result.
func (e *Engine) WaitProcess(ctx context.Context, id, procID string) (_ *sandbox.Process, err error) {
	defer e.audited(ctx, "getProcess", id, &err)
	b, c, cmd, err := e.process(ctx, "getProcess", id, procID)
	if err != nil {
		return nil, err
	}
	if cmd.Running {
		st, err := c.Attach(ctx, procID, [2]uint64{cmd.StdoutBytes, cmd.StderrBytes}, true, func(bool, uint64, []byte) error { return nil })
		if ctx.Err() != nil {
			return nil, &sandbox.Error{Kind: sandbox.ErrTimeout, Msg: "process still running", Err: ctx.Err()}
		}
		if err != nil {
			return nil, agentErr(err)
		}
		cmd.Running, cmd.Exit = false, st
	}
	return e.processView(ctx, b, c, cmd, true)
}

// KillProcess sends a signal (default SIGKILL) to a background process's
// process group.
func (e *Engine) KillProcess(ctx context.Context, id, procID string, signal int) (err error) {
	defer e.audited(ctx, "killProcess", id, &err)
	if signal == 0 {
		signal = 9
	}
	if signal < 1 || signal > 64 {
		return sandbox.Errorf(sandbox.ErrInvalid, "signal", "must be 1-64")
	}
	_, c, cmd, err := e.process(ctx, "killProcess", id, procID)
	if err != nil {
		return err
	}
	if !cmd.Running {
		return sandbox.Errorf(sandbox.ErrState, "", "process %s has exited", procID)
	}
	if err := c.Signal(ctx, procID, signal); err != nil {
		return agentErr(err)
	}
	return nil
}

// ListProcesses returns a sandbox's background processes, oldest first,
// without their output (GetProcess has it).
func (e *Engine) ListProcesses(ctx context.Context, id string) ([]sandbox.Process, error) {
	b, c, err := e.agentFor(ctx, "listProcesses", id)
	if err != nil {
		return nil, err
	}
	cmds, err := c.Commands(ctx)
	if err != nil {
		return nil, agentErr(err)
	}
	out := []sandbox.Process{}
	for _, cmd := range cmds {
		p, err := e.processView(ctx, b, c, cmd, false)
		if err != nil {
			return nil, err
		}
		out = append(out, *p)
	}
	return out, nil
}

// ProcessOutput delivers a background process's output from offsets
// (bytes of stdout and stderr already seen) on: what the agent still
// keeps, then, with follow, what comes until the process ends. It returns
// the process's exit once it has ended (nil when it stops before: no
// follow, or ctx done). A chunk's offset past the previous one's end says
// that the agent's ring dropped the bytes between.
func (e *Engine) ProcessOutput(ctx context.Context, id, procID string, offsets [2]uint64, follow bool, out agentclient.Output) (_ *sandbox.ExecResult, err error) {
	defer e.audited(ctx, "getProcessOutput", id, &err)
	_, c, _, err := e.process(ctx, "getProcessOutput", id, procID)
	if err != nil {
		return nil, err
	}
	st, err := c.Attach(ctx, procID, offsets, follow, out)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, agentclient.ErrGuest) {
			return nil, nil // the caller left
		}
		return nil, agentErr(err)
	}
	if st == nil {
		return nil, nil
	}
	return result(agentclient.ExecResult{ExitStatus: *st}), nil
}
