package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"time"

	"github.com/harebox/harebox/agent/agentpb"
)

// MaxCommands bounds the list of commands the host accepts from an agent
// (an agent keeps at most 64).
const MaxCommands = 256

var commandID = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Command is a command the agent owns (protocol 2): it runs on when the
// session that started it ends.
type Command struct {
	ID      string
	PID     int
	Running bool
	// Exit is set once it has finished.
	Exit    *ExitStatus
	Started time.Time
	// StdoutBytes and StderrBytes count what each stream produced in all.
	StdoutBytes, StderrBytes uint64
}

// Start runs req as a command the agent owns, under id, with stdin (when
// not nil) as its input, then end of file; with req.KeepStdin, stdin
// stays open after those bytes, for Input. ringBytes bounds the output
// the agent keeps of each stream (0: its default). A command that could
// not start comes back finished, with Exit.Error.
func (c *Client) Start(ctx context.Context, id string, req ExecRequest, stdin []byte, ringBytes int) (_ Command, err error) {
	defer classify(&err)
	if !commandID.MatchString(id) {
		return Command{}, fmt.Errorf("start: bad command id %q", id)
	}
	st, err := req.proto()
	if err != nil {
		return Command{}, err
	}
	st.Stdin = stdin != nil || req.KeepStdin
	if req.KeepStdin {
		if err := c.need(4, "keeping a command's stdin open"); err != nil {
			return Command{}, err
		}
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	r, err := c.rpc.Start(ctx, &agentpb.StartRequest{Id: id, Exec: st, Stdin: stdin, RingBytes: uint32(ringBytes), KeepStdin: req.KeepStdin})
	if err != nil {
		return Command{}, c.wrap("start", err)
	}
	cmd, err := command(r)
	if err == nil && cmd.ID != id {
		err = fmt.Errorf("%w: start: answered for command %q", ErrGuest, cmd.ID)
	}
	return cmd, err
}

// Input gives command id, started with KeepStdin, stdin bytes, waiting
// while the agent's queue for it is full; protocol 4.
func (c *Client) Input(ctx context.Context, id string, stdin []byte) error {
	return c.input(ctx, &agentpb.InputRequest{Id: id, Msg: &agentpb.InputRequest_Stdin{Stdin: stdin}})
}

// CloseInput ends command id's stdin (^D on a terminal); protocol 4.
func (c *Client) CloseInput(ctx context.Context, id string) error {
	return c.input(ctx, &agentpb.InputRequest{Id: id, Msg: &agentpb.InputRequest_StdinEof{StdinEof: true}})
}

// Resize sets the terminal size of command id, started with a PTY;
// protocol 4.
func (c *Client) Resize(ctx context.Context, id string, rows, cols uint16) error {
	return c.input(ctx, &agentpb.InputRequest{Id: id, Msg: &agentpb.InputRequest_Resize{Resize: &agentpb.Resize{Rows: uint32(rows), Cols: uint32(cols)}}})
}

func (c *Client) input(ctx context.Context, req *agentpb.InputRequest) (err error) {
	defer classify(&err)
	if !commandID.MatchString(req.Id) {
		return fmt.Errorf("input: bad command id %q", req.Id)
	}
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	_, err = c.rpc.Input(ctx, req)
	return c.wrap("input", err)
}

// Commands lists the commands the agent keeps, oldest first.
func (c *Client) Commands(ctx context.Context) (_ []Command, err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	r, err := c.rpc.Commands(ctx, &agentpb.Empty{})
	if err != nil {
		return nil, c.wrap("commands", err)
	}
	if len(r.Commands) > MaxCommands {
		return nil, fmt.Errorf("%w: commands: %d of them", ErrGuest, len(r.Commands))
	}
	out := make([]Command, 0, len(r.Commands))
	for _, x := range r.Commands {
		cmd, err := command(x)
		if err != nil {
			return nil, err
		}
		out = append(out, cmd)
	}
	return out, nil
}

// Signal delivers sig to a command's process group.
func (c *Client) Signal(ctx context.Context, id string, sig int) (err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	_, err = c.rpc.Signal(ctx, &agentpb.SignalRequest{Id: id, Signal: int32(sig)})
	return c.wrap("signal", err)
}

// Output is where Attach delivers a command's output: each chunk with the
// offset it starts at in its stream. An offset past the end of what came
// before says the agent's ring dropped the bytes between.
type Output func(stderr bool, offset uint64, data []byte) error

// Attach delivers a command's output from the offsets (stdout, stderr) on:
// what the agent still keeps, then, with follow, what comes until the
// command ends. It returns the exit once the command has ended, and nil
// when it stops earlier (no follow, while the command runs). The caller's
// ctx bounds it (no default deadline: a follow may last as long as the
// command); when ctx ends first, the error is ctx's.
//
// The host keeps ctx's deadline to itself. Sent along (gRPC's timeout
// header), it is measured on the guest's clock, and a guest whose clock
// runs ahead (a restored guest catching up, under TCG and load) ended a
// bounded wait early with Canceled, which the caller could not tell from
// a failure.
func (c *Client) Attach(ctx context.Context, id string, offsets [2]uint64, follow bool, out Output) (_ *ExitStatus, err error) {
	defer classify(&err)
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	s, err := c.rpc.Attach(sctx, &agentpb.AttachRequest{Id: id, StdoutOffset: offsets[0], StderrOffset: offsets[1], Follow: follow})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, c.wrap("attach", err)
	}
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, c.wrap("attach", err)
		}
		var oc *agentpb.OutputChunk
		i := 0
		switch x := m.Msg.(type) {
		case *agentpb.AttachChunk_Stdout:
			oc = x.Stdout
		case *agentpb.AttachChunk_Stderr:
			oc, i = x.Stderr, 1
		case *agentpb.AttachChunk_Exit:
			st, err := exitStatus(x.Exit)
			if err != nil {
				return nil, err
			}
			// Nothing may follow the exit.
			if _, err := s.Recv(); !errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("%w: attach: a message after the exit", ErrGuest)
			}
			return &st, nil
		default:
			return nil, fmt.Errorf("%w: attach: an empty message", ErrGuest)
		}
		if oc == nil || len(oc.Data) == 0 || len(oc.Data) > MaxChunk || oc.Offset < offsets[i] || oc.Offset > 1<<62 {
			return nil, fmt.Errorf("%w: attach: a bad output chunk", ErrGuest)
		}
		if err := out(i == 1, oc.Offset, oc.Data); err != nil {
			return nil, err
		}
		offsets[i] = oc.Offset + uint64(len(oc.Data))
	}
}

// command checks an agent's report of a command field by field.
func command(r *agentpb.CommandInfo) (Command, error) {
	bad := func(what string) (Command, error) {
		return Command{}, fmt.Errorf("%w: command: bad %s", ErrGuest, what)
	}
	switch {
	case !commandID.MatchString(r.GetId()):
		return bad("id")
	case r.GetPid() < 0:
		return bad("pid")
	case r.GetRunning() == (r.GetExit() != nil):
		return bad("running and exit")
	case r.GetStartedUnixMs() < 0 || r.GetStartedUnixMs() > 1<<50:
		return bad("start time")
	case r.GetStdoutBytes() > 1<<62 || r.GetStderrBytes() > 1<<62:
		return bad("byte counts")
	}
	cmd := Command{
		ID: r.GetId(), PID: int(r.GetPid()), Running: r.GetRunning(), Started: time.UnixMilli(r.GetStartedUnixMs()).UTC(),
		StdoutBytes: r.GetStdoutBytes(), StderrBytes: r.GetStderrBytes(),
	}
	if r.GetExit() != nil {
		st, err := exitStatus(r.GetExit())
		if err != nil {
			return Command{}, err
		}
		cmd.Exit = &st
	}
	return cmd, nil
}
