package mcpserver_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/harebox/harebox/api"
	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/hypervisor/voldisk"
	"github.com/harebox/harebox/internal/testapi"
	"github.com/harebox/harebox/mcpserver"
	"github.com/harebox/harebox/sandbox"
)

// server is hareboxd's API on the fake hypervisor, and its root key.
func server(t *testing.T) (string, string) { return testapi.Server(t) }

// session connects an MCP client to a server of the tools, with key.
func session(t *testing.T, base, key string) *mcp.ClientSession {
	c, err := apiclient.New(base, key)
	if err != nil {
		t.Fatal(err)
	}
	ct, st := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := mcpserver.New(c, "test").Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// call calls a tool: its structured result into out, or its error text.
func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any, out any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var text string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text += tc.Text
		}
	}
	if !res.IsError && out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatal(err)
		}
	}
	return text, res.IsError
}

func TestTools(t *testing.T) {
	base, root := server(t)
	cs := session(t, base, root)
	var box mcpserver.Sandbox
	if msg, isErr := call(t, cs, "create_sandbox", map[string]any{"labels": map[string]string{"t": "mcp"},
		"firewall": map[string]any{"default_outbound": "deny", "outbound": []any{map[string]any{"action": "allow", "hosts": []string{"example.com"}, "ports": "443"}}}}, &box); isErr || box.ID == "" {
		t.Fatalf("create_sandbox: %s", msg)
	}
	var ran mcpserver.RunOutput
	if msg, isErr := call(t, cs, "run_command", map[string]any{"sandbox_id": box.ID, "command": "echo hi; echo oops >&2; exit 3"}, &ran); isErr ||
		ran.ExitCode != 3 || ran.Stdout != "hi\n" || ran.Stderr != "oops\n" {
		t.Errorf("run_command: %+v %s", ran, msg)
	}
	call(t, cs, "write_file", map[string]any{"sandbox_id": box.ID, "path": "/tmp/a.txt", "content": "text\n"}, nil)
	var f mcpserver.FileContent
	if msg, isErr := call(t, cs, "read_file", map[string]any{"sandbox_id": box.ID, "path": "/tmp/a.txt"}, &f); isErr || f.Content != "text\n" || f.Encoding != "utf-8" {
		t.Errorf("read_file: %+v %s", f, msg)
	}
	blob := []byte{0xff, 0, 0xfe}
	call(t, cs, "write_file", map[string]any{"sandbox_id": box.ID, "path": "/tmp/b", "content": base64.StdEncoding.EncodeToString(blob), "encoding": "base64"}, nil)
	if _, isErr := call(t, cs, "read_file", map[string]any{"sandbox_id": box.ID, "path": "/tmp/b"}, &f); isErr || f.Encoding != "base64" || f.Content != base64.StdEncoding.EncodeToString(blob) {
		t.Errorf("read_file of bytes: %+v", f)
	}
	// Too big for a model's context: refused, with what to do instead.
	big := strings.Repeat("x", mcpserver.MaxReadBytes+1)
	call(t, cs, "write_file", map[string]any{"sandbox_id": box.ID, "path": "/tmp/big", "content": big}, nil)
	if msg, isErr := call(t, cs, "read_file", map[string]any{"sandbox_id": box.ID, "path": "/tmp/big"}, nil); !isErr || !strings.Contains(msg, "run_command") {
		t.Errorf("read_file of a big file: %v %s", isErr, msg)
	}
	for _, bad := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"run_command", map[string]any{"sandbox_id": box.ID}, "required"},
		{"run_command", map[string]any{"sandbox_id": "sbx_nope", "command": "true"}, "not_found"},
		{"write_file", map[string]any{"sandbox_id": box.ID, "path": "/tmp/c", "content": "!!", "encoding": "base64"}, "base64"},
		{"write_file", map[string]any{"sandbox_id": box.ID, "path": "/tmp/c", "content": "x", "encoding": "rot13"}, "encoding"},
		{"write_file", map[string]any{"sandbox_id": box.ID, "path": "relative", "content": "x"}, "invalid"},
		{"read_file", map[string]any{"sandbox_id": box.ID, "path": "/no/such"}, "not_found"},
		{"create_sandbox", map[string]any{"size": "huge"}, "invalid"},
		{"create_sandbox", map[string]any{"firewall": map[string]any{"default_outbound": "maybe"}}, "firewall"},
		// (This server's sandboxes have no network, so no mesh.)
		{"create_sandbox", map[string]any{"mesh": true}, "no mesh"},
		{"create_sandbox", map[string]any{"project": "no-such-project"}, "no project"},
		{"delete_sandbox", map[string]any{}, "required"},
		{"list_sandboxes", map[string]any{"extra": 1}, ""},
	} {
		msg, isErr := call(t, cs, bad.tool, bad.args, nil)
		if !isErr || !strings.Contains(msg, bad.want) {
			t.Errorf("%s %v: error %v %q, want one naming %q", bad.tool, bad.args, isErr, msg, bad.want)
		}
	}

	// A key for commands only: the tools it may not use answer forbidden.
	c, _ := apiclient.New(base, root)
	var k struct{ Secret string }
	if err := c.Do(context.Background(), "POST", "/v1/keys", nil, map[string]any{"scope": map[string]any{"actions": []string{"exec", "listSandboxes"}}}, &k); err != nil {
		t.Fatal(err)
	}
	limited := session(t, base, k.Secret)
	for _, tool := range []struct {
		name string
		args map[string]any
	}{{"create_sandbox", map[string]any{}}, {"delete_sandbox", map[string]any{"sandbox_id": box.ID}}, {"write_file", map[string]any{"sandbox_id": box.ID, "path": "/tmp/x", "content": "x"}}} {
		if msg, isErr := call(t, limited, tool.name, tool.args, nil); !isErr || !strings.Contains(msg, "forbidden") {
			t.Errorf("%s with a key for commands: %v %s", tool.name, isErr, msg)
		}
	}
	if _, isErr := call(t, limited, "run_command", map[string]any{"sandbox_id": box.ID, "command": "echo ok"}, &ran); isErr || ran.Stdout != "ok\n" {
		t.Errorf("run_command with a key for commands: %+v", ran)
	}

	var l mcpserver.List
	call(t, cs, "list_sandboxes", map[string]any{"label": "t=mcp"}, &l)
	if len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != box.ID || l.Sandboxes[0].Labels["t"] != "mcp" {
		t.Errorf("list_sandboxes: %+v", l)
	}
	var d mcpserver.Deleted
	if msg, isErr := call(t, cs, "delete_sandbox", map[string]any{"sandbox_id": box.ID}, &d); isErr || !d.Deleted {
		t.Errorf("delete_sandbox: %s", msg)
	}
}

// withKey sends every request with key.
type withKey struct{ key string }

func (k withKey) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if k.key != "" {
		r.Header.Set("Authorization", "Bearer "+k.key)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func httpSession(base, key string) (*mcp.ClientSession, error) {
	t := &mcp.StreamableClientTransport{Endpoint: base + api.MCPPath, HTTPClient: &http.Client{Transport: withKey{key}},
		MaxRetries: -1, DisableStandaloneSSE: true}
	return mcp.NewClient(&mcp.Implementation{Name: "test", Version: "v1"}, nil).Connect(context.Background(), t, nil)
}

// TestStreamableHTTP: hareboxd's /mcp serves the same tools to agents that
// reach the server, each request authenticated by its own key: none or a
// wrong one is refused before any MCP, a key from the wrong address too,
// and a scoped key gets tool errors for what it may not do.
func TestStreamableHTTP(t *testing.T) {
	base, root := server(t)
	if _, err := httpSession(base, ""); err == nil {
		t.Error("an MCP session without a key")
	}
	if _, err := httpSession(base, "hbk_nope"); err == nil {
		t.Error("an MCP session with a wrong key")
	}
	c, _ := apiclient.New(base, root)
	key := func(scope map[string]any) string {
		var k struct{ Secret string }
		if err := c.Do(context.Background(), "POST", "/v1/keys", nil, map[string]any{"scope": scope}, &k); err != nil {
			t.Fatal(err)
		}
		return k.Secret
	}
	if _, err := httpSession(base, key(map[string]any{"cidrs": []string{"192.0.2.0/24"}})); err == nil {
		t.Error("an MCP session with a key from the wrong address")
	}
	cs, err := httpSession(base, root)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var box mcpserver.Sandbox
	if msg, isErr := call(t, cs, "create_sandbox", map[string]any{"labels": map[string]string{"t": "http"}}, &box); isErr || box.ID == "" {
		t.Fatalf("create_sandbox over HTTP: %s", msg)
	}
	var ran mcpserver.RunOutput
	if msg, isErr := call(t, cs, "run_command", map[string]any{"sandbox_id": box.ID, "command": "echo over-http"}, &ran); isErr || ran.Stdout != "over-http\n" {
		t.Errorf("run_command over HTTP: %+v %s", ran, msg)
	}
	limited, err := httpSession(base, key(map[string]any{"actions": []string{"exec", "listSandboxes"}}))
	if err != nil {
		t.Fatal(err)
	}
	defer limited.Close()
	if msg, isErr := call(t, limited, "delete_sandbox", map[string]any{"sandbox_id": box.ID}, nil); !isErr || !strings.Contains(msg, "forbidden") {
		t.Errorf("delete_sandbox over HTTP with a key for commands: %v %s", isErr, msg)
	}
	if _, isErr := call(t, limited, "run_command", map[string]any{"sandbox_id": box.ID, "command": "echo limited"}, &ran); isErr || ran.Stdout != "limited\n" {
		t.Errorf("run_command over HTTP with a key for commands: %+v", ran)
	}
	// The audit log names the key that acted through MCP.
	var a struct {
		Entries []struct{ Action, Principal string }
	}
	if err := c.Do(context.Background(), "GET", "/v1/audit", nil, nil, &a); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range a.Entries {
		if e.Action == "exec" && strings.HasPrefix(e.Principal, "key_") {
			n++
		}
	}
	if n == 0 {
		t.Errorf("no exec by the scoped key in the audit log: %+v", a.Entries)
	}
}

// The volume tools: made, attached at create_sandbox, listed with the
// sandbox, refused while attached, deleted.
func TestVolumeTools(t *testing.T) {
	if err := (voldisk.Tools{}).Check(); err != nil {
		t.Skip(err)
	}
	base, root := server(t)
	cs := session(t, base, root)
	var v mcpserver.Volume
	if msg, isErr := call(t, cs, "create_volume", map[string]any{"name": "data", "size_gb": 1}, &v); isErr || v.Name != "data" {
		t.Fatalf("create_volume: %s", msg)
	}
	var box mcpserver.Sandbox
	if msg, isErr := call(t, cs, "create_sandbox", map[string]any{"volumes": []any{map[string]any{"name": "data", "path": "/mnt/data"}}}, &box); isErr {
		t.Fatalf("create_sandbox with a volume: %s", msg)
	}
	var l mcpserver.Volumes
	if msg, isErr := call(t, cs, "list_volumes", map[string]any{}, &l); isErr || len(l.Volumes) != 1 || len(l.Volumes[0].Attached) != 1 || l.Volumes[0].Attached[0] != box.ID {
		t.Errorf("list_volumes: %+v %s", l, msg)
	}
	if msg, isErr := call(t, cs, "delete_volume", map[string]any{"name": "data"}, nil); !isErr || !strings.Contains(msg, "conflict") {
		t.Errorf("delete_volume while attached: %v %s", isErr, msg)
	}
	if msg, isErr := call(t, cs, "create_volume", map[string]any{"name": "x"}, nil); !isErr || !strings.Contains(msg, "size_gb") {
		t.Errorf("create_volume without a size: %v %s", isErr, msg)
	}
	call(t, cs, "delete_sandbox", map[string]any{"sandbox_id": box.ID}, nil)
	if msg, isErr := call(t, cs, "delete_volume", map[string]any{"name": "data"}, nil); isErr {
		t.Errorf("delete_volume: %s", msg)
	}
}

// TestRunCodeTool: run_code's answer as an agent gets it, the chart as
// image content, from a server that answers as hareboxd does (the real
// interpreter is e2e's TestCodeInterpreter); and the error on a sandbox
// with no interpreter, from the real API.
func TestRunCodeTool(t *testing.T) {
	chart := base64.StdEncoding.EncodeToString([]byte("\x89PNG\r\n\x1a\nnot really"))
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req sandbox.CodeRequest
		json.NewDecoder(r.Body).Decode(&req)
		if r.URL.Path != "/v1/sandboxes/sbx_1/code" || req.Code != "plot()" || req.ContextID != "c1" {
			http.Error(w, `{"error": {"code": "invalid", "message": "unexpected"}}`, 400)
			return
		}
		json.NewEncoder(w).Encode(sandbox.CodeExecution{ContextID: "c1", ExecutionCount: 3, Status: "ok", Stdout: "plotted\n",
			Results: []sandbox.CodeResult{{PNG: chart, Text: "<Figure>", Width: 640, Height: 480}, {IsMainResult: true, Text: "42"}}})
	}))
	defer fake.Close()
	cs := session(t, fake.URL, "key")
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"sandbox_id": "sbx_1", "code": "plot()", "context_id": "c1"}})
	if err != nil || res.IsError {
		t.Fatalf("run_code: %v %+v", err, res)
	}
	var out mcpserver.CodeOutput
	b, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(b, &out)
	if out.ExecutionCount != 3 || out.Stdout != "plotted\n" || len(out.Results) != 2 || out.Results[0].Image != "image/png" || out.Results[1].Text != "42" {
		t.Errorf("structured: %+v", out)
	}
	var images int
	for _, c := range res.Content {
		if ic, ok := c.(*mcp.ImageContent); ok {
			images++
			if ic.MIMEType != "image/png" || !strings.HasPrefix(string(ic.Data), "\x89PNG") {
				t.Errorf("image: %s %q", ic.MIMEType, ic.Data)
			}
		}
	}
	if images != 1 {
		t.Errorf("%d images", images)
	}

	base, root := server(t)
	real := session(t, base, root)
	var box mcpserver.Sandbox
	if msg, isErr := call(t, real, "create_sandbox", map[string]any{}, &box); isErr {
		t.Fatal(msg)
	}
	if msg, isErr := call(t, real, "run_code", map[string]any{"sandbox_id": box.ID, "code": "1"}, nil); !isErr || !strings.Contains(msg, "code-interpreter") {
		t.Errorf("run_code without an interpreter: %v %s", isErr, msg)
	}
}
