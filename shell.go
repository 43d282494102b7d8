package harebox

import (
	"context"
	"io"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/sandbox"
)

// Shell runs r as an interactive session whose input streams: stdin goes
// to the command as it comes, until its end.
//
// With a terminal (term not nil), r runs on a pseudo-terminal: stdin is
// typed into it (its end is ^D) and stdout receives what it shows (output
// and echo, stdout and stderr together; stderr is not used). Without r.Cmd
// or r.Argv it runs the user's login shell, and it has no timeout unless r
// asks for one.
//
// Without a terminal, r runs as an exec does (its timeout included), with
// stdin as its standard input and its two outputs apart.
//
// It ends when the command exits or ctx is done (which kills it).
func (e *Engine) Shell(ctx context.Context, id string, r sandbox.ExecRequest, term *sandbox.Terminal, stdin io.Reader, stdout, stderr io.Writer) (_ *sandbox.ExecResult, err error) {
	defer e.audited(ctx, "openPty", id, &err)
	if term != nil && r.Cmd == "" && len(r.Argv) == 0 {
		r.Cmd = `exec "${SHELL:-/bin/sh}" -l`
	}
	b, c, err := e.execTarget(ctx, "openPty", id, &r)
	if err != nil {
		return nil, err
	}
	ar := b.agentRequest(&r)
	eio := agentclient.ExecIO{Stdin: stdin, Stdout: stdout, Stderr: stderr}
	kind := "stream"
	if term != nil {
		kind = "shell"
		ar.Timeout = 0
		if r.TimeoutSeconds > 0 {
			ar.Timeout = r.Timeout()
		}
		ar.PTY, ar.Rows, ar.Cols = true, term.Rows, term.Cols
		eio.Stderr, eio.Resize, eio.Signals = stdout, term.Resize, term.Signals
	}
	started := e.opts.Now()
	st, err := c.ExecStream(ctx, ar, eio)
	if err != nil {
		return nil, err
	}
	res := agentclient.ExecResult{ExitStatus: st}.Result()
	e.history.Record(ctx, b.historyRef(), kind, &r, started, res)
	return res, nil
}
