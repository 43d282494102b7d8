package main

import (
	"context"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/agent/transport"
)

// TestLiveAgent talks to an agent in a real VM through the host end of its
// virtio-serial port (a QEMU chardev Unix socket), named by
// HAREBOX_AGENT_SOCKET. Without it the test skips: booting VMs is the job
// of the backend's own tests. HAREBOX_AGENT_SHUTDOWN=1 ends with Shutdown.
func TestLiveAgent(t *testing.T) {
	sock := os.Getenv("HAREBOX_AGENT_SOCKET")
	if sock == "" {
		t.Skip("HAREBOX_AGENT_SOCKET is not set (no VM to talk to)")
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	sess, err := transport.Client(conn)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	cc, err := grpc.NewClient("passthrough:///agent",
		grpc.WithContextDialer(transport.Dialer(sess)),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := agentpb.NewAgentClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	h, err := c.Health(ctx, &agentpb.HealthRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("health: %+v", h)

	execs := []*agentpb.ExecStart{
		{Shell: "id; hostname; uname -r; mount | head -20; ip addr show lo 2>&1 | head -3"},
		{Argv: []string{"tty"}, Pty: true},
	}
	// HAREBOX_AGENT_LIVE_SHELL adds one more command, for poking at a VM.
	if sh := os.Getenv("HAREBOX_AGENT_LIVE_SHELL"); sh != "" {
		execs = append(execs, &agentpb.ExecStart{Shell: sh})
	}
	for _, st := range execs {
		s, err := c.Exec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		s.Send(&agentpb.ExecRequest{Msg: &agentpb.ExecRequest_Start{Start: st}})
		s.CloseSend()
		var out strings.Builder
		for {
			m, err := s.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			out.Write(m.GetStdout())
			out.Write(m.GetStderr())
			if x := m.GetExit(); x != nil {
				t.Logf("exec %v: exit %+v\n%s", st, x, out.String())
				if x.ExitCode != 0 {
					t.Errorf("exit %+v", x)
				}
			}
		}
	}

	ws, err := c.WriteFile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ws.Send(&agentpb.WriteFileRequest{Msg: &agentpb.WriteFileRequest_Header{Header: &agentpb.WriteFileHeader{Path: "/tmp/live/x.txt", MakeParents: true}}})
	ws.Send(&agentpb.WriteFileRequest{Msg: &agentpb.WriteFileRequest_Data{Data: []byte("hello vm\n")}})
	info, err := ws.CloseAndRecv()
	if err != nil || info.Size != 9 {
		t.Fatalf("write: %v, %v", info, err)
	}
	id := strings.Repeat("ab", 16)
	if _, err := c.Reseed(ctx, &agentpb.ReseedRequest{Entropy: make([]byte, 64), MachineId: id, Hostname: "fork-1"}); err != nil {
		t.Fatalf("reseed: %v", err)
	}

	if os.Getenv("HAREBOX_AGENT_SHUTDOWN") == "1" {
		if _, err := c.Shutdown(ctx, &agentpb.ShutdownRequest{}); err != nil {
			t.Fatal(err)
		}
	}
}
