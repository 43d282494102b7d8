package client

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/agent/guest"
	"github.com/harebox/harebox/agent/transport"
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

// A guest may open no stream but its one hello.
func TestGuestOpensStrayStream(t *testing.T) {
	host, g := net.Pipe()
	defer g.Close()
	c, err := New(host, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sess, err := transport.Server(g)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	st, err := sess.Open()
	if err != nil {
		t.Fatal(err)
	}
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
