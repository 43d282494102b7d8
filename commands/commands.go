// Package commands runs commands in running sandboxes through their guest
// agents, in the foreground: a command waited for (Exec), one whose
// output streams as it comes (Stream), and interactive sessions, on a
// terminal or not (Shell). Background processes, which outlive their
// caller, are package processes'.
//
// Every call is authorized on its sandbox for the principal in the
// context, recorded in the audit log as the engine's own calls are, and
// a finished command in its sandbox's command history. The engine gives
// the service its running sandboxes (Sandboxes) and their agents, with
// the agent's errors translated into kinds.
package commands

import (
	"bytes"
	"context"
	"io"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/history"
	"github.com/harebox/harebox/sandbox"
)

// Agent is what the service needs of a sandbox's agent (agentclient.Client's
// foreground commands).
type Agent interface {
	Exec(ctx context.Context, req agentclient.ExecRequest, stdin io.Reader) (agentclient.ExecResult, error)
	ExecStream(ctx context.Context, req agentclient.ExecRequest, eio agentclient.ExecIO) (agentclient.ExitStatus, error)
}

// Sandbox is a running sandbox, as the engine gives it for one call.
type Sandbox struct {
	// Agent is its agent; its errors are sandbox errors.
	Agent Agent
	// Request is what the agent runs for r: the sandbox's environment
	// under r's own.
	Request func(r *sandbox.ExecRequest) agentclient.ExecRequest
	// History is the sandbox as its command history records it.
	History history.Sandbox
}

// Sandboxes is what the service needs of the sandboxes (the engine).
type Sandboxes interface {
	// Check authorizes action on sandbox id for the principal in ctx. A
	// sandbox the principal may not see is ErrNotFound, exactly like a
	// missing one.
	Check(ctx context.Context, action, id string) error
	// Running returns sandbox id, which must be running, with a live
	// connection to its agent (the caller has authorized the call).
	Running(ctx context.Context, id string) (*Sandbox, error)
	// AccountOf is the account sandbox id belongs to, for its audit
	// entries ("" when there is no such sandbox).
	AccountOf(ctx context.Context, id string) string
}

// History records a finished command in its sandbox's history
// (history.Service).
type History interface {
	Record(ctx context.Context, b history.Sandbox, kind string, r *sandbox.ExecRequest, started time.Time, res *sandbox.ExecResult)
}

// Auditor records a call, and how it ended, in the audit log.
type Auditor interface {
	Record(ctx context.Context, action, accountID, target string, err error)
}

// Options are a Service's parts.
type Options struct {
	Sandboxes Sandboxes
	History   History
	Audit     Auditor
	// Now is the clock of the command history.
	Now func() time.Time
}

// Service runs foreground commands. It is safe for concurrent use.
type Service struct{ o Options }

// New returns a Service.
func New(o Options) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Service{o: o}
}

// audited records, when a call ends, what the principal in ctx did to
// sandbox id (and how it ended) in the audit log.
func (s *Service) audited(ctx context.Context, action, id string, err *error) {
	s.o.Audit.Record(ctx, action, s.o.Sandboxes.AccountOf(ctx, id), id, *err)
}

// target authorizes action on sandbox id, validates r and returns the
// sandbox it runs in.
func (s *Service) target(ctx context.Context, action, id string, r *sandbox.ExecRequest) (*Sandbox, error) {
	if err := s.o.Sandboxes.Check(ctx, action, id); err != nil {
		return nil, err
	}
	if err := r.Check(); err != nil {
		return nil, err
	}
	return s.o.Sandboxes.Running(ctx, id)
}

// Exec runs a command in sandbox id and waits for it. Output beyond the
// cap the engine gives its agent clients is dropped and flagged.
func (s *Service) Exec(ctx context.Context, id string, r sandbox.ExecRequest) (_ *sandbox.ExecResult, err error) {
	defer s.audited(ctx, "exec", id, &err)
	b, err := s.target(ctx, "exec", id, &r)
	if err != nil {
		return nil, err
	}
	var stdin io.Reader
	if r.Stdin != nil {
		stdin = bytes.NewReader(r.Stdin)
	}
	started := s.o.Now()
	res, err := b.Agent.Exec(ctx, b.Request(&r), stdin)
	if err != nil {
		return nil, err
	}
	out := res.Result()
	s.o.History.Record(ctx, b.History, "exec", &r, started, out)
	return out, nil
}

// Stream runs a command in sandbox id and writes its output as it comes.
// Stdin, if not nil, is fed to the command (else r.Stdin, if set).
func (s *Service) Stream(ctx context.Context, id string, r sandbox.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (_ *sandbox.ExecResult, err error) {
	defer s.audited(ctx, "execStream", id, &err)
	b, err := s.target(ctx, "execStream", id, &r)
	if err != nil {
		return nil, err
	}
	if stdin == nil && r.Stdin != nil {
		stdin = bytes.NewReader(r.Stdin)
	}
	started := s.o.Now()
	ho, he, stdout, stderr := history.Writers(stdout, stderr)
	st, err := b.Agent.ExecStream(ctx, b.Request(&r), agentclient.ExecIO{Stdin: stdin, Stdout: stdout, Stderr: stderr})
	if err != nil {
		return nil, err
	}
	out := agentclient.ExecResult{ExitStatus: st}.Result()
	kept := *out
	kept.Stdout, kept.StdoutTruncated = string(ho.Bytes()), ho.Truncated()
	kept.Stderr, kept.StderrTruncated = string(he.Bytes()), he.Truncated()
	s.o.History.Record(ctx, b.History, "stream", &r, started, &kept)
	return out, nil
}

// Shell runs r in sandbox id as an interactive session whose input
// streams: stdin goes to the command as it comes, until its end.
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
func (s *Service) Shell(ctx context.Context, id string, r sandbox.ExecRequest, term *sandbox.Terminal, stdin io.Reader, stdout, stderr io.Writer) (_ *sandbox.ExecResult, err error) {
	defer s.audited(ctx, "openPty", id, &err)
	if term != nil && r.Cmd == "" && len(r.Argv) == 0 {
		r.Cmd = `exec "${SHELL:-/bin/sh}" -l`
	}
	b, err := s.target(ctx, "openPty", id, &r)
	if err != nil {
		return nil, err
	}
	ar := b.Request(&r)
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
	started := s.o.Now()
	st, err := b.Agent.ExecStream(ctx, ar, eio)
	if err != nil {
		return nil, err
	}
	res := agentclient.ExecResult{ExitStatus: st}.Result()
	s.o.History.Record(ctx, b.History, kind, &r, started, res)
	return res, nil
}
