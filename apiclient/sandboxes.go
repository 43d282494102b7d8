package apiclient

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/move"
	"github.com/harebox/harebox/sandbox"
)

// The sandbox methods below have the names and shapes of the library's
// (package harebox's Engine) where the two overlap, so a program moves
// between an engine in its own process and a remote server by changing
// the value it calls. Each is one REST call; errors are *Error.

// Create makes a sandbox and returns it once its agent answers.
func (c *Client) Create(ctx context.Context, req sandbox.CreateRequest) (*sandbox.Sandbox, error) {
	var out sandbox.Sandbox
	return &out, c.Do(ctx, http.MethodPost, "/v1/sandboxes", nil, req, &out)
}

// Get returns a sandbox.
func (c *Client) Get(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	var out sandbox.Sandbox
	return &out, c.Do(ctx, http.MethodGet, SandboxPath(id), nil, nil, &out)
}

// List returns the sandboxes f selects (state, labels, account, project,
// fleet) that the key may see.
func (c *Client) List(ctx context.Context, f sandbox.ListFilter) ([]*sandbox.Sandbox, error) {
	q := url.Values{}
	for k, v := range map[string]string{"state": string(f.State), "account": f.Account, "project": f.Project, "fleet": f.Fleet} {
		if v != "" {
			q.Set(k, v)
		}
	}
	for k, v := range f.Labels {
		q.Add("label", k+"="+v)
	}
	var out struct {
		Sandboxes []*sandbox.Sandbox `json:"sandboxes"`
	}
	return out.Sandboxes, c.Do(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &out)
}

// Delete deletes a sandbox (its key is destroyed: crypto-erase).
func (c *Client) Delete(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodDelete, SandboxPath(id), nil, nil, nil)
}

func (c *Client) transition(ctx context.Context, id, verb string) (*sandbox.Sandbox, error) {
	var out sandbox.Sandbox
	return &out, c.Do(ctx, http.MethodPost, SandboxPath(id, "/"+verb), nil, nil, &out)
}

// Pause freezes a sandbox in memory.
func (c *Client) Pause(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return c.transition(ctx, id, "pause")
}

// Resume runs a paused or hibernated sandbox again.
func (c *Client) Resume(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return c.transition(ctx, id, "resume")
}

// Stop shuts a sandbox down and keeps its disk.
func (c *Client) Stop(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return c.transition(ctx, id, "stop")
}

// Start boots a stopped sandbox again.
func (c *Client) Start(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return c.transition(ctx, id, "start")
}

// Hibernate writes a sandbox's memory to disk, encrypted, and frees it.
func (c *Client) Hibernate(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return c.transition(ctx, id, "hibernate")
}

// Move moves a sandbox to host to (the operator only): the sandbox on
// its new host, the host it left and how long it did not run.
func (c *Client) Move(ctx context.Context, id, to string) (*move.Result, error) {
	var out move.Result
	return &out, c.Do(ctx, http.MethodPost, SandboxPath(id, "/move"), nil, map[string]string{"to": to}, &out)
}

// SetTimeout sets when a running or paused sandbox expires: ttl from now,
// rounded down to whole seconds, or never for 0.
func (c *Client) SetTimeout(ctx context.Context, id string, ttl time.Duration) (*sandbox.Sandbox, error) {
	secs := int64(ttl / time.Second)
	var out sandbox.Sandbox
	return &out, c.Do(ctx, http.MethodPost, SandboxPath(id, "/timeout"), nil, sandbox.TimeoutRequest{TTLSeconds: &secs}, &out)
}

// Fork makes req.Count new sandboxes from a running one.
func (c *Client) Fork(ctx context.Context, id string, req sandbox.ForkRequest) ([]*sandbox.Sandbox, error) {
	var out struct {
		Sandboxes []*sandbox.Sandbox `json:"sandboxes"`
	}
	return out.Sandboxes, c.Do(ctx, http.MethodPost, SandboxPath(id, "/fork"), nil, req, &out)
}

// Snapshot takes a named snapshot of a sandbox.
func (c *Client) Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (*sandbox.Snapshot, error) {
	var out sandbox.Snapshot
	return &out, c.Do(ctx, http.MethodPost, SandboxPath(id, "/snapshots"), nil, req, &out)
}

// DeleteSnapshot deletes a snapshot (its key is destroyed).
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodDelete, Path("snapshots", id), nil, nil, nil)
}

// Exec runs a command and returns its result. Unless ctx has a deadline,
// the call waits for the command's timeout and a minute more.
func (c *Client) Exec(ctx context.Context, id string, req sandbox.ExecRequest) (*sandbox.ExecResult, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Timeout()+time.Minute)
		defer cancel()
	}
	var out sandbox.ExecResult
	return &out, c.Do(ctx, http.MethodPost, SandboxPath(id, "/exec"), nil, req, &out)
}

// StartProcess runs a command in the background; it outlives this client.
func (c *Client) StartProcess(ctx context.Context, id string, req sandbox.ExecRequest) (*sandbox.Process, error) {
	var out sandbox.Process
	return &out, c.Do(ctx, http.MethodPost, SandboxPath(id, "/processes"), nil, req, &out)
}

// ListProcesses returns a sandbox's background processes.
func (c *Client) ListProcesses(ctx context.Context, id string) ([]sandbox.Process, error) {
	var out struct {
		Processes []sandbox.Process `json:"processes"`
	}
	return out.Processes, c.Do(ctx, http.MethodGet, SandboxPath(id, "/processes"), nil, nil, &out)
}

// GetProcess returns a background process as it is now, with its output
// once it has finished.
func (c *Client) GetProcess(ctx context.Context, id, procID string) (*sandbox.Process, error) {
	var out sandbox.Process
	return &out, c.Do(ctx, http.MethodGet, SandboxPath(id, "/processes/"+url.PathEscape(procID)), nil, nil, &out)
}

// WaitProcess waits until a background process ends (or ctx is done) and
// returns it with its result. Each call waits up to an hour on the
// server; it asks again until the process ends or ctx is done.
func (c *Client) WaitProcess(ctx context.Context, id, procID string) (*sandbox.Process, error) {
	for {
		var out sandbox.Process
		wait := 3600 * time.Second
		if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
			wait = max(time.Until(d), 0)
		}
		rctx, cancel := context.WithTimeout(ctx, wait+time.Minute)
		q := url.Values{"wait": {"true"}, "timeout_seconds": {strconv.FormatFloat(wait.Seconds(), 'f', 0, 64)}}
		err := c.Do(rctx, http.MethodGet, SandboxPath(id, "/processes/"+url.PathEscape(procID)), q, nil, &out)
		cancel()
		if err != nil || !out.Running {
			return &out, err
		}
		if err := ctx.Err(); err != nil {
			return &out, err
		}
	}
}

// KillProcess sends a signal (0: SIGKILL) to a background process.
func (c *Client) KillProcess(ctx context.Context, id, procID string, signal int) error {
	return c.Do(ctx, http.MethodPost, SandboxPath(id, "/processes/"+url.PathEscape(procID)+"/kill"), nil, map[string]int{"signal": signal}, nil)
}

// SendProcessInput gives a running background process, started with its
// stdin kept open, input: a terminal size, stdin bytes, their end.
func (c *Client) SendProcessInput(ctx context.Context, id, procID string, in sandbox.ProcessInput) error {
	return c.Do(ctx, http.MethodPost, SandboxPath(id, "/processes/"+url.PathEscape(procID)+"/input"), nil, in, nil)
}

// WriteOptions are a file write's options: the library's.
type WriteOptions = sandbox.WriteOptions

// WriteFile writes r to path in the sandbox (streamed; bounded by the
// server's file limit).
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, o WriteOptions) (*sandbox.FileInfo, error) {
	q := url.Values{"path": {path}}
	if o.Mode != 0 {
		q.Set("mode", fmt.Sprintf("%o", o.Mode))
	}
	if o.Owner != "" {
		q.Set("owner", o.Owner)
	}
	if o.MakeParents {
		q.Set("make_parents", "true")
	}
	var out sandbox.FileInfo
	return &out, c.Do(ctx, http.MethodPut, SandboxPath(id, "/files"), q, io.Reader(readerOnly{r}), &out)
}

// readerOnly hides everything of a reader but Read, so send streams it
// as octets (a *bytes.Buffer is still a reader, not a value to encode).
type readerOnly struct{ io.Reader }

// ReadFile copies a file of the sandbox to w and returns its size.
func (c *Client) ReadFile(ctx context.Context, id, path string, w io.Writer) (int64, error) {
	cw := &countingWriter{w: w}
	err := c.Do(ctx, http.MethodGet, SandboxPath(id, "/files"), url.Values{"path": {path}}, nil, io.Writer(cw))
	return cw.n, err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (cw *countingWriter) Write(b []byte) (int, error) {
	n, err := cw.w.Write(b)
	cw.n += int64(n)
	return n, err
}

// StatFile describes a file of the sandbox.
func (c *Client) StatFile(ctx context.Context, id, path string) (*sandbox.FileInfo, error) {
	var out sandbox.FileInfo
	return &out, c.Do(ctx, http.MethodGet, SandboxPath(id, "/files/stat"), url.Values{"path": {path}}, nil, &out)
}

// MoveFile renames a file or directory of the sandbox (within one file
// system, replacing a file at to).
func (c *Client) MoveFile(ctx context.Context, id, from, to string) (*sandbox.FileInfo, error) {
	var out sandbox.FileInfo
	return &out, c.Do(ctx, http.MethodPost, SandboxPath(id, "/files/move"), url.Values{"from": {from}, "to": {to}}, nil, &out)
}

// Firewall returns a sandbox's firewall policy.
func (c *Client) Firewall(ctx context.Context, id string) (*firewall.Policy, error) {
	var out firewall.Policy
	return &out, c.Do(ctx, http.MethodGet, SandboxPath(id, "/firewall"), nil, nil, &out)
}

// SetFirewall replaces a sandbox's firewall policy and returns it as in
// force.
func (c *Client) SetFirewall(ctx context.Context, id string, p *firewall.Policy) (*firewall.Policy, error) {
	var out firewall.Policy
	return &out, c.Do(ctx, http.MethodPut, SandboxPath(id, "/firewall"), nil, p, &out)
}
