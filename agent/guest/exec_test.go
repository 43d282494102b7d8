package guest

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/harebox/harebox/agent/agentpb"
)

type execResult struct {
	pid    int32
	stdout string
	stderr string
	exit   *agentpb.ExecExit
}

// execStream starts an exec and returns the stream, with its started pid
// read when the process started.
func execStream(t *testing.T, ctx context.Context, c agentpb.AgentClient, st *agentpb.ExecStart) agentpb.Agent_ExecClient {
	t.Helper()
	s, err := c.Exec(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Start{Start: st}}); err != nil {
		t.Fatal(err)
	}
	return s
}

// collect reads a stream to its end, checking there is exactly one Exit
// and that it comes last.
func collect(t *testing.T, s agentpb.Agent_ExecClient) execResult {
	t.Helper()
	var r execResult
	var out, errb strings.Builder
	for {
		m, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		if r.exit != nil {
			t.Fatalf("message %v after exit", m)
		}
		switch x := m.Msg.(type) {
		case *agentpb.ExecResponse_StartedPid:
			r.pid = x.StartedPid
		case *agentpb.ExecResponse_Stdout:
			if len(x.Stdout) > execChunk {
				t.Fatalf("stdout chunk of %d bytes", len(x.Stdout))
			}
			out.Write(x.Stdout)
		case *agentpb.ExecResponse_Stderr:
			errb.Write(x.Stderr)
		case *agentpb.ExecResponse_Exit:
			r.exit = x.Exit
		}
	}
	if r.exit == nil {
		t.Fatal("stream ended without exit")
	}
	r.stdout, r.stderr = out.String(), errb.String()
	return r
}

func run(t *testing.T, c agentpb.AgentClient, st *agentpb.ExecStart) execResult {
	t.Helper()
	s := execStream(t, testCtx(t), c, st)
	s.CloseSend()
	return collect(t, s)
}

func TestExecArgvAndShell(t *testing.T) {
	e := newEnv(t)
	r := run(t, e.client, &agentpb.ExecStart{Argv: []string{"echo", "hello", "world"}})
	if r.stdout != "hello world\n" || r.exit.ExitCode != 0 || r.exit.Error != "" || r.pid <= 0 {
		t.Fatalf("argv: %+v", r)
	}
	r = run(t, e.client, &agentpb.ExecStart{Shell: "echo out; echo err >&2; exit 3"})
	if r.stdout != "out\n" || r.stderr != "err\n" || r.exit.ExitCode != 3 {
		t.Fatalf("shell: %+v", r)
	}
	// Output larger than one chunk arrives whole.
	r = run(t, e.client, &agentpb.ExecStart{Shell: "head -c 300000 /dev/zero"})
	if len(r.stdout) != 300000 || r.exit.ExitCode != 0 {
		t.Fatalf("big output: %d bytes, exit %+v", len(r.stdout), r.exit)
	}
}

func TestExecEnvCwd(t *testing.T) {
	e := newEnv(t)
	r := run(t, e.client, &agentpb.ExecStart{
		Shell: `echo "$FOO|$HOME|$USER|$PATH|$(pwd)"`,
		Env:   []string{"FOO=bar=baz", "PATH=/usr/bin:/bin"},
		Cwd:   "/tmp",
		User:  "root",
	})
	if r.stdout != "bar=baz|/root|root|/usr/bin:/bin|/tmp\n" {
		t.Fatalf("got %q (%+v)", r.stdout, r.exit)
	}
	// The default user starts in its home with its groups.
	r = run(t, e.client, &agentpb.ExecStart{Shell: `echo "$(id -u) $(id -G) $(pwd) $USER"`})
	if r.stdout != "1000 1000 2000 "+e.home+" user\n" {
		t.Fatalf("default user: %q (%+v)", r.stdout, r.exit)
	}
}

func TestExecStdin(t *testing.T) {
	e := newEnv(t)
	s := execStream(t, testCtx(t), e.client, &agentpb.ExecStart{Argv: []string{"cat"}, Stdin: true})
	for _, part := range []string{"hello ", "stdin\n"} {
		if err := s.Send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Stdin{Stdin: []byte(part)}}); err != nil {
			t.Fatal(err)
		}
	}
	s.Send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_StdinEof{StdinEof: true}})
	r := collect(t, s)
	if r.stdout != "hello stdin\n" || r.exit.ExitCode != 0 {
		t.Fatalf("%+v", r)
	}
	// Without stdin the process reads /dev/null.
	r = run(t, e.client, &agentpb.ExecStart{Argv: []string{"cat"}})
	if r.stdout != "" || r.exit.ExitCode != 0 {
		t.Fatalf("no stdin: %+v", r)
	}
}

// groupAlive reports whether any live (non-zombie) process is in pgid.
func groupAlive(t *testing.T, pgid int32) []string {
	t.Helper()
	var alive []string
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// Fields after "comm)": state ppid pgrp ...
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 2 && f[2] == strconv.Itoa(int(pgid)) && f[0] != "Z" {
			alive = append(alive, p+": "+string(b[:i+1]))
		}
	}
	return alive
}

func TestExecTimeoutKillsGroup(t *testing.T) {
	e := newEnv(t)
	start := time.Now()
	r := run(t, e.client, &agentpb.ExecStart{Shell: "sleep 100 & sleep 100", TimeoutMs: 300})
	if !r.exit.TimedOut || r.exit.ExitCode != -1 || r.exit.Signal != 9 {
		t.Fatalf("exit = %+v", r.exit)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %v", d)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		alive := groupAlive(t, r.pid)
		if len(alive) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes survived the timeout: %v", alive)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestExecSignal(t *testing.T) {
	e := newEnv(t)
	s := execStream(t, testCtx(t), e.client, &agentpb.ExecStart{Shell: "sleep 100 & sleep 100"})
	m, err := s.Recv()
	if err != nil || m.GetStartedPid() <= 0 {
		t.Fatalf("first message %v, %v", m, err)
	}
	if err := s.Send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Signal{Signal: 15}}); err != nil {
		t.Fatal(err)
	}
	r := collect(t, s)
	if r.exit.ExitCode != -1 || r.exit.Signal != 15 || r.exit.TimedOut {
		t.Fatalf("exit = %+v", r.exit)
	}
}

func TestExecCancelKillsGroup(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	s := execStream(t, ctx, e.client, &agentpb.ExecStart{Shell: "sleep 100 & sleep 100"})
	m, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	pid := m.GetStartedPid()
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for len(groupAlive(t, pid)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("processes survived the cancel: %v", groupAlive(t, pid))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestExecPTY(t *testing.T) {
	e := newEnv(t)
	r := run(t, e.client, &agentpb.ExecStart{Argv: []string{"tty"}, Pty: true, User: "root"})
	if !regexp.MustCompile(`^/dev/pts/\d+\r?\n$`).MatchString(r.stdout) || r.exit.ExitCode != 0 {
		t.Fatalf("tty: %q %+v", r.stdout, r.exit)
	}
	r = run(t, e.client, &agentpb.ExecStart{Argv: []string{"stty", "size"}, Pty: true, PtyRows: 40, PtyCols: 100})
	if strings.TrimSpace(r.stdout) != "40 100" {
		t.Fatalf("initial size: %q %+v", r.stdout, r.exit)
	}

	// Resize, then let the process look.
	s := execStream(t, testCtx(t), e.client, &agentpb.ExecStart{
		Shell: "read x; stty size", Pty: true, Stdin: true, PtyRows: 24, PtyCols: 80,
	})
	s.Send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Resize{Resize: &agentpb.Resize{Rows: 33, Cols: 77}}})
	s.Send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Stdin{Stdin: []byte("go\n")}})
	r = collect(t, s)
	if !strings.Contains(r.stdout, "33 77") || r.exit.ExitCode != 0 {
		t.Fatalf("after resize: %q %+v", r.stdout, r.exit)
	}
}

func TestExecUsers(t *testing.T) {
	e := newEnv(t)
	r := run(t, e.client, &agentpb.ExecStart{Shell: "id -u; id -g", User: "65534"})
	if r.stdout != "65534\n65534\n" || r.exit.ExitCode != 0 {
		t.Fatalf("uid 65534: %q %+v", r.stdout, r.exit)
	}
	r = run(t, e.client, &agentpb.ExecStart{Argv: []string{"id", "-u"}, User: "4242"})
	if r.stdout != "4242\n" {
		t.Fatalf("uid 4242: %q %+v", r.stdout, r.exit)
	}
	r = run(t, e.client, &agentpb.ExecStart{Argv: []string{"id", "-u"}, User: "nosuchuser"})
	if r.exit.Error == "" || r.exit.ExitCode != 127 || r.pid != 0 {
		t.Fatalf("bad user: %+v", r)
	}
	r = run(t, e.client, &agentpb.ExecStart{Argv: []string{"/no/such/binary"}})
	if r.exit.Error == "" || r.exit.ExitCode != 127 {
		t.Fatalf("no binary: %+v", r)
	}
	r = run(t, e.client, &agentpb.ExecStart{Argv: []string{"no-such-command-here"}})
	if !strings.Contains(r.exit.Error, "not found") || r.exit.ExitCode != 127 {
		t.Fatalf("no command: %+v", r)
	}
	r = run(t, e.client, &agentpb.ExecStart{Argv: []string{"true"}, Cwd: "/no/such/dir"})
	if r.exit.Error == "" {
		t.Fatalf("bad cwd: %+v", r)
	}
}

func TestExecInvalid(t *testing.T) {
	e := newEnv(t)
	bad := []*agentpb.ExecRequest{
		{Msg: &agentpb.ExecRequest_Stdin{Stdin: []byte("x")}},
		{Msg: &agentpb.ExecRequest_Start{Start: &agentpb.ExecStart{}}},
		{Msg: &agentpb.ExecRequest_Start{Start: &agentpb.ExecStart{Argv: []string{"true"}, Shell: "true"}}},
		{Msg: &agentpb.ExecRequest_Start{Start: &agentpb.ExecStart{Argv: []string{"true"}, Env: []string{"NOEQUALS"}}}},
		{Msg: &agentpb.ExecRequest_Start{Start: &agentpb.ExecStart{Argv: []string{"true"}, Env: []string{"A=b\x00c"}}}},
		{Msg: &agentpb.ExecRequest_Start{Start: &agentpb.ExecStart{Argv: []string{"true"}, Cwd: "relative"}}},
	}
	for _, req := range bad {
		s, err := e.client.Exec(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		s.Send(req)
		s.CloseSend()
		_, err = s.Recv()
		wantCode(t, err, codes.InvalidArgument)
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestExecConcurrent(t *testing.T) {
	e := newEnv(t)
	run(t, e.client, &agentpb.ExecStart{Argv: []string{"true"}}) // warm up the connection
	before, beforeG := openFDs(t), runtime.NumGoroutine()

	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := e.client.Exec(testCtx(t))
			if err != nil {
				errs <- err
				return
			}
			st := &agentpb.ExecStart{Shell: fmt.Sprintf("sleep 0.2; echo %d; echo e%d >&2", i, i), Pty: i%4 == 0}
			s.Send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Start{Start: st}})
			s.CloseSend()
			var out, errOut string
			for {
				m, err := s.Recv()
				if err == io.EOF {
					break
				}
				if err != nil {
					errs <- err
					return
				}
				out += string(m.GetStdout())
				errOut += string(m.GetStderr())
			}
			want := fmt.Sprintf("%d\n", i)
			if st.Pty {
				out = strings.ReplaceAll(out, "\r\n", "\n")
				want = fmt.Sprintf("%d\ne%d\n", i, i)
			} else if errOut != fmt.Sprintf("e%d\n", i) {
				errs <- fmt.Errorf("exec %d stderr %q", i, errOut)
			}
			if out != want {
				errs <- fmt.Errorf("exec %d stdout %q, want %q", i, out, want)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Every pipe, pty, goroutine and stream of those execs is gone again
	// (a little slack for gRPC's own idle goroutines).
	deadline := time.Now().Add(5 * time.Second)
	for openFDs(t) > before || runtime.NumGoroutine() > beforeG+4 {
		if time.Now().After(deadline) {
			t.Fatalf("fds: %d before, %d after; goroutines: %d before, %d after",
				before, openFDs(t), beforeG, runtime.NumGoroutine())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A background child that keeps stdout open must not hold the exit back.
func TestExecBackgroundChildDoesNotBlockExit(t *testing.T) {
	e := newEnv(t)
	start := time.Now()
	r := run(t, e.client, &agentpb.ExecStart{Shell: "echo before; sleep 3 & echo after", User: "root"})
	if r.stdout != "before\nafter\n" || r.exit.ExitCode != 0 {
		t.Fatalf("%+v", r)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("exit waited %v for the background child", d)
	}
	unix.Kill(-int(r.pid), unix.SIGKILL) // the sleeper
}

// The agent starts raised (its unit's Nice=-15); its first command, and
// every one after it, runs at the default priority.
func TestExecNotRaised(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("raising a priority needs root")
	}
	unboostOnce = sync.Once{}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range tasks {
		tid, _ := strconv.Atoi(tk.Name())
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, -15); err != nil {
			t.Fatal(err)
		}
	}
	e := newEnv(t)
	for range 2 {
		// Field 19 of stat is the nice value (the command is cut's own).
		r := run(t, e.client, &agentpb.ExecStart{Shell: "cut -d' ' -f19 /proc/self/stat"})
		if r.stdout != "0\n" {
			t.Fatalf("a command ran at nice %q", r.stdout)
		}
	}
	if got, _ := os.ReadFile("/proc/self/stat"); strings.Fields(string(got))[18] != "0" {
		t.Errorf("the agent stays at nice %s", strings.Fields(string(got))[18])
	}
}
