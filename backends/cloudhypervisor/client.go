package cloudhypervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/harebox/harebox/hypervisor"
)

// API is the subset of the Cloud Hypervisor REST API the backend drives.
// *Client implements it over the VMM's Unix socket; tests drive the same
// client against a spec-validating stub VMM.
type API interface {
	Ping(ctx context.Context) (VmmPingResponse, error)
	ShutdownVMM(ctx context.Context) error
	CreateVM(ctx context.Context, cfg VmConfig) error
	BootVM(ctx context.Context) error
	Info(ctx context.Context) (VmInfo, error)
	Counters(ctx context.Context) (VmCounters, error)
	PauseVM(ctx context.Context) error
	ResumeVM(ctx context.Context) error
	ShutdownVM(ctx context.Context) error
	DeleteVM(ctx context.Context) error
	Snapshot(ctx context.Context, cfg VmSnapshotConfig) error
	Restore(ctx context.Context, cfg RestoreConfig) error
	AddDisk(ctx context.Context, cfg DiskConfig) (PciDeviceInfo, error)
	RemoveDevice(ctx context.Context, id string) error
}

const (
	apiBase = "http://localhost/api/v1"

	// DefaultTimeout bounds a call whose context has no deadline.
	DefaultTimeout = 30 * time.Second
	// DefaultStateTimeout bounds snapshot and restore, which write or read
	// all of guest memory, when the context has no deadline.
	DefaultStateTimeout = 10 * time.Minute
	// DefaultMaxResponseBytes caps a response body: vm.info with a device
	// tree is a few KiB; anything near this is not a sane VMM.
	DefaultMaxResponseBytes = 1 << 20
	// maxErrorMessage caps the VMM message kept in an APIError.
	maxErrorMessage = 4 << 10
)

// ErrResponseTooLarge is wrapped by errors for bodies over the size limit.
var ErrResponseTooLarge = errors.New("response body too large")

// Client talks to one VMM's API socket.
type Client struct {
	socket string
	hc     *http.Client
	// MaxResponseBytes caps response bodies (DefaultMaxResponseBytes if 0).
	MaxResponseBytes int64
	// Timeout and StateTimeout apply when a call's context has no deadline
	// (DefaultTimeout and DefaultStateTimeout if 0).
	Timeout      time.Duration
	StateTimeout time.Duration
}

var _ API = (*Client)(nil)

// NewClient returns a client for the API socket at path.
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		// One connection per call: the VMM's HTTP server is minimal, and a
		// pooled connection to a VMM that restarted would only fail later.
		DisableKeepAlives:      true,
		MaxResponseHeaderBytes: 64 << 10,
	}
	return &Client{socket: socket, hc: &http.Client{Transport: tr}}
}

// Socket is the API socket path.
func (c *Client) Socket() string { return c.socket }

// APIError is a non-2xx answer from the VMM. It unwraps to the portable
// hypervisor error kind for its status, if there is one.
type APIError struct {
	Method  string
	Path    string
	Status  int
	Message string
}

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	return fmt.Sprintf("cloud-hypervisor %s %s: HTTP %d: %s", e.Method, e.Path, e.Status, msg)
}

// Unwrap maps the status to a kind. The spec uses 404 for "VM not created"
// and 405 for "VM not in a state that allows this".
func (e *APIError) Unwrap() error {
	switch e.Status {
	case http.StatusNotFound:
		return hypervisor.ErrNotFound
	case http.StatusMethodNotAllowed, http.StatusConflict, http.StatusTooManyRequests:
		return hypervisor.ErrState
	case http.StatusBadRequest:
		return hypervisor.ErrInvalid
	case http.StatusNotImplemented:
		return hypervisor.ErrUnsupported
	case http.StatusServiceUnavailable:
		return hypervisor.ErrUnavailable
	}
	return nil
}

func (c *Client) Ping(ctx context.Context) (VmmPingResponse, error) {
	var out VmmPingResponse
	err := c.do(ctx, http.MethodGet, "/vmm.ping", nil, &out, c.timeout())
	if err == nil && out.Version == "" {
		err = fmt.Errorf("cloud-hypervisor GET /vmm.ping: response has no version")
	}
	return out, err
}

func (c *Client) ShutdownVMM(ctx context.Context) error {
	return c.do(ctx, http.MethodPut, "/vmm.shutdown", nil, nil, c.timeout())
}

func (c *Client) CreateVM(ctx context.Context, cfg VmConfig) error {
	return c.do(ctx, http.MethodPut, "/vm.create", cfg, nil, c.timeout())
}

func (c *Client) BootVM(ctx context.Context) error {
	return c.do(ctx, http.MethodPut, "/vm.boot", nil, nil, c.timeout())
}

func (c *Client) Info(ctx context.Context) (VmInfo, error) {
	var out VmInfo
	err := c.do(ctx, http.MethodGet, "/vm.info", nil, &out, c.timeout())
	return out, err
}

func (c *Client) Counters(ctx context.Context) (VmCounters, error) {
	var out VmCounters
	err := c.do(ctx, http.MethodGet, "/vm.counters", nil, &out, c.timeout())
	return out, err
}

func (c *Client) PauseVM(ctx context.Context) error {
	return c.do(ctx, http.MethodPut, "/vm.pause", nil, nil, c.timeout())
}

func (c *Client) ResumeVM(ctx context.Context) error {
	return c.do(ctx, http.MethodPut, "/vm.resume", nil, nil, c.timeout())
}

func (c *Client) ShutdownVM(ctx context.Context) error {
	return c.do(ctx, http.MethodPut, "/vm.shutdown", nil, nil, c.timeout())
}

func (c *Client) DeleteVM(ctx context.Context) error {
	return c.do(ctx, http.MethodPut, "/vm.delete", nil, nil, c.timeout())
}

func (c *Client) Snapshot(ctx context.Context, cfg VmSnapshotConfig) error {
	return c.do(ctx, http.MethodPut, "/vm.snapshot", cfg, nil, c.stateTimeout())
}

func (c *Client) Restore(ctx context.Context, cfg RestoreConfig) error {
	return c.do(ctx, http.MethodPut, "/vm.restore", cfg, nil, c.stateTimeout())
}

// AddDisk hot-plugs a disk into the running VM.
func (c *Client) AddDisk(ctx context.Context, cfg DiskConfig) (PciDeviceInfo, error) {
	var out PciDeviceInfo
	err := c.do(ctx, http.MethodPut, "/vm.add-disk", cfg, &out, c.timeout())
	return out, err
}

// RemoveDevice unplugs a device (the guest is asked to let it go).
func (c *Client) RemoveDevice(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPut, "/vm.remove-device", VmRemoveDevice{ID: id}, nil, c.timeout())
}

func (c *Client) timeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return DefaultTimeout
}

func (c *Client) stateTimeout() time.Duration {
	if c.StateTimeout > 0 {
		return c.StateTimeout
	}
	return DefaultStateTimeout
}

func (c *Client) maxBytes() int64 {
	if c.MaxResponseBytes > 0 {
		return c.MaxResponseBytes
	}
	return DefaultMaxResponseBytes
}

// do sends one request. in is JSON-encoded when non-nil; out, when non-nil,
// receives the JSON body of a 200 answer.
func (c *Client) do(ctx context.Context, method, path string, in, out any, def time.Duration) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, def)
		defer cancel()
	}
	op := "cloud-hypervisor " + method + " " + path

	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s: encode request: %w", op, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, apiBase+path, body)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")

	resp, err := c.hc.Do(req)
	if err != nil {
		if isNoVMM(err) {
			// Nothing listens on the socket: the VMM is gone.
			return fmt.Errorf("%s: %w: %w", op, hypervisor.ErrUnavailable, err)
		}
		return fmt.Errorf("%s: %w", op, err)
	}
	defer resp.Body.Close()

	limit := c.maxBytes()
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return fmt.Errorf("%s: read response: %w", op, err)
	}
	if int64(len(data)) > limit {
		return fmt.Errorf("%s: HTTP %d: %w (over %d bytes)", op, resp.StatusCode, ErrResponseTooLarge, limit)
	}

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return &APIError{Method: method, Path: path, Status: resp.StatusCode, Message: cleanMessage(data)}
	}
	if out == nil {
		return nil
	}
	if resp.StatusCode != http.StatusOK || len(data) == 0 {
		return fmt.Errorf("%s: HTTP %d without a body", op, resp.StatusCode)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s: decode response: %w", op, err)
	}
	return nil
}

// isNoVMM reports whether a transport error means no VMM is listening.
func isNoVMM(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

// cleanMessage turns a VMM error body into one printable, bounded line.
func cleanMessage(b []byte) string {
	if len(b) > maxErrorMessage {
		b = b[:maxErrorMessage]
	}
	s := strings.Map(func(r rune) rune {
		switch {
		case r == '\n' || r == '\r' || r == '\t':
			return ' '
		case !unicode.IsPrint(r):
			return -1
		}
		return r
	}, string(b))
	return strings.TrimSpace(s)
}
