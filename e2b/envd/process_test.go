package envd_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/e2b/envd"
	"github.com/harebox/harebox/e2b/envdpb/process"
	"github.com/harebox/harebox/e2b/envdpb/process/processconnect"
	"github.com/harebox/harebox/sandbox"
)

// processActions are what envd's process service does on a sandbox: an
// envd token's principal needs them all.
var processActions = []string{"startProcess", "listProcesses", "getProcessOutput", "killProcess", "sendProcessInput"}

// scoped is access whose principal may do only the given actions.
type scoped struct {
	access
	actions []string
}

func (a scoped) Principal(_ context.Context, id string) (authz.Principal, error) {
	return authz.Principal{AccountID: a.account, KeyID: "envd", Scope: authz.Scope{Sandboxes: []string{id}, Actions: a.actions}}, nil
}

// events are a stream's events as they come, and how it ended.
type events struct {
	ch  chan *process.ProcessEvent
	err error // once ch is closed
}

// eventsOf reads a Start or Connect stream's events as they come.
func eventsOf[T any, PT interface {
	*T
	GetEvent() *process.ProcessEvent
}](s *connect.ServerStreamForClient[T]) *events {
	e := &events{ch: make(chan *process.ProcessEvent, 64)}
	go func() {
		for s.Receive() {
			e.ch <- PT(s.Msg()).GetEvent()
		}
		e.err = s.Err()
		close(e.ch)
	}()
	return e
}

// next is the stream's next event other than a keepalive (nil once it
// has ended).
func (e *events) next(t *testing.T) *process.ProcessEvent {
	t.Helper()
	for {
		select {
		case ev, ok := <-e.ch:
			if !ok || ev.GetKeepalive() == nil {
				return ev
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no event in 10 s")
		}
	}
}

// pid is the stream's first event's PID, which must be a start.
func (e *events) pid(t *testing.T) uint32 {
	t.Helper()
	ev := e.next(t)
	if ev.GetStart() == nil || ev.GetStart().GetPid() == 0 {
		t.Fatalf("first event: %v", ev)
	}
	return ev.GetStart().GetPid()
}

// rest reads the stream to its end: the output of each kind, the end
// event, and the stream's error.
func (e *events) rest(t *testing.T) (stdout, stderr, pty string, end *process.ProcessEvent_EndEvent, err error) {
	t.Helper()
	for ev := e.next(t); ev != nil; ev = e.next(t) {
		switch {
		case ev.GetData() != nil:
			d := ev.GetData()
			stdout += string(d.GetStdout())
			stderr += string(d.GetStderr())
			pty += string(d.GetPty())
		case ev.GetEnd() != nil:
			if end != nil {
				t.Fatalf("a second end: %v", ev)
			}
			end = ev.GetEnd()
		default:
			t.Fatalf("event %v mid-stream", ev)
		}
	}
	return stdout, stderr, pty, end, e.err
}

// envd's process service over a real engine on the in-memory hypervisor,
// through the generated Connect client in JSON (as the SDK speaks) and in
// binary: starts with their output and exit codes, a list with the tag and
// config, connects by pid and by tag, stdin in (sent and streamed) and
// closed, a terminal, signals, keepalives, the stream's timeout as the
// process's, and the errors.
func TestProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eng, ids, account := memEngine(t, 1)
	sb := struct{ ID, AccountID string }{ids[0], account}
	acc := access{id: sb.ID, token: "tok", account: sb.AccountID}
	serve := func(actions []string) string {
		s := envd.New(envd.Options{Files: eng, Access: scoped{acc, actions}, Processes: eng.Processes()})
		srv := httptest.NewServer(s.Handler(sb.ID))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	base := serve(processActions)
	// (Streams still open end before the servers close, which waits.)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	withToken := func(tok string) connect.ClientOption {
		return connect.WithInterceptors(headerInterceptor{"X-Access-Token", tok})
	}
	jsonc := processconnect.NewProcessClient(http.DefaultClient, base, connect.WithProtoJSON(), withToken("tok"))
	binc := processconnect.NewProcessClient(http.DefaultClient, base, withToken("tok"))
	code := func(err error) connect.Code { return connect.CodeOf(err) }
	start := func(c processconnect.ProcessClient, ctx context.Context, m *process.StartRequest, hdr ...string) *events {
		req := connect.NewRequest(m)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header().Set(hdr[i], hdr[i+1])
		}
		s, err := c.Start(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return eventsOf(s)
	}
	cfg := func(cmd string, args ...string) *process.ProcessConfig {
		return &process.ProcessConfig{Cmd: cmd, Args: args}
	}
	byPID := func(pid uint32) *process.ProcessSelector {
		return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	}
	stdin := func(b string) *process.ProcessInput {
		return &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte(b)}}
	}

	// A command's output and its exit, in both encodings.
	for name, c := range map[string]processconnect.ProcessClient{"json": jsonc, "binary": binc} {
		ev := start(c, ctx, &process.StartRequest{Process: cfg("echo", "hello")})
		ev.pid(t)
		out, errOut, pty, end, err := ev.rest(t)
		if err != nil || out != "hello\n" || errOut != "" || pty != "" || end == nil || end.ExitCode != 0 || !end.Exited || end.Status != "exit status 0" || end.Error != nil {
			t.Fatalf("%s: echo: %q %q %q %v %v", name, out, errOut, pty, end, err)
		}
	}
	// A non-zero exit, and stderr.
	ev := start(binc, ctx, &process.StartRequest{Process: cfg("exit", "3")})
	ev.pid(t)
	if _, _, _, end, err := ev.rest(t); err != nil || end == nil || end.ExitCode != 3 || end.GetError() != "exit status 3" {
		t.Fatalf("exit 3: %v %v", end, err)
	}
	ev = start(jsonc, ctx, &process.StartRequest{Process: cfg("cat", "/nope")})
	ev.pid(t)
	if out, errOut, _, end, err := ev.rest(t); err != nil || out != "" || !strings.Contains(errOut, "No such file") || end.GetExitCode() != 1 {
		t.Fatalf("cat of no file: %q %q %v %v", out, errOut, end, err)
	}

	// A reader with its stdin kept open, a tag, env and a cwd from the
	// user's home: listed with them, found by pid and by tag, its input
	// reaching both of its streams, until its stdin closes.
	tag, cwd := "reader", "work"
	reader := start(jsonc, ctx, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "cat", Envs: map[string]string{"A": "b"}, Cwd: &cwd},
		Tag: &tag, Stdin: new(true)})
	pid := reader.pid(t)
	list, err := jsonc.List(ctx, connect.NewRequest(&process.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var info *process.ProcessInfo
	for _, p := range list.Msg.GetProcesses() {
		if p.GetPid() == pid {
			info = p
		}
	}
	if info == nil || info.GetTag() != "reader" || info.GetConfig().GetCmd() != "cat" || len(info.GetConfig().GetArgs()) != 0 ||
		info.GetConfig().GetEnvs()["A"] != "b" || info.GetConfig().GetCwd() != "/home/user/work" {
		t.Fatalf("list: %v", list.Msg)
	}
	if _, err := jsonc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: byPID(pid), Input: stdin("one\n")})); err != nil {
		t.Fatal(err)
	}
	if e := reader.next(t); string(e.GetData().GetStdout()) != "one\n" {
		t.Fatalf("the reader's output: %v", e)
	}
	cs, err := binc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "reader"}}}))
	if err != nil {
		t.Fatal(err)
	}
	attached := eventsOf(cs)
	if got := attached.pid(t); got != pid {
		t.Fatalf("connect by tag: pid %d, want %d", got, pid)
	}
	if _, err := binc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: byPID(pid), Input: stdin("two\n")})); err != nil {
		t.Fatal(err)
	}
	if _, err := jsonc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: byPID(pid)})); err != nil {
		t.Fatal(err)
	}
	if out, _, _, end, err := reader.rest(t); err != nil || out != "two\n" || end.GetExitCode() != 0 {
		t.Fatalf("the reader, to its end: %q %v %v", out, end, err)
	}
	// (The attached stream sees only what came after it attached.)
	if out, _, _, end, err := attached.rest(t); err != nil || out != "two\n" || end.GetExitCode() != 0 {
		t.Fatalf("the attached stream, to its end: %q %v %v", out, end, err)
	}
	// Ended, it is no longer listed, nor given input; a connect sees its end.
	if list, err := jsonc.List(ctx, connect.NewRequest(&process.ListRequest{})); err != nil || len(list.Msg.GetProcesses()) != 0 {
		t.Fatalf("list after the end: %v %v", list, err)
	}
	if _, err := jsonc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: byPID(pid), Input: stdin("x")})); code(err) != connect.CodeNotFound {
		t.Fatalf("input to an ended process: %v", err)
	}
	cs, err = jsonc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: byPID(pid)}))
	if err != nil {
		t.Fatal(err)
	}
	late := eventsOf(cs)
	late.pid(t)
	if out, _, _, end, err := late.rest(t); err != nil || out != "" || end.GetExitCode() != 0 {
		t.Fatalf("connect to an ended process: %q %v %v", out, end, err)
	}

	// Input streamed (a client stream over HTTP/1.1), in order.
	ev = start(binc, ctx, &process.StartRequest{Process: cfg("cat"), Stdin: new(true)})
	pid = ev.pid(t)
	in := binc.StreamInput(ctx)
	for _, m := range []*process.StreamInputRequest{
		{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: byPID(pid)}}},
		{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: stdin("a")}}},
		{Event: &process.StreamInputRequest_Keepalive{Keepalive: &process.StreamInputRequest_KeepAlive{}}},
		{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: stdin("b")}}},
	} {
		if err := in.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatalf("stream input: %v", err)
	}
	if _, err := binc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: byPID(pid)})); err != nil {
		t.Fatal(err)
	}
	if out, _, _, _, err := ev.rest(t); err != nil || out != "ab" {
		t.Fatalf("streamed input: %q %v", out, err)
	}

	// A terminal: its output is the terminal's, its input too, resized.
	ev = start(jsonc, ctx, &process.StartRequest{Process: cfg("cat"), Pty: &process.PTY{Size: &process.PTY_Size{Rows: 24, Cols: 80}}})
	pid = ev.pid(t)
	if _, err := jsonc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: byPID(pid),
		Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte("ls\n")}}})); err != nil {
		t.Fatal(err)
	}
	if e := ev.next(t); string(e.GetData().GetPty()) != "ls\n" {
		t.Fatalf("the terminal's output: %v", e)
	}
	if _, err := jsonc.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: byPID(pid), Pty: &process.PTY{Size: &process.PTY_Size{Rows: 40, Cols: 120}}})); err != nil {
		t.Fatalf("resize: %v", err)
	}
	if _, err := jsonc.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: byPID(pid), Pty: &process.PTY{Size: &process.PTY_Size{Rows: 0, Cols: 120}}})); code(err) != connect.CodeInvalidArgument {
		t.Fatalf("resize to 0 rows: %v", err)
	}
	if _, err := jsonc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: byPID(pid), Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	if _, _, _, end, err := ev.rest(t); err != nil || end.GetExitCode() != -1 || end.GetExited() || end.GetStatus() != "signal: killed" || end.GetError() != "signal: killed" {
		t.Fatalf("the killed terminal's end: %v %v", end, err)
	}

	// A quiet process: keepalives as asked, then SIGTERM.
	ev = start(jsonc, ctx, &process.StartRequest{Process: cfg("sleep", "600"), Stdin: new(false)}, "Keepalive-Ping-Interval", "1")
	pid = ev.pid(t)
	select {
	case e := <-ev.ch:
		if e.GetKeepalive() == nil {
			t.Fatalf("a quiet stream's event: %v", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no keepalive in 5 s (asked every 1 s)")
	}
	if _, err := jsonc.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: byPID(pid), Pty: &process.PTY{Size: &process.PTY_Size{Rows: 40, Cols: 120}}})); code(err) != connect.CodeFailedPrecondition {
		t.Fatalf("resize of a process with no terminal: %v", err)
	}
	if _, err := jsonc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: byPID(pid), Input: stdin("x")})); code(err) != connect.CodeFailedPrecondition {
		t.Fatalf("input to a process whose stdin was not kept: %v", err)
	}
	if _, err := jsonc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: byPID(pid), Signal: process.Signal_SIGNAL_SIGTERM})); err != nil {
		t.Fatal(err)
	}
	if _, _, _, end, err := ev.rest(t); err != nil || end.GetExitCode() != -1 || end.GetStatus() != "signal: terminated" {
		t.Fatalf("the terminated process's end: %v %v", end, err)
	}

	// The stream's timeout is the process's: past it the stream ends with
	// deadline_exceeded and the agent kills the process. A caller that
	// goes away with no timeout leaves its process running (background).
	tctx, tcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	ev = start(binc, tctx, &process.StartRequest{Process: cfg("sleep", "600")})
	timed := ev.pid(t)
	if _, _, _, end, err := ev.rest(t); code(err) != connect.CodeDeadlineExceeded || end != nil {
		t.Fatalf("past the stream's timeout: %v %v", end, err)
	}
	tcancel()
	gctx, gone := context.WithCancel(ctx)
	ev = start(binc, gctx, &process.StartRequest{Process: cfg("sleep", "600")})
	bg := ev.pid(t)
	gone()
	ev.rest(t)
	running := func(pid uint32) bool {
		list, err := binc.List(ctx, connect.NewRequest(&process.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list.Msg.GetProcesses() {
			if p.GetPid() == pid {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(5 * time.Second); running(timed) && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
	}
	if running(timed) || !running(bg) {
		t.Fatalf("after the timeout: the timed-out process runs %v, the left one %v", running(timed), running(bg))
	}
	if _, err := binc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: byPID(bg), Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}

	// Errors.
	if _, err := jsonc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: byPID(99999), Input: stdin("x")})); code(err) != connect.CodeNotFound {
		t.Fatalf("input to no process: %v", err)
	}
	if _, err := jsonc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: byPID(99999), Signal: process.Signal_SIGNAL_SIGKILL})); code(err) != connect.CodeNotFound {
		t.Fatalf("kill of no process (the SDK's kill answers false): %v", err)
	}
	if _, err := jsonc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: byPID(99999)})); code(err) != connect.CodeNotFound {
		t.Fatalf("close of no process's stdin: %v", err)
	}
	cs, err = jsonc.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "nosuch"}}}))
	if err == nil {
		_, _, _, _, err = eventsOf(cs).rest(t)
	}
	if code(err) != connect.CodeNotFound {
		t.Fatalf("connect to no tag: %v", err)
	}
	if _, err := jsonc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: byPID(bg)})); code(err) != connect.CodeInvalidArgument {
		t.Fatalf("no signal: %v", err)
	}
	if _, err := jsonc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: byPID(bg)})); code(err) != connect.CodeInvalidArgument {
		t.Fatalf("no input: %v", err)
	}
	if _, err := jsonc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Input: stdin("x")})); code(err) != connect.CodeInvalidArgument {
		t.Fatalf("input to no selector: %v", err)
	}
	for name, m := range map[string]*process.StartRequest{
		"no command":     {},
		"a 5000-row pty": {Process: cfg("cat"), Pty: &process.PTY{Size: &process.PTY_Size{Rows: 5000, Cols: 80}}},
		"a bad env name": {Process: &process.ProcessConfig{Cmd: "true", Envs: map[string]string{"A=B": "c"}}},
		"a too long tag": {Process: cfg("true"), Tag: new(strings.Repeat("t", 257))},
	} {
		s, err := jsonc.Start(ctx, connect.NewRequest(m))
		if err == nil {
			_, _, _, _, err = eventsOf(s).rest(t)
		}
		if code(err) != connect.CodeInvalidArgument {
			t.Fatalf("start of %s: %v", name, err)
		}
	}
	// (Started as a user the guest does not have: it cannot start.)
	req := connect.NewRequest(&process.StartRequest{Process: cfg("true")})
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("ghost:")))
	s, err := jsonc.Start(ctx, req)
	if err == nil {
		_, _, _, _, err = eventsOf(s).rest(t)
	}
	if code(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "could not start") {
		t.Fatalf("start as an unknown user: %v", err)
	}
	// (A request that does not say keeps stdin open, as envd does.)
	big := &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: make([]byte, sandbox.MaxProcessInput+1)}}
	ev = start(binc, ctx, &process.StartRequest{Process: cfg("cat")})
	pid = ev.pid(t)
	if _, err := binc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: byPID(pid), Input: big})); code(err) != connect.CodeInvalidArgument {
		t.Fatalf("input over %d bytes: %v", sandbox.MaxProcessInput, err)
	}
	if _, err := binc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: byPID(pid), Input: stdin("kept")})); err != nil {
		t.Fatalf("input to a process started without saying: %v", err)
	}
	binc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: byPID(pid)}))
	if out, _, _, _, err := ev.rest(t); err != nil || out != "kept" {
		t.Fatalf("a process started without saying: %q %v", out, err)
	}
	// A wrong token, and a principal that may not give input.
	bad := processconnect.NewProcessClient(http.DefaultClient, base, withToken("nope"))
	if _, err := bad.List(ctx, connect.NewRequest(&process.ListRequest{})); code(err) != connect.CodeUnauthenticated {
		t.Fatalf("list with a wrong token: %v", err)
	}
	s, err = bad.Start(ctx, connect.NewRequest(&process.StartRequest{Process: cfg("true")}))
	if err == nil {
		_, _, _, _, err = eventsOf(s).rest(t)
	}
	if code(err) != connect.CodeUnauthenticated {
		t.Fatalf("start with a wrong token: %v", err)
	}
	noInput := processconnect.NewProcessClient(http.DefaultClient, serve([]string{"startProcess", "listProcesses", "getProcessOutput", "killProcess"}), withToken("tok"))
	ev = start(noInput, ctx, &process.StartRequest{Process: cfg("sleep", "600"), Stdin: new(true)})
	pid = ev.pid(t)
	if _, err := noInput.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: byPID(pid), Input: stdin("x")})); code(err) != connect.CodePermissionDenied {
		t.Fatalf("input without sendProcessInput: %v", err)
	}
	if _, err := noInput.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: byPID(pid), Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	ev.rest(t)
}

// headerInterceptor sets a header on every call, as the SDK sets the
// access token.
type headerInterceptor struct{ k, v string }

func (h headerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
		r.Header().Set(h.k, h.v)
		return next(ctx, r)
	}
}

func (h headerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set(h.k, h.v)
		return conn
	}
}

func (h headerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
