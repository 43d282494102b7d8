package move

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/harebox/harebox/sandbox"
)

// Client is a source host's side of moves: it calls other hosts'
// internal endpoints with this host's deployment certificate.
type Client struct {
	hc *http.Client
}

// NewClient returns a client that calls other hosts with tc (the
// deployment's mutual TLS, cluster.TLS.Client).
func NewClient(tc *tls.Config) *Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tc.Clone(),
		TLSHandshakeTimeout: 5 * time.Second,
		// (An answer comes once the files are on the target's disk, or
		// once it resumed the sandbox: the callers' contexts bound them.)
		ResponseHeaderTimeout: 10 * time.Minute,
		IdleConnTimeout:       90 * time.Second,
	}
	return &Client{hc: &http.Client{Transport: tr}}
}

// Host is the host a call goes to: its name and internal address.
type Host struct{ Name, Address string }

func (c *Client) call(ctx context.Context, h Host, method, path, query string, body io.Reader, out any) error {
	base, err := url.Parse(h.Address)
	if err != nil || base.Scheme != "https" || base.Host == "" {
		return sandbox.Errorf(sandbox.ErrUnavailable, "", "host %s has no usable internal address (%q)", h.Name, h.Address)
	}
	u := base.JoinPath(path)
	u.RawQuery = query
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return sandbox.Errorf(sandbox.ErrUnavailable, "", "host %s cannot be reached: %v", h.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return readError(h.Name, resp)
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out); err != nil {
		return fmt.Errorf("host %s: its answer: %w", h.Name, err)
	}
	return nil
}

func jsonBody(v any) io.Reader {
	b, _ := json.Marshal(v)
	return bytes.NewReader(b)
}

// Check asks host h whether it can take sandbox id.
func (c *Client) Check(ctx context.Context, h Host, id string, ck Check) (Ready, error) {
	var r Ready
	err := c.call(ctx, h, http.MethodPost, Prefix+id+"/check", "", jsonBody(ck), &r)
	return r, err
}

// Send streams sandbox id's files to host h, and returns once they are
// on its disk: its hibernation files (the directory dir), or for a
// stopped sandbox its machine directory's files (dir, but those skip
// names).
func (c *Client) Send(ctx context.Context, h Host, id, dir string, stopped bool, skip func(rel string) bool) error {
	size, err := dirBytes(dir, skip)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(pack(pw, dir, skip)) }()
	defer pr.Close()
	q := url.Values{"bytes": {strconv.FormatInt(size, 10)}}
	if stopped {
		q.Set("stopped", "1")
	}
	return c.call(ctx, h, http.MethodPut, Prefix+id+"/files", q.Encode(), pr, nil)
}

// Adopt has host h take sandbox id up.
func (c *Client) Adopt(ctx context.Context, h Host, id string, a Adoption) (*sandbox.Sandbox, error) {
	var sb sandbox.Sandbox
	if err := c.call(ctx, h, http.MethodPost, Prefix+id+"/adopt", "", jsonBody(a), &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Drop has host h remove what it received of sandbox id (a move that
// failed before the store said the sandbox was h's).
func (c *Client) Drop(ctx context.Context, h Host, id string) error {
	return c.call(ctx, h, http.MethodDelete, Prefix+id, "", nil, nil)
}
