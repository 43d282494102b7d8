package memhv

import (
	"context"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/agent/guest"
	"github.com/harebox/harebox/agent/layout"
)

const (
	// execChunk bounds one stdout/stderr message, as in the real agent.
	execChunk = 32 << 10
	// exitNotFound is a shell's code for a command it cannot find.
	exitNotFound = 127
	// maxSleep bounds the sleep command.
	maxSleep = 24 * time.Hour
	// shutdownDelay lets the Shutdown reply reach the host before the
	// machine stops, as the real agent waits before powering off.
	shutdownDelay = 100 * time.Millisecond
	// firstGuestPID is the pid of the first command in a machine.
	firstGuestPID = 100
)

var (
	machineIDRe = regexp.MustCompile(`^[0-9a-f]{32}$`)
	hostnameRe  = regexp.MustCompile(`^[a-z0-9-]{1,63}$`)
)

// agent is a machine's fake guest agent. Every call first waits for the
// machine to run, so a paused machine answers nothing.
type agent struct {
	agentpb.UnimplementedAgentServer
	m    *machine
	fs   *fsys
	pids atomic.Int32
	// cmds are its background commands, each run by Exec as the real
	// agent runs them.
	cmdsOnce sync.Once
	cmds     *guest.Commands
}

func (a *agent) commands() *guest.Commands {
	a.cmdsOnce.Do(func() { a.cmds = guest.NewCommands(a.Exec, checkStart) })
	return a.cmds
}

// Start implements agentpb.AgentServer.
func (a *agent) Start(ctx context.Context, req *agentpb.StartRequest) (*agentpb.CommandInfo, error) {
	if err := a.m.awake(ctx); err != nil {
		return nil, err
	}
	return a.commands().Start(ctx, req)
}

// Attach implements agentpb.AgentServer.
func (a *agent) Attach(req *agentpb.AttachRequest, stream agentpb.Agent_AttachServer) error {
	if err := a.m.awake(stream.Context()); err != nil {
		return err
	}
	return a.commands().Attach(req, stream)
}

// Signal implements agentpb.AgentServer.
func (a *agent) Signal(ctx context.Context, req *agentpb.SignalRequest) (*agentpb.Empty, error) {
	if err := a.m.awake(ctx); err != nil {
		return nil, err
	}
	return a.commands().Signal(ctx, req)
}

// Input implements agentpb.AgentServer.
func (a *agent) Input(ctx context.Context, req *agentpb.InputRequest) (*agentpb.Empty, error) {
	if err := a.m.awake(ctx); err != nil {
		return nil, err
	}
	return a.commands().Input(ctx, req)
}

// Commands implements agentpb.AgentServer.
func (a *agent) Commands(ctx context.Context, req *agentpb.Empty) (*agentpb.CommandList, error) {
	if err := a.m.awake(ctx); err != nil {
		return nil, err
	}
	return a.commands().List(ctx, req)
}

func (a *agent) Health(ctx context.Context, _ *agentpb.HealthRequest) (*agentpb.HealthResponse, error) {
	if err := a.m.awake(ctx); err != nil {
		return nil, err
	}
	return &agentpb.HealthResponse{
		Version: guest.Version, Protocol: layout.Protocol, UptimeSeconds: time.Since(a.m.started).Seconds(), Mode: "fake", Kernel: Name,
	}, nil
}

// SyncTime accepts a valid time and changes nothing: the fake guest reads
// the host's clock.
func (a *agent) SyncTime(ctx context.Context, req *agentpb.SyncTimeRequest) (*agentpb.Empty, error) {
	if err := a.m.awake(ctx); err != nil {
		return nil, err
	}
	if req.GetUnixNano() <= 0 {
		return nil, status.Error(codes.InvalidArgument, "unix_nano must be positive")
	}
	return &agentpb.Empty{}, nil
}

// Reseed checks the request as the real agent does and writes
// /etc/machine-id (and /etc/hostname); the entropy is dropped.
func (a *agent) Reseed(ctx context.Context, req *agentpb.ReseedRequest) (*agentpb.ReseedResponse, error) {
	if err := a.m.awake(ctx); err != nil {
		return nil, err
	}
	if n := len(req.GetEntropy()); n < 32 || n > 512 {
		return nil, status.Errorf(codes.InvalidArgument, "entropy must be 32-512 bytes, got %d", n)
	}
	if !machineIDRe.MatchString(req.GetMachineId()) {
		return nil, status.Error(codes.InvalidArgument, "machine_id must be 32 lower-case hex characters")
	}
	if h := req.GetHostname(); h != "" && !hostnameRe.MatchString(h) {
		return nil, status.Error(codes.InvalidArgument, "hostname must match [a-z0-9-]{1,63}")
	}
	a.fs.mu.Lock()
	a.fs.put("/etc/machine-id", []byte(req.GetMachineId()+"\n"), 0o444, 0, 0)
	if h := req.GetHostname(); h != "" {
		a.fs.put("/etc/hostname", []byte(h+"\n"), 0o644, 0, 0)
	}
	a.fs.mu.Unlock()
	return &agentpb.ReseedResponse{MachineId: req.GetMachineId()}, nil
}

// Shutdown answers, then stops the machine (a reboot too: the real
// backends run with -no-reboot).
func (a *agent) Shutdown(ctx context.Context, _ *agentpb.ShutdownRequest) (*agentpb.Empty, error) {
	if err := a.m.awake(ctx); err != nil {
		return nil, err
	}
	time.AfterFunc(shutdownDelay, func() { a.m.stop("powered off by the guest") })
	return &agentpb.Empty{}, nil
}

// Exec interprets the built-in commands of the package comment; it runs
// no program. Its messages are the real agent's: the pid, output chunks,
// then exactly one exit.
func (a *agent) Exec(stream agentpb.Agent_ExecServer) error {
	ctx := stream.Context()
	if err := a.m.awake(ctx); err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	st := first.GetStart()
	if st == nil {
		return status.Error(codes.InvalidArgument, "the first exec message must be start")
	}
	if err := checkStart(st); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	stdin := make(chan []byte, 16)
	x := &execution{a: a, stream: stream, began: time.Now(), signals: make(chan int32, 4), stdin: stdin, stdinR: stdin}
	go x.recv()
	acct, err := lookupUser(st.GetUser())
	if err != nil {
		return x.exit(&agentpb.ExecExit{ExitCode: exitNotFound, Error: err.Error()})
	}
	cwd := st.GetCwd()
	if cwd == "" {
		cwd = acct.home
	}
	pid := firstGuestPID + a.pids.Add(1) - 1
	if err := x.send(&agentpb.ExecResponse{Msg: &agentpb.ExecResponse_StartedPid{StartedPid: pid}}); err != nil {
		return err
	}
	exit := x.run(ctx, st, cwd)
	if exit == nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return x.exit(exit)
}

// checkStart refuses what the real agent refuses.
func checkStart(st *agentpb.ExecStart) error {
	switch {
	case (len(st.GetArgv()) > 0) == (st.GetShell() != ""):
		return fmt.Errorf("exactly one of argv and shell must be set")
	case len(st.GetArgv()) > 0 && st.GetArgv()[0] == "":
		return fmt.Errorf("argv[0] is empty")
	case st.GetCwd() != "" && !filepath.IsAbs(st.GetCwd()):
		return fmt.Errorf("cwd must be absolute")
	case st.GetTimeoutMs() < 0:
		return fmt.Errorf("timeout_ms must not be negative")
	}
	return nil
}

// execution is one Exec call.
type execution struct {
	a       *agent
	stream  agentpb.Agent_ExecServer
	began   time.Time
	signals chan int32
	// stdin carries stdin's chunks, and is closed at its end (recv's
	// alone; the command reads stdinR).
	stdin  chan []byte
	stdinR <-chan []byte
	sendMu sync.Mutex // gRPC streams allow one sender at a time
}

// recv takes signals and stdin from the client until the stream ends;
// resizes are dropped.
func (x *execution) recv() {
	defer func() {
		if x.stdin != nil {
			close(x.stdin)
		}
	}()
	for {
		req, err := x.stream.Recv()
		if err != nil {
			return
		}
		switch m := req.GetMsg().(type) {
		case *agentpb.ExecRequest_Signal:
			if m.Signal > 0 && m.Signal <= 64 {
				select {
				case x.signals <- m.Signal:
				default:
				}
			}
		case *agentpb.ExecRequest_Stdin:
			if x.stdin != nil {
				select {
				case x.stdin <- m.Stdin:
				case <-x.stream.Context().Done():
					return
				}
			}
		case *agentpb.ExecRequest_StdinEof:
			if x.stdin != nil {
				close(x.stdin)
				x.stdin = nil
			}
		}
	}
}

// catStdin copies stdin to out until its end; nil, or how the command
// ended otherwise (a signal; the caller gone is an exit of nil, ok false).
func (x *execution) catStdin(ctx context.Context, stdin <-chan []byte, out io.Writer) (exit *agentpb.ExecExit, ok bool) {
	for {
		select {
		case b, more := <-stdin:
			if !more {
				return nil, true
			}
			out.Write(b)
		case sig := <-x.signals:
			return &agentpb.ExecExit{ExitCode: -1, Signal: sig}, true
		case <-ctx.Done():
			return nil, false
		}
	}
}

// run interprets the commands; nil means the caller went away.
func (x *execution) run(ctx context.Context, st *agentpb.ExecStart, cwd string) *agentpb.ExecExit {
	var timeout <-chan time.Time
	if ms := st.GetTimeoutMs(); ms > 0 {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	cmds := [][]string{st.GetArgv()}
	if st.GetShell() != "" {
		cmds = nil
		for _, c := range strings.FieldsFunc(st.GetShell(), func(r rune) bool { return r == ';' || r == '\n' }) {
			if args := strings.Fields(c); len(args) > 0 {
				cmds = append(cmds, args)
			}
		}
	}
	stdout, stderr := &output{x: x}, &output{x: x, stderr: true}
	code := 0
	for _, args := range cmds {
		out := io.Writer(stdout)
		if n := len(args); st.GetShell() != "" && n > 1 && args[n-1] == ">&2" {
			out, args = stderr, args[:n-1]
		}
		switch args[0] {
		case "echo":
			fmt.Fprintln(out, strings.Join(args[1:], " "))
			code = 0
		case "cat":
			if len(args) == 1 && st.GetStdin() {
				exit, ok := x.catStdin(ctx, x.stdinR, out)
				if !ok || exit != nil {
					return exit
				}
				code = 0
				continue
			}
			code = x.cat(out, stderr, cwd, args[1:])
		case "printenv":
			code = 1
			for _, kv := range st.GetEnv() {
				if k, v, _ := strings.Cut(kv, "="); len(args) > 1 && k == args[1] {
					fmt.Fprintln(out, v)
					code = 0
				}
			}
		case "true":
			code = 0
		case "false":
			code = 1
		case "exit":
			if len(args) > 1 {
				n, err := strconv.Atoi(args[1])
				if err != nil {
					fmt.Fprintf(stderr, "exit: Illegal number: %s\n", args[1])
					n = 2
				}
				code = n
			}
			return &agentpb.ExecExit{ExitCode: int32(code & 0xff)}
		case "sleep", "stubborn":
			secs, err := math.NaN(), error(nil)
			if len(args) == 2 {
				secs, err = strconv.ParseFloat(args[1], 64)
			}
			if err != nil || !(secs >= 0 && secs <= maxSleep.Seconds()) {
				fmt.Fprintf(stderr, "sleep: invalid time interval\n")
				code = 1
				continue
			}
			t := time.NewTimer(time.Duration(secs * float64(time.Second)))
			timeout := timeout
			if args[0] == "stubborn" {
				timeout = nil // an agent that does not enforce timeouts
			}
			select {
			case <-t.C:
				code = 0
			case <-timeout:
				t.Stop()
				return &agentpb.ExecExit{ExitCode: -1, Signal: 9, TimedOut: true}
			case sig := <-x.signals:
				t.Stop()
				return &agentpb.ExecExit{ExitCode: -1, Signal: sig}
			case <-ctx.Done():
				t.Stop()
				return nil
			}
		default:
			fmt.Fprintf(stderr, "fake agent: command not found: %s\n", args[0])
			code = exitNotFound
		}
	}
	return &agentpb.ExecExit{ExitCode: int32(code)}
}

func (x *execution) cat(out, stderr io.Writer, cwd string, paths []string) int {
	code := 0
	for _, p := range paths {
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		p = filepath.Clean(p)
		x.a.fs.mu.Lock()
		n, err := x.a.fs.get("cat", p)
		x.a.fs.mu.Unlock()
		switch {
		case err != nil:
			fmt.Fprintf(stderr, "cat: %s: No such file or directory\n", p)
			code = 1
		case n.Dir:
			fmt.Fprintf(stderr, "cat: %s: Is a directory\n", p)
			code = 1
		default:
			out.Write(n.Data)
		}
	}
	return code
}

// send waits while the machine is paused, as a frozen guest's output does.
func (x *execution) send(m *agentpb.ExecResponse) error {
	if err := x.a.m.awake(x.stream.Context()); err != nil {
		return err
	}
	x.sendMu.Lock()
	defer x.sendMu.Unlock()
	return x.stream.Send(m)
}

func (x *execution) exit(e *agentpb.ExecExit) error {
	e.DurationMs = time.Since(x.began).Milliseconds()
	return x.send(&agentpb.ExecResponse{Msg: &agentpb.ExecResponse_Exit{Exit: e}})
}

// output streams one of the command's outputs in chunks.
type output struct {
	x      *execution
	stderr bool
}

func (o *output) Write(b []byte) (int, error) {
	for n := 0; n < len(b); {
		k := min(len(b)-n, execChunk)
		msg := &agentpb.ExecResponse{Msg: &agentpb.ExecResponse_Stdout{Stdout: b[n : n+k]}}
		if o.stderr {
			msg.Msg = &agentpb.ExecResponse_Stderr{Stderr: b[n : n+k]}
		}
		if err := o.x.send(msg); err != nil {
			return n, err
		}
		n += k
	}
	return len(b), nil
}
