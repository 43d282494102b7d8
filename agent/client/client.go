// Package client is the host's client of the guest agent. The guest is
// hostile, so everything it sends is bounded and validated: message sizes,
// collected output, the number of list entries, and every call has a
// deadline.
package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/agent/transport"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/hvsock"
	"github.com/harebox/harebox/model"
)

// Limits on what the host accepts from a guest.
const (
	// MaxMessage bounds one gRPC message in either direction.
	MaxMessage = 4 << 20
	// MaxChunk bounds one data chunk (exec output, file read).
	MaxChunk = 1 << 20
	// DefaultMaxOutput caps collected stdout and stderr, each.
	DefaultMaxOutput = 8 << 20
	// MaxListEntries caps a directory listing.
	MaxListEntries = 10000
	// DefaultCallTimeout is the deadline of a call whose context has none.
	DefaultCallTimeout = 30 * time.Second
)

// ErrGuest marks a reply that broke the protocol: the guest is buggy or
// hostile. Check with errors.Is.
var ErrGuest = errors.New("invalid reply from guest agent")

// ErrAgentTooOld is DialReady's refusal of an agent older than
// layout.MinProtocol: the sandbox was made from an image this host no
// longer talks to.
var ErrAgentTooOld = errors.New("the guest agent is too old for this host")

// Options configures a client.
type Options struct {
	// CallTimeout is the deadline for calls whose context has none.
	CallTimeout time.Duration
	// MaxOutput caps the stdout and stderr Exec collects, each.
	MaxOutput int
	// MinProtocol is the oldest agent protocol level DialReady accepts;
	// below layout.MinProtocol counts as layout.MinProtocol.
	MinProtocol uint32
}

// Client talks to one guest agent over one byte stream.
type Client struct {
	opts Options
	conn io.Closer
	sess *yamux.Session
	cc   *grpc.ClientConn
	rpc  agentpb.AgentClient

	closeOnce sync.Once
	mu        sync.Mutex
	ended     error // why the guest's side ended the session, if it did
	endedBy   error // why the session ended, whoever ended it
	watched   chan struct{}
	// hello is closed when the agent's session announced itself (its
	// first hello, taken), with nonce. unannounced: the host settled on
	// an agent that sends no hello; a hello after that is a new agent,
	// and ends the session (firstHello).
	hello       chan struct{}
	nonce       []byte
	unannounced bool
	closedAt    string // where Close was called from
	closedFor   error  // and why, if the caller said
	// level is the agent's protocol level plus one, from its last health
	// answer (0: none yet).
	level atomic.Uint32
}

// need refuses a call (or a field) an agent of a known level below level
// lacks, as the agent itself refuses a call it lacks (Unimplemented).
func (c *Client) need(level uint32, what string) error {
	if l := c.level.Load(); l != 0 && l-1 < level {
		return status.Errorf(codes.Unimplemented, "%s needs agent protocol %d; this agent speaks %d", what, level, l-1)
	}
	return nil
}

// Dial connects to the agent endpoint a backend reports.
func Dial(ctx context.Context, ep hypervisor.AgentEndpoint, opts Options) (*Client, error) {
	var conn net.Conn
	var err error
	switch ep.Transport {
	case hypervisor.TransportSerial:
		var d net.Dialer
		conn, err = d.DialContext(ctx, "unix", ep.Path)
	case hypervisor.TransportHybridVsock:
		conn, err = hvsock.DialHybridVsock(ctx, ep.Path, ep.Port)
	default:
		return nil, fmt.Errorf("agent: unknown transport %q", ep.Transport)
	}
	if err != nil {
		return nil, fmt.Errorf("agent: dial %s: %w", ep.Path, err)
	}
	return New(conn, opts)
}

// New starts a client over an open byte stream to the agent; Close closes it.
func New(conn io.ReadWriteCloser, opts Options) (*Client, error) {
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.MaxOutput <= 0 {
		opts.MaxOutput = DefaultMaxOutput
	}
	sess, err := transport.Client(conn)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("agent: yamux: %w", err)
	}
	cc, err := grpc.NewClient("passthrough:///agent",
		grpc.WithContextDialer(transport.Dialer(sess)),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessage), grpc.MaxCallSendMsgSize(MaxMessage)),
		grpc.WithMaxHeaderListSize(16<<10),
	)
	if err != nil {
		sess.Close()
		conn.Close()
		return nil, fmt.Errorf("agent: grpc: %w", err)
	}
	c := &Client{opts: opts, conn: conn, sess: sess, cc: cc, rpc: agentpb.NewAgentClient(cc), watched: make(chan struct{}), hello: make(chan struct{})}
	go func() {
		defer close(c.watched)
		// A restarted agent announces itself on this session: end it, so
		// calls in flight fail now and the next one redials.
		err := transport.WatchHellos(sess, c.firstHello)
		c.mu.Lock()
		if errors.Is(err, transport.ErrSessionEnded) {
			c.endedBy = err
			c.mu.Unlock()
			return
		}
		c.ended, c.endedBy = err, err
		c.mu.Unlock()
		c.Close()
	}()
	return c, nil
}

// firstHello takes the session's first hello, unless the host settled on
// an agent that sends none: then the hello is a new agent's.
func (c *Client) firstHello(nonce []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unannounced {
		return false
	}
	c.nonce = nonce
	close(c.hello)
	return true
}

// announcedAs reports the nonce the session's agent announced itself with
// (nil: none yet).
func (c *Client) announcedAs() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nonce
}

// settleUnannounced records that the host uses this session with an
// agent that sends no hello, unless one came meanwhile.
func (c *Client) settleUnannounced() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nonce == nil {
		c.unannounced = true
	}
}

// Close tears down the connection. A call it cuts short says where it
// was called from.
func (c *Client) Close() error { return c.close(callers(3), nil) }

// CloseFor is Close with the reason a call it cuts short fails with
// (wrapped): why the caller ended the connection.
func (c *Client) CloseFor(why error) error { return c.close(callers(3), why) }

func (c *Client) close(at string, why error) error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closedAt, c.closedFor = at, why
		c.mu.Unlock()
		c.cc.Close()
		c.sess.Close()
		c.conn.Close()
	})
	return nil
}

// callers names the n calls above its caller's, nearest first
// ("file.go:12 < other.go:34").
func callers(n int) string {
	pcs := make([]uintptr, n)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	var at []string
	for {
		f, more := frames.Next()
		if f.File != "" {
			at = append(at, fmt.Sprintf("%s:%d", filepath.Base(f.File), f.Line))
		}
		if !more {
			return strings.Join(at, " < ")
		}
	}
}

// Done is closed when the underlying session has died.
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// Err says why the session ended when the guest's side ended it:
// transport.ErrAgentReplaced (the agent restarted) or transport.ErrBadHello.
// It is nil while the session lives, and when it ended otherwise.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended
}

// EndReason says why the session ended: ErrAgentReplaced, ErrBadHello, or
// ErrSessionEnded wrapping the session's own reason (Close, the link
// closed, unanswered keepalives, a protocol error). It waits, up to a
// second, for the session's end to be recorded once Done is closed, and
// returns nil while the session lives.
func (c *Client) EndReason() error {
	select {
	case <-c.sess.CloseChan():
	default:
		return nil
	}
	select {
	case <-c.watched:
	case <-time.After(time.Second):
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.endedBy
}

// ctx applies the default deadline when the caller set none.
func (c *Client) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.opts.CallTimeout)
}

// Health is the agent's answer to a health check.
type Health struct {
	Version       string  `json:"version"`
	UptimeSeconds float64 `json:"uptime_seconds"`
	Mode          string  `json:"mode"`
	Kernel        string  `json:"kernel"`
	// Protocol is the agent's protocol level (layout.Protocol; 0 for
	// agents that predate it).
	Protocol uint32 `json:"protocol"`
	// Session is the nonce of the answering session's hello (protocol 3
	// and later; DialReady checks it).
	Session []byte `json:"-"`
}

// Health checks that the agent answers.
func (c *Client) Health(ctx context.Context) (_ Health, err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	r, err := c.rpc.Health(ctx, &agentpb.HealthRequest{})
	if err != nil {
		return Health{}, c.wrap("health", err)
	}
	h := Health{Version: r.Version, UptimeSeconds: r.UptimeSeconds, Mode: r.Mode, Kernel: r.Kernel, Protocol: r.Protocol, Session: r.Session}
	c.level.Store(min(r.Protocol, 1<<16) + 1)
	if !printable(h.Version, 128) || !printable(h.Mode, 16) || !printable(h.Kernel, 128) || !(h.UptimeSeconds >= 0) || len(h.Session) > 64 {
		return Health{}, fmt.Errorf("%w: health: bad fields", ErrGuest)
	}
	return h, nil
}

// WaitReady polls Health until it answers or ctx is done.
func (c *Client) WaitReady(ctx context.Context) (_ Health, err error) {
	defer classify(&err)
	for {
		attempt, cancel := context.WithTimeout(ctx, 2*time.Second)
		h, err := c.Health(attempt)
		cancel()
		if err == nil {
			return h, nil
		}
		select {
		case <-ctx.Done():
			return Health{}, fmt.Errorf("agent not ready: %w (last error: %v)", ctx.Err(), err)
		case <-c.Done():
			return Health{}, fmt.Errorf("agent not ready: connection closed (last error: %v)", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// SyncTime sets the guest clock to t.
func (c *Client) SyncTime(ctx context.Context, t time.Time) (err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	_, err = c.rpc.SyncTime(ctx, &agentpb.SyncTimeRequest{UnixNano: t.UnixNano()})
	return c.wrap("sync time", err)
}

// Reseed gives a cloned guest fresh entropy and a new machine ID.
func (c *Client) Reseed(ctx context.Context, entropy []byte, machineID, hostname string) (err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	r, err := c.rpc.Reseed(ctx, &agentpb.ReseedRequest{Entropy: entropy, MachineId: machineID, Hostname: hostname})
	if err != nil {
		return c.wrap("reseed", err)
	}
	if r.MachineId != machineID {
		return fmt.Errorf("%w: reseed: machine id not applied", ErrGuest)
	}
	return nil
}

// SetNetwork moves the guest's interface to the network that cmdline
// (kernel command-line parameters, as a fresh boot gets them) names.
func (c *Client) SetNetwork(ctx context.Context, cmdline string) (err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	if _, err := c.rpc.SetNetwork(ctx, &agentpb.SetNetworkRequest{Cmdline: cmdline}); err != nil {
		return c.wrap("set network", err)
	}
	return nil
}

// Shutdown asks the guest to power off (or reboot).
func (c *Client) Shutdown(ctx context.Context, reboot bool) (err error) {
	defer classify(&err)
	ctx, cancel := c.ctx(ctx)
	defer cancel()
	_, err = c.rpc.Shutdown(ctx, &agentpb.ShutdownRequest{Reboot: reboot})
	return c.wrap("shutdown", err)
}

// wrap names the call and keeps the gRPC status for errors.Is/As and
// status.Code; a call cut short by a restarted agent also says so
// (errors.Is(err, transport.ErrAgentReplaced)).
func (c *Client) wrap(call string, err error) error {
	if err == nil {
		return nil
	}
	if why := c.Err(); why != nil {
		return fmt.Errorf("agent %s: %w: %w", call, why, err)
	}
	// A call this host's own Close cut short fails in whatever way its
	// stream saw the close ("client connection is closing", or a bare
	// EOF from a Send): the close is why. (Close records itself before it
	// closes anything.)
	c.mu.Lock()
	at, why := c.closedAt, c.closedFor
	c.mu.Unlock()
	switch {
	case why != nil:
		return fmt.Errorf("agent %s: %w (%v)", call, why, err)
	case at != "":
		return fmt.Errorf("agent %s: %w (this host closed the connection, at %s)", call, err, at)
	}
	return fmt.Errorf("agent %s: %w", call, err)
}

// Code returns the gRPC code an agent error carries (codes.Unknown if none).
func Code(err error) codes.Code {
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus().Code()
	}
	return codes.Unknown
}

// printable reports whether s is at most n bytes of printable ASCII.
func printable(s string, n int) bool {
	if len(s) > n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// HelloWait bounds how long DialReady waits for a new session's hello
// before it asks the agent's health anyway (a booting guest's agent, or
// one that sends no hello).
const HelloWait = 5 * time.Second

// errStaleSession: the agent session that answered is not the one that
// announced itself on this connection: it began before the connection.
var errStaleSession = errors.New("the agent answered on a session that predates this connection")

// DialReady dials ep until the agent answers a health check or ctx is done.
// A VM that is still booting refuses or ignores the first attempts.
//
// Each agent session starts with a hello, when the host connects, and
// (protocol 3 and later) names it in Health. On a virtio-serial port an
// agent session can outlive the host connection it began on (the guest
// missed the host's close) and answer the next one; its streams are not
// the new host's, and it dies of that, or of its own unanswered
// keepalives, under the new host's calls. So DialReady settles only on
// the session that announced itself on its connection: one that answers
// under another name, or none, is dropped and dialled again, after a
// pause long enough for the guest to see the host gone and start afresh.
//
// Its error is the agent's too old (of kind model.ErrState) or it does not
// answer (model.ErrUnavailable).
func DialReady(ctx context.Context, ep hypervisor.AgentEndpoint, opts Options) (_ *Client, _ Health, err error) {
	defer func() {
		if err != nil && !errors.Is(err, ErrAgentTooOld) {
			err = &model.Error{Kind: model.ErrUnavailable, Msg: "the sandbox's agent does not answer", Err: err}
		}
		classify(&err)
	}()
	var lastErr error
	// What the attempts saw, for the error: connections made, and how
	// many of them carried an agent's hello (none: no byte came back
	// through the VMM; some: the agent spoke but did not answer).
	dials, hellos := 0, 0
	for {
		pause := 100 * time.Millisecond
		c, err := Dial(ctx, ep, opts)
		if err == nil {
			dials++
			h, herr := c.ready(ctx)
			if c.announcedAs() != nil {
				hellos++
			}
			if least := max(opts.MinProtocol, layout.MinProtocol); herr == nil && h.Protocol < least {
				c.Close()
				return nil, Health{}, fmt.Errorf("%w: it speaks protocol %d (version %q), this host needs %d or later",
					ErrAgentTooOld, h.Protocol, h.Version, least)
			}
			if herr == nil {
				return c, h, nil
			}
			c.Close()
			err = herr
			if errors.Is(err, errStaleSession) {
				pause = time.Second
			}
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return nil, Health{}, fmt.Errorf("agent not ready: %w (%d connections, a hello on %d; last error: %v)", ctx.Err(), dials, hellos, lastErr)
		case <-time.After(pause):
		}
	}
}

// HangUp connects to the agent of a machine just restored from a
// snapshot that was taken while a host was connected (a fork's clone, a
// sandbox made from a named snapshot), hangs up, and waits a moment. On
// a virtio-serial port such an agent still holds its old session, and
// answers a new host only once that host gave up on it (HelloWait, then
// a health check's 5 s: 10 s per restore, measured in BenchmarkFork); a
// hang-up ends it, as the hang-up before a golden snapshot or a
// hibernate does, and the agent greets the next connection with a fresh
// session. Other transports give each connection its own stream: nothing
// to do.
func HangUp(ctx context.Context, ep hypervisor.AgentEndpoint, opts Options) {
	if ep.Transport != hypervisor.TransportSerial {
		return
	}
	c, err := Dial(ctx, ep, opts)
	if err != nil {
		return // (DialReady tries again)
	}
	c.Close()
	select {
	case <-ctx.Done():
	case <-time.After(hangUpWait):
	}
}

// hangUpWait is how long the guest is given to see a hang-up (its port
// reads end of file within a few hundred ms).
const hangUpWait = 500 * time.Millisecond

// ready waits for the session's hello (up to HelloWait), then for the
// agent's health (up to 5 s), which must come from the session that said
// hello: errStaleSession if not. An agent that names no session (before
// protocol 3) is taken as it is.
func (c *Client) ready(ctx context.Context) (Health, error) {
	if err := c.waitHello(ctx, HelloWait); err != nil {
		return Health{}, err
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	h, err := c.WaitReady(hctx)
	if err != nil {
		return h, err
	}
	if len(h.Session) == 0 {
		if h.Protocol >= layout.HelloProtocol {
			return h, fmt.Errorf("%w: health: an agent of protocol %d names no session", ErrGuest, h.Protocol)
		}
		// An older agent: a hello from now on is a new agent's.
		c.settleUnannounced()
		return h, nil
	}
	// (The session's hello precedes its answers on the wire, but is read
	// by another goroutine: give it a moment.)
	if err := c.waitHello(ctx, time.Second); err != nil {
		return h, err
	}
	if !bytes.Equal(c.announcedAs(), h.Session) {
		return h, errStaleSession
	}
	return h, nil
}

// waitHello waits up to d for the session's hello; only ctx ending is an
// error.
func (c *Client) waitHello(ctx context.Context, d time.Duration) error {
	wait := time.NewTimer(d)
	defer wait.Stop()
	select {
	case <-c.hello:
	case <-wait.C:
	case <-c.Done():
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}
