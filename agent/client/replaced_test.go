package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/agent/guest"
	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/agent/transport"
	"github.com/harebox/harebox/hypervisor"
)

// serialPort stands for the guest end of a virtio-serial port: an agent
// that dies leaves it open (the host sees no EOF), and the next agent
// reads and writes the same channel.
type serialPort struct {
	net.Conn
	dead atomic.Bool
}

func (p *serialPort) Read(b []byte) (int, error) {
	if p.dead.Load() {
		return 0, net.ErrClosed
	}
	return p.Conn.Read(b)
}

func (p *serialPort) Write(b []byte) (int, error) {
	if p.dead.Load() {
		return 0, net.ErrClosed
	}
	return p.Conn.Write(b)
}

// Close is the agent's close of its file: the channel stays.
func (p *serialPort) Close() error { return nil }

// kill ends the agent on this view of the channel without a word to the
// host, as SIGKILL does.
func (p *serialPort) kill() {
	p.dead.Store(true)
	p.Conn.SetReadDeadline(time.Now()) // interrupt its pending read
}

// stuckAgent answers health, and never answers Stat: a call in flight.
type stuckAgent struct {
	agentpb.UnimplementedAgentServer
}

func (stuckAgent) Health(context.Context, *agentpb.HealthRequest) (*agentpb.HealthResponse, error) {
	return &agentpb.HealthResponse{Version: "1", Mode: "test"}, nil
}

func (stuckAgent) Stat(ctx context.Context, _ *agentpb.PathRequest) (*agentpb.FileInfo, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A restarted agent on a channel without EOF (virtio-serial): the host
// ends the old session as soon as the new agent's hello arrives, the call
// in flight fails at once, and the client says why.
func TestAgentRestartOnSerial(t *testing.T) {
	host, chanEnd := net.Pipe()
	defer chanEnd.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	first := &serialPort{Conn: chanEnd}
	served := make(chan struct{})
	go func() { guest.ServeConn(ctx, first, stuckAgent{}); close(served) }()
	c, err := New(host, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.EndReason(); err != nil {
		t.Errorf("a live session has an end reason: %v", err)
	}
	inflight := make(chan error, 1)
	go func() {
		_, err := c.Stat(context.Background(), "/etc") // 30 s default deadline
		inflight <- err
	}()
	time.Sleep(200 * time.Millisecond) // the call reaches the agent

	first.kill()
	<-served
	chanEnd.SetReadDeadline(time.Time{})
	start := time.Now()
	go guest.ServeConn(ctx, &serialPort{Conn: chanEnd}, stuckAgent{})

	select {
	case err := <-inflight:
		if err == nil {
			t.Fatal("the call in flight succeeded")
		}
		t.Logf("in-flight call failed after %v: %v", time.Since(start), err)
	case <-time.After(3 * time.Second):
		t.Fatal("the call in flight was still waiting 3 s after the agent restarted")
	}
	select {
	case <-c.Done():
	case <-time.After(time.Second):
		t.Fatal("the old session is still open")
	}
	if err := c.Err(); !errors.Is(err, transport.ErrAgentReplaced) {
		// A hello that collides with a stream ID the host still holds ends
		// the session as a protocol error instead; both are a restart.
		t.Logf("session ended without a recorded reason (%v)", err)
	}
	if err := c.EndReason(); !errors.Is(err, transport.ErrAgentReplaced) && !errors.Is(err, transport.ErrSessionEnded) {
		t.Errorf("the end reason: %v", err)
	}
}

// The link closes under a session (the VM went, or the host's side was
// closed): the session ends, and says why, without a hello involved.
func TestSessionEndReason(t *testing.T) {
	host, g := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go guest.ServeConn(ctx, &serialPort{Conn: g}, stuckAgent{})
	c, err := New(host, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	g.Close()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the session outlived its link")
	}
	err = c.EndReason()
	if !errors.Is(err, transport.ErrSessionEnded) || errors.Is(err, transport.ErrAgentReplaced) || c.Err() != nil {
		t.Errorf("end reason %v (Err %v), want the session's own", err, c.Err())
	}
	t.Logf("end reason: %v", err)
}

// guestStream is a host client over a link whose guest end is a raw
// session (no agent), and a stream that guest opened; all closed at the
// test's end.
func guestStream(t *testing.T) (c *Client, guest net.Conn, st net.Conn) {
	t.Helper()
	host, g := net.Pipe()
	t.Cleanup(func() { g.Close() })
	c, err := New(host, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	sess, err := transport.Server(g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	if st, err = sess.Open(); err != nil {
		t.Fatal(err)
	}
	return c, g, st
}

// The link closes as the host reads the agent's hello (part of it came):
// the session ended, which is not a bad hello.
func TestLinkClosedInTheHello(t *testing.T) {
	c, g, st := guestStream(t)
	st.Write([]byte("HBHELLO1"))
	time.Sleep(100 * time.Millisecond) // (the host has these, and waits for the rest)
	g.Close()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the session outlived its link")
	}
	if err := c.EndReason(); !errors.Is(err, transport.ErrSessionEnded) || errors.Is(c.Err(), transport.ErrBadHello) {
		t.Errorf("end reason %v (Err %v), want the session's own", err, c.Err())
	}
}

// A guest may open no stream but its one hello.
func TestGuestOpensStrayStream(t *testing.T) {
	c, _, st := guestStream(t)
	st.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	st.Close()
	select {
	case <-c.Done():
	case <-time.After(transport.HelloTimeout + 2*time.Second):
		t.Fatal("the host kept a session whose guest opened a stray stream")
	}
	if !errors.Is(c.Err(), transport.ErrBadHello) {
		t.Fatalf("Err() = %v, want ErrBadHello", c.Err())
	}
}

// virtioPort emulates a virtio-serial port behind a host socket: one
// channel to the guest, host connections that come and go on a Unix
// socket, a guest agent that starts a session when a host connects, and
// what the guest sends while no host is connected is dropped. When
// missClose is set, the guest misses the next host's close (both port
// events reach it before it reads): its session lives on and answers the
// next host, which is the stale session DialReady must not settle on.
type virtioPort struct {
	t         *testing.T
	ctx       context.Context
	guestEnd  net.Conn
	portEnd   net.Conn
	mu        sync.Mutex
	host      net.Conn    // the connected host, if any
	session   *serialPort // the guest's live session, if any
	ended     chan struct{}
	missClose bool
	sessions  int // guest sessions started
}

func newVirtioPort(t *testing.T) (*virtioPort, hypervisor.AgentEndpoint) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &virtioPort{t: t, ctx: ctx}
	p.guestEnd, p.portEnd = net.Pipe()
	path := filepath.Join(t.TempDir(), "port.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); l.Close(); p.guestEnd.Close(); p.portEnd.Close() })
	// Guest to host: to the connected host, or dropped.
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := p.portEnd.Read(buf)
			if err != nil {
				return
			}
			p.mu.Lock()
			h := p.host
			p.mu.Unlock()
			if h != nil {
				h.Write(buf[:n])
			}
		}
	}()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.connect(c)
		}
	}()
	return p, hypervisor.AgentEndpoint{Transport: hypervisor.TransportSerial, Path: path}
}

// connect serves one host connection until it closes.
func (p *virtioPort) connect(c net.Conn) {
	p.mu.Lock()
	p.host = c
	if p.session == nil {
		if p.ended != nil {
			<-p.ended // (the last session has stopped reading)
		}
		p.guestEnd.SetReadDeadline(time.Time{})
		p.session, p.ended = &serialPort{Conn: p.guestEnd}, make(chan struct{})
		p.sessions++
		go func(port *serialPort, ended chan struct{}) {
			guest.ServeConn(p.ctx, port, guest.New(guest.Options{}))
			close(ended)
		}(p.session, p.ended)
	}
	p.mu.Unlock()
	go func() {
		io.Copy(p.portEnd, c)
		c.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		p.host = nil
		if p.missClose {
			p.missClose = false
			return
		}
		// The guest reads EOF: its session ends.
		p.session.kill()
		p.session = nil
	}()
}

// A host that reconnects to a port whose agent session outlived the last
// host (it missed the close) does not settle on that session: it drops
// it and dials again, and gets a session that announced itself to it.
func TestStaleSessionOnSerial(t *testing.T) {
	t.Parallel() // (it waits on timeouts, as the others marked so do)
	port, ep := newVirtioPort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The last host: it took the agent's hello and was killed (its
	// streams are gone with it; it held none open here, so the stale
	// session answers the next host's calls).
	conn, err := net.Dial("unix", ep.Path)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := transport.Client(conn)
	if err != nil {
		t.Fatal(err)
	}
	hello := make(chan struct{})
	go transport.WatchHellos(sess, func([]byte) bool { close(hello); return true })
	select {
	case <-hello:
	case <-time.After(5 * time.Second):
		t.Fatal("no hello from the agent")
	}
	port.mu.Lock()
	port.missClose = true
	port.mu.Unlock()
	conn.Close()

	start := time.Now()
	c, h, err := DialReady(ctx, ep, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n := c.announcedAs(); n == nil || !bytes.Equal(n, h.Session) {
		t.Errorf("DialReady settled on a session that did not announce itself to it (after %v)", time.Since(start))
	}
	if h.Protocol < layout.HelloProtocol {
		t.Errorf("health %+v", h)
	}
	if _, err := c.Health(ctx); err != nil {
		t.Errorf("a call on the new session: %v", err)
	}
	port.mu.Lock()
	defer port.mu.Unlock()
	if port.sessions < 2 {
		t.Errorf("%d guest sessions: the stale one was used", port.sessions)
	}
	t.Logf("a fresh session after %v (%d guest sessions)", time.Since(start), port.sessions)
}

// A call that this host's own Close cuts short says where Close was
// called: the one clue to who ended a session the guest did not end.
func TestClosedByHost(t *testing.T) {
	host, g := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go guest.ServeConn(ctx, &serialPort{Conn: g}, stuckAgent{})
	c, err := New(host, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	inflight := make(chan error, 1)
	go func() {
		_, err := c.Stat(context.Background(), "/etc")
		inflight <- err
	}()
	time.Sleep(200 * time.Millisecond) // the call reaches the agent
	c.Close()
	select {
	case err := <-inflight:
		if err == nil || !strings.Contains(err.Error(), "this host closed the connection, at replaced_test.go:") {
			t.Errorf("the call cut short by Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call outlived Close")
	}

	// CloseFor: the call cut short fails with the reason given.
	c2, err := New(host2(t, ctx), Options{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := c2.Stat(context.Background(), "/etc")
		inflight <- err
	}()
	time.Sleep(200 * time.Millisecond)
	why := errors.New("the sandbox was deleted")
	c2.CloseFor(why)
	if err := <-inflight; !errors.Is(err, why) {
		t.Errorf("the call cut short by CloseFor: %v", err)
	}
	// However a call saw the close: a stream's Send gets a bare EOF (an
	// exec's first message, when the close came just after the stream
	// opened: a 503 in the crash loop, where the sandbox's delete hung up).
	if err := c2.wrap("exec", io.EOF); !errors.Is(err, why) {
		t.Errorf("an EOF after CloseFor: %v", err)
	}
	if _, err := c2.ExecStream(context.Background(), ExecRequest{Shell: "true"}, ExecIO{}); !errors.Is(err, why) {
		t.Errorf("an exec after CloseFor: %v", err)
	}
}

// host2 is the host end of a new channel to a stuck agent.
func host2(t *testing.T, ctx context.Context) net.Conn {
	host, g := net.Pipe()
	t.Cleanup(func() { host.Close(); g.Close() })
	go guest.ServeConn(ctx, &serialPort{Conn: g}, stuckAgent{})
	return host
}
