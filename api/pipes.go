package api

import (
	"context"
	"net"
	"net/netip"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Pipes is a net.Listener of connections made in this process, for a
// server that sandboxes reach through the host's egress proxy (see
// linuxnet.Options.API): each connection's peer address is the sandbox's,
// so the keys' CIDRs apply to it as to any caller. Connections are Unix
// socket pairs, which half-close like TCP.
type Pipes struct {
	ch        chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

// NewPipes returns a listener; serve it with the API's http.Server.
func NewPipes() *Pipes {
	return &Pipes{ch: make(chan net.Conn), done: make(chan struct{})}
}

// Dial returns the client end of a new connection whose server end the
// listener accepts with src as its peer.
func (p *Pipes) Dial(ctx context.Context, src netip.Addr) (net.Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	conn := func(fd int, name string) (net.Conn, error) {
		f := os.NewFile(uintptr(fd), name)
		defer f.Close() // FileConn dups it
		return net.FileConn(f)
	}
	client, err := conn(fds[0], "api-client")
	if err != nil {
		unix.Close(fds[1])
		return nil, err
	}
	server, err := conn(fds[1], "api-server")
	if err != nil {
		client.Close()
		return nil, err
	}
	peer := peerConn{Conn: server, remote: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
	select {
	case p.ch <- peer:
		return client, nil
	case <-p.done:
		err = net.ErrClosed
	case <-ctx.Done():
		err = ctx.Err()
	}
	client.Close()
	server.Close()
	return nil, err
}

// Accept implements net.Listener.
func (p *Pipes) Accept() (net.Conn, error) {
	select {
	case c := <-p.ch:
		return c, nil
	case <-p.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (p *Pipes) Close() error {
	p.closeOnce.Do(func() { close(p.done) })
	return nil
}

// Addr implements net.Listener.
func (p *Pipes) Addr() net.Addr { return &net.UnixAddr{Name: "api-pipes", Net: "unix"} }

// peerConn reports the sandbox as the peer of a piped connection.
type peerConn struct {
	net.Conn
	remote net.Addr
}

func (c peerConn) RemoteAddr() net.Addr { return c.remote }

// CloseWrite half-closes, as a TCP connection's would.
func (c peerConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
