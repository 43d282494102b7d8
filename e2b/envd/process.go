package envd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/e2b/envdpb/process"
	"github.com/harebox/harebox/e2b/envdpb/process/processconnect"
	"github.com/harebox/harebox/processes"
	"github.com/harebox/harebox/sandbox"
)

// envd's process service runs E2B's commands and terminals as the
// sandbox's background processes (package processes): the guest's agent
// owns each one, so it runs on when the caller's stream ends, as in E2B;
// every call is authorized and audited there for the principal in the
// context, and the command history and the host's timeout backstop see
// them as they see any background process.
//
// E2B names a process by its PID in the guest (or a tag). A start's
// stream carries its PID, its output as it comes and its end; the
// process's timeout is the stream's (the Connect-Timeout-Ms the SDK sends
// as its timeoutMs, 60 s by default, none for 0), as envd kills a process
// whose start's deadline passes whether or not the caller still listens,
// background or not. HareBox bounds "none" to MaxTimeout.

// Processes is the calls envd's process service makes on a sandbox's
// processes (processes.Service has them), each authorized and audited
// for the principal in the context.
type Processes interface {
	List(ctx context.Context, id string) ([]sandbox.Process, error)
	StartWith(ctx context.Context, id string, r sandbox.ExecRequest, o processes.StartOptions) (*sandbox.Process, error)
	Find(ctx context.Context, id string, pid int, tag string) (*sandbox.Process, [2]uint64, error)
	Output(ctx context.Context, id, procID string, offsets [2]uint64, follow bool, out agentclient.Output) (*sandbox.ExecResult, error)
	SendInput(ctx context.Context, id, procID string, in sandbox.ProcessInput) error
	Kill(ctx context.Context, id, procID string, signal int) error
}

const (
	// MaxTimeout is the longest a process envd starts may run: what a
	// start with no deadline (E2B's timeout 0) gets, HareBox's longest.
	MaxTimeout = 24 * time.Hour
	// maxEventBytes bounds the output one data event carries (envd's
	// own chunk); a longer chunk from the agent goes as several.
	maxEventBytes = 32 << 10
	// procKeepalive is how often a quiet process stream says it is alive
	// when the caller does not ask (keepaliveOf; the SDK asks 50 s), as
	// envd does.
	procKeepalive = 90 * time.Second
	// Terminal size bounds and the size of a terminal asked with none.
	maxTermSize              = 1000
	defaultRows, defaultCols = 24, 80
)

// processService is envd's process service; a call it does not serve
// answers unimplemented.
type processService struct {
	processconnect.UnimplementedProcessHandler
	s *Server
}

var _ Processes = (*processes.Service)(nil)

func (p *processService) procs() Processes { return p.s.opts.Processes }

// Start starts a process and streams its events: start with its PID at
// once, its output as it comes, then its end.
func (p *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	id := sandboxOf(ctx)
	r, o, err := startRequest(ctx, req.Msg)
	if err != nil {
		return rpcError(err)
	}
	proc, err := p.procs().StartWith(ctx, id, r, o)
	if err != nil {
		return rpcError(err)
	}
	if proc.Result != nil && proc.Result.Error != "" {
		// (envd answers a process it could not start so.)
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("the process could not start: %s", proc.Result.Error))
	}
	_, timed := ctx.Deadline()
	return p.follow(ctx, id, proc, [2]uint64{}, keepaliveOf(req.Header(), procKeepalive), timed, func(e *process.ProcessEvent) error {
		return stream.Send(&process.StartResponse{Event: e})
	})
}

// Connect streams a process's events from now on: start with its PID,
// the output that comes, its end (at once for one that has ended).
func (p *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	proc, from, err := p.find(ctx, req.Msg.GetProcess(), false)
	if err != nil {
		return err
	}
	return p.follow(ctx, sandboxOf(ctx), proc, from, keepaliveOf(req.Header(), procKeepalive), false, func(e *process.ProcessEvent) error {
		return stream.Send(&process.ConnectResponse{Event: e})
	})
}

// startRequest is a StartRequest as the engine's: the command as argv,
// as the call's user, a relative cwd from the user's home, the timeout
// the call's deadline leaves; stdin kept open unless the request says
// not (envd's default for a request that does not say; the SDK says
// false unless asked), and always for a terminal.
func startRequest(ctx context.Context, m *process.StartRequest) (sandbox.ExecRequest, processes.StartOptions, error) {
	cfg := m.GetProcess()
	if cfg.GetCmd() == "" {
		return sandbox.ExecRequest{}, processes.StartOptions{}, sandbox.Errorf(sandbox.ErrInvalid, "process.cmd", "is required")
	}
	user := userOf(ctx)
	r := sandbox.ExecRequest{Argv: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Env: cfg.GetEnvs(), User: user,
		TimeoutSeconds: MaxTimeout.Seconds()}
	if cfg.Cwd != nil {
		r.Cwd = Resolve(cfg.GetCwd(), user)
	}
	if dl, ok := ctx.Deadline(); ok {
		r.TimeoutSeconds = min(time.Until(dl), MaxTimeout).Seconds()
		if r.TimeoutSeconds <= 0 {
			return sandbox.ExecRequest{}, processes.StartOptions{}, connect.NewError(connect.CodeDeadlineExceeded, errors.New("the call's deadline has passed"))
		}
	}
	o := processes.StartOptions{Tag: m.GetTag(), KeepStdin: m.Stdin == nil || m.GetStdin()}
	if pty := m.GetPty(); pty != nil {
		rows, cols := pty.GetSize().GetRows(), pty.GetSize().GetCols()
		if rows == 0 && cols == 0 {
			rows, cols = defaultRows, defaultCols
		}
		if rows < 1 || rows > maxTermSize || cols < 1 || cols > maxTermSize {
			return sandbox.ExecRequest{}, processes.StartOptions{}, sandbox.Errorf(sandbox.ErrInvalid, "pty.size", "rows and cols must be 1-%d", maxTermSize)
		}
		o.PTY, o.Rows, o.Cols, o.KeepStdin = true, uint16(rows), uint16(cols), true
	}
	return r, o, nil
}

// follow sends proc's start, its output from offsets on and its end; a
// keepalive when the stream has been quiet for every. The agent's stream
// is read only as fast as the caller takes events, so nothing queues on
// the host. When ctx ends first (the caller's deadline or the caller
// gone), so does the stream; the process runs on until its own timeout.
// With timed (the process's timeout is ctx's deadline), a process killed
// at its timeout ends the stream as that deadline does, whichever of the
// two the host saw first: deadline_exceeded, the SDK's TimeoutError, as
// envd's stream ends.
func (p *processService) follow(ctx context.Context, id string, proc *sandbox.Process, from [2]uint64, every time.Duration, timed bool, send func(*process.ProcessEvent) error) error {
	var mu sync.Mutex // (a stream takes one sender at a time)
	sendOne := func(e *process.ProcessEvent) error {
		mu.Lock()
		defer mu.Unlock()
		return send(e)
	}
	if err := sendOne(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: uint32(proc.PID)}}}); err != nil {
		return err
	}
	caller := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	beat := time.NewTicker(every)
	defer beat.Stop()
	var beatErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case <-beat.C:
				if err := sendOne(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
					beatErr = err
					cancel()
					return
				}
			}
		}
	}()
	res, err := p.procs().Output(ctx, id, proc.ID, from, true, func(stderr bool, _ uint64, data []byte) error {
		for len(data) > 0 {
			n := min(len(data), maxEventBytes)
			if err := sendOne(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: dataEvent(proc.PTY, stderr, data[:n])}}); err != nil {
				return err
			}
			data = data[n:]
		}
		beat.Reset(every)
		return nil
	})
	cancel()
	wg.Wait()
	switch {
	case beatErr != nil:
		return beatErr
	case err != nil:
		return rpcError(err)
	case res == nil && !errors.Is(caller.Err(), context.DeadlineExceeded):
		// (Output stops without an exit only when ctx ends.)
		return connect.NewError(connect.CodeCanceled, errors.New("the caller went away"))
	case res == nil, timed && res.TimedOut:
		return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the call's timeout passed (a process the call started is killed then)"))
	}
	return sendOne(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: endEvent(res)}})
}

// dataEvent is a chunk of output: all of it the terminal's for a process
// on one.
func dataEvent(pty, stderr bool, b []byte) *process.ProcessEvent_DataEvent {
	switch {
	case pty:
		return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Pty{Pty: b}}
	case stderr:
		return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: b}}
	}
	return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: b}}
}

// endEvent is how a process ended as envd says it (Go's exec: exit code
// -1 and "signal: killed" for a signal; an error for anything but exit 0;
// the SDK makes a non-zero exit code its CommandExitError).
func endEvent(res *sandbox.ExecResult) *process.ProcessEvent_EndEvent {
	e := &process.ProcessEvent_EndEvent{ExitCode: int32(res.ExitCode), Exited: true, Status: fmt.Sprintf("exit status %d", res.ExitCode)}
	if res.Signal != 0 {
		e.ExitCode, e.Exited, e.Status = -1, false, "signal: "+syscall.Signal(res.Signal).String()
	}
	msg := ""
	switch {
	case res.Error != "":
		msg, e.Exited = res.Error, false
	case res.TimedOut:
		msg = "timed out: " + e.Status
	case e.ExitCode != 0 || !e.Exited:
		msg = e.Status
	}
	if msg != "" {
		e.Error = &msg
	}
	return e
}

// find is the process sel names; with running, one that runs (an ended
// one is not found, as envd forgets a process when it ends).
func (p *processService) find(ctx context.Context, sel *process.ProcessSelector, running bool) (*sandbox.Process, [2]uint64, error) {
	var pid int
	var tag string
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		pid = int(s.Pid)
	case *process.ProcessSelector_Tag:
		tag = s.Tag
	}
	if pid == 0 && tag == "" {
		return nil, [2]uint64{}, connect.NewError(connect.CodeInvalidArgument, errors.New("process: give a pid or a tag"))
	}
	proc, from, err := p.procs().Find(ctx, sandboxOf(ctx), pid, tag)
	if err != nil {
		return nil, from, rpcError(err)
	}
	if running && !proc.Running {
		return nil, from, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d has ended", proc.PID))
	}
	return proc, from, nil
}

// List lists the running processes, with how they were started (what the
// host noted of them).
func (p *processService) List(ctx context.Context, _ *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	ps, err := p.procs().List(ctx, sandboxOf(ctx))
	if err != nil {
		return nil, rpcError(err)
	}
	out := &process.ListResponse{Processes: []*process.ProcessInfo{}}
	for _, proc := range ps {
		if !proc.Running {
			continue
		}
		cfg := &process.ProcessConfig{Envs: proc.Env}
		switch {
		case len(proc.Argv) > 0:
			cfg.Cmd, cfg.Args = proc.Argv[0], proc.Argv[1:]
		case proc.Cmd != "":
			cfg.Cmd, cfg.Args = "/bin/sh", []string{"-c", proc.Cmd}
		}
		if proc.Cwd != "" {
			cfg.Cwd = &proc.Cwd
		}
		info := &process.ProcessInfo{Config: cfg, Pid: uint32(proc.PID)}
		if proc.Tag != "" {
			info.Tag = &proc.Tag
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

// input gives the process sel names input (stdin or the terminal's
// alike: the agent writes both where the process reads).
func (p *processService) input(ctx context.Context, sel *process.ProcessSelector, in sandbox.ProcessInput) error {
	proc, _, err := p.find(ctx, sel, true)
	if err != nil {
		return err
	}
	return rpcError(p.procs().SendInput(ctx, sandboxOf(ctx), proc.ID, in))
}

// stdinOf is a ProcessInput's bytes.
func stdinOf(in *process.ProcessInput) ([]byte, error) {
	switch x := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		return x.Stdin, nil
	case *process.ProcessInput_Pty:
		return x.Pty, nil
	}
	return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input: give stdin or pty bytes"))
}

// SendInput gives a process stdin (or terminal) bytes.
func (p *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	b, err := stdinOf(req.Msg.GetInput())
	if err != nil {
		return nil, err
	}
	if len(b) == 0 {
		// (Nothing to give; the process must still be there.)
		_, _, err := p.find(ctx, req.Msg.GetProcess(), true)
		return connect.NewResponse(&process.SendInputResponse{}), err
	}
	if err := p.input(ctx, req.Msg.GetProcess(), sandbox.ProcessInput{Stdin: b}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// StreamInput gives a process the input of a client stream: start names
// it, then data events, in order (keepalives ignored).
func (p *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	var proc *sandbox.Process
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			found, _, err := p.find(ctx, ev.Start.GetProcess(), true)
			if err != nil {
				return nil, err
			}
			proc = found
		case *process.StreamInputRequest_Data:
			if proc == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input before the start event that names the process"))
			}
			b, err := stdinOf(ev.Data.GetInput())
			if err != nil {
				return nil, err
			}
			if len(b) == 0 {
				continue
			}
			if err := p.procs().SendInput(ctx, sandboxOf(ctx), proc.ID, sandbox.ProcessInput{Stdin: b}); err != nil {
				return nil, rpcError(err)
			}
		case *process.StreamInputRequest_Keepalive:
		default:
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("an empty stream input event"))
		}
	}
	if err := stream.Err(); err != nil {
		return nil, rpcError(fmt.Errorf("stream input: %w", err))
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

// CloseStdin ends a process's stdin (^D on a terminal).
func (p *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	if err := p.input(ctx, req.Msg.GetProcess(), sandbox.ProcessInput{EOF: true}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

// Update resizes a process's terminal.
func (p *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	if req.Msg.Pty == nil {
		// (Nothing to change; the process must still be there.)
		_, _, err := p.find(ctx, req.Msg.GetProcess(), true)
		return connect.NewResponse(&process.UpdateResponse{}), err
	}
	rows, cols := req.Msg.GetPty().GetSize().GetRows(), req.Msg.GetPty().GetSize().GetCols()
	if rows < 1 || rows > maxTermSize || cols < 1 || cols > maxTermSize {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("pty.size: rows and cols must be 1-%d", maxTermSize))
	}
	if err := p.input(ctx, req.Msg.GetProcess(), sandbox.ProcessInput{Rows: uint16(rows), Cols: uint16(cols)}); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

// SendSignal sends SIGTERM or SIGKILL to a process's process group.
func (p *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	sig := req.Msg.GetSignal()
	if sig != process.Signal_SIGNAL_SIGTERM && sig != process.Signal_SIGNAL_SIGKILL {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal: must be SIGTERM or SIGKILL, not %v", sig))
	}
	proc, _, err := p.find(ctx, req.Msg.GetProcess(), true)
	if err != nil {
		return nil, err
	}
	if err := p.procs().Kill(ctx, sandboxOf(ctx), proc.ID, int(sig)); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}
