package codeinterp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/history"
	"github.com/harebox/harebox/sandbox"
)

// The Service's own part: authorization, the image without an
// interpreter, the sandbox's variables under the cell's, the audit and
// history entries, a client per agent connection. (The interpreter's
// answers are the Client's, tested above.)

// agent connects to the fake interpreter, counting its connections.
type agent struct {
	addr  string
	dials atomic.Int32
}

func (a *agent) Connect(ctx context.Context, port uint16) (net.Conn, error) {
	if port != layout.InterpreterPort {
		return nil, fmt.Errorf("port %d", port)
	}
	a.dials.Add(1)
	var d net.Dialer
	return d.DialContext(ctx, "tcp", a.addr)
}

type fakeSandboxes struct {
	deny   bool
	interp bool
	asked  int // how often Interpreter was asked
	sb     *Sandbox
	audit  []string
	hist   []string
	mu     sync.Mutex
}

func (f *fakeSandboxes) Check(ctx context.Context, action, id string) error {
	if f.deny || id != f.sb.ID {
		return sandbox.Errorf(sandbox.ErrNotFound, "", "no sandbox %s", id)
	}
	return nil
}

func (f *fakeSandboxes) Running(ctx context.Context, id string) (*Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := *f.sb
	sb.Interpreter = func() (bool, error) {
		f.asked++
		return f.interp, nil
	}
	return &sb, nil
}

func (f *fakeSandboxes) AccountOf(ctx context.Context, id string) string { return "acct_1" }

func (f *fakeSandboxes) Record(ctx context.Context, action, accountID, target string, err error) {
	f.audit = append(f.audit, fmt.Sprintf("%s %s %s %v", action, accountID, target, err != nil))
}

type recorder struct{ f *fakeSandboxes }

func (r recorder) Record(ctx context.Context, b history.Sandbox, kind string, req *sandbox.ExecRequest, started time.Time, res *sandbox.ExecResult) {
	r.f.hist = append(r.f.hist, fmt.Sprintf("%s %s %s %q %q %d", b.ID, kind, req.Cmd, res.Stdout, res.Stderr, res.ExitCode))
}

func TestService(t *testing.T) {
	var gotEnv map[string]string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/execute":
			var body struct {
				Env map[string]string `json:"env"`
			}
			json.NewDecoder(r.Body).Decode(&body)
			gotEnv = body.Env
			fmt.Fprintln(w, `{"type": "stdout", "text": "hi\n"}`)
			fmt.Fprintln(w, `{"type": "error", "name": "ValueError", "value": "bad", "traceback": ""}`)
			fmt.Fprintln(w, `{"type": "end", "status": "error"}`)
		default:
			fmt.Fprint(w, `[]`)
		}
	}))
	defer srv.Close()
	a := &agent{addr: strings.TrimPrefix(srv.URL, "http://")}
	f := &fakeSandboxes{sb: &Sandbox{ID: "sbx_1", Image: "code-interpreter", Agent: a,
		Env: map[string]string{"A": "sandbox", "B": "sandbox"}, History: history.Sandbox{ID: "sbx_1"}}, interp: true}
	s := NewService(ServiceOptions{Sandboxes: f, History: recorder{f}, Audit: f, Client: Options{ReadyTimeout: time.Second}})
	defer s.Close()
	ctx := context.Background()

	x, err := s.Run(ctx, "sbx_1", sandbox.CodeRequest{Code: "raise", Env: map[string]string{"B": "cell"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if x.Stdout != "hi\n" || x.Error == nil || x.Error.Name != "ValueError" {
		t.Fatalf("execution: %+v", x)
	}
	if gotEnv["A"] != "sandbox" || gotEnv["B"] != "cell" {
		t.Errorf("the cell's environment: %v, want the sandbox's under the cell's", gotEnv)
	}
	if len(f.hist) != 1 || f.hist[0] != `sbx_1 code raise "hi\n" "ValueError: bad\n" 1` {
		t.Errorf("history: %q", f.hist)
	}
	// The same agent connection: the same client (its connection kept).
	if _, err := s.Contexts(ctx, "sbx_1"); err != nil {
		t.Fatal(err)
	}
	if n := a.dials.Load(); n != 1 {
		t.Errorf("%d connections for two calls through one agent connection", n)
	}
	if f.asked != 1 {
		t.Errorf("the image was asked for its interpreter %d times for one client", f.asked)
	}
	// A new agent connection (the machine started again): a new client.
	b := &agent{addr: a.addr}
	f.mu.Lock()
	f.sb.Agent = b
	f.mu.Unlock()
	if _, err := s.Contexts(ctx, "sbx_1"); err != nil {
		t.Fatal(err)
	}
	if b.dials.Load() != 1 || a.dials.Load() != 1 {
		t.Errorf("after a new agent connection: %d new, %d old dials", b.dials.Load(), a.dials.Load())
	}
	s.Forget("sbx_1")
	if _, err := s.Contexts(ctx, "sbx_1"); err != nil || b.dials.Load() != 2 {
		t.Errorf("after Forget: %v, %d dials (want a new client)", err, b.dials.Load())
	}

	// Refused before anything reaches the guest: a sandbox the caller may
	// not see, an image without an interpreter, a bad request.
	f.deny = true
	if _, err := s.Run(ctx, "sbx_1", sandbox.CodeRequest{Code: "1"}, nil); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("denied: %v", err)
	}
	f.deny = false
	f.interp = false
	s.Forget("sbx_1") // (an image's interpreter is asked when a client is made)
	if err := s.DeleteContext(ctx, "sbx_1", "default"); !errors.Is(err, sandbox.ErrState) || !strings.Contains(err.Error(), "code-interpreter") {
		t.Errorf("no interpreter: %v", err)
	}
	f.interp = true
	if _, err := s.Run(ctx, "sbx_1", sandbox.CodeRequest{}, nil); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("empty cell: %v", err)
	}
	want := []string{"runCode acct_1 sbx_1 false", "runCode acct_1 sbx_1 true", "deleteCodeContext acct_1 sbx_1 true", "runCode acct_1 sbx_1 true"}
	if strings.Join(f.audit, "|") != strings.Join(want, "|") {
		t.Errorf("audit: %q, want %q", f.audit, want)
	}
	if len(f.hist) != 1 {
		t.Errorf("history after refused calls: %q", f.hist)
	}
}
