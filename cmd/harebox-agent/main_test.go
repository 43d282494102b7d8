package main

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/agent/guest"
	"github.com/harebox/harebox/agent/transport"
)

func TestCommand(t *testing.T) {
	for _, c := range []struct {
		pid  int
		args []string
		want string
	}{
		{1, nil, "init"},
		{1, []string{"quiet", "serve"}, "init"}, // kernel leftovers
		{42, []string{"serve", "-socket", "x"}, "serve"},
		{42, []string{"init"}, "init"},
		{42, nil, ""},
	} {
		if got, _ := command(c.pid, c.args); got != c.want {
			t.Errorf("command(%d, %v) = %q, want %q", c.pid, c.args, got, c.want)
		}
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), 42, []string{"init"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "PID 1") {
		t.Errorf("init outside PID 1: code %d, %q", code, errb.String())
	}
	if code := run(context.Background(), 42, []string{"version"}, &out, &errb); code != 0 || out.String() != guest.Version+"\n" {
		t.Errorf("version: %d %q", code, out.String())
	}
	if code := run(context.Background(), 42, []string{"bogus"}, &out, &errb); code != 2 {
		t.Errorf("bogus: %d", code)
	}
}

// TestServeSocket runs `serve -socket` and talks to it as the host would:
// yamux over the stream, gRPC on top.
func TestServeSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		var errb bytes.Buffer
		done <- run(ctx, 42, []string{"serve", "-socket", sock}, &errb, &errb)
	}()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("serve did not stop")
		}
	}()

	var conn net.Conn
	var err error
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(20 * time.Millisecond) {
		if conn, err = net.Dial("unix", sock); err == nil {
			break
		}
	}
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
	hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
	defer hcancel()
	h, err := agentpb.NewAgentClient(cc).Health(hctx, &agentpb.HealthRequest{})
	if err != nil || h.Version != guest.Version {
		t.Fatalf("health: %v, %v", h, err)
	}
}
