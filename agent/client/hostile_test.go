package client

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/agent/transport"
	"github.com/harebox/harebox/model"
)

// These tests put a hostile guest on the other end of the channel. The
// host must return errors within its deadlines, never hang or crash, and
// never accept more than its bounds.

// rawGuest connects a client to a guest that does whatever f does with the
// raw byte stream.
func rawGuest(t *testing.T, f func(guest net.Conn)) *Client {
	t.Helper()
	host, guest := net.Pipe()
	go f(guest)
	c, err := New(host, Options{CallTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); guest.Close() })
	return c
}

// within fails the test if f takes longer than d.
func within(t *testing.T, d time.Duration, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { f(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("call still running after %v", d)
	}
}

func TestSilentGuest(t *testing.T) {
	t.Parallel() // (it waits on timeouts, as the others marked so do)
	c := rawGuest(t, func(g net.Conn) { io.Copy(io.Discard, g) })
	within(t, 5*time.Second, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if _, err := c.Health(ctx); err == nil {
			t.Error("health succeeded against a silent guest")
		}
	})
	// No deadline from the caller: the client's default applies.
	within(t, 10*time.Second, func() {
		if _, err := c.Stat(context.Background(), "/etc"); err == nil {
			t.Error("stat succeeded against a silent guest")
		}
	})
}

func TestGarbageGuest(t *testing.T) {
	c := rawGuest(t, func(g net.Conn) {
		go io.Copy(io.Discard, g)
		junk := bytes.Repeat([]byte("\x00\x01garbage\xff"), 10000)
		g.Write(junk)
	})
	within(t, 5*time.Second, func() {
		if _, err := c.Health(context.Background()); err == nil {
			t.Error("health succeeded against a garbage stream")
		}
	})
}

func TestHugeFrameGuest(t *testing.T) {
	t.Parallel() // (it waits on timeouts, as the others marked so do)
	c := rawGuest(t, func(g net.Conn) {
		go io.Copy(io.Discard, g)
		// A yamux data frame for stream 1 claiming 4 GiB: far beyond the
		// receive window, so the session must be torn down, not buffered.
		hdr := make([]byte, 12)
		hdr[0], hdr[1] = 0, 0 // version, type data
		binary.BigEndian.PutUint16(hdr[2:], 0)
		binary.BigEndian.PutUint32(hdr[4:], 1)
		binary.BigEndian.PutUint32(hdr[8:], 0xffffffff)
		g.Write(hdr)
		g.Write(make([]byte, 1<<20))
	})
	within(t, 5*time.Second, func() {
		if _, err := c.Health(context.Background()); err == nil {
			t.Error("health succeeded against an oversized frame")
		}
	})
}

// evilAgent is a gRPC agent that breaks the protocol in the ways a hostile
// guest could.
type evilAgent struct {
	agentpb.UnimplementedAgentServer
}

func (evilAgent) Health(context.Context, *agentpb.HealthRequest) (*agentpb.HealthResponse, error) {
	return &agentpb.HealthResponse{Version: strings.Repeat("v", MaxMessage+1)}, nil
}

func (evilAgent) Stat(_ context.Context, r *agentpb.PathRequest) (*agentpb.FileInfo, error) {
	switch r.Path {
	case "/badmode":
		return &agentpb.FileInfo{Path: r.Path, Name: "badmode", Type: agentpb.FileType_FILE_TYPE_REGULAR, Mode: 0o170777}, nil
	case "/badname":
		return &agentpb.FileInfo{Path: r.Path, Name: "a/b", Type: agentpb.FileType_FILE_TYPE_REGULAR}, nil
	default:
		return &agentpb.FileInfo{Path: r.Path, Name: "x", Type: 99}, nil
	}
}

func (evilAgent) ListDir(_ context.Context, r *agentpb.ListDirRequest) (*agentpb.ListDirResponse, error) {
	out := &agentpb.ListDirResponse{}
	for i := 0; i < int(r.Limit)+5; i++ {
		out.Entries = append(out.Entries, &agentpb.FileInfo{Name: "f", Type: agentpb.FileType_FILE_TYPE_REGULAR})
	}
	return out, nil
}

func (evilAgent) Exec(s agentpb.Agent_ExecServer) error {
	start, err := s.Recv()
	if err != nil {
		return err
	}
	switch strings.Join(start.GetStart().Argv, " ") {
	case "flood":
		// Far more output than the host keeps; then a valid exit.
		chunk := bytes.Repeat([]byte("y"), 512<<10)
		for i := 0; i < 64; i++ {
			if err := s.Send(&agentpb.ExecResponse{Msg: &agentpb.ExecResponse_Stdout{Stdout: chunk}}); err != nil {
				return err
			}
		}
		return s.Send(&agentpb.ExecResponse{Msg: &agentpb.ExecResponse_Exit{Exit: &agentpb.ExecExit{}}})
	case "noexit":
		return nil
	case "twopids":
		for i := 0; i < 3; i++ {
			s.Send(&agentpb.ExecResponse{Msg: &agentpb.ExecResponse_StartedPid{StartedPid: 42}})
		}
		return s.Send(&agentpb.ExecResponse{Msg: &agentpb.ExecResponse_Exit{Exit: &agentpb.ExecExit{}}})
	case "badexit":
		return s.Send(&agentpb.ExecResponse{Msg: &agentpb.ExecResponse_Exit{Exit: &agentpb.ExecExit{ExitCode: 100000}}})
	case "twoexits":
		s.Send(&agentpb.ExecResponse{Msg: &agentpb.ExecResponse_Exit{Exit: &agentpb.ExecExit{}}})
		return s.Send(&agentpb.ExecResponse{Msg: &agentpb.ExecResponse_Stdout{Stdout: []byte("late")}})
	default: // hang forever
		<-s.Context().Done()
		return nil
	}
}

func (evilAgent) ReadFile(r *agentpb.ReadFileRequest, s agentpb.Agent_ReadFileServer) error {
	// Sends more than the limit asked for.
	for i := 0; i < 4; i++ {
		if err := s.Send(&agentpb.ReadFileChunk{Data: make([]byte, 64<<10)}); err != nil {
			return err
		}
	}
	return nil
}

func evilClient(t *testing.T) *Client {
	t.Helper()
	host, guest := net.Pipe()
	sess, err := transport.Server(guest)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.MaxSendMsgSize(64 << 20))
	agentpb.RegisterAgentServer(srv, evilAgent{})
	go srv.Serve(sess)
	c, err := New(host, Options{CallTimeout: 5 * time.Second, MaxOutput: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); srv.Stop(); sess.Close() })
	return c
}

func TestEvilAgent(t *testing.T) {
	c := evilClient(t)
	ctx := context.Background()
	within(t, 30*time.Second, func() {
		if _, err := c.Health(ctx); err == nil {
			t.Error("oversized health reply accepted")
		}
		for _, p := range []string{"/badmode", "/badname", "/badtype"} {
			if _, err := c.Stat(ctx, p); !errors.Is(err, ErrGuest) {
				t.Errorf("stat %s: want ErrGuest, got %v", p, err)
			}
		}
		if _, _, err := c.ListDir(ctx, "/", 10); !errors.Is(err, ErrGuest) || !errors.Is(err, model.ErrUnavailable) {
			t.Errorf("list: want ErrGuest, got %v", err)
		}
		r, err := c.Exec(ctx, ExecRequest{Argv: []string{"flood"}}, nil)
		if err != nil {
			t.Errorf("flood: %v", err)
		} else if len(r.Stdout) != 1<<20 || !r.StdoutTruncated {
			t.Errorf("flood: kept %d bytes (truncated %v), want 1 MiB and truncated", len(r.Stdout), r.StdoutTruncated)
		}
		if _, err := c.Exec(ctx, ExecRequest{Argv: []string{"noexit"}}, nil); !errors.Is(err, ErrGuest) {
			t.Errorf("noexit: want ErrGuest, got %v", err)
		}
		if _, err := c.Exec(ctx, ExecRequest{Argv: []string{"twopids"}}, nil); !errors.Is(err, ErrGuest) {
			t.Errorf("repeated pid: want ErrGuest, got %v", err)
		}
		if _, err := c.Exec(ctx, ExecRequest{Argv: []string{"badexit"}}, nil); !errors.Is(err, ErrGuest) {
			t.Errorf("badexit: want ErrGuest, got %v", err)
		}
		if _, err := c.Exec(ctx, ExecRequest{Argv: []string{"twoexits"}}, nil); !errors.Is(err, ErrGuest) {
			t.Errorf("twoexits: want ErrGuest, got %v", err)
		}
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = c.Exec(tctx, ExecRequest{Argv: []string{"hang"}}, nil)
		cancel()
		if err == nil {
			t.Error("hanging exec returned no error")
		}
		var buf bytes.Buffer
		if _, err := c.ReadFile(ctx, "/f", &buf, 0, 100_000); !errors.Is(err, ErrGuest) {
			t.Errorf("read past limit: want ErrGuest, got %v", err)
		}
	})
}

// TestPingFloodGuest: a guest that floods yamux pings and never reads must
// not make the host spawn goroutines without bound; the session ends.
func TestPingFloodGuest(t *testing.T) {
	before := runtime.NumGoroutine()
	host, guest := net.Pipe()
	c, err := New(host, Options{CallTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		ping := make([]byte, 12)
		ping[1] = 2                             // ping
		binary.BigEndian.PutUint16(ping[2:], 1) // SYN: wants a reply
		for i := uint32(0); ; i++ {
			binary.BigEndian.PutUint32(ping[8:], i)
			select {
			case <-stop:
				return
			default:
			}
			if _, err := guest.Write(ping); err != nil {
				return
			}
		}
	}()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("the session survived a ping flood; %d goroutines", runtime.NumGoroutine())
	}
	if n := runtime.NumGoroutine(); n > before+200 {
		t.Fatalf("%d goroutines after the flood (%d before)", n, before)
	}
}
