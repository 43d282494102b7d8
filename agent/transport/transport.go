// Package transport carries the agent's gRPC over one byte stream (a
// virtio-serial port or a vsock connection), multiplexed with yamux. Both the
// guest agent and the host client use it, so the two ends agree on framing.
package transport

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/hashicorp/yamux"
)

// MaxStreamWindow bounds how much a peer may send on one stream before it is
// acknowledged: a hostile guest cannot make the host buffer more than this
// per stream.
const MaxStreamWindow = 1 << 20

// Config returns the yamux config both ends use. Keepalives detect a peer
// that stopped answering; writes time out so a stuck channel cannot pin a
// goroutine forever.
func Config() *yamux.Config {
	c := yamux.DefaultConfig()
	c.AcceptBacklog = 64
	c.EnableKeepAlive = true
	c.KeepAliveInterval = 5 * time.Second
	c.ConnectionWriteTimeout = PingTimeout
	c.StreamOpenTimeout = 10 * time.Second
	c.StreamCloseTimeout = 10 * time.Second
	c.MaxStreamWindowSize = MaxStreamWindow
	c.LogOutput = io.Discard
	return c
}

// PingTimeout is how long either end waits for the other to answer a
// keepalive (yamux's ConnectionWriteTimeout, which also bounds a write)
// before it ends the session. A guest short of memory stalls for many
// seconds under software emulation while its OOM killer works, and ending
// the session then would kill the commands in flight (the agent stops a
// command whose caller is gone) — from the host's side, or from the
// guest's, whose own ping timer is overdue when it wakes. A restarted
// agent is told by its hello and an exited VM by the hypervisor, so
// waiting longer costs little.
const PingTimeout = 30 * time.Second

// Client starts the host side of a session over conn. The guest is not
// trusted: its frames pass through a guard against ping floods.
func Client(conn io.ReadWriteCloser) (*yamux.Session, error) {
	return yamux.Client(guarded{Reader: &pingGuard{r: conn}, WriteCloser: conn}, Config())
}

// Server starts the guest side of a session over conn. The session is a
// net.Listener: hand it to grpc.Server.Serve.
func Server(conn io.ReadWriteCloser) (*yamux.Session, error) {
	return yamux.Server(conn, Config())
}

// Dialer returns a grpc-style dialer that opens a new yamux stream per call.
func Dialer(s *yamux.Session) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, _ string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			c, err := s.Open()
			ch <- result{c, err}
		}()
		select {
		case r := <-ch:
			return r.c, r.err
		case <-ctx.Done():
			go func() {
				if r := <-ch; r.c != nil {
					r.c.Close()
				}
			}()
			return nil, ctx.Err()
		}
	}
}
