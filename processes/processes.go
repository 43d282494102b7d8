// Package processes runs a sandbox's background processes over its guest
// agent.
//
// A background process is a command the guest's agent owns: it runs on
// when hareboxd restarts or the caller goes away, with its output kept in
// the agent (a bounded ring per stream) and its exit kept until the agent
// forgets it (the oldest finished first, once 64 are kept). The host keeps
// only what the agent does not report: each process's command line and
// how it was started (tag, env, cwd, user, terminal), for as long as the
// engine runs and the sandbox's machine lives (Forget).
//
// Every call is authorized on its sandbox for the principal in the
// context and recorded in the audit log, as the engine's own calls are.
// The engine gives the service its running sandboxes (Sandboxes) and
// their agents, with the agent's errors translated into kinds.
package processes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/history"
	"github.com/harebox/harebox/sandbox"
	"google.golang.org/grpc/codes"
)

// grace is how long past its timeout a background process may run before
// the host kills it.
const grace = 10 * time.Second

// Agent is what the service needs of a sandbox's agent (agentclient.Client's
// calls on the commands it owns).
type Agent interface {
	Start(ctx context.Context, id string, req agentclient.ExecRequest, stdin []byte, ringBytes int) (agentclient.Command, error)
	Commands(ctx context.Context) ([]agentclient.Command, error)
	Attach(ctx context.Context, id string, offsets [2]uint64, follow bool, out agentclient.Output) (*agentclient.ExitStatus, error)
	Signal(ctx context.Context, id string, sig int) error
	Input(ctx context.Context, id string, stdin []byte) error
	CloseInput(ctx context.Context, id string) error
	Resize(ctx context.Context, id string, rows, cols uint16) error
}

// Sandbox is a running sandbox, as the engine gives it for one call.
type Sandbox struct {
	ID string
	// Agent is its agent; its errors are sandbox errors (their kinds are
	// what the API answers with).
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
	// MaxOutputBytes bounds what is read of each stream of a finished
	// process, and what its history entry is given.
	MaxOutputBytes int
	Log            *slog.Logger
}

// Service runs the background processes of the sandboxes. It is safe for
// concurrent use.
type Service struct {
	o Options
	// ctx bounds the following of started processes to their end (for
	// their history): until the engine closes.
	ctx context.Context

	mu    sync.Mutex
	notes map[string]map[string]note // by sandbox, then process
}

// note is what the host keeps of a process: its command line and how it
// was started.
type note struct {
	cmd  string
	argv []string
	tag  string
	env  map[string]string
	cwd  string
	user string
	pty  bool
}

// StartOptions are what a start may ask beyond its ExecRequest (E2B's
// process service asks them).
type StartOptions struct {
	// KeepStdin keeps the process's stdin open after the request's Stdin,
	// for SendInput (an agent of protocol 4).
	KeepStdin bool
	// PTY runs it on a terminal of Rows by Cols (1-1000 each); its output
	// is then all stdout, and its input the terminal's.
	PTY        bool
	Rows, Cols uint16
	// Tag names it, for Find (at most 256 bytes).
	Tag string
}

func (o *StartOptions) check() error {
	if o.PTY && (o.Rows < 1 || o.Rows > 1000 || o.Cols < 1 || o.Cols > 1000) {
		return sandbox.Errorf(sandbox.ErrInvalid, "pty", "a terminal's rows and cols must be 1-1000")
	}
	if len(o.Tag) > 256 {
		return sandbox.Errorf(sandbox.ErrInvalid, "tag", "must be at most 256 bytes")
	}
	return nil
}

// New returns a Service whose followers of started processes run under
// ctx (canceled when the engine closes).
func New(ctx context.Context, o Options) *Service {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Service{o: o, ctx: ctx, notes: map[string]map[string]note{}}
}

// Forget drops what the host keeps of sandbox id's processes: the engine
// calls it when the sandbox's machine goes (destroyed, stopped or
// hibernated).
func (s *Service) Forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.notes, id)
}

func (s *Service) put(id, procID string, n note) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.notes[id] == nil {
		s.notes[id] = map[string]note{}
	}
	s.notes[id][procID] = n
}

func (s *Service) drop(id, procID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.notes[id], procID)
	if len(s.notes[id]) == 0 {
		delete(s.notes, id)
	}
}

func (s *Service) note(id, procID string) note {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.notes[id][procID]
}

// audited records, when a call ends, what the principal in ctx did to
// sandbox id (and how it ended).
func (s *Service) audited(ctx context.Context, action, id string, err *error) {
	s.o.Audit.Record(ctx, action, s.o.Sandboxes.AccountOf(ctx, id), id, *err)
}

// running authorizes action on sandbox id and returns it, running.
func (s *Service) running(ctx context.Context, action, id string) (*Sandbox, error) {
	if err := s.o.Sandboxes.Check(ctx, action, id); err != nil {
		return nil, err
	}
	return s.o.Sandboxes.Running(ctx, id)
}

// Start runs a command in the background in sandbox id and returns once
// it has started.
func (s *Service) Start(ctx context.Context, id string, r sandbox.ExecRequest) (*sandbox.Process, error) {
	return s.StartWith(ctx, id, r, StartOptions{})
}

// StartWith is Start with options: stdin kept open, a terminal, a tag.
func (s *Service) StartWith(ctx context.Context, id string, r sandbox.ExecRequest, o StartOptions) (_ *sandbox.Process, err error) {
	defer s.audited(ctx, "startProcess", id, &err)
	if err := s.o.Sandboxes.Check(ctx, "startProcess", id); err != nil {
		return nil, err
	}
	if err := r.Check(); err != nil {
		return nil, err
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	sb, err := s.o.Sandboxes.Running(ctx, id)
	if err != nil {
		return nil, err
	}
	procID := "proc_" + strings.TrimPrefix(sandbox.NewID(), sandbox.IDPrefix)
	// (Noted first: a list that comes while it starts shows its command.)
	s.put(id, procID, note{cmd: r.Cmd, argv: r.Argv, tag: o.Tag, env: maps.Clone(r.Env), cwd: r.Cwd, user: r.User, pty: o.PTY})
	ar := sb.Request(&r)
	ar.KeepStdin, ar.PTY, ar.Rows, ar.Cols = o.KeepStdin, o.PTY, o.Rows, o.Cols
	cmd, err := sb.Agent.Start(ctx, procID, ar, r.Stdin, 0)
	if err != nil {
		// (Also what a Forget that ran before this put would have
		// dropped: the machine went, and its agent with it.)
		s.drop(id, procID)
		return nil, err
	}
	go s.record(sb, procID, r)
	return s.view(ctx, sb, cmd, false)
}

// record follows a process the service started to its end, for the
// sandbox's command history (kept with the output's first
// MaxOutputBytes). One that ends while no engine runs is not recorded.
func (s *Service) record(sb *Sandbox, procID string, r sandbox.ExecRequest) {
	started := time.Now()
	// The agent enforces the timeout; the host kills what outlives it by
	// grace anyway (an agent that is wedged or was replaced by root in
	// the guest), as a synchronous exec stops waiting.
	backstop := time.AfterFunc(r.Timeout()+grace, func() {
		ctx, cancel := context.WithTimeout(s.ctx, 10*time.Second)
		defer cancel()
		if err := sb.Agent.Signal(ctx, procID, 9); err == nil {
			s.o.Log.Warn("background process outlived its timeout; killed by the host", "sandbox", sb.ID, "process", procID, "timeout", r.Timeout())
		}
	})
	defer backstop.Stop()
	out, errw := agentclient.NewCapBuffer(s.o.MaxOutputBytes), agentclient.NewCapBuffer(s.o.MaxOutputBytes)
	st, err := sb.Agent.Attach(s.ctx, procID, [2]uint64{}, true, collect(out, errw))
	if err != nil || st == nil {
		return // (the engine closed, or the agent went away)
	}
	res := agentclient.ExecResult{ExitStatus: *st, Stdout: out.Bytes(), Stderr: errw.Bytes(),
		StdoutTruncated: out.Truncated(), StderrTruncated: errw.Truncated()}.Result()
	s.o.History.Record(context.Background(), sb.History, "background", &r, started, res)
}

// collect is an Output into a buffer per stream.
func collect(out, errw *agentclient.CapBuffer) agentclient.Output {
	return func(stderr bool, _ uint64, data []byte) error {
		if stderr {
			errw.Write(data)
		} else {
			out.Write(data)
		}
		return nil
	}
}

// view is a process as the API shows it; withOutput reads its output from
// the agent (up to MaxOutputBytes of each stream) once it has finished.
func (s *Service) view(ctx context.Context, sb *Sandbox, cmd agentclient.Command, withOutput bool) (*sandbox.Process, error) {
	n := s.note(sb.ID, cmd.ID)
	p := &sandbox.Process{ID: cmd.ID, SandboxID: sb.ID, Cmd: n.cmd, Argv: n.argv, PID: cmd.PID, Running: cmd.Running, StartedAt: cmd.Started,
		Tag: n.tag, Env: maps.Clone(n.env), Cwd: n.cwd, User: n.user, PTY: n.pty}
	if cmd.Exit == nil {
		return p, nil
	}
	res := agentclient.ExecResult{ExitStatus: *cmd.Exit}
	if withOutput {
		out, errw := agentclient.NewCapBuffer(s.o.MaxOutputBytes), agentclient.NewCapBuffer(s.o.MaxOutputBytes)
		if _, err := sb.Agent.Attach(ctx, cmd.ID, [2]uint64{}, false, collect(out, errw)); err != nil {
			return nil, err
		}
		res.Stdout, res.Stderr = out.Bytes(), errw.Bytes()
		// (What the agent's ring no longer held is missing too.)
		res.StdoutTruncated = out.Truncated() || uint64(len(res.Stdout)) < cmd.StdoutBytes
		res.StderrTruncated = errw.Truncated() || uint64(len(res.Stderr)) < cmd.StderrBytes
	}
	p.Result = res.Result()
	return p, nil
}

// process authorizes action on sandbox id and finds its process procID.
func (s *Service) process(ctx context.Context, action, id, procID string) (*Sandbox, agentclient.Command, error) {
	sb, err := s.running(ctx, action, id)
	if err != nil {
		return nil, agentclient.Command{}, err
	}
	cmds, err := sb.Agent.Commands(ctx)
	if err != nil {
		return nil, agentclient.Command{}, err
	}
	for _, cmd := range cmds {
		if cmd.ID == procID {
			return sb, cmd, nil
		}
	}
	return nil, agentclient.Command{}, sandbox.Errorf(sandbox.ErrNotFound, "", "no process %q in sandbox %s", procID, id)
}

// Get returns a background process as it is now, with its output once it
// has finished.
func (s *Service) Get(ctx context.Context, id, procID string) (_ *sandbox.Process, err error) {
	defer s.audited(ctx, "getProcess", id, &err)
	sb, cmd, err := s.process(ctx, "getProcess", id, procID)
	if err != nil {
		return nil, err
	}
	return s.view(ctx, sb, cmd, true)
}

// Wait waits until a background process exits (or ctx is done) and
// returns it with its result.
func (s *Service) Wait(ctx context.Context, id, procID string) (_ *sandbox.Process, err error) {
	defer s.audited(ctx, "getProcess", id, &err)
	sb, cmd, err := s.process(ctx, "getProcess", id, procID)
	if err != nil {
		return nil, err
	}
	if cmd.Running {
		st, err := sb.Agent.Attach(ctx, procID, [2]uint64{cmd.StdoutBytes, cmd.StderrBytes}, true, func(bool, uint64, []byte) error { return nil })
		if ctx.Err() != nil {
			return nil, &sandbox.Error{Kind: sandbox.ErrTimeout, Msg: "process still running", Err: ctx.Err()}
		}
		if err != nil {
			return nil, err
		}
		cmd.Running, cmd.Exit = false, st
	}
	return s.view(ctx, sb, cmd, true)
}

// Kill sends a signal (default SIGKILL) to a background process's process
// group.
func (s *Service) Kill(ctx context.Context, id, procID string, signal int) (err error) {
	defer s.audited(ctx, "killProcess", id, &err)
	if signal == 0 {
		signal = 9
	}
	if signal < 1 || signal > 64 {
		return sandbox.Errorf(sandbox.ErrInvalid, "signal", "must be 1-64")
	}
	sb, cmd, err := s.process(ctx, "killProcess", id, procID)
	if err != nil {
		return err
	}
	if !cmd.Running {
		return sandbox.Errorf(sandbox.ErrState, "", "process %s has exited", procID)
	}
	return sb.Agent.Signal(ctx, procID, signal)
}

// List returns a sandbox's background processes, oldest first, without
// their output (Get has it).
func (s *Service) List(ctx context.Context, id string) ([]sandbox.Process, error) {
	sb, err := s.running(ctx, "listProcesses", id)
	if err != nil {
		return nil, err
	}
	cmds, err := sb.Agent.Commands(ctx)
	if err != nil {
		return nil, err
	}
	out := []sandbox.Process{}
	for _, cmd := range cmds {
		p, err := s.view(ctx, sb, cmd, false)
		if err != nil {
			return nil, err
		}
		out = append(out, *p)
	}
	return out, nil
}

// Output delivers a background process's output from offsets (bytes of
// stdout and stderr already seen) on: what the agent still keeps, then,
// with follow, what comes until the process ends. It returns the
// process's exit once it has ended (nil when it stops before: no follow,
// or ctx done). A chunk's offset past the previous one's end says that the
// agent's ring dropped the bytes between.
func (s *Service) Output(ctx context.Context, id, procID string, offsets [2]uint64, follow bool, out agentclient.Output) (_ *sandbox.ExecResult, err error) {
	defer s.audited(ctx, "getProcessOutput", id, &err)
	sb, err := s.running(ctx, "getProcessOutput", id)
	if err != nil {
		return nil, err
	}
	// (No look at the agent's list first: the attach says whether the
	// process is there, one round trip less for every follow.)
	st, err := sb.Agent.Attach(ctx, procID, offsets, follow, out)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, agentclient.ErrGuest) {
			return nil, nil // the caller left
		}
		if agentclient.Code(err) == codes.NotFound {
			return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no process %q in sandbox %s", procID, id)
		}
		return nil, err
	}
	if st == nil {
		return nil, nil
	}
	return agentclient.ExecResult{ExitStatus: *st}.Result(), nil
}

// Find returns the process of sandbox id whose PID in the guest is pid
// (when not 0), or whose tag is tag (when pid is 0): a running one before
// one that has exited (the guest reuses PIDs), the newest first. With it
// come the bytes each of its streams has produced, from where a follow of
// its output (Output) starts at what comes next. It is a list's lookup,
// authorized as one and not audited.
func (s *Service) Find(ctx context.Context, id string, pid int, tag string) (*sandbox.Process, [2]uint64, error) {
	if (pid == 0) == (tag == "") {
		return nil, [2]uint64{}, sandbox.Errorf(sandbox.ErrInvalid, "process", "give a pid or a tag")
	}
	sb, err := s.running(ctx, "listProcesses", id)
	if err != nil {
		return nil, [2]uint64{}, err
	}
	cmds, err := sb.Agent.Commands(ctx)
	if err != nil {
		return nil, [2]uint64{}, err
	}
	var found *agentclient.Command
	// (Oldest first: the last match of each kind is the newest.)
	for i := range cmds {
		c := &cmds[i]
		if pid != 0 && c.PID != pid || tag != "" && s.note(id, c.ID).tag != tag {
			continue
		}
		if found == nil || c.Running || !found.Running {
			found = c
		}
	}
	if found == nil {
		what := fmt.Sprintf("with pid %d", pid)
		if pid == 0 {
			what = fmt.Sprintf("tagged %q", tag)
		}
		return nil, [2]uint64{}, sandbox.Errorf(sandbox.ErrNotFound, "", "no process %s in sandbox %s", what, id)
	}
	p, err := s.view(ctx, sb, *found, false)
	if err != nil {
		return nil, [2]uint64{}, err
	}
	return p, [2]uint64{found.StdoutBytes, found.StderrBytes}, nil
}

// SendInput gives a running background process, started with its stdin
// kept open, input: a new terminal size first, then stdin bytes, then
// their end.
func (s *Service) SendInput(ctx context.Context, id, procID string, in sandbox.ProcessInput) (err error) {
	defer s.audited(ctx, "sendProcessInput", id, &err)
	// (Authorized before the input is looked at, as a start is.)
	if err := s.o.Sandboxes.Check(ctx, "sendProcessInput", id); err != nil {
		return err
	}
	if err := in.Check(); err != nil {
		return err
	}
	sb, cmd, err := s.process(ctx, "sendProcessInput", id, procID)
	if err != nil {
		return err
	}
	if !cmd.Running {
		return sandbox.Errorf(sandbox.ErrState, "", "process %s has exited", procID)
	}
	if in.Rows != 0 {
		if err := sb.Agent.Resize(ctx, procID, in.Rows, in.Cols); err != nil {
			return err
		}
	}
	if len(in.Stdin) > 0 {
		if err := sb.Agent.Input(ctx, procID, in.Stdin); err != nil {
			return err
		}
	}
	if in.EOF {
		return sb.Agent.CloseInput(ctx, procID)
	}
	return nil
}
