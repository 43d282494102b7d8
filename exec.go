package harebox

import (
	"context"
	"io"

	"github.com/harebox/harebox/commands"
	"github.com/harebox/harebox/sandbox"
)

// Foreground commands are package commands': it authorizes, audits and
// records each in its sandbox's history, and runs it through the
// sandbox's agent, which the runtime lends it. The methods below are the
// library's names for its calls.

// Commands runs foreground commands in the sandboxes, for the principal
// in the context.
func (e *Engine) Commands() *commands.Service { return e.commands }

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
