package client

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/agent/guest"
)

// lyingCommands is an agent whose command replies break the protocol.
type lyingCommands struct {
	agentpb.UnimplementedAgentServer
	chunks []*agentpb.AttachChunk
	info   *agentpb.CommandInfo
	list   int
}

func (l *lyingCommands) Health(context.Context, *agentpb.HealthRequest) (*agentpb.HealthResponse, error) {
	return &agentpb.HealthResponse{Version: "x", Mode: "service", Protocol: 2}, nil
}

func (l *lyingCommands) Start(context.Context, *agentpb.StartRequest) (*agentpb.CommandInfo, error) {
	return l.info, nil
}

func (l *lyingCommands) Commands(context.Context, *agentpb.Empty) (*agentpb.CommandList, error) {
	out := &agentpb.CommandList{}
	for range l.list {
		out.Commands = append(out.Commands, &agentpb.CommandInfo{Id: "c", Running: true})
	}
	return out, nil
}

func (l *lyingCommands) Attach(_ *agentpb.AttachRequest, s agentpb.Agent_AttachServer) error {
	for _, c := range l.chunks {
		if err := s.Send(c); err != nil {
			return err
		}
	}
	return nil
}

func out(offset uint64, data string) *agentpb.AttachChunk {
	return &agentpb.AttachChunk{Msg: &agentpb.AttachChunk_Stdout{Stdout: &agentpb.OutputChunk{Offset: offset, Data: []byte(data)}}}
}

func exitChunk(code int32) *agentpb.AttachChunk {
	return &agentpb.AttachChunk{Msg: &agentpb.AttachChunk_Exit{Exit: &agentpb.ExecExit{ExitCode: code}}}
}

// TestCommandsHostile: what an agent says about its commands is checked
// field by field; a lie is ErrGuest, never a panic or a hang.
func TestCommandsHostile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	attach := func(chunks ...*agentpb.AttachChunk) error {
		c, _, err := DialReady(ctx, serveAgent(t, &lyingCommands{chunks: chunks}), Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.Attach(ctx, "c", [2]uint64{10, 0}, true, func(bool, uint64, []byte) error { return nil })
		return err
	}
	for name, chunks := range map[string][]*agentpb.AttachChunk{
		"offset before the one asked": {out(5, "x")},
		"offset going back":           {out(10, "abc"), out(11, "d")},
		"an empty chunk":              {out(10, "")},
		"a huge chunk":                {out(10, strings.Repeat("x", MaxChunk+1))},
		"a message after the exit":    {exitChunk(0), out(10, "x")},
		"a bad exit code":             {exitChunk(999)},
		"an empty message":            {{}},
	} {
		if err := attach(chunks...); !errors.Is(err, ErrGuest) {
			t.Errorf("%s: %v, want ErrGuest", name, err)
		}
	}
	if err := attach(out(10, "ok"), out(20, "after a drop"), exitChunk(3)); err != nil {
		t.Errorf("a well-formed stream with a drop: %v", err)
	}
	for name, l := range map[string]*lyingCommands{
		"another command's id": {info: &agentpb.CommandInfo{Id: "other", Running: true}},
		"a bad id":             {info: &agentpb.CommandInfo{Id: "a/b", Running: true}},
		"running and exited":   {info: &agentpb.CommandInfo{Id: "c", Running: true, Exit: &agentpb.ExecExit{}}},
		"neither":              {info: &agentpb.CommandInfo{Id: "c"}},
		"a negative pid":       {info: &agentpb.CommandInfo{Id: "c", Running: true, Pid: -1}},
	} {
		c, _, err := DialReady(ctx, serveAgent(t, l), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Start(ctx, "c", ExecRequest{Argv: []string{"true"}}, nil, 0); !errors.Is(err, ErrGuest) {
			t.Errorf("start, %s: %v", name, err)
		}
		c.Close()
	}
	c, _, err := DialReady(ctx, serveAgent(t, &lyingCommands{list: MaxCommands + 1}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Commands(ctx); !errors.Is(err, ErrGuest) {
		t.Errorf("too many commands: %v", err)
	}
}

// TestCommandsThroughTheClient: the real agent's commands, through the
// host's client, from another session than the one that started them.
func TestCommandsThroughTheClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ep := serveAgent(t, guest.New(guest.Options{}))
	first, _, err := DialReady(ctx, ep, Options{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := first.Start(ctx, "job", ExecRequest{Shell: "echo a; sleep 0.3; echo b >&2; exit 3", User: "root"}, nil, 0)
	if err != nil || !cmd.Running || cmd.PID == 0 {
		t.Fatalf("start: %+v %v", cmd, err)
	}
	first.Close()
	second, _, err := DialReady(ctx, ep, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	var got [2]strings.Builder
	st, err := second.Attach(ctx, "job", [2]uint64{}, true, func(stderr bool, _ uint64, data []byte) error {
		if stderr {
			got[1].Write(data)
		} else {
			got[0].Write(data)
		}
		return nil
	})
	if err != nil || st == nil || st.ExitCode != 3 || got[0].String() != "a\n" || got[1].String() != "b\n" {
		t.Fatalf("attach: %+v %v %q %q", st, err, got[0].String(), got[1].String())
	}
	l, err := second.Commands(ctx)
	if err != nil || len(l) != 1 || l[0].Running || l[0].Exit.ExitCode != 3 || l[0].StdoutBytes != 2 {
		t.Fatalf("commands: %+v %v", l, err)
	}
}

// fastClock is an agent whose clock runs ahead of the host's: a deadline
// it is told of expires at once, as gRPC's server would end the stream
// when its own timer fires.
type fastClock struct {
	agentpb.UnimplementedAgentServer
	sawDeadline chan bool
}

func (f *fastClock) Health(context.Context, *agentpb.HealthRequest) (*agentpb.HealthResponse, error) {
	return &agentpb.HealthResponse{Version: "x", Mode: "service", Protocol: 2}, nil
}

func (f *fastClock) Attach(_ *agentpb.AttachRequest, s agentpb.Agent_AttachServer) error {
	_, has := s.Context().Deadline()
	f.sawDeadline <- has
	if has {
		return status.Error(codes.Canceled, "the guest's timer fired")
	}
	<-s.Context().Done()
	return s.Context().Err()
}

// TestAttachKeepsTheDeadline: a bounded follow ends when the host's
// deadline does, with the deadline's error; the guest is not told the
// deadline, so a guest clock that runs ahead cannot end it early.
func TestAttachKeepsTheDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := &fastClock{sawDeadline: make(chan bool, 1)}
	c, _, err := DialReady(ctx, serveAgent(t, f), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer wcancel()
	start := time.Now()
	_, err = c.Attach(wctx, "c", [2]uint64{}, true, func(bool, uint64, []byte) error { return nil })
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took < 300*time.Millisecond {
		t.Errorf("attach ended after %v with %v, want the host's deadline after 300ms", took, err)
	}
	if <-f.sawDeadline {
		t.Error("the guest was told the host's deadline")
	}
}
