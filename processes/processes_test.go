package processes_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/history"
	"github.com/harebox/harebox/internal/testdomains"
	"github.com/harebox/harebox/processes"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// one is the engine as the service sees it, with one sandbox: any other
// is not found, and a stopped one is not running.
type one struct {
	testdomains.Sandbox
	sb      *processes.Sandbox
	stopped bool
}

func (o *one) Running(_ context.Context, id string) (*processes.Sandbox, error) {
	if o.stopped {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is stopped; it must be running", id)
	}
	return o.sb, nil
}

// TestProcesses runs background processes in a memhv guest through the
// service, over the real store, secret store, audit log and command
// history: what the sandbox's Request makes is what runs, the command
// line is the host's note (dropped when the agent refuses the start, and
// by Forget), a finished process is in the history, output reads from
// offsets, waits, kills and their errors, and every call but a list is in
// the audit log.
func TestProcesses(t *testing.T) {
	ctx := context.Background()
	parts := testdomains.New(t)
	dir, db, sec, al, acc := parts.Dir, parts.Store, parts.Secrets, parts.Audit, parts.Account
	hist := history.New(history.Options{Store: db, Secrets: sec, Now: time.Now,
		Key: func(context.Context, string) ([]byte, error) { return nil, nil }})

	id := sandbox.NewID()
	sbs := &one{Sandbox: testdomains.Sandbox{ID: id, Account: acc.ID}, sb: &processes.Sandbox{ID: id, Agent: testdomains.Agent(t, dir),
		// (The sandbox's own variable, which printenv shows.)
		Request: func(r *sandbox.ExecRequest) agentclient.ExecRequest {
			return agentclient.ExecRequest{Shell: r.Cmd, Argv: r.Argv, Cwd: r.Cwd, Env: map[string]string{"FROM": "the sandbox"}, Timeout: r.Timeout()}
		},
		History: history.Sandbox{ID: id, AccountID: acc.ID, Monitoring: true, Deleting: func() bool { return false }}}}
	ectx, cancel := context.WithCancel(ctx) // (the engine's: until it closes)
	defer cancel()
	s := processes.New(ectx, processes.Options{Sandboxes: sbs, History: hist, Audit: al, MaxOutputBytes: 1 << 20})

	// A process that ends by itself.
	cmd := "echo one; echo two >&2; printenv FROM"
	p, err := s.Start(ctx, id, sandbox.ExecRequest{Cmd: cmd})
	if err != nil || p.ID == "" || p.SandboxID != id || p.Cmd != cmd {
		t.Fatalf("start: %+v %v", p, err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	done, err := s.Wait(wctx, id, p.ID)
	if err != nil || done.Running || done.Cmd != cmd || done.Result == nil ||
		done.Result.ExitCode != 0 || done.Result.Stdout != "one\nthe sandbox\n" || done.Result.Stderr != "two\n" {
		t.Fatalf("wait: %+v %v", done, err)
	}
	// Its output from offsets: 4 bytes of stdout already seen.
	var got [2]string
	var from [2]uint64
	res, err := s.Output(ctx, id, p.ID, [2]uint64{4, 0}, false, func(stderr bool, offset uint64, data []byte) error {
		i := 0
		if stderr {
			i = 1
		}
		if got[i] == "" {
			from[i] = offset
		}
		got[i] += string(data)
		return nil
	})
	if err != nil || res == nil || res.ExitCode != 0 || got != [2]string{"the sandbox\n", "two\n"} || from != [2]uint64{4, 0} {
		t.Fatalf("output from offsets: %+v %v %q from %v", res, err, got, from)
	}
	// Its history entry is written when the service sees it end.
	var h []sandbox.Command
	for deadline := time.Now().Add(5 * time.Second); len(h) == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if h, err = hist.List(ctx, id, 0); err != nil {
			t.Fatal(err)
		}
	}
	if len(h) != 1 || h[0].Kind != "background" || h[0].Cmd != cmd || h[0].Result == nil || h[0].Result.Stdout != "one\nthe sandbox\n" {
		t.Fatalf("history: %+v", h)
	}

	// A process that runs until it is killed.
	long, err := s.Start(ctx, id, sandbox.ExecRequest{Argv: []string{"sleep", "600"}})
	if err != nil || !long.Running || len(long.Argv) != 2 {
		t.Fatalf("start: %+v %v", long, err)
	}
	short, scancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = s.Wait(short, id, long.ID)
	scancel()
	if !errors.Is(err, sandbox.ErrTimeout) {
		t.Fatalf("wait on a running process, past the caller's deadline: %v", err)
	}
	if err := s.Kill(ctx, id, long.ID, 65); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("kill with signal 65: %v", err)
	}
	if err := s.Kill(ctx, id, long.ID, 0); err != nil {
		t.Fatal(err)
	}
	if k, err := s.Wait(wctx, id, long.ID); err != nil || k.Running || k.Result == nil || k.Result.Signal != 9 {
		t.Fatalf("wait after the kill: %+v %v", k, err)
	}
	if err := s.Kill(ctx, id, long.ID, 0); !errors.Is(err, sandbox.ErrState) {
		t.Fatalf("kill of an exited process: %v", err)
	}
	l, err := s.List(ctx, id)
	if err != nil || len(l) != 2 || l[0].ID != p.ID || l[0].Cmd != cmd || l[1].ID != long.ID || len(l[1].Argv) != 2 || l[0].Result == nil || l[0].Result.Stdout != "" {
		t.Fatalf("list (oldest first, without output): %+v %v", l, err)
	}

	// Refusals.
	if _, err := s.Get(ctx, id, "proc_nope"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("get of no process: %v", err)
	}
	if _, err := s.Get(ctx, sandbox.NewID(), p.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("get in another sandbox: %v", err)
	}
	if _, err := s.Output(ctx, id, "proc_nope", [2]uint64{}, true, func(bool, uint64, []byte) error { return nil }); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("output of no process: %v", err)
	}
	if _, err := s.Start(ctx, id, sandbox.ExecRequest{}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("start of nothing: %v", err)
	}
	if n := processes.Noted(s); n != 2 {
		t.Fatalf("%d command lines noted, want 2", n)
	}
	// (The host lets a relative cwd through; the agent refuses it.)
	if _, err := s.Start(ctx, id, sandbox.ExecRequest{Cmd: "true", Cwd: "tmp"}); err == nil {
		t.Fatal("the agent started a process in a relative cwd")
	}
	if n := processes.Noted(s); n != 2 {
		t.Fatalf("%d command lines noted after a refused start, want 2", n)
	}
	sbs.stopped = true
	if _, err := s.List(ctx, id); !errors.Is(err, sandbox.ErrState) {
		t.Fatalf("list in a stopped sandbox: %v", err)
	}
	sbs.stopped = false

	// Forget drops the notes; the agent still has the processes.
	s.Forget(id)
	if n := processes.Noted(s); n != 0 {
		t.Fatalf("%d command lines noted after Forget", n)
	}
	if l, err := s.List(ctx, id); err != nil || len(l) != 2 || l[0].Cmd != "" || l[1].Argv != nil {
		t.Fatalf("list after Forget: %+v %v", l, err)
	}

	entries, err := al.List(ctx, store.AuditFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		seen[fmt.Sprintf("%s %s %s %s", e.Action, e.Target, e.Outcome, e.Error)] = true
		if e.Action == "listProcesses" {
			t.Errorf("a list was audited: %+v", e)
		}
	}
	for _, want := range []string{
		"startProcess " + id + " ok ", "getProcess " + id + " ok ", "getProcessOutput " + id + " ok ", "killProcess " + id + " ok ",
		"getProcess " + id + " error timeout", "killProcess " + id + " error invalid", "killProcess " + id + " error conflict",
		"getProcess " + id + " denied not_found", "startProcess " + id + " error invalid",
	} {
		if !seen[want] {
			t.Errorf("no audit entry %q in %v", want, seen)
		}
	}
}

// TestInput: a process started with its stdin kept open, a tag and its
// config is found by its PID and by its tag, with what it was started
// with; its input reaches it (cat echoes it) until its end, and input is
// refused when it is bad, its stdin closed, or the process gone; every
// input is audited.
func TestInput(t *testing.T) {
	ctx := context.Background()
	parts := testdomains.New(t)
	dir, db, sec, al, acc := parts.Dir, parts.Store, parts.Secrets, parts.Audit, parts.Account
	hist := history.New(history.Options{Store: db, Secrets: sec, Now: time.Now,
		Key: func(context.Context, string) ([]byte, error) { return nil, nil }})
	id := sandbox.NewID()
	sbs := &one{Sandbox: testdomains.Sandbox{ID: id, Account: acc.ID}, sb: &processes.Sandbox{ID: id, Agent: testdomains.Agent(t, dir),
		Request: func(r *sandbox.ExecRequest) agentclient.ExecRequest {
			return agentclient.ExecRequest{Shell: r.Cmd, Argv: r.Argv, Cwd: r.Cwd, Env: r.Env, Timeout: r.Timeout()}
		},
		History: history.Sandbox{ID: id, AccountID: acc.ID, Deleting: func() bool { return false }}}}
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := processes.New(ectx, processes.Options{Sandboxes: sbs, History: hist, Audit: al, MaxOutputBytes: 1 << 20})

	env := map[string]string{"A": "b"}
	p, err := s.StartWith(ctx, id, sandbox.ExecRequest{Argv: []string{"cat"}, Env: env, Cwd: "/tmp", User: "root"},
		processes.StartOptions{KeepStdin: true, Tag: "reader"})
	if err != nil || !p.Running || p.Tag != "reader" || p.Env["A"] != "b" || p.Cwd != "/tmp" || p.User != "root" || p.PTY {
		t.Fatalf("start: %+v %v", p, err)
	}
	env["A"] = "changed" // (the note is the host's own copy)
	byPID, offs, err := s.Find(ctx, id, p.PID, "")
	if err != nil || byPID.ID != p.ID || byPID.Env["A"] != "b" || offs != [2]uint64{} {
		t.Fatalf("find by pid: %+v %v %v", byPID, offs, err)
	}
	if byTag, _, err := s.Find(ctx, id, 0, "reader"); err != nil || byTag.ID != p.ID {
		t.Fatalf("find by tag: %+v %v", byTag, err)
	}
	for _, bad := range []struct {
		pid int
		tag string
	}{{0, ""}, {1, "x"}} {
		if _, _, err := s.Find(ctx, id, bad.pid, bad.tag); !errors.Is(err, sandbox.ErrInvalid) {
			t.Fatalf("find by %v: %v", bad, err)
		}
	}
	if _, _, err := s.Find(ctx, id, 99999, ""); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("find of no pid: %v", err)
	}

	for _, bad := range []sandbox.ProcessInput{{}, {Rows: 10}, {Rows: 1001, Cols: 10}, {Stdin: make([]byte, sandbox.MaxProcessInput+1)}} {
		if err := s.SendInput(ctx, id, p.ID, bad); !errors.Is(err, sandbox.ErrInvalid) {
			t.Fatalf("input %d bytes, %dx%d: %v", len(bad.Stdin), bad.Rows, bad.Cols, err)
		}
	}
	if err := s.SendInput(ctx, id, p.ID, sandbox.ProcessInput{Rows: 10, Cols: 20}); !errors.Is(err, sandbox.ErrState) {
		t.Fatalf("resize of a process with no terminal: %v", err)
	}
	if err := s.SendInput(ctx, id, p.ID, sandbox.ProcessInput{Stdin: []byte("hello\n")}); err != nil {
		t.Fatal(err)
	}
	if err := s.SendInput(ctx, id, p.ID, sandbox.ProcessInput{Stdin: []byte("bye\n"), EOF: true}); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	done, err := s.Wait(wctx, id, p.ID)
	if err != nil || done.Result == nil || done.Result.ExitCode != 0 || done.Result.Stdout != "hello\nbye\n" {
		t.Fatalf("wait: %+v %v", done, err)
	}
	if err := s.SendInput(ctx, id, p.ID, sandbox.ProcessInput{Stdin: []byte("late")}); !errors.Is(err, sandbox.ErrState) {
		t.Fatalf("input to an exited process: %v", err)
	}
	if err := s.SendInput(ctx, id, "proc_nope", sandbox.ProcessInput{EOF: true}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("input to no process: %v", err)
	}
	// Its stdin not kept open: refused by the agent.
	q, err := s.Start(ctx, id, sandbox.ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SendInput(ctx, id, q.ID, sandbox.ProcessInput{Stdin: []byte("x")}); !errors.Is(err, sandbox.ErrState) {
		t.Fatalf("input to a process whose stdin is closed: %v", err)
	}
	if f, _, err := s.Find(ctx, id, q.PID, ""); err != nil || f.ID != q.ID || !f.Running {
		t.Fatalf("find of a running process by its pid: %+v %v", f, err)
	}
	s.Kill(ctx, id, q.ID, 9)

	entries, err := al.List(ctx, store.AuditFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.Action == "sendProcessInput" {
			n++
		}
	}
	if n != 10 {
		t.Errorf("%d inputs audited, want 10", n)
	}
}
