// Package mcpserver serves HareBox to agent frameworks over the Model
// Context Protocol (the official Go SDK): tools to create a sandbox (with
// a firewall policy and volumes), run a command, read and write files,
// list and delete, and to create, list and delete volumes. Every tool calls the REST API with the client's key, so an
// agent can do only what that key allows (a scoped key limits it to its
// actions, projects, labels and sandboxes).
package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/sandbox"
)

// MaxReadBytes is the most read_file returns, and MaxOutputBytes the most
// of each stream run_command returns: a model's context is no place for
// more.
const (
	MaxReadBytes   = 1 << 20
	MaxOutputBytes = 256 << 10
)

// New returns an MCP server whose tools call the API through c.
func New(c *apiclient.Client, version string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "harebox", Title: "HareBox sandboxes", Version: version},
		&mcp.ServerOptions{Instructions: "Each sandbox is a virtual machine with its own kernel. Create one, run commands and move files in it, and delete it when done. Outbound network is what its firewall policy allows."})
	t := &tools{c: c}
	mcp.AddTool(s, &mcp.Tool{Name: "create_sandbox", Description: "Create a sandbox (a virtual machine) and wait until it runs. Returns its id."}, t.create)
	mcp.AddTool(s, &mcp.Tool{Name: "run_command", Description: "Run a shell command in a sandbox and wait for it: its exit code, stdout and stderr (the first 256 KiB of each)."}, t.run)
	mcp.AddTool(s, &mcp.Tool{Name: "run_code", Description: "Run a cell of Python (or JavaScript, TypeScript or bash) in a sandbox's code interpreter (a sandbox made from the code-interpreter image) and wait for it: state lasts from one cell to the next in a context, like a notebook. Returns its output, the value of its last expression, its exception, and charts as images."}, t.runCode)
	mcp.AddTool(s, &mcp.Tool{Name: "read_file", Description: fmt.Sprintf("Read a file of a sandbox (at most %d bytes): UTF-8 text as is, anything else base64.", MaxReadBytes)}, t.read)
	mcp.AddTool(s, &mcp.Tool{Name: "write_file", Description: "Write a file in a sandbox, creating or replacing it."}, t.write)
	mcp.AddTool(s, &mcp.Tool{Name: "list_sandboxes", Description: "List the sandboxes this key can see."}, t.list)
	mcp.AddTool(s, &mcp.Tool{Name: "delete_sandbox", Description: "Delete a sandbox: its VM stops and its disk's key is destroyed."}, t.delete)
	mcp.AddTool(s, &mcp.Tool{Name: "create_volume", Description: "Create a volume: a disk of the project that outlives sandboxes, encrypted under its own key. Attach it at create_sandbox (volumes)."}, t.createVolume)
	mcp.AddTool(s, &mcp.Tool{Name: "list_volumes", Description: "List a project's volumes and the sandboxes each is attached to."}, t.listVolumes)
	mcp.AddTool(s, &mcp.Tool{Name: "delete_volume", Description: "Delete a volume no sandbox has attached: its key is destroyed, then its file."}, t.deleteVolume)
	return s
}

type tools struct{ c *apiclient.Client }

// Rule is an outbound firewall rule.
type Rule struct {
	Action string   `json:"action" jsonschema:"allow or deny"`
	Hosts  []string `json:"hosts,omitempty" jsonschema:"host names (*.example.com for its subdomains)"`
	CIDRs  []string `json:"cidrs,omitempty" jsonschema:"address ranges"`
	Ports  string   `json:"ports,omitempty" jsonschema:"ports: 443, 80,443 or 8000-9000; all when empty"`
}

// Firewall is a sandbox's outbound policy.
type Firewall struct {
	DefaultOutbound string `json:"default_outbound" jsonschema:"allow or deny: what no rule matches"`
	Outbound        []Rule `json:"outbound,omitempty" jsonschema:"rules tried in order; the first match wins"`
}

// CreateInput is create_sandbox's arguments.
type CreateInput struct {
	Image      string            `json:"image,omitempty" jsonschema:"the guest image (default: the server's default image)"`
	Size       string            `json:"size,omitempty" jsonschema:"small, medium or large (default small)"`
	TTLSeconds int64             `json:"ttl_seconds,omitempty" jsonschema:"delete it after this many seconds (0: the server's default)"`
	Labels     map[string]string `json:"labels,omitempty" jsonschema:"labels to find it by"`
	Firewall   *Firewall         `json:"firewall,omitempty" jsonschema:"its outbound firewall policy (default: the server's)"`
	Project    string            `json:"project,omitempty" jsonschema:"the project it belongs to, ID or name (default: the account's default project)"`
	Mesh       *bool             `json:"mesh,omitempty" jsonschema:"true puts it on its project's private mesh, where the project's other mesh sandboxes reach it by name; false keeps it off (default: as the project says)"`
	Volumes    []VolumeMount     `json:"volumes,omitempty" jsonschema:"volumes of its project to mount: one writer at a time; a reader sees a volume as it was when it attached"`
}

// VolumeMount attaches a volume at create.
type VolumeMount struct {
	Name     string `json:"name" jsonschema:"the volume's name"`
	Path     string `json:"path" jsonschema:"where the sandbox mounts it: an absolute path such as /mnt/data"`
	ReadOnly bool   `json:"read_only,omitempty" jsonschema:"mount it read-only"`
}

// Sandbox is a sandbox as the tools show it.
type Sandbox struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Image     string            `json:"image"`
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	// MeshName is the name its project's other mesh sandboxes reach it by.
	MeshName string `json:"mesh_name,omitempty"`
}

func view(s *sandbox.Sandbox) Sandbox {
	return Sandbox{ID: s.ID, State: string(s.State), Image: s.Image, Labels: s.Labels, CreatedAt: s.CreatedAt, MeshName: s.MeshName}
}

func (t *tools) create(ctx context.Context, _ *mcp.CallToolRequest, in CreateInput) (*mcp.CallToolResult, Sandbox, error) {
	req := sandbox.CreateRequest{Image: in.Image, Size: sandbox.Size{Preset: in.Size}, TTLSeconds: in.TTLSeconds, Labels: in.Labels,
		Project: in.Project, Mesh: in.Mesh}
	for _, v := range in.Volumes {
		req.Volumes = append(req.Volumes, sandbox.VolumeMount{Name: v.Name, Path: v.Path, ReadOnly: v.ReadOnly})
	}
	if in.Firewall != nil {
		b, err := json.Marshal(in.Firewall)
		if err != nil {
			return nil, Sandbox{}, err
		}
		req.Firewall = b
	}
	var s sandbox.Sandbox
	if err := t.c.Do(ctx, "POST", "/v1/sandboxes", nil, req, &s); err != nil {
		return nil, Sandbox{}, explain(err)
	}
	return nil, view(&s), nil
}

// RunInput is run_command's arguments.
type RunInput struct {
	SandboxID      string `json:"sandbox_id" jsonschema:"the sandbox"`
	Command        string `json:"command" jsonschema:"a shell command line, run with /bin/sh -c"`
	Stdin          string `json:"stdin,omitempty" jsonschema:"what the command reads on its standard input"`
	Cwd            string `json:"cwd,omitempty" jsonschema:"the directory it runs in"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"kill it after this many seconds (0: the server's default)"`
}

// RunOutput is what a command did.
type RunOutput struct {
	ExitCode  int    `json:"exit_code"`
	Signal    int    `json:"signal,omitempty" jsonschema:"the signal that ended it, if one did"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	Truncated bool   `json:"truncated,omitempty" jsonschema:"output beyond 256 KiB a stream (or the server's cap) was dropped"`
	Error     string `json:"error,omitempty" jsonschema:"why it could not start"`
}

func (t *tools) run(ctx context.Context, _ *mcp.CallToolRequest, in RunInput) (*mcp.CallToolResult, RunOutput, error) {
	if in.SandboxID == "" || in.Command == "" {
		return nil, RunOutput{}, errors.New("sandbox_id and command are required")
	}
	req := sandbox.ExecRequest{Cmd: in.Command, Cwd: in.Cwd, TimeoutSeconds: float64(in.TimeoutSeconds)}
	if in.Stdin != "" {
		req.Stdin = []byte(in.Stdin)
	}
	if in.TimeoutSeconds < 0 || in.TimeoutSeconds > 86400 {
		return nil, RunOutput{}, errors.New("timeout_seconds: from 0 (the server's default) to 86400")
	}
	// The call waits for the command, and a minute more: the server's
	// timeout ends it first, with its output and timed_out.
	timeout := sandbox.DefaultExecTimeout
	if in.TimeoutSeconds > 0 {
		timeout = time.Duration(in.TimeoutSeconds) * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout+time.Minute)
	defer cancel()
	var r sandbox.ExecResult
	if err := t.c.Do(ctx, "POST", apiclient.SandboxPath(in.SandboxID, "/exec"), nil, req, &r); err != nil {
		return nil, RunOutput{}, explain(err)
	}
	out := RunOutput{ExitCode: r.ExitCode, Signal: r.Signal, Stdout: r.Stdout, Stderr: r.Stderr, TimedOut: r.TimedOut,
		Truncated: r.StdoutTruncated || r.StderrTruncated, Error: r.Error}
	for _, s := range []*string{&out.Stdout, &out.Stderr} {
		if len(*s) > MaxOutputBytes {
			*s, out.Truncated = strings.ToValidUTF8((*s)[:MaxOutputBytes], ""), true
		}
	}
	return nil, out, nil
}

// CodeInput is run_code's arguments.
type CodeInput struct {
	SandboxID      string `json:"sandbox_id" jsonschema:"the sandbox (made from the code-interpreter image)"`
	Code           string `json:"code" jsonschema:"the cell"`
	ContextID      string `json:"context_id,omitempty" jsonschema:"the context it runs in (default: the language's default context)"`
	Language       string `json:"language,omitempty" jsonschema:"python (the default), javascript, typescript or bash"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"interrupt it after this many seconds (0: 300); the context stays usable"`
}

// CodeOutput is what a cell did. Its charts come as image content.
type CodeOutput struct {
	Status         string `json:"status" jsonschema:"ok, error, timeout, or died (the kernel died: the context must be restarted)"`
	ExecutionCount int    `json:"execution_count"`
	Stdout         string `json:"stdout"`
	Stderr         string `json:"stderr"`
	// Results are the cell's rich results as text: its value, what it
	// displayed (HTML as is, images attached).
	Results   []CodeResultText   `json:"results,omitempty"`
	Error     *sandbox.CodeError `json:"error,omitempty"`
	Truncated bool               `json:"truncated,omitempty" jsonschema:"output beyond 256 KiB a stream (or the server's cap) was dropped"`
}

// CodeResultText is one rich result, its text formats.
type CodeResultText struct {
	IsMainResult bool   `json:"is_main_result" jsonschema:"the value of the cell's last expression"`
	Text         string `json:"text,omitempty"`
	HTML         string `json:"html,omitempty"`
	Markdown     string `json:"markdown,omitempty"`
	Image        string `json:"image,omitempty" jsonschema:"the MIME type of the image attached for it"`
}

// maxImages bounds the images a run_code result attaches.
const maxImages = 8

func (t *tools) runCode(ctx context.Context, _ *mcp.CallToolRequest, in CodeInput) (*mcp.CallToolResult, CodeOutput, error) {
	if in.SandboxID == "" || in.Code == "" {
		return nil, CodeOutput{}, errors.New("sandbox_id and code are required")
	}
	req := sandbox.CodeRequest{Code: in.Code, ContextID: in.ContextID, Language: in.Language, TimeoutSeconds: float64(in.TimeoutSeconds)}
	x, err := t.c.RunCode(ctx, in.SandboxID, req)
	if err != nil {
		return nil, CodeOutput{}, explain(err)
	}
	out := CodeOutput{Status: x.Status, ExecutionCount: x.ExecutionCount, Stdout: x.Stdout, Stderr: x.Stderr, Error: x.Error,
		Truncated: x.StdoutTruncated || x.StderrTruncated}
	for _, s := range []*string{&out.Stdout, &out.Stderr} {
		if len(*s) > MaxOutputBytes {
			*s, out.Truncated = strings.ToValidUTF8((*s)[:MaxOutputBytes], ""), true
		}
	}
	res := &mcp.CallToolResult{}
	for _, r := range x.Results {
		rt := CodeResultText{IsMainResult: r.IsMainResult, Text: r.Text, HTML: r.HTML, Markdown: r.Markdown}
		for mime, b64 := range map[string]string{"image/png": r.PNG, "image/jpeg": r.JPEG} {
			if b64 == "" || len(res.Content) >= maxImages {
				continue
			}
			if b, err := base64.StdEncoding.DecodeString(b64); err == nil {
				res.Content = append(res.Content, &mcp.ImageContent{Data: b, MIMEType: mime})
				rt.Image = mime
				break
			}
		}
		out.Results = append(out.Results, rt)
	}
	summary, err := json.Marshal(out)
	if err != nil {
		return nil, CodeOutput{}, err
	}
	res.Content = append([]mcp.Content{&mcp.TextContent{Text: string(summary)}}, res.Content...)
	return res, out, nil
}

// ReadInput is read_file's arguments.
type ReadInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox"`
	Path      string `json:"path" jsonschema:"the file's absolute path"`
}

// FileContent is a file's content.
type FileContent struct {
	Content  string `json:"content"`
	Encoding string `json:"encoding" jsonschema:"utf-8 or base64"`
	Bytes    int    `json:"bytes"`
}

func (t *tools) read(ctx context.Context, _ *mcp.CallToolRequest, in ReadInput) (*mcp.CallToolResult, FileContent, error) {
	if in.SandboxID == "" || in.Path == "" {
		return nil, FileContent{}, errors.New("sandbox_id and path are required")
	}
	var stat sandbox.FileInfo
	q := url.Values{"path": {in.Path}}
	if err := t.c.Do(ctx, "GET", apiclient.SandboxPath(in.SandboxID, "/files/stat"), q, nil, &stat); err != nil {
		return nil, FileContent{}, explain(err)
	}
	if stat.Size > MaxReadBytes {
		return nil, FileContent{}, fmt.Errorf("%s has %d bytes, more than read_file returns (%d): read part of it with run_command (head, tail, sed -n)", in.Path, stat.Size, MaxReadBytes)
	}
	var buf bytes.Buffer
	if err := t.c.Do(ctx, "GET", apiclient.SandboxPath(in.SandboxID, "/files"), q, nil, &limited{w: &buf, n: MaxReadBytes}); err != nil {
		return nil, FileContent{}, explain(err)
	}
	b := buf.Bytes()
	if utf8.Valid(b) {
		return nil, FileContent{Content: string(b), Encoding: "utf-8", Bytes: len(b)}, nil
	}
	return nil, FileContent{Content: base64.StdEncoding.EncodeToString(b), Encoding: "base64", Bytes: len(b)}, nil
}

// limited takes at most n bytes, and fails past them (the file grew).
type limited struct {
	w io.Writer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	if len(p) > l.n {
		return 0, fmt.Errorf("the file is longer than %d bytes", MaxReadBytes)
	}
	l.n -= len(p)
	return l.w.Write(p)
}

// WriteInput is write_file's arguments.
type WriteInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox"`
	Path      string `json:"path" jsonschema:"the file's absolute path"`
	Content   string `json:"content" jsonschema:"what to write"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"utf-8 (default) or base64"`
	Mode      string `json:"mode,omitempty" jsonschema:"octal permissions, e.g. 0755 (default 0644)"`
}

// Written is what write_file wrote.
type Written struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

func (t *tools) write(ctx context.Context, _ *mcp.CallToolRequest, in WriteInput) (*mcp.CallToolResult, Written, error) {
	if in.SandboxID == "" || in.Path == "" {
		return nil, Written{}, errors.New("sandbox_id and path are required")
	}
	b := []byte(in.Content)
	switch in.Encoding {
	case "", "utf-8":
	case "base64":
		var err error
		if b, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, Written{}, fmt.Errorf("content is not base64: %w", err)
		}
	default:
		return nil, Written{}, fmt.Errorf("encoding %q: want utf-8 or base64", in.Encoding)
	}
	q := url.Values{"path": {in.Path}}
	if in.Mode != "" {
		q.Set("mode", in.Mode)
	}
	if err := t.c.Do(ctx, "PUT", apiclient.SandboxPath(in.SandboxID, "/files"), q, bytes.NewReader(b), nil); err != nil {
		return nil, Written{}, explain(err)
	}
	return nil, Written{Path: in.Path, Bytes: len(b)}, nil
}

// ListInput is list_sandboxes's arguments.
type ListInput struct {
	Label string `json:"label,omitempty" jsonschema:"only those with this label, KEY=VALUE"`
}

// List is the sandboxes a key sees.
type List struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

func (t *tools) list(ctx context.Context, _ *mcp.CallToolRequest, in ListInput) (*mcp.CallToolResult, List, error) {
	var q url.Values
	if in.Label != "" {
		q = url.Values{"label": {in.Label}}
	}
	var l struct {
		Sandboxes []*sandbox.Sandbox `json:"sandboxes"`
	}
	if err := t.c.Do(ctx, "GET", "/v1/sandboxes", q, nil, &l); err != nil {
		return nil, List{}, explain(err)
	}
	out := List{Sandboxes: []Sandbox{}}
	for _, s := range l.Sandboxes {
		out.Sandboxes = append(out.Sandboxes, view(s))
	}
	return nil, out, nil
}

// DeleteInput is delete_sandbox's arguments.
type DeleteInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the sandbox"`
}

// Deleted says which sandbox was deleted.
type Deleted struct {
	ID      string `json:"id"`
	Deleted bool   `json:"deleted"`
}

func (t *tools) delete(ctx context.Context, _ *mcp.CallToolRequest, in DeleteInput) (*mcp.CallToolResult, Deleted, error) {
	if in.SandboxID == "" {
		return nil, Deleted{}, errors.New("sandbox_id is required")
	}
	if err := t.c.Do(ctx, "DELETE", apiclient.SandboxPath(in.SandboxID), nil, nil, nil); err != nil {
		return nil, Deleted{}, explain(err)
	}
	return nil, Deleted{ID: in.SandboxID, Deleted: true}, nil
}

// VolumeInput names a project's volume; CreateVolumeInput makes one.
type VolumeInput struct {
	Name    string `json:"name" jsonschema:"the volume's name (or vol_ ID)"`
	Project string `json:"project,omitempty" jsonschema:"its project, ID or name (default: the account's default project)"`
}

type CreateVolumeInput struct {
	Name    string `json:"name" jsonschema:"a DNS label, unique in the project"`
	SizeGB  int    `json:"size_gb" jsonschema:"its size in GB"`
	Project string `json:"project,omitempty" jsonschema:"its project, ID or name (default: the account's default project)"`
}

// Volume is a volume as the tools show it.
type Volume struct {
	ID       string   `json:"id"`
	Name     string   `json:"name"`
	SizeGB   int      `json:"size_gb"`
	Attached []string `json:"attached_to" jsonschema:"the sandboxes it is attached to"`
}

// Volumes lists volumes.
type Volumes struct {
	Volumes []Volume `json:"volumes"`
}

type apiVolume struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	SizeGB      int    `json:"size_gb"`
	Attachments []struct {
		SandboxID string `json:"sandbox_id"`
	} `json:"attachments"`
}

func (v apiVolume) view() Volume {
	out := Volume{ID: v.ID, Name: v.Name, SizeGB: v.SizeGB, Attached: []string{}}
	for _, a := range v.Attachments {
		out.Attached = append(out.Attached, a.SandboxID)
	}
	return out
}

func projectQuery(p string) url.Values {
	if p == "" {
		return nil
	}
	return url.Values{"project": {p}}
}

func (t *tools) createVolume(ctx context.Context, _ *mcp.CallToolRequest, in CreateVolumeInput) (*mcp.CallToolResult, Volume, error) {
	if in.Name == "" || in.SizeGB < 1 {
		return nil, Volume{}, errors.New("name and size_gb (at least 1) are required")
	}
	var v apiVolume
	if err := t.c.Do(ctx, "POST", "/v1/volumes", projectQuery(in.Project), map[string]any{"name": in.Name, "size_gb": in.SizeGB}, &v); err != nil {
		return nil, Volume{}, explain(err)
	}
	return nil, v.view(), nil
}

// ProjectInput names a project.
type ProjectInput struct {
	Project string `json:"project,omitempty" jsonschema:"the project, ID or name (default: the account's default project)"`
}

func (t *tools) listVolumes(ctx context.Context, _ *mcp.CallToolRequest, in ProjectInput) (*mcp.CallToolResult, Volumes, error) {
	var l struct {
		Volumes []apiVolume `json:"volumes"`
	}
	if err := t.c.Do(ctx, "GET", "/v1/volumes", projectQuery(in.Project), nil, &l); err != nil {
		return nil, Volumes{}, explain(err)
	}
	out := Volumes{Volumes: []Volume{}}
	for _, v := range l.Volumes {
		out.Volumes = append(out.Volumes, v.view())
	}
	return nil, out, nil
}

func (t *tools) deleteVolume(ctx context.Context, _ *mcp.CallToolRequest, in VolumeInput) (*mcp.CallToolResult, Deleted, error) {
	if in.Name == "" {
		return nil, Deleted{}, errors.New("name is required")
	}
	if err := t.c.Do(ctx, "DELETE", apiclient.Path("volumes", in.Name), projectQuery(in.Project), nil, nil); err != nil {
		return nil, Deleted{}, explain(err)
	}
	return nil, Deleted{ID: in.Name, Deleted: true}, nil
}

// explain is an API error as a tool error a model can act on: the
// server's code and message.
func explain(err error) error {
	var e *apiclient.Error
	if errors.As(err, &e) {
		if e.Field != "" {
			return fmt.Errorf("%s (%d %s, field %s)", e.Message, e.Status, e.Code, e.Field)
		}
		return fmt.Errorf("%s (%d %s)", e.Message, e.Status, e.Code)
	}
	return err
}
