package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/model"
)

// connectChunk is the most a Conn sends the agent in one message.
const connectChunk = 32 << 10

// ErrNotListening is Connect's error when nothing listens on the port
// (yet: a service may be starting).
var ErrNotListening = errors.New("nothing listens on the port")

// Connect opens a TCP connection to port on the guest's loopback and
// returns it once the guest has made it. It lasts until Close or ctx
// ends; what the guest sends is read through it in chunks of at most
// MaxChunk bytes, each checked. Protocol 6.
func (c *Client) Connect(ctx context.Context, port uint16) (_ net.Conn, err error) {
	defer classify(&err)
	if err := c.need(6, "connections to the guest's services"); err != nil {
		return nil, err
	}
	if port == 0 {
		return nil, errors.New("agent connect: port 0")
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	cn := &Conn{port: port, cancel: func() { stop(); cancel() }}
	defer func() {
		if err != nil {
			cn.Close()
		}
	}()
	if cn.stream, err = c.rpc.Connect(sctx); err != nil {
		return nil, c.wrap("connect", err)
	}
	if err := cn.stream.Send(&agentpb.ConnectRequest{Port: uint32(port)}); err != nil {
		return nil, c.wrap("connect", err)
	}
	// The first answer says the connection is made; until it comes, the
	// call's own timeout holds (a guest that never answers).
	first := make(chan error, 1)
	go func() {
		m, err := cn.stream.Recv()
		switch {
		case Code(err) == codes.FailedPrecondition:
			first <- &model.Error{Kind: model.ErrUnavailable, Msg: fmt.Sprintf("nothing listens on port %d in the sandbox", port), Err: ErrNotListening}
		case err != nil:
			first <- c.wrap("connect", err)
		case !m.GetConnected() || len(m.GetData()) > 0:
			first <- fmt.Errorf("%w: connect: the first answer is not a connection", ErrGuest)
		default:
			first <- nil
		}
	}()
	t := time.NewTimer(c.opts.CallTimeout)
	defer t.Stop()
	select {
	case err := <-first:
		if err != nil {
			return nil, err
		}
	case <-t.C:
		return nil, fmt.Errorf("%w: connect to port %d: no answer in %s", ErrGuest, port, c.opts.CallTimeout)
	}
	return cn, nil
}

// Conn is a connection to a port on the guest's loopback (Connect). Its
// deadlines are not supported: a caller bounds it with Connect's context,
// or closes it.
type Conn struct {
	port   uint16
	stream agentpb.Agent_ConnectClient
	cancel context.CancelFunc

	rmu  sync.Mutex
	rbuf []byte
	rerr error

	wmu    sync.Mutex
	closed bool
}

// Read implements net.Conn.
func (cn *Conn) Read(p []byte) (int, error) {
	cn.rmu.Lock()
	defer cn.rmu.Unlock()
	for len(cn.rbuf) == 0 {
		if cn.rerr != nil {
			return 0, cn.rerr
		}
		m, err := cn.stream.Recv()
		switch {
		case errors.Is(err, io.EOF):
			cn.rerr = io.EOF
		case err != nil:
			cn.rerr = fmt.Errorf("agent connection to port %d: %w", cn.port, err)
		case m.GetConnected():
			cn.rerr = fmt.Errorf("%w: connect: a second connected answer", ErrGuest)
		case len(m.GetData()) > MaxChunk:
			cn.rerr = fmt.Errorf("%w: connect: a chunk of %d bytes", ErrGuest, len(m.GetData()))
		default:
			cn.rbuf = m.GetData()
		}
		if cn.rerr != nil && !errors.Is(cn.rerr, io.EOF) {
			cn.cancel() // (a guest that lies is not read again)
		}
	}
	n := copy(p, cn.rbuf)
	cn.rbuf = cn.rbuf[n:]
	return n, nil
}

// Write implements net.Conn.
func (cn *Conn) Write(p []byte) (int, error) {
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	if cn.closed {
		return 0, net.ErrClosed
	}
	n := 0
	for len(p) > 0 {
		k := min(len(p), connectChunk)
		if err := cn.stream.Send(&agentpb.ConnectRequest{Data: p[:k]}); err != nil {
			return n, fmt.Errorf("agent connection to port %d: %w", cn.port, err)
		}
		n, p = n+k, p[k:]
	}
	return n, nil
}

// CloseWrite ends the host's half: the guest's side reads end of file.
func (cn *Conn) CloseWrite() error {
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	if cn.closed {
		return net.ErrClosed
	}
	cn.closed = true
	return cn.stream.CloseSend()
}

// Close implements net.Conn: the call ends, both halves with it.
func (cn *Conn) Close() error {
	cn.wmu.Lock()
	cn.closed = true
	cn.wmu.Unlock()
	cn.cancel()
	return nil
}

// LocalAddr implements net.Conn.
func (cn *Conn) LocalAddr() net.Addr { return connAddr("host") }

// RemoteAddr implements net.Conn: the guest's port.
func (cn *Conn) RemoteAddr() net.Addr { return connAddr("guest:" + strconv.Itoa(int(cn.port))) }

// SetDeadline implements net.Conn; deadlines are not supported.
func (cn *Conn) SetDeadline(time.Time) error { return os.ErrNoDeadline }

// SetReadDeadline implements net.Conn; deadlines are not supported.
func (cn *Conn) SetReadDeadline(time.Time) error { return os.ErrNoDeadline }

// SetWriteDeadline implements net.Conn; deadlines are not supported.
func (cn *Conn) SetWriteDeadline(time.Time) error { return os.ErrNoDeadline }

type connAddr string

func (a connAddr) Network() string { return "agent" }
func (a connAddr) String() string  { return string(a) }
