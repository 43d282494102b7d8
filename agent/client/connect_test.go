package client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/model"
)

// Connect through the real agent, to services on this machine's loopback
// (the agent's "guest" here).

func TestConnect(t *testing.T) {
	ctx, c := dialAgent(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write([]byte(r.Method + " " + r.URL.Path + " " + strconv.Itoa(len(b))))
	}))
	defer srv.Close()
	port, _ := strconv.Atoi(srv.URL[strings.LastIndex(srv.URL, ":")+1:])

	// HTTP over it, as the code interpreter's client speaks, with a body
	// larger than one chunk each way.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return c.Connect(ctx, uint16(port))
	}}}
	defer hc.CloseIdleConnections()
	for i := 0; i < 3; i++ {
		resp, err := hc.Post("http://guest/x", "text/plain", strings.NewReader(strings.Repeat("a", 200<<10)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "POST /x 204800" {
			t.Fatalf("answer %q", b)
		}
	}

	// Half close: the guest's side reads end of file and may still answer.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		g, err := l.Accept()
		if err != nil {
			return
		}
		b, _ := io.ReadAll(g)
		g.Write([]byte("got " + string(b)))
		g.Close()
	}()
	cn, err := c.Connect(ctx, uint16(l.Addr().(*net.TCPAddr).Port))
	if err != nil {
		t.Fatal(err)
	}
	cn.Write([]byte("hello"))
	cn.(*Conn).CloseWrite()
	if b, err := io.ReadAll(cn); err != nil || string(b) != "got hello" {
		t.Fatalf("after half close: %q %v", b, err)
	}
	cn.Close()
	if _, err := cn.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("write after close: %v", err)
	}

	// Nothing listens: a clear error at once, of a kind the API shows.
	l2, _ := net.Listen("tcp", "127.0.0.1:0")
	free := l2.Addr().(*net.TCPAddr).Port
	l2.Close()
	start := time.Now()
	if _, err := c.Connect(ctx, uint16(free)); !errors.Is(err, model.ErrUnavailable) || !errors.Is(err, ErrNotListening) {
		t.Errorf("nothing listens: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("refused after %v", d)
	}
}

func (evilAgent) Connect(s agentpb.Agent_ConnectServer) error {
	first, err := s.Recv()
	if err != nil {
		return err
	}
	switch first.GetPort() {
	case 1: // bytes before saying it is connected
		return s.Send(&agentpb.ConnectResponse{Data: []byte("x")})
	case 2: // a chunk past the bound
		s.Send(&agentpb.ConnectResponse{Connected: true})
		return s.Send(&agentpb.ConnectResponse{Data: make([]byte, MaxChunk+1)})
	case 3: // connected twice
		s.Send(&agentpb.ConnectResponse{Connected: true})
		return s.Send(&agentpb.ConnectResponse{Connected: true})
	default: // never answers
		<-s.Context().Done()
		return nil
	}
}

func TestEvilConnect(t *testing.T) {
	t.Parallel() // (it waits on timeouts, as the others marked so do)
	c := evilClient(t)
	ctx := context.Background()
	within(t, 30*time.Second, func() {
		if _, err := c.Connect(ctx, 1); !errors.Is(err, ErrGuest) {
			t.Errorf("data before connected: %v", err)
		}
		for _, port := range []uint16{2, 3} {
			cn, err := c.Connect(ctx, port)
			if err != nil {
				t.Fatalf("port %d: %v", port, err)
			}
			if _, err := io.ReadAll(cn); !errors.Is(err, ErrGuest) {
				t.Errorf("port %d: read %v", port, err)
			}
			cn.Close()
		}
		start := time.Now()
		if _, err := c.Connect(ctx, 4); !errors.Is(err, ErrGuest) {
			t.Errorf("no answer: %v", err)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("no answer given up after %v", d)
		}
	})
}
