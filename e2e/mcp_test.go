package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testserver"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCP is the walkthrough as Model Context Protocol tool calls, by the
// official SDK's client through `harebox mcp` (stdio) against a real
// hareboxd and a real VM: create a sandbox with a firewall policy, run
// commands (exit code, stdout, stderr), write and read files (text and
// bytes), list, delete. A key scoped to commands only gets tool errors
// for what it may not do, and runs commands.
func TestMCP(t *testing.T) {
	s := testserver.Prepare(t)
	dataDir, err := os.MkdirTemp("", "hbmcp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.Start(t, s, dataDir)
	defer testserver.Finish(t, srv, dataDir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	connect := func(key string) *mcp.ClientSession {
		t.Helper()
		cmd := exec.Command(filepath.Join(s.Bin, "harebox"), "mcp")
		cmd.Env = append(srv.Env(s), "HAREBOX_API_KEY="+key)
		cmd.Stderr = os.Stderr
		c := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "v1"}, nil)
		cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	// call calls a tool and decodes its structured result; it fails the
	// test on a tool error unless wantErr, and returns the error text.
	call := func(cs *mcp.ClientSession, name string, args map[string]any, out any, wantErr bool) string {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		text := ""
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				text += tc.Text
			}
		}
		if res.IsError != wantErr {
			t.Fatalf("%s: error %v, want %v: %s", name, res.IsError, wantErr, text)
		}
		if out != nil && !wantErr {
			b, _ := json.Marshal(res.StructuredContent)
			if err := json.Unmarshal(b, out); err != nil {
				t.Fatalf("%s: %v (%s)", name, err, b)
			}
		}
		return text
	}

	cs := connect(srv.Key)
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		if tl.InputSchema == nil || tl.Description == "" {
			t.Errorf("tool %s has no schema or description", tl.Name)
		}
	}
	if got := strings.Join(names, " "); got != "create_sandbox create_volume delete_sandbox delete_volume list_sandboxes list_volumes read_file run_code run_command write_file" {
		t.Errorf("tools: %s", got)
	}

	var box struct{ ID, State string }
	call(cs, "create_sandbox", map[string]any{"image": "minimal", "labels": map[string]string{"e2e": "mcp"},
		"firewall": map[string]any{"default_outbound": "deny"}}, &box, false)
	if box.ID == "" || box.State != "running" {
		t.Fatalf("create_sandbox: %+v", box)
	}
	defer srv.Call(t, "DELETE", "/v1/sandboxes/"+box.ID, srv.Key, nil)
	var ran struct {
		ExitCode       int `json:"exit_code"`
		Stdout, Stderr string
	}
	call(cs, "run_command", map[string]any{"sandbox_id": box.ID, "command": "read x; echo out-$x; echo err >&2; exit 3", "stdin": "put\n"}, &ran, false)
	if ran.ExitCode != 3 || ran.Stdout != "out-put\n" || ran.Stderr != "err\n" {
		t.Errorf("run_command: %+v", ran)
	}
	var wrote struct{ Bytes int }
	call(cs, "write_file", map[string]any{"sandbox_id": box.ID, "path": "/tmp/note.txt", "content": "hello, guest\n"}, &wrote, false)
	bin := []byte{0, 1, 2, 0xff, 0xfe}
	call(cs, "write_file", map[string]any{"sandbox_id": box.ID, "path": "/tmp/blob", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64", "mode": "0600"}, nil, false)
	var file struct{ Content, Encoding string }
	call(cs, "read_file", map[string]any{"sandbox_id": box.ID, "path": "/tmp/note.txt"}, &file, false)
	if file.Content != "hello, guest\n" || file.Encoding != "utf-8" {
		t.Errorf("read_file text: %+v", file)
	}
	call(cs, "read_file", map[string]any{"sandbox_id": box.ID, "path": "/tmp/blob"}, &file, false)
	if file.Content != base64.StdEncoding.EncodeToString(bin) || file.Encoding != "base64" {
		t.Errorf("read_file bytes: %+v", file)
	}
	call(cs, "run_command", map[string]any{"sandbox_id": box.ID, "command": "stat -c %a /tmp/blob"}, &ran, false)
	if strings.TrimSpace(ran.Stdout) != "600" {
		t.Errorf("write_file mode: %q", ran.Stdout)
	}
	if msg := call(cs, "read_file", map[string]any{"sandbox_id": box.ID, "path": "/no/such"}, nil, true); !strings.Contains(msg, "not_found") {
		t.Errorf("read_file of a missing file: %s", msg)
	}
	if msg := call(cs, "run_command", map[string]any{"sandbox_id": box.ID}, nil, true); msg == "" {
		t.Error("run_command without a command: no error text")
	}

	// A key for commands and reads only.
	_, k := srv.Call(t, "POST", "/v1/keys", srv.Key, map[string]any{"scope": map[string]any{"actions": []string{"exec", "listSandboxes", "getSandbox"}}})
	limited := connect(k["secret"].(string))
	if msg := call(limited, "create_sandbox", map[string]any{"image": "minimal"}, nil, true); !strings.Contains(msg, "forbidden") {
		t.Errorf("create_sandbox with a key for commands only: %s", msg)
	}
	if msg := call(limited, "delete_sandbox", map[string]any{"sandbox_id": box.ID}, nil, true); !strings.Contains(msg, "forbidden") {
		t.Errorf("delete_sandbox with a key for commands only: %s", msg)
	}
	call(limited, "run_command", map[string]any{"sandbox_id": box.ID, "command": "echo limited"}, &ran, false)
	if ran.Stdout != "limited\n" {
		t.Errorf("run_command with a key for commands: %+v", ran)
	}

	// The same tools over streamable HTTP on hareboxd itself.
	hs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "v1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp", HTTPClient: &http.Client{Transport: bearerKey(srv.Key)}, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hs.Close()
	call(hs, "run_command", map[string]any{"sandbox_id": box.ID, "command": "uname -s"}, &ran, false)
	if ran.Stdout != "Linux\n" {
		t.Errorf("run_command over HTTP: %+v", ran)
	}

	var l struct {
		Sandboxes []struct{ ID string }
	}
	call(cs, "list_sandboxes", map[string]any{"label": "e2e=mcp"}, &l, false)
	if len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != box.ID {
		t.Errorf("list_sandboxes: %+v", l)
	}
	call(cs, "delete_sandbox", map[string]any{"sandbox_id": box.ID}, nil, false)
	call(cs, "list_sandboxes", map[string]any{"label": "e2e=mcp"}, &l, false)
	for _, b := range l.Sandboxes {
		if b.ID == box.ID {
			t.Errorf("list_sandboxes after delete: %+v", l)
		}
	}
}

// bearerKey sends every request with an API key.
type bearerKey string

func (k bearerKey) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(k))
	return http.DefaultTransport.RoundTrip(r)
}
