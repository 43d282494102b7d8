package guest

import (
	"context"
	"regexp"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/agentpb"
)

// Commands the agent owns: they run detached from the call that started
// them, so a host that goes away (a restart, a dropped session) finds them
// again, with their output, by ID.
const (
	// DefaultRing and MaxRing bound each stream's kept output.
	DefaultRing = 4 << 20
	MaxRing     = 64 << 20
	// MaxCommands bounds the commands kept; once full, the oldest finished
	// one is forgotten to make room, and with none finished a start is
	// refused.
	MaxCommands = 64
	// inputQueue bounds the stdin and signals waiting for a command.
	inputQueue = 16
)

var commandID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ring keeps the last size bytes of a stream and counts all of them.
type ring struct {
	size  int
	data  []byte
	start uint64 // the offset of data[0] in the stream
}

func (r *ring) write(p []byte) {
	r.data = append(r.data, p...)
	if over := len(r.data) - r.size; over > 0 {
		r.data = r.data[over:]
		r.start += uint64(over)
	}
	if cap(r.data) > 2*r.size+execChunk {
		// (Dropping from the front keeps the old array: copy once in a
		// while so it stays about size.)
		r.data = append(make([]byte, 0, len(r.data)+execChunk), r.data...)
	}
}

func (r *ring) total() uint64 { return r.start + uint64(len(r.data)) }

// read copies up to n bytes from off on, or from the oldest byte kept if
// off is older: from is where they start.
func (r *ring) read(off uint64, n int) (from uint64, b []byte) {
	off = max(off, r.start)
	if off >= r.total() {
		return off, nil
	}
	i := int(off - r.start)
	end := min(len(r.data), i+n)
	return off, append([]byte(nil), r.data[i:end]...)
}

// command is one command the agent owns.
type command struct {
	id      string
	started time.Time
	input   chan *agentpb.ExecRequest // stdin and signals, for its execution
	cancel  context.CancelFunc
	ended   <-chan struct{} // closed once it has finished
	pty     bool

	mu sync.Mutex
	// stdinOpen: started with keep_stdin, and no Input has ended it.
	stdinOpen bool
	pid       int
	out       [2]ring // stdout, stderr
	exit      *agentpb.ExecExit
	changed   chan struct{} // closed (and replaced) on every change
	begun     chan struct{} // closed once it started or failed to
}

// detached stands for an Exec call's stream for a command the agent owns:
// the execution's messages go to the command, its input comes from Start
// and Signal. (An execution calls only Send, Recv and Context.)
type detached struct {
	grpc.ServerStream
	c   *command
	ctx context.Context
}

func (d *detached) Context() context.Context { return d.ctx }

func (d *detached) Recv() (*agentpb.ExecRequest, error) {
	select {
	case m := <-d.c.input:
		return m, nil
	case <-d.ctx.Done():
		return nil, d.ctx.Err()
	}
}

func (d *detached) Send(m *agentpb.ExecResponse) error {
	c := d.c
	c.mu.Lock()
	defer c.mu.Unlock()
	switch m := m.GetMsg().(type) {
	case *agentpb.ExecResponse_StartedPid:
		c.pid = int(m.StartedPid)
		close(c.begun)
	case *agentpb.ExecResponse_Stdout:
		c.out[0].write(m.Stdout)
	case *agentpb.ExecResponse_Stderr:
		c.out[1].write(m.Stderr)
	case *agentpb.ExecResponse_Exit:
		c.exit = m.Exit
		select {
		case <-c.begun:
		default: // it never started
			close(c.begun)
		}
		// Only its input loop still waits on this context: the process
		// has been reaped.
		c.cancel()
	}
	close(c.changed)
	c.changed = make(chan struct{})
	return nil
}

// finish records an exit for a command whose Exec returned without one.
func (d *detached) finish(err error) {
	d.c.mu.Lock()
	done := d.c.exit != nil
	d.c.mu.Unlock()
	if done {
		return
	}
	msg := "the command ended without an exit status"
	if err != nil {
		msg = err.Error()
	}
	d.Send(&agentpb.ExecResponse{Msg: &agentpb.ExecResponse_Exit{Exit: &agentpb.ExecExit{ExitCode: exitStartFailed, Error: msg}}})
}

func (c *command) info() *agentpb.CommandInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return &agentpb.CommandInfo{
		Id: c.id, Pid: int32(c.pid), Running: c.exit == nil, Exit: c.exit,
		StartedUnixMs: c.started.UnixMilli(), StdoutBytes: c.out[0].total(), StderrBytes: c.out[1].total(),
	}
}

// Commands implements the agent's owned commands (Start, Attach, Signal,
// Commands) over any Exec implementation: each command runs as an Exec
// call whose stream is the command itself. The real agent and the test
// hypervisor's fake one share it.
type Commands struct {
	exec func(agentpb.Agent_ExecServer) error
	// validate refuses a start before it is kept (nil: accept).
	validate func(*agentpb.ExecStart) error
	table    commandTable
}

// NewCommands returns the commands of an agent whose Exec is exec;
// validate (may be nil) refuses what that Exec would refuse.
func NewCommands(exec func(agentpb.Agent_ExecServer) error, validate func(*agentpb.ExecStart) error) *Commands {
	return &Commands{exec: exec, validate: validate}
}

// commandTable is the commands the agent keeps.
type commandTable struct {
	mu   sync.Mutex
	byID map[string]*command
}

func (t *commandTable) get(id string) (*command, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.byID[id]
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "no command %q", id)
	}
	return c, nil
}

// add keeps c, forgetting the oldest finished command if the table is full.
func (t *commandTable) add(c *command) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byID == nil {
		t.byID = map[string]*command{}
	}
	if t.byID[c.id] != nil {
		return status.Errorf(codes.AlreadyExists, "a command %q exists", c.id)
	}
	if len(t.byID) >= MaxCommands {
		var oldest *command
		for _, o := range t.byID {
			o.mu.Lock()
			done := o.exit != nil
			o.mu.Unlock()
			if done && (oldest == nil || o.started.Before(oldest.started)) {
				oldest = o
			}
		}
		if oldest == nil {
			return status.Errorf(codes.ResourceExhausted, "%d commands run already", MaxCommands)
		}
		delete(t.byID, oldest.id)
	}
	t.byID[c.id] = c
	return nil
}

func (t *commandTable) list() []*command {
	t.mu.Lock()
	defer t.mu.Unlock()
	l := make([]*command, 0, len(t.byID))
	for _, c := range t.byID {
		l = append(l, c)
	}
	sort.Slice(l, func(i, j int) bool { return l[i].started.Before(l[j].started) })
	return l
}

// Start runs a command the agent owns (agentpb.AgentServer's Start).
func (s *Commands) Start(ctx context.Context, req *agentpb.StartRequest) (*agentpb.CommandInfo, error) {
	if !commandID.MatchString(req.GetId()) {
		return nil, status.Error(codes.InvalidArgument, "id must be 1 to 64 of A-Z, a-z, 0-9, _ and -")
	}
	st := req.GetExec()
	if st == nil {
		return nil, status.Error(codes.InvalidArgument, "exec is required")
	}
	if s.validate != nil {
		if err := s.validate(st); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
	}
	size := int(req.GetRingBytes())
	if size == 0 {
		size = DefaultRing
	}
	if size < 0 || size > MaxRing {
		return nil, status.Errorf(codes.InvalidArgument, "ring_bytes must be at most %d", MaxRing)
	}
	if (len(req.GetStdin()) > 0 || req.GetKeepStdin()) && !st.GetStdin() {
		return nil, status.Error(codes.InvalidArgument, "stdin bytes and keep_stdin need exec.stdin")
	}
	c := &command{
		id: req.GetId(), started: time.Now(), input: make(chan *agentpb.ExecRequest, inputQueue),
		changed: make(chan struct{}), begun: make(chan struct{}), pty: st.GetPty(), stdinOpen: req.GetKeepStdin(),
	}
	c.out[0].size, c.out[1].size = size, size
	c.input <- &agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Start{Start: st}}
	if st.GetStdin() {
		if len(req.GetStdin()) > 0 {
			c.input <- &agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Stdin{Stdin: req.GetStdin()}}
		}
		if !req.GetKeepStdin() {
			c.input <- &agentpb.ExecRequest{Msg: &agentpb.ExecRequest_StdinEof{StdinEof: true}}
		}
	}
	var dctx context.Context
	dctx, c.cancel = context.WithCancel(context.Background())
	c.ended = dctx.Done()
	if err := s.table.add(c); err != nil {
		c.cancel()
		return nil, err
	}
	go func() {
		d := &detached{c: c, ctx: dctx}
		err := s.exec(d)
		// An Exec that ended without an exit (it refused the start) ends
		// the command all the same.
		d.finish(err)
	}()
	select {
	case <-c.begun:
	case <-ctx.Done():
		// It starts anyway; the caller finds it by its ID.
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return c.info(), nil
}

// Attach streams a command's output (agentpb.AgentServer's Attach).
func (s *Commands) Attach(req *agentpb.AttachRequest, stream agentpb.Agent_AttachServer) error {
	c, err := s.table.get(req.GetId())
	if err != nil {
		return err
	}
	offs := [2]uint64{req.GetStdoutOffset(), req.GetStderrOffset()}
	for {
		c.mu.Lock()
		var chunks []*agentpb.AttachChunk
		for i := range c.out {
			from, b := c.out[i].read(offs[i], execChunk)
			if len(b) == 0 {
				continue
			}
			offs[i] = from + uint64(len(b))
			oc := &agentpb.OutputChunk{Offset: from, Data: b}
			if i == 0 {
				chunks = append(chunks, &agentpb.AttachChunk{Msg: &agentpb.AttachChunk_Stdout{Stdout: oc}})
			} else {
				chunks = append(chunks, &agentpb.AttachChunk{Msg: &agentpb.AttachChunk_Stderr{Stderr: oc}})
			}
		}
		exit, changed := c.exit, c.changed
		c.mu.Unlock()
		for _, ch := range chunks {
			if err := stream.Send(ch); err != nil {
				return err
			}
		}
		switch {
		case len(chunks) > 0:
			continue // more may be kept
		case exit != nil:
			return stream.Send(&agentpb.AttachChunk{Msg: &agentpb.AttachChunk_Exit{Exit: exit}})
		case !req.GetFollow():
			return nil
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return stream.Context().Err()
		}
	}
}

// Signal signals a command (agentpb.AgentServer's Signal).
func (s *Commands) Signal(_ context.Context, req *agentpb.SignalRequest) (*agentpb.Empty, error) {
	c, err := s.table.get(req.GetId())
	if err != nil {
		return nil, err
	}
	if req.GetSignal() < 1 || req.GetSignal() > 64 {
		return nil, status.Error(codes.InvalidArgument, "signal must be 1 to 64")
	}
	c.mu.Lock()
	done := c.exit != nil
	c.mu.Unlock()
	if done {
		return nil, status.Errorf(codes.FailedPrecondition, "command %q has finished", c.id)
	}
	select {
	case c.input <- &agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Signal{Signal: req.GetSignal()}}:
		return &agentpb.Empty{}, nil
	default:
		return nil, status.Errorf(codes.ResourceExhausted, "command %q has %d signals and inputs waiting", c.id, inputQueue)
	}
}

// Input gives a command stdin bytes, their end or a terminal size
// (agentpb.AgentServer's Input): queued for its execution, waiting while
// the queue is full, until the command ends or the call's deadline.
func (s *Commands) Input(ctx context.Context, req *agentpb.InputRequest) (*agentpb.Empty, error) {
	c, err := s.table.get(req.GetId())
	if err != nil {
		return nil, err
	}
	m := &agentpb.ExecRequest{}
	c.mu.Lock()
	open, done := c.stdinOpen, c.exit != nil
	switch in := req.GetMsg().(type) {
	case *agentpb.InputRequest_Stdin:
		m.Msg = &agentpb.ExecRequest_Stdin{Stdin: in.Stdin}
	case *agentpb.InputRequest_StdinEof:
		m.Msg = &agentpb.ExecRequest_StdinEof{StdinEof: true}
		c.stdinOpen = false
	case *agentpb.InputRequest_Resize:
		if !c.pty {
			c.mu.Unlock()
			return nil, status.Errorf(codes.FailedPrecondition, "command %q has no terminal", c.id)
		}
		m.Msg = &agentpb.ExecRequest_Resize{Resize: in.Resize}
		open = true
	default:
		c.mu.Unlock()
		return nil, status.Error(codes.InvalidArgument, "input needs stdin, stdin_eof or resize")
	}
	c.mu.Unlock()
	switch {
	case done:
		return nil, status.Errorf(codes.FailedPrecondition, "command %q has finished", c.id)
	case !open:
		return nil, status.Errorf(codes.FailedPrecondition, "command %q's stdin is closed (or was not kept open)", c.id)
	}
	select {
	case c.input <- m:
		return &agentpb.Empty{}, nil
	case <-c.ended:
		return nil, status.Errorf(codes.FailedPrecondition, "command %q has finished", c.id)
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// List lists the commands kept (agentpb.AgentServer's Commands).
func (s *Commands) List(context.Context, *agentpb.Empty) (*agentpb.CommandList, error) {
	l := &agentpb.CommandList{}
	for _, c := range s.table.list() {
		l.Commands = append(l.Commands, c.info())
	}
	return l, nil
}

// The real agent's commands run through its own Exec.

// Start implements agentpb.AgentServer.
func (s *Server) Start(ctx context.Context, req *agentpb.StartRequest) (*agentpb.CommandInfo, error) {
	return s.cmds.Start(ctx, req)
}

// Attach implements agentpb.AgentServer.
func (s *Server) Attach(req *agentpb.AttachRequest, stream agentpb.Agent_AttachServer) error {
	return s.cmds.Attach(req, stream)
}

// Signal implements agentpb.AgentServer.
func (s *Server) Signal(ctx context.Context, req *agentpb.SignalRequest) (*agentpb.Empty, error) {
	return s.cmds.Signal(ctx, req)
}

// Input implements agentpb.AgentServer.
func (s *Server) Input(ctx context.Context, req *agentpb.InputRequest) (*agentpb.Empty, error) {
	return s.cmds.Input(ctx, req)
}

// Commands implements agentpb.AgentServer.
func (s *Server) Commands(ctx context.Context, req *agentpb.Empty) (*agentpb.CommandList, error) {
	return s.cmds.List(ctx, req)
}
