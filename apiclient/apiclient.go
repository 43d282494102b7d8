// Package apiclient is the Go client of HareBox's REST API: the way a Go
// program reaches a remote server (the CLI and the MCP server use it). Its
// sandbox methods have the names and shapes of the engine's (package
// harebox), which a program on the sandbox host can use directly instead;
// every other route is Do.
package apiclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
)

// Error is an error the API returned.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
	// RetryAfter is the server's Retry-After (a rate_limited answer).
	RetryAfter time.Duration `json:"-"`
}

func (e *Error) Error() string {
	if e.Field != "" && !strings.Contains(e.Message, e.Field) {
		return e.Message + " (field " + e.Field + ")"
	}
	return e.Message
}

// Is matches the error kinds of package model by the server's code, so a
// Go client checks an answer as the engine does:
// errors.Is(err, model.ErrNotFound). (ErrState and ErrExists share the
// code "conflict": either matches a conflict.)
func (e *Error) Is(target error) bool {
	return target != nil && model.Code(target) == e.Code && e.Code != model.CodeInternal
}

// Client talks to one HareBox server.
type Client struct {
	base string
	key  string
	http *http.Client
}

// New returns a client for url ("http://127.0.0.1:7070",
// "https://host:7443" or "unix:/path"). Empty url and key come from
// HAREBOX_URL and HAREBOX_API_KEY; an https server is trusted as
// HAREBOX_CA says (see TLSConfig).
func New(rawURL, key string) (*Client, error) {
	return Open(Options{URL: rawURL, Key: key})
}

// Options configure a client. Empty fields come from the environment.
type Options struct {
	// URL is the server (HAREBOX_URL, else http://127.0.0.1:7070).
	URL string
	// Key is the API key (HAREBOX_API_KEY).
	Key string
	// CA is how an https server is trusted (HAREBOX_CA): a PEM file of CA
	// certificates or a "sha256:" fingerprint pin (see TLSConfig).
	CA string
	// Transport, if set, carries the requests instead of a connection to
	// URL (a server's own handler, in process); CA is then unused.
	Transport http.RoundTripper
}

// Open returns a client as o says.
func Open(o Options) (*Client, error) {
	rawURL, key, ca := o.URL, o.Key, o.CA
	if rawURL == "" {
		rawURL = os.Getenv("HAREBOX_URL")
	}
	if key == "" {
		key = os.Getenv("HAREBOX_API_KEY")
	}
	if ca == "" {
		ca = os.Getenv("HAREBOX_CA")
	}
	if rawURL == "" {
		rawURL = "http://127.0.0.1:7070"
	}
	tr := &http.Transport{ResponseHeaderTimeout: 0, MaxIdleConnsPerHost: 4, ForceAttemptHTTP2: true}
	if u, err := url.Parse(rawURL); err == nil && u.Scheme == "https" { // (Parse lower-cases it)
		cfg, err := TLSConfig(ca)
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = cfg
	}
	if path, ok := strings.CutPrefix(rawURL, "unix:"); ok {
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
		rawURL = "http://harebox"
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("server URL %q: want http(s)://host:port or unix:/path", rawURL)
	}
	var rt http.RoundTripper = tr
	if o.Transport != nil {
		rt = o.Transport
	}
	return &Client{base: strings.TrimRight(rawURL, "/"), key: key, http: &http.Client{Transport: rt}}, nil
}

// Do sends a JSON request (body may be nil, []byte, an io.Reader or a
// value to encode) and decodes a JSON answer into out (if not nil).
func (c *Client) Do(ctx context.Context, method, path string, query url.Values, body any, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	resp, err := c.send(ctx, method, path, query, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if w, ok := out.(io.Writer); ok {
		_, err := io.Copy(w, resp.Body)
		return err
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func (c *Client) send(ctx context.Context, method, path string, query url.Values, body any) (*http.Response, error) {
	return c.sendWith(ctx, method, path, query, body, nil)
}

// sendWith is send with more request headers.
func (c *Client) sendWith(ctx context.Context, method, path string, query url.Values, body any, hdr http.Header) (*http.Response, error) {
	var rd io.Reader
	ctype := "application/json"
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case io.Reader:
		rd, ctype = b, "application/octet-stream"
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(enc)
	}
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	if rd != nil {
		req.Header.Set("Content-Type", ctype)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the HareBox server at %s: %w", c.base, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		var e struct {
			Error Error `json:"error"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, &e) != nil || e.Error.Message == "" {
			return nil, &Error{Status: resp.StatusCode, Code: "http", Message: fmt.Sprintf("HTTP %d: %.200s", resp.StatusCode, b)}
		}
		e.Error.Status = resp.StatusCode
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			e.Error.RetryAfter = time.Duration(s) * time.Second
		}
		return nil, &e.Error
	}
	return resp, nil
}

// DialPty opens a terminal session in a sandbox (the API's openPty:
// rows, cols, cmd, user, cwd and timeout_seconds in query), over this
// client's connection settings (TLS trust, Unix socket). A refusal before
// the session is an *Error.
func (c *Client) DialPty(ctx context.Context, id string, query url.Values) (*websocket.Conn, error) {
	u := c.base + "/v1/sandboxes/" + url.PathEscape(id) + "/pty"
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	h := http.Header{}
	if c.key != "" {
		h.Set("Authorization", "Bearer "+c.key)
	}
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: h, CompressionMode: websocket.CompressionDisabled})
	if err == nil {
		return conn, nil
	}
	if resp != nil && resp.StatusCode >= 300 {
		var e struct {
			Error Error `json:"error"`
		}
		if b, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20)); rerr == nil && json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
			e.Error.Status = resp.StatusCode
			return nil, &e.Error
		}
	}
	return nil, fmt.Errorf("terminal: %w", err)
}

// ProcessOutput writes a background process's output from offsets
// (bytes of stdout and stderr already seen) to stdout and stderr: what
// the guest still keeps, then, with follow, what comes until it ends. It
// returns the process's result once it has ended (nil before: no follow,
// or a broken stream) and the offsets reached, to go on from after a
// broken stream. An offset that jumps means the guest dropped bytes.
func (c *Client) ProcessOutput(ctx context.Context, id, pid string, offsets [2]uint64, follow bool, stdout, stderr io.Writer) (*sandbox.ExecResult, [2]uint64, error) {
	q := url.Values{"stdout_offset": {strconv.FormatUint(offsets[0], 10)}, "stderr_offset": {strconv.FormatUint(offsets[1], 10)}}
	if follow {
		q.Set("follow", "true")
	}
	resp, err := c.send(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/processes/"+url.PathEscape(pid)+"/output", q, nil)
	if err != nil {
		return nil, offsets, err
	}
	defer resp.Body.Close()
	var res *sandbox.ExecResult
	err = scanSSE(resp.Body, 16<<20, func(event string, data []byte) error {
		switch event {
		case "stdout", "stderr":
			offset, b, err := outputChunk(data)
			if err != nil {
				return err
			}
			i, w := 0, stdout
			if event == "stderr" {
				i, w = 1, stderr
			}
			if offset < offsets[i] {
				return fmt.Errorf("process output: %s went back from %d to %d", event, offsets[i], offset)
			}
			if _, err := w.Write(b); err != nil {
				return err
			}
			offsets[i] = offset + uint64(len(b))
		case "exit":
			res = &sandbox.ExecResult{}
			if err := json.Unmarshal(data, res); err != nil {
				return err
			}
			return errStop
		}
		return nil
	})
	if errors.Is(err, errStop) || err == nil {
		return res, offsets, nil
	}
	var ae *Error
	if errors.As(err, &ae) {
		return nil, offsets, err
	}
	return nil, offsets, fmt.Errorf("process output: %w", err)
}

// outputChunk decodes a stdout or stderr event: its offset in its stream
// (0 where the event has none) and its bytes.
func outputChunk(data []byte) (uint64, []byte, error) {
	var chunk struct {
		Offset uint64 `json:"offset"`
		Data   string `json:"data"`
	}
	if err := json.Unmarshal(data, &chunk); err != nil {
		return 0, nil, err
	}
	b, err := base64.StdEncoding.DecodeString(chunk.Data)
	return chunk.Offset, b, err
}

// ExecStream runs a command and writes its output as the server streams
// it; it returns the final result.
func (c *Client) ExecStream(ctx context.Context, id string, req sandbox.ExecRequest, stdout, stderr io.Writer) (*sandbox.ExecResult, error) {
	resp, err := c.send(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/exec/stream", nil, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var res *sandbox.ExecResult
	err = scanSSE(resp.Body, 16<<20, func(event string, data []byte) error {
		switch event {
		case "stdout", "stderr":
			_, b, err := outputChunk(data)
			if err != nil {
				return err
			}
			w := stdout
			if event == "stderr" {
				w = stderr
			}
			if _, err := w.Write(b); err != nil {
				return err
			}
		case "exit":
			res = &sandbox.ExecResult{}
			if err := json.Unmarshal(data, res); err != nil {
				return err
			}
			return errStop
		}
		return nil
	})
	if errors.Is(err, errStop) {
		return res, nil
	}
	if err != nil {
		var ae *Error
		if errors.As(err, &ae) {
			return nil, err
		}
		return nil, fmt.Errorf("exec stream: %w", err)
	}
	return nil, errors.New("exec stream: the server closed the stream without an exit status")
}

// errStop ends a scanSSE early without an error.
var errStop = errors.New("stop")

// scanSSE reads server-sent events (lines up to max bytes), calling fn
// with each event's name and data; an "error" event ends it as the
// *Error it carries. It returns fn's error, or nil when the stream ends.
func scanSSE(r io.Reader, max int, fn func(event string, data []byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), max)
	var event string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data := []byte(strings.TrimPrefix(line, "data: "))
			if event == "error" {
				var e struct {
					Error Error `json:"error"`
				}
				if err := json.Unmarshal(data, &e); err != nil {
					return err
				}
				return &e.Error
			}
			if err := fn(event, data); err != nil {
				return err
			}
		}
	}
	return sc.Err()
}

// SandboxPath is the API path of a sandbox, with an optional suffix.
func SandboxPath(id string, suffix ...string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + strings.Join(suffix, "")
}

// DefaultTimeout bounds a Do call whose context has no deadline (exec
// streams last as long as their command's own timeout).
const DefaultTimeout = 5 * time.Minute
