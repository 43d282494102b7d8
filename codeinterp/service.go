package codeinterp

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/history"
	"github.com/harebox/harebox/sandbox"
)

// The Service answers the code interpreter's calls on sandboxes (the REST
// API and the E2B listener call it directly): each is authorized on its
// sandbox for the principal in the context and audited, a cell is
// recorded in the sandbox's command history. The engine gives it its
// running sandboxes (Sandboxes) and has it forget a sandbox's client when
// the sandbox's machine goes.

// Agent is what the service needs of a sandbox's agent: a connection to a
// port on the guest's loopback (agentclient.Client's Connect).
type Agent interface {
	Connect(ctx context.Context, port uint16) (net.Conn, error)
}

// Sandbox is a running sandbox, as the engine gives it for one call.
type Sandbox struct {
	ID string
	// Image is its image's name; Interpreter reports whether that image
	// has an interpreter (images.Image.CodeInterpreter). It may read the
	// image's manifest: it is asked only when a client is made.
	Image       string
	Interpreter func() (bool, error)
	// Agent is its live agent connection; its errors are sandbox errors.
	// A new connection (the machine started again) gets a new client.
	Agent Agent
	// Env is what the sandbox is given in its environment; a cell sees
	// it under the request's own.
	Env map[string]string
	// History is the sandbox as its command history records it.
	History history.Sandbox
}

// Sandboxes is what the service needs of the sandboxes (the engine).
type Sandboxes interface {
	// Check authorizes action on sandbox id for the principal in ctx; a
	// sandbox the principal may not see is ErrNotFound.
	Check(ctx context.Context, action, id string) error
	// Running returns sandbox id, which must be running (the caller has
	// authorized the call).
	Running(ctx context.Context, id string) (*Sandbox, error)
	// AccountOf is the account sandbox id belongs to, for its audit
	// entries ("" when there is no such sandbox).
	AccountOf(ctx context.Context, id string) string
}

// History records a finished cell in its sandbox's history
// (history.Service).
type History interface {
	Record(ctx context.Context, b history.Sandbox, kind string, r *sandbox.ExecRequest, started time.Time, res *sandbox.ExecResult)
}

// Auditor records a call, and how it ended, in the audit log.
type Auditor interface {
	Record(ctx context.Context, action, accountID, target string, err error)
}

// ServiceOptions are a Service's parts.
type ServiceOptions struct {
	Sandboxes Sandboxes
	History   History
	Audit     Auditor
	// Client are the options of each sandbox's Client.
	Client Options
	// Now is the clock of the history's entries (default time.Now).
	Now func() time.Time
}

// Service runs cells and manages contexts in the sandboxes' interpreters.
// It is safe for concurrent use.
type Service struct {
	o ServiceOptions

	mu      sync.Mutex
	clients map[string]held // by sandbox
}

// held is a sandbox's client and the agent connection it dials through.
type held struct {
	agent  Agent
	client *Client
}

// NewService returns a Service.
func NewService(o ServiceOptions) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Service{o: o, clients: map[string]held{}}
}

// Forget closes sandbox id's client: the engine calls it when the
// sandbox's machine goes (destroyed, stopped, hibernated).
func (s *Service) Forget(id string) {
	s.mu.Lock()
	h, ok := s.clients[id]
	delete(s.clients, id)
	s.mu.Unlock()
	if ok {
		h.client.Close()
	}
}

// Close closes every sandbox's client.
func (s *Service) Close() {
	s.mu.Lock()
	all := s.clients
	s.clients = map[string]held{}
	s.mu.Unlock()
	for _, h := range all {
		h.client.Close()
	}
}

func (s *Service) audited(ctx context.Context, action, id string, err *error) {
	s.o.Audit.Record(ctx, action, s.o.Sandboxes.AccountOf(ctx, id), id, *err)
}

// held returns sandbox id's client if it dials through agent, else nil.
func (s *Service) held(id string, agent Agent) *Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.clients[id]; ok && h.agent == agent {
		return h.client
	}
	return nil
}

// client authorizes action on running sandbox id and returns its
// interpreter's client.
func (s *Service) client(ctx context.Context, action, id string) (*Sandbox, *Client, error) {
	if err := s.o.Sandboxes.Check(ctx, action, id); err != nil {
		return nil, nil, err
	}
	sb, err := s.o.Sandboxes.Running(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if c := s.held(id, sb.Agent); c != nil {
		return sb, c, nil
	}
	has, err := sb.Interpreter()
	if err != nil {
		return nil, nil, err
	}
	if !has {
		return nil, nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s has no code interpreter: its image (%s) has none; create one from the code-interpreter image", id, sb.Image)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.clients[id]
	if ok && h.agent == sb.Agent { // (made meanwhile)
		return sb, h.client, nil
	}
	if ok {
		h.client.Close() // (through a connection that is gone)
	}
	agent := sb.Agent
	c := New(func(ctx context.Context) (net.Conn, error) {
		return agent.Connect(ctx, layout.InterpreterPort)
	}, s.o.Client)
	s.clients[id] = held{agent: agent, client: c}
	return sb, c, nil
}

// Run runs a cell in sandbox id's interpreter and returns how it ended;
// emit, if set, gets its output, results and errors as they come. The
// cell sees the sandbox's variables under the request's.
func (s *Service) Run(ctx context.Context, id string, r sandbox.CodeRequest, emit func(sandbox.CodeEvent) error) (_ *sandbox.CodeExecution, err error) {
	defer s.audited(ctx, "runCode", id, &err)
	sb, c, err := s.client(ctx, "runCode", id)
	if err != nil {
		return nil, err
	}
	if err := r.Check(); err != nil {
		return nil, err
	}
	env := map[string]string{}
	for k, v := range sb.Env {
		env[k] = v
	}
	for k, v := range r.Env {
		env[k] = v
	}
	started := s.o.Now()
	x, err := c.Run(ctx, r, env, emit)
	if err != nil {
		return nil, err
	}
	s.o.History.Record(ctx, sb.History, "code", &sandbox.ExecRequest{Cmd: r.Code}, started, historyOf(x))
	return x, nil
}

// historyOf is what the command history keeps of a cell: its output, and
// its error as stderr's last line.
func historyOf(x *sandbox.CodeExecution) *sandbox.ExecResult {
	res := &sandbox.ExecResult{Stdout: x.Stdout, Stderr: x.Stderr, DurationMS: x.DurationMS,
		StdoutTruncated: x.StdoutTruncated, StderrTruncated: x.StderrTruncated, TimedOut: x.Status == sandbox.CodeTimeout}
	if x.Error != nil {
		res.ExitCode = 1
		res.Stderr += x.Error.Name + ": " + x.Error.Value + "\n"
	}
	return res
}

// Contexts lists sandbox id's interpreter contexts.
func (s *Service) Contexts(ctx context.Context, id string) ([]sandbox.CodeContext, error) {
	_, c, err := s.client(ctx, "listCodeContexts", id)
	if err != nil {
		return nil, err
	}
	return c.Contexts(ctx)
}

// CreateContext starts a context (a kernel of its own).
func (s *Service) CreateContext(ctx context.Context, id string, r sandbox.CodeContextRequest) (_ *sandbox.CodeContext, err error) {
	defer s.audited(ctx, "createCodeContext", id, &err)
	_, c, err := s.client(ctx, "createCodeContext", id)
	if err != nil {
		return nil, err
	}
	return c.CreateContext(ctx, r)
}

// RestartContext gives a context a fresh kernel (its state is lost; a
// dead one comes back).
func (s *Service) RestartContext(ctx context.Context, id, contextID string) (_ *sandbox.CodeContext, err error) {
	defer s.audited(ctx, "restartCodeContext", id, &err)
	_, c, err := s.client(ctx, "restartCodeContext", id)
	if err != nil {
		return nil, err
	}
	return c.RestartContext(ctx, contextID)
}

// DeleteContext shuts a context's kernel down.
func (s *Service) DeleteContext(ctx context.Context, id, contextID string) (err error) {
	defer s.audited(ctx, "deleteCodeContext", id, &err)
	_, c, err := s.client(ctx, "deleteCodeContext", id)
	if err != nil {
		return err
	}
	return c.DeleteContext(ctx, contextID)
}
