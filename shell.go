package harebox

import (
	"context"
	"io"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/sandbox"
)

// Terminal is an interactive session's terminal: its size at the start,
// and what changes it while the session runs.
type Terminal struct {
	Rows, Cols uint16
	// Resize delivers new sizes (rows, cols); Signals signals for the
	// session's process group. Either may be nil.
	Resize  <-chan [2]uint16
	Signals <-chan int
}

// Shell runs r on a pseudo-terminal in the sandbox, as an interactive
// session: stdin is typed into the terminal (its end is ^D), out receives
// what the terminal shows (output and echo, stdout and stderr together).
// Without r.Cmd or r.Argv it runs the user's login shell. The session has
// no timeout unless r asks for one; it ends when its process exits or ctx
// is done (which kills it).
func (e *Engine) Shell(ctx context.Context, id string, r sandbox.ExecRequest, term Terminal, stdin io.Reader, out io.Writer) (_ *sandbox.ExecResult, err error) {
	defer e.audited(ctx, "openPty", id, &err)
	if r.Cmd == "" && len(r.Argv) == 0 {
		r.Cmd = `exec "${SHELL:-/bin/sh}" -l`
	}
	b, c, err := e.execTarget(ctx, "openPty", id, &r)
	if err != nil {
		return nil, err
	}
	ar := b.agentRequest(&r)
	ar.Timeout = 0
	if r.TimeoutSeconds > 0 {
		ar.Timeout = r.Timeout()
	}
	ar.PTY, ar.Rows, ar.Cols = true, term.Rows, term.Cols
	started := e.opts.Now()
	st, err := c.ExecStream(ctx, ar, agentclient.ExecIO{Stdin: stdin, Stdout: out, Stderr: out, Resize: term.Resize, Signals: term.Signals})
	if err != nil {
		return nil, agentErr(err)
	}
	res := result(agentclient.ExecResult{ExitStatus: st})
	e.remember(ctx, b, "shell", &r, started, res)
	return res, nil
}
