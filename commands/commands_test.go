package commands_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/commands"
	"github.com/harebox/harebox/history"
	"github.com/harebox/harebox/internal/testdomains"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// one is the engine as the service sees it, with one running sandbox.
type one struct {
	testdomains.Sandbox
	sb  *commands.Sandbox
	ran int // calls of Running
}

func (o *one) Running(context.Context, string) (*commands.Sandbox, error) {
	o.ran++
	return o.sb, nil
}

// TestCommands runs commands in a memhv guest through the service, over
// the real store, audit log and command history: what the sandbox's
// Request makes is what runs, stdin both ways, a streamed command's
// output as it comes and in the history, an invalid request refused
// before the sandbox is asked for, a sandbox the caller may not see, and
// each call in the audit log.
func TestCommands(t *testing.T) {
	ctx := context.Background()
	parts := testdomains.New(t)
	hist := history.New(history.Options{Store: parts.Store, Secrets: parts.Secrets, Now: time.Now,
		Key: func(context.Context, string) ([]byte, error) { return nil, nil }})
	id := sandbox.NewID()
	sbs := &one{Sandbox: testdomains.Sandbox{ID: id, Account: parts.Account.ID}, sb: &commands.Sandbox{Agent: testdomains.Agent(t, parts.Dir),
		Request: func(r *sandbox.ExecRequest) agentclient.ExecRequest {
			return agentclient.ExecRequest{Shell: r.Cmd, Argv: r.Argv, Env: map[string]string{"FROM": "the sandbox"}, Timeout: r.Timeout()}
		},
		History: history.Sandbox{ID: id, AccountID: parts.Account.ID, Monitoring: true, Deleting: func() bool { return false }}}}
	s := commands.New(commands.Options{Sandboxes: sbs, History: hist, Audit: parts.Audit})

	r, err := s.Exec(ctx, id, sandbox.ExecRequest{Cmd: "printenv FROM; cat; exit 3", Stdin: []byte("in\n")})
	if err != nil || r.ExitCode != 3 || r.Stdout != "the sandbox\nin\n" {
		t.Fatalf("exec: %+v %v", r, err)
	}
	var out, errs bytes.Buffer
	r, err = s.Stream(ctx, id, sandbox.ExecRequest{Cmd: "cat; echo oops >&2"}, strings.NewReader("streamed\n"), &out, &errs)
	if err != nil || r.ExitCode != 0 || out.String() != "streamed\n" || errs.String() != "oops\n" {
		t.Fatalf("stream: %+v %v %q %q", r, err, out.String(), errs.String())
	}
	out.Reset()
	r, err = s.Shell(ctx, id, sandbox.ExecRequest{Argv: []string{"cat"}}, nil, strings.NewReader("typed\n"), &out, &errs)
	if err != nil || r.ExitCode != 0 || out.String() != "typed\n" {
		t.Fatalf("shell without a terminal: %+v %v %q", r, err, out.String())
	}
	ran := sbs.ran
	if _, err := s.Exec(ctx, id, sandbox.ExecRequest{}); !errors.Is(err, sandbox.ErrInvalid) || sbs.ran != ran {
		t.Errorf("no command: %v (the sandbox asked for %d times)", err, sbs.ran-ran)
	}
	other := sandbox.NewID()
	if _, err := s.Exec(ctx, other, sandbox.ExecRequest{Cmd: "true"}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("another sandbox: %v", err)
	}

	cmds, err := hist.List(ctx, id, 10)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, c := range cmds {
		kinds[c.Kind]++
		if c.Kind == "exec" && (c.Result == nil || c.Result.ExitCode != 3 || c.Cmd != "printenv FROM; cat; exit 3") {
			t.Errorf("the exec in the history: %+v %+v", c, c.Result)
		}
	}
	if len(cmds) != 3 || kinds["exec"] != 1 || kinds["stream"] != 2 {
		t.Errorf("history: %v", kinds)
	}
	entries, err := parts.Audit.List(ctx, store.AuditFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		seen[fmt.Sprintf("%s %s %s %s", e.Action, e.Target, e.Outcome, e.Error)] = true
	}
	for _, want := range []string{"exec " + id + " ok ", "execStream " + id + " ok ", "openPty " + id + " ok ",
		"exec " + id + " error invalid", "exec " + other + " denied not_found"} {
		if !seen[want] {
			t.Errorf("no audit entry %q in %v", want, seen)
		}
	}
}
