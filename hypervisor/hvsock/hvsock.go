// Package hvsock dials a guest vsock port through a hybrid-vsock Unix
// socket (Cloud Hypervisor, Firecracker): "CONNECT <port>\n", then "OK <n>\n".
package hvsock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"
)

// ErrHandshake is wrapped by every hybrid-vsock handshake failure.
var ErrHandshake = errors.New("hybrid vsock handshake failed")

const (
	// DefaultHandshakeTimeout bounds the CONNECT/OK exchange when the
	// context has no deadline.
	DefaultHandshakeTimeout = 5 * time.Second
	// maxReplyLine bounds the reply: "OK " and a 32-bit port fit in 14.
	maxReplyLine = 32
)

// DialHybridVsock connects to a guest vsock port through the VMM's hybrid
// vsock Unix socket: it sends "CONNECT <port>\n" and expects "OK <n>\n".
// The VMM closes the connection when nothing in the guest listens on port.
// The returned conn's Read starts right after the OK line.
func DialHybridVsock(ctx context.Context, path string, port uint32) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("hybrid vsock %s port %d: %w", path, port, err)
	}
	rest, err := handshake(ctx, conn, port)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("hybrid vsock %s port %d: %w", path, port, err)
	}
	return &vsockConn{Conn: conn, pending: rest}, nil
}

// handshake runs CONNECT/OK on conn and returns bytes that arrived after
// the OK line, which belong to the stream.
func handshake(ctx context.Context, conn net.Conn, port uint32) ([]byte, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultHandshakeTimeout)
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	// Cancelling ctx unblocks the handshake by expiring the deadline.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	req := []byte("CONNECT " + strconv.FormatUint(uint64(port), 10) + "\n")
	// One write: the VMM parses the request from a single read.
	if n, err := conn.Write(req); err != nil || n != len(req) {
		return nil, fmt.Errorf("%w: write CONNECT: %w", ErrHandshake, orShort(err))
	}

	buf := make([]byte, maxReplyLine)
	n := 0
	for {
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			if err := parseOK(buf[:i]); err != nil {
				return nil, err
			}
			if err := conn.SetDeadline(time.Time{}); err != nil {
				return nil, err
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return bytes.Clone(buf[i+1 : n]), nil
		}
		if n == len(buf) {
			return nil, fmt.Errorf("%w: no newline in the first %d bytes of the reply %q", ErrHandshake, len(buf), buf[:n])
		}
		m, err := conn.Read(buf[n:])
		n += m
		if err != nil && bytes.IndexByte(buf[:n], '\n') < 0 {
			switch {
			case ctx.Err() != nil:
				return nil, fmt.Errorf("%w: %w", ErrHandshake, ctx.Err())
			case errors.Is(err, os.ErrDeadlineExceeded):
				// Our deadline is ctx's (or the default): report it as such.
				return nil, fmt.Errorf("%w: no reply in time: %w", ErrHandshake, context.DeadlineExceeded)
			case errors.Is(err, io.EOF) && n == 0:
				return nil, fmt.Errorf("%w: connection closed before a reply (is anything listening on the port in the guest?)", ErrHandshake)
			case errors.Is(err, io.EOF):
				return nil, fmt.Errorf("%w: connection closed in the middle of the reply %q", ErrHandshake, buf[:n])
			}
			return nil, fmt.Errorf("%w: read reply: %w", ErrHandshake, err)
		}
	}
}

// parseOK accepts "OK <decimal>" (the host-side port the VMM assigned).
func parseOK(line []byte) error {
	num, ok := bytes.CutPrefix(line, []byte("OK "))
	if ok && len(num) > 0 && len(num) <= 10 {
		if _, err := strconv.ParseUint(string(num), 10, 32); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: unexpected reply %q", ErrHandshake, line)
}

func orShort(err error) error {
	if err == nil {
		return io.ErrShortWrite
	}
	return err
}

// vsockConn serves bytes that arrived with the OK line before reading on.
type vsockConn struct {
	net.Conn
	pending []byte
}

func (c *vsockConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// CloseWrite half-closes the stream, as *net.UnixConn does.
func (c *vsockConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
