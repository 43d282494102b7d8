package guest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/agentpb"
)

func TestRing(t *testing.T) {
	r := ring{size: 10}
	r.write([]byte("0123456"))
	if from, b := r.read(2, 100); from != 2 || string(b) != "23456" {
		t.Fatalf("read 2: %d %q", from, b)
	}
	r.write([]byte("789abcdef")) // 16 bytes in all: 6 dropped
	if r.total() != 16 {
		t.Fatalf("total %d", r.total())
	}
	if from, b := r.read(0, 100); from != 6 || string(b) != "6789abcdef" {
		t.Fatalf("read past the drop: %d %q", from, b)
	}
	if from, b := r.read(14, 1); from != 14 || string(b) != "e" {
		t.Fatalf("read 14: %d %q", from, b)
	}
	if _, b := r.read(16, 10); b != nil {
		t.Fatalf("read at the end: %q", b)
	}
	// Many small writes: the array stays about its size.
	big := ring{size: 1 << 10}
	for range 10000 {
		big.write(bytes.Repeat([]byte("x"), 100))
	}
	if cap(big.data) > 2*big.size+execChunk+100 || big.total() != 1_000_000 {
		t.Fatalf("cap %d total %d", cap(big.data), big.total())
	}
}

// attach reads a command's output from offsets to the stream's end.
func attach(t *testing.T, c agentpb.AgentClient, req *agentpb.AttachRequest) (stdout, stderr string, offs [2]uint64, exit *agentpb.ExecExit) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := c.Attach(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var out [2]strings.Builder
	offs = [2]uint64{req.StdoutOffset, req.StderrOffset}
	for {
		m, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("attach: %v", err)
		}
		if exit != nil {
			t.Fatalf("%v after the exit", m)
		}
		var oc *agentpb.OutputChunk
		i := 0
		switch x := m.Msg.(type) {
		case *agentpb.AttachChunk_Stdout:
			oc = x.Stdout
		case *agentpb.AttachChunk_Stderr:
			oc, i = x.Stderr, 1
		case *agentpb.AttachChunk_Exit:
			exit = x.Exit
			continue
		}
		if oc.Offset < offs[i] {
			t.Fatalf("stream %d went back from %d to %d", i, offs[i], oc.Offset)
		}
		out[i].Write(oc.Data)
		offs[i] = oc.Offset + uint64(len(oc.Data))
	}
	return out[0].String(), out[1].String(), offs, exit
}

// TestCommandsOutliveTheirCaller: a started command runs on after the
// session that started it is gone; another session attaches to it by ID
// and gets what it wrote, from any offset, then what it writes, then its
// exit; signals reach it; the list and its limits hold.
func TestCommandsOutliveTheirCaller(t *testing.T) {
	e := newEnv(t)
	srv := e.srv
	first := dialAgent(t, srv)
	ctx := context.Background()
	info, err := first.Start(ctx, &agentpb.StartRequest{Id: "cmd-1", Exec: &agentpb.ExecStart{
		Shell: "echo one; echo err >&2; read line; echo got $line; sleep 1; echo two", Stdin: true, User: "root"}, Stdin: []byte("hello\n")})
	if err != nil || info.Pid == 0 || !info.Running || info.Id != "cmd-1" {
		t.Fatalf("start: %+v %v", info, err)
	}
	// The caller's session ends; the command does not.
	second := dialAgent(t, srv)
	out, errOut, offs, exit := attach(t, second, &agentpb.AttachRequest{Id: "cmd-1", Follow: true})
	if out != "one\ngot hello\ntwo\n" || errOut != "err\n" || exit == nil || exit.ExitCode != 0 {
		t.Fatalf("attached: %q %q %+v", out, errOut, exit)
	}
	// Again from an offset, without follow: the rest, and the exit.
	if out, _, _, exit := attach(t, second, &agentpb.AttachRequest{Id: "cmd-1", StdoutOffset: 4, StderrOffset: offs[1]}); out != "got hello\ntwo\n" || exit == nil {
		t.Fatalf("from offset 4: %q %+v", out, exit)
	}
	l, err := second.Commands(ctx, &agentpb.Empty{})
	if err != nil || len(l.Commands) != 1 || l.Commands[0].Running || l.Commands[0].StdoutBytes != uint64(len("one\ngot hello\ntwo\n")) {
		t.Fatalf("list: %+v %v", l, err)
	}

	// A long one, signalled; a start that fails is a finished command.
	if _, err := second.Start(ctx, &agentpb.StartRequest{Id: "sleeper", Exec: &agentpb.ExecStart{Argv: []string{"sleep", "60"}, User: "root"}}); err != nil {
		t.Fatal(err)
	}
	if out, _, _, exit := attach(t, second, &agentpb.AttachRequest{Id: "sleeper"}); out != "" || exit != nil {
		t.Fatalf("a running command without follow: %q %+v", out, exit)
	}
	if _, err := second.Signal(ctx, &agentpb.SignalRequest{Id: "sleeper", Signal: 15}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, exit := attach(t, second, &agentpb.AttachRequest{Id: "sleeper", Follow: true}); exit == nil || exit.Signal != 15 {
		t.Fatalf("after SIGTERM: %+v", exit)
	}
	if _, err := second.Signal(ctx, &agentpb.SignalRequest{Id: "sleeper", Signal: 9}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a signal to a finished command: %v", err)
	}
	info, err = second.Start(ctx, &agentpb.StartRequest{Id: "nope", Exec: &agentpb.ExecStart{Argv: []string{"no-such-binary"}, User: "root"}})
	if err != nil || info.Running || info.Exit == nil || info.Exit.ExitCode != exitStartFailed {
		t.Fatalf("a start that fails: %+v %v", info, err)
	}
	// A timeout the agent enforces, with no caller at all.
	if _, err := second.Start(ctx, &agentpb.StartRequest{Id: "slow", Exec: &agentpb.ExecStart{Argv: []string{"sleep", "30"}, TimeoutMs: 300, User: "root"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, exit := attach(t, second, &agentpb.AttachRequest{Id: "slow", Follow: true}); exit == nil || !exit.TimedOut {
		t.Fatalf("the agent's timeout: %+v", exit)
	}

	// Bad requests.
	for _, req := range []*agentpb.StartRequest{
		{Id: "", Exec: &agentpb.ExecStart{Argv: []string{"true"}}},
		{Id: "a/b", Exec: &agentpb.ExecStart{Argv: []string{"true"}}},
		{Id: strings.Repeat("x", 65), Exec: &agentpb.ExecStart{Argv: []string{"true"}}},
		{Id: "x"},
		{Id: "x", Exec: &agentpb.ExecStart{Argv: []string{"true"}}, RingBytes: MaxRing + 1},
		{Id: "x", Exec: &agentpb.ExecStart{Argv: []string{"true"}}, Stdin: []byte("no stdin asked")},
	} {
		if _, err := second.Start(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%+v: %v", req, err)
		}
	}
	if _, err := second.Start(ctx, &agentpb.StartRequest{Id: "cmd-1", Exec: &agentpb.ExecStart{Argv: []string{"true"}}}); status.Code(err) != codes.AlreadyExists {
		t.Errorf("a second cmd-1: %v", err)
	}
	if _, err := second.Attach(ctx, &agentpb.AttachRequest{Id: "none"}); err == nil {
		s, _ := second.Attach(ctx, &agentpb.AttachRequest{Id: "none"})
		if _, err := s.Recv(); status.Code(err) != codes.NotFound {
			t.Errorf("attach to no command: %v", err)
		}
	}
}

// TestCommandsRingAndLimit: output beyond the ring is dropped from the
// front and shows as a jump in offsets, never as a hang; the table keeps
// at most MaxCommands, forgetting the oldest finished ones.
func TestCommandsRingAndLimit(t *testing.T) {
	e := newEnv(t)
	c := dialAgent(t, e.srv)
	ctx := context.Background()
	// 100 KB of output into a 16 KB ring.
	if _, err := c.Start(ctx, &agentpb.StartRequest{Id: "loud", RingBytes: 16 << 10, Exec: &agentpb.ExecStart{
		Shell: "head -c 100000 /dev/zero | tr '\\0' x; echo; echo end", User: "root"}}); err != nil {
		t.Fatal(err)
	}
	attach(t, c, &agentpb.AttachRequest{Id: "loud", Follow: true}) // until it ends
	out, _, offs, exit := attach(t, c, &agentpb.AttachRequest{Id: "loud"})
	if exit == nil || offs[0] != 100005 || len(out) != 16<<10 || !strings.HasSuffix(out, "x\nend\n") {
		t.Fatalf("exit %+v, offset %d, kept %d bytes", exit, offs[0], len(out))
	}
	for i := range MaxCommands {
		if _, err := c.Start(ctx, &agentpb.StartRequest{Id: fmt.Sprint("c", i), Exec: &agentpb.ExecStart{Argv: []string{"true"}, User: "root"}}); err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		attach(t, c, &agentpb.AttachRequest{Id: fmt.Sprint("c", i), Follow: true})
	}
	l, _ := c.Commands(ctx, &agentpb.Empty{})
	if len(l.Commands) != MaxCommands || l.Commands[0].Id != "c0" {
		t.Fatalf("kept %d, first %s", len(l.Commands), l.Commands[0].Id)
	}
	if _, err := c.Attach(ctx, &agentpb.AttachRequest{Id: "loud"}); err == nil {
		s, _ := c.Attach(ctx, &agentpb.AttachRequest{Id: "loud"})
		if _, err := s.Recv(); status.Code(err) != codes.NotFound {
			t.Errorf("the oldest finished command was kept: %v", err)
		}
	}
}
