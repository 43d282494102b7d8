package guest

import (
	"errors"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/agentpb"
)

// Connect's bounds: how many run at once, how long a connection may take
// to be made, and the size of the chunks it sends the host.
const (
	maxConns       = 64
	connectTimeout = 5 * time.Second
	connChunk      = 32 << 10
)

// Connect implements agentpb.AgentServer: a TCP connection to a port on
// the guest's loopback, relayed over the call.
func (s *Server) Connect(stream agentpb.Agent_ConnectServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	port := first.GetPort()
	if port < 1 || port > 65535 || len(first.GetData()) > 0 || first.GetCloseWrite() {
		return status.Error(codes.InvalidArgument, "the first connect message names a port (1-65535) and nothing else")
	}
	if s.conns.Add(1) > maxConns {
		s.conns.Add(-1)
		return status.Errorf(codes.ResourceExhausted, "%d connections are open already", maxConns)
	}
	defer s.conns.Add(-1)
	d := net.Dialer{Timeout: connectTimeout}
	conn, err := d.DialContext(stream.Context(), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if errors.Is(err, syscall.ECONNREFUSED) {
		// (Its own code: the host waits for a service that is starting.)
		return status.Errorf(codes.FailedPrecondition, "nothing listens on port %d", port)
	}
	if err != nil {
		return status.Errorf(codes.Unavailable, "connect to port %d: %v", port, err)
	}
	defer conn.Close()
	if err := stream.Send(&agentpb.ConnectResponse{Connected: true}); err != nil {
		return err
	}
	// The guest side to the host, until it closes; the host side to the
	// guest, until the host closes its half or the call ends.
	sent := make(chan error, 1)
	go func() {
		buf := make([]byte, connChunk)
		for {
			n, err := conn.Read(buf)
			if n > 0 {
				if serr := stream.Send(&agentpb.ConnectResponse{Data: buf[:n]}); serr != nil {
					sent <- serr
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				sent <- err
				return
			}
		}
	}()
	recvd := make(chan error, 1)
	go func() { recvd <- relayIn(stream, conn) }()
	select {
	case err := <-sent:
		// The guest side closed (or failed): the call ends, and with it
		// the host's half.
		if err != nil {
			return status.Errorf(codes.Aborted, "connection to port %d: %v", port, err)
		}
		return nil
	case err := <-recvd:
		if err != nil {
			return err
		}
		// The host closed its half: the guest side may still answer.
		if err := <-sent; err != nil {
			return status.Errorf(codes.Aborted, "connection to port %d: %v", port, err)
		}
		return nil
	case <-stream.Context().Done():
		return stream.Context().Err()
	}
}

// relayIn writes what the host sends to conn until the host closes its
// half (nil) or the call fails.
func relayIn(stream agentpb.Agent_ConnectServer, conn net.Conn) error {
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			m, err = &agentpb.ConnectRequest{CloseWrite: true}, nil
		}
		if err != nil {
			return err
		}
		if m.GetPort() != 0 {
			return status.Error(codes.InvalidArgument, "port is for the first connect message only")
		}
		if len(m.GetData()) > 0 {
			if _, err := conn.Write(m.GetData()); err != nil {
				return status.Errorf(codes.Aborted, "write: %v", err)
			}
		}
		if m.GetCloseWrite() {
			if cw, ok := conn.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
			}
			return nil
		}
	}
}
