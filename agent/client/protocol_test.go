package client

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/agent/guest"
	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/model"
)

// oldAgent is an agent from before the protocol level: it reports none and
// has no Stat.
type oldAgent struct {
	agentpb.UnimplementedAgentServer
}

func (oldAgent) Health(context.Context, *agentpb.HealthRequest) (*agentpb.HealthResponse, error) {
	return &agentpb.HealthResponse{Version: "0.0.9", Mode: "service"}, nil
}

// serveAgent serves srv on a Unix socket, one session per connection, as
// the guest does on its channel.
func serveAgent(t *testing.T, srv agentpb.AgentServer) hypervisor.AgentEndpoint {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go guest.ServeConn(ctx, c, srv)
		}
	}()
	return hypervisor.AgentEndpoint{Transport: hypervisor.TransportSerial, Path: path}
}

// TestProtocolLevels: the agent reports its protocol level; a host that
// needs a later one refuses the agent at once with ErrAgentTooOld rather
// than retrying until its deadline; a call an older agent lacks fails
// with codes.Unimplemented, which the engine turns into a clear error.
func TestProtocolLevels(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, h, err := DialReady(ctx, serveAgent(t, guest.New(guest.Options{})), Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Its errors are of the API's kinds, the cause kept.
	if _, err := c.Stat(ctx, filepath.Join(t.TempDir(), "missing")); !errors.Is(err, model.ErrNotFound) || Code(err) != codes.NotFound {
		t.Errorf("stat of a missing file: %v, want of kind not found, code NotFound", err)
	}
	c.Close()
	if h.Protocol != layout.Protocol {
		t.Fatalf("this tree's agent reports protocol %d, want %d", h.Protocol, layout.Protocol)
	}

	old := serveAgent(t, oldAgent{})
	c, h, err = DialReady(ctx, old, Options{})
	if err != nil || h.Protocol != 0 {
		t.Fatalf("an agent of protocol 0 (MinProtocol %d): %+v %v", layout.MinProtocol, h, err)
	}
	if _, err := c.Stat(ctx, "/"); Code(err) != codes.Unimplemented || !errors.Is(err, model.ErrInvalid) || !strings.Contains(err.Error(), "image built with this release") {
		t.Errorf("a call the old agent lacks: %v", err)
	}
	c.Close()
	start := time.Now()
	if _, _, err := DialReady(ctx, old, Options{MinProtocol: layout.Protocol}); !errors.Is(err, ErrAgentTooOld) || !errors.Is(err, model.ErrState) ||
		!strings.Contains(err.Error(), "image built with this release") || time.Since(start) > 5*time.Second {
		t.Fatalf("a host that needs protocol %d: %v after %v", layout.Protocol, err, time.Since(start))
	}
}

// TestDialReadySilent: a VMM that takes connections and passes no byte
// back (a port it is not forwarding) fails DialReady with what the
// attempts saw: connections made, none with a hello.
func TestDialReadySilent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _, err = DialReady(ctx, hypervisor.AgentEndpoint{Transport: hypervisor.TransportSerial, Path: path}, Options{})
	if !errors.Is(err, model.ErrUnavailable) || !strings.Contains(err.Error(), "1 connections, a hello on 0") {
		t.Fatalf("DialReady on a silent VMM: %v", err)
	}
}
