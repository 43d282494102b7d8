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
	"sync/atomic"
	"time"

	"github.com/harebox/harebox/sandbox"
)

// Client is a source host's side of moves: it calls other hosts'
// internal endpoints with this host's deployment certificate.
type Client struct {
	hc *http.Client
	// stall cuts a files' stream the target takes nothing of for that
	// long.
	stall time.Duration
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
	return &Client{hc: &http.Client{Transport: tr}, stall: time.Minute}
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
	q := url.Values{}
	if stopped {
		q.Set("stopped", "1")
	}
	return c.send(ctx, h, Prefix+id+"/files", dir, q, skip)
}

// send streams dir's files (but those skip names) to path on host h.
func (c *Client) send(ctx context.Context, h Host, path, dir string, q url.Values, skip func(rel string) bool) error {
	size, err := dirBytes(dir, skip)
	if err != nil {
		return err
	}
	// A target that stops reading is cut (its stream would block the
	// source, which holds the sandbox, for good).
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	pr, pw := io.Pipe()
	w := &progress{w: pw}
	w.at.Store(time.Now().UnixNano())
	go func() { pw.CloseWithError(pack(w, dir, skip)) }()
	defer pr.Close()
	go w.watch(ctx, cancel, c.stall)
	if q == nil {
		q = url.Values{}
	}
	q.Set("bytes", strconv.FormatInt(size, 10))
	return c.call(ctx, h, http.MethodPut, path, q.Encode(), pr, nil)
}

// SendVolume streams the files of volume vol, which moves with sandbox
// id, to host h (those of dir that skip does not name), and returns once
// they are on its disk.
func (c *Client) SendVolume(ctx context.Context, h Host, id, vol, dir string, skip func(rel string) bool) error {
	if !fileName.MatchString(vol) {
		return fmt.Errorf("move: volume %q: not a name a move carries", vol)
	}
	return c.send(ctx, h, Prefix+id+"/volumes/"+vol, dir, nil, skip)
}

// progress is a writer that notes when a write last went through.
type progress struct {
	w  io.Writer
	at atomic.Int64
}

func (p *progress) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.at.Store(time.Now().UnixNano())
	return n, err
}

// watch cancels the stream when no write went through for stall.
func (p *progress) watch(ctx context.Context, cancel context.CancelCauseFunc, stall time.Duration) {
	t := time.NewTicker(stall / 10)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if time.Since(time.Unix(0, p.at.Load())) > stall {
				cancel(fmt.Errorf("the target took nothing of the files for %v", stall))
				return
			}
		}
	}
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
