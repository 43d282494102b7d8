// Package codeinterp runs code in a sandbox's code interpreter: contexts
// (one kernel each, whose state lasts from one cell to the next) and
// cells, whose output, rich results and errors come back as events.
//
// The interpreter is a server in the guest (images/interpreter, on the
// guest's loopback), reached through the agent; everything it sends is
// untrusted. Checked here: every answer line is bounded (MaxLine) and
// must be one of the known events with fields of the right types; output
// is forwarded up to a bound per stream and kept up to a smaller one;
// results are bounded in number and size, kept only in allowlisted
// formats, images only when their base64 decodes to a PNG or JPEG of sane
// dimensions, JSON only when it parses; text is made valid UTF-8; a cell
// gets at most its timeout plus a grace before the host gives up on it,
// and an answer that ends without saying how the cell ended is an error.
// Not checked: what HTML, SVG or Markdown contain (they are passed on as
// text, never rendered by the host).
package codeinterp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/sandbox"
)

// Limits.
const (
	// MaxLine bounds one line of the interpreter's answer (a result with a
	// large image, in base64, is one line).
	MaxLine = 24 << 20
	// MaxResults bounds the results kept of one cell; MaxResultBytes one
	// format of one result, MaxResultsBytes all of a cell's.
	MaxResults      = 64
	MaxResultBytes  = 16 << 20
	MaxResultsBytes = 64 << 20
	// MaxImageSide and MaxImagePixels bound an image's dimensions.
	MaxImageSide   = 16384
	MaxImagePixels = 64 << 20
	// MaxErrorName, MaxErrorValue and MaxTraceback bound an error's parts
	// (longer ones are cut).
	MaxErrorName  = 256
	MaxErrorValue = 64 << 10
	MaxTraceback  = 256 << 10
	// MaxContexts bounds the contexts listed.
	MaxContexts = 256
	// callTimeout bounds the calls on contexts (a kernel's start
	// included: seconds under emulation).
	callTimeout = 2 * time.Minute
)

// ErrInterpreter is the cause of the error of an interpreter that breaks
// the protocol (of kind unavailable).
var ErrInterpreter = errors.New("the sandbox's code interpreter broke its protocol")

// lie is the error of an answer that breaks the protocol.
func lie(format string, args ...any) error {
	return &sandbox.Error{Kind: sandbox.ErrUnavailable, Msg: "the sandbox's code interpreter answered wrongly: " + fmt.Sprintf(format, args...), Err: ErrInterpreter}
}

// Options are a Client's bounds.
type Options struct {
	// MaxOutput is what an Execution keeps of each of stdout and stderr;
	// MaxStream what is forwarded of each as events. Beyond both, output
	// is dropped and flagged.
	MaxOutput int
	MaxStream int
	// ReadyTimeout is how long a call waits for an interpreter that is
	// starting (nothing listens yet, or it says it is not ready).
	ReadyTimeout time.Duration
	// Grace is how long past a cell's timeout the host waits for the
	// interpreter to say it interrupted it (default 30 s).
	Grace time.Duration
}

func (o *Options) defaults() {
	if o.MaxOutput <= 0 {
		o.MaxOutput = 8 << 20
	}
	if o.MaxStream <= 0 {
		o.MaxStream = 64 << 20
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 3 * time.Minute
	}
	if o.Grace <= 0 {
		o.Grace = 30 * time.Second
	}
}

// Dialer connects to the interpreter's port in the guest.
type Dialer func(ctx context.Context) (net.Conn, error)

// Client talks to one sandbox's interpreter. It keeps a few connections
// open between calls; Close drops them.
type Client struct {
	o  Options
	tr *http.Transport
	hc *http.Client
}

// New returns a Client that reaches the interpreter through dial.
func New(dial Dialer, o Options) *Client {
	o.defaults()
	c := &Client{o: o}
	c.tr = &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
		// (A cell's answer starts at once; its end is bounded by the
		// request's context.)
		ResponseHeaderTimeout:  callTimeout,
		MaxResponseHeaderBytes: 16 << 10,
	}
	c.hc = &http.Client{Transport: c.tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return c
}

// Close drops the connections kept open.
func (c *Client) Close() { c.tr.CloseIdleConnections() }

// call sends one request and returns its answer once it is 2xx; an
// interpreter that is starting (nothing listens, or 503) is waited for
// up to ReadyTimeout.
func (c *Client) call(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	bo := backoff.WithContext(backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(100*time.Millisecond), backoff.WithMaxInterval(2*time.Second),
		backoff.WithMaxElapsedTime(c.o.ReadyTimeout)), ctx)
	var resp *http.Response
	err := backoff.Retry(func() error {
		req, err := http.NewRequestWithContext(ctx, method, "http://interpreter"+path, bytes.NewReader(raw))
		if err != nil {
			return backoff.Permanent(err)
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err = c.hc.Do(req)
		switch {
		case errors.Is(err, agentclient.ErrNotListening):
			return err
		case err != nil:
			return backoff.Permanent(err)
		case resp.StatusCode == http.StatusServiceUnavailable:
			resp.Body.Close()
			return errors.New("the code interpreter is starting")
		}
		return nil
	}, bo)
	if err != nil {
		var se *sandbox.Error
		switch {
		case errors.As(err, &se):
			return nil, err
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			return nil, sandbox.Errorf(sandbox.ErrTimeout, "", "the sandbox's code interpreter did not answer in time")
		case ctx.Err() != nil:
			return nil, err
		}
		return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "the sandbox's code interpreter does not answer: %v", err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, answerError(resp)
	}
	return resp, nil
}

// answerError is the error of a non-2xx answer: its kind from the status,
// its message the interpreter's (bounded, cleaned: it is the sandbox's).
func answerError(resp *http.Response) error {
	var e struct {
		Error string `json:"error"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	json.Unmarshal(b, &e)
	msg := clean(e.Error, 512)
	if msg == "" {
		msg = resp.Status
	}
	kind := sandbox.ErrUnavailable
	switch resp.StatusCode {
	case http.StatusBadRequest:
		kind = sandbox.ErrInvalid
	case http.StatusNotFound:
		kind = sandbox.ErrNotFound
	case http.StatusConflict:
		kind = sandbox.ErrState
	case http.StatusRequestEntityTooLarge:
		kind = sandbox.ErrTooLarge
	case http.StatusTooManyRequests:
		kind = sandbox.ErrCapacity
	}
	return sandbox.Errorf(kind, "", "code interpreter: %s", msg)
}

// Contexts lists the interpreter's contexts.
func (c *Client) Contexts(ctx context.Context) ([]sandbox.CodeContext, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := c.call(ctx, http.MethodGet, "/contexts", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var l []sandbox.CodeContext
	if err := decode(resp.Body, &l); err != nil {
		return nil, err
	}
	if len(l) > MaxContexts {
		return nil, lie("%d contexts", len(l))
	}
	for i := range l {
		if err := checkContext(&l[i]); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// CreateContext starts a context.
func (c *Client) CreateContext(ctx context.Context, r sandbox.CodeContextRequest) (*sandbox.CodeContext, error) {
	if err := r.Check(); err != nil {
		return nil, err
	}
	return c.contextCall(ctx, http.MethodPost, "/contexts", r)
}

// RestartContext replaces a context's kernel by a fresh one (its state
// is lost; a dead kernel comes back).
func (c *Client) RestartContext(ctx context.Context, id string) (*sandbox.CodeContext, error) {
	if err := sandbox.CheckCodeContextID(id); err != nil {
		return nil, err
	}
	return c.contextCall(ctx, http.MethodPost, "/contexts/"+id+"/restart", nil)
}

// DeleteContext shuts a context's kernel down.
func (c *Client) DeleteContext(ctx context.Context, id string) error {
	if err := sandbox.CheckCodeContextID(id); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := c.call(ctx, http.MethodDelete, "/contexts/"+id, nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

func (c *Client) contextCall(ctx context.Context, method, path string, body any) (*sandbox.CodeContext, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := c.call(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var cc sandbox.CodeContext
	if err := decode(resp.Body, &cc); err != nil {
		return nil, err
	}
	return &cc, checkContext(&cc)
}

func checkContext(cc *sandbox.CodeContext) error {
	if sandbox.CheckCodeContextID(cc.ID) != nil || !slices.Contains(sandbox.CodeLanguages, cc.Language) ||
		len(cc.Cwd) > 4096 || !strings.HasPrefix(cc.Cwd, "/") {
		return lie("a context %q of language %q in %q", clean(cc.ID, 80), clean(cc.Language, 20), clean(cc.Cwd, 200))
	}
	cc.Cwd = clean(cc.Cwd, 4096)
	return nil
}

// decode reads one bounded JSON document, strictly.
func decode(r io.Reader, v any) error {
	d := json.NewDecoder(io.LimitReader(r, 1<<20))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return lie("%v", err)
	}
	return nil
}
