package cloudhypervisor

import (
	"bytes"
	"context"
	"syscall"
	"testing"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
)

// TestAgentRestartOverVsock: the host's side of an agent killed in the
// guest, on Cloud Hypervisor's channel (hybrid vsock through the VMM,
// here the stub with the real agent transport behind its vsock port; a
// real guest needs hardware KVM). Each vsock connection is its own agent
// session, so the agent's death closes the host's connection: the call in
// flight fails at once, and the next dial gets a new session (a new
// hello, which Health names).
func TestAgentRestartOverVsock(t *testing.T) {
	t.Setenv(stubAgentEnv, "1")
	b := stubBackend(t)
	ctx := testCtx(t)
	files := newTestFiles(t)
	m, err := b.Launch(ctx, files.spec("vsock", false))
	if err != nil {
		t.Fatal(err)
	}
	reap(t, m)
	c, h, err := agentclient.DialReady(ctx, m.AgentEndpoint(), agentclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if len(h.Session) == 0 {
		t.Fatalf("health %+v names no session", h)
	}
	inflight := make(chan error, 1)
	go func() {
		_, err := c.Stat(context.Background(), "/etc") // never answered
		inflight <- err
	}()
	time.Sleep(200 * time.Millisecond)
	info, err := m.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	syscall.Kill(info.PID, syscall.SIGUSR1) // the agent dies in the guest
	select {
	case err := <-inflight:
		if err == nil {
			t.Fatal("the call in flight succeeded")
		}
		t.Logf("the call in flight failed after %v: %v", time.Since(killed).Round(time.Millisecond), err)
	case <-time.After(3 * time.Second):
		t.Fatal("the call in flight still waits 3 s after the agent died")
	}
	select {
	case <-c.Done():
	case <-time.After(time.Second):
		t.Fatal("the session outlived the agent")
	}
	again, h2, err := agentclient.DialReady(ctx, m.AgentEndpoint(), agentclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if bytes.Equal(h.Session, h2.Session) {
		t.Error("the new connection answers in the old session")
	}
	if _, err := again.Health(ctx); err != nil {
		t.Errorf("the restarted agent: %v", err)
	}
}
