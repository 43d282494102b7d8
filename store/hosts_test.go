package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/sandbox"
)

func TestHosts(t *testing.T) { forEachStore(t, testHosts) }

func testHosts(t *testing.T, s *DB, reopen func() *DB) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	if _, err := s.GetHost(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("GetHost of none: %v", err)
	}
	a := &Host{Name: "a", Site: "local", Address: "https://127.0.0.1:9000", Capacity: sandbox.Resources{VCPUs: 8, MemoryMB: 8192, DiskGB: 100},
		Up: true, StartedAt: now, RenewedAt: now, LeaseUntil: now.Add(10 * time.Second)}
	b := *a
	b.Name, b.Up = "b", false
	for _, h := range []*Host{a, &b} {
		if err := s.PutHost(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	a.Used = sandbox.Resources{VCPUs: 2}
	if err := s.PutHost(ctx, a); err != nil { // (a renewal replaces the row)
		t.Fatal(err)
	}
	s = reopen()
	l, err := s.ListHosts(ctx)
	if err != nil || len(l) != 2 || l[0].Name != "a" || l[1].Name != "b" || l[0].Used.VCPUs != 2 || !l[0].LeaseUntil.Equal(a.LeaseUntil) || l[1].Up {
		t.Fatalf("ListHosts: %+v %v", l, err)
	}
	// Sandboxes by host and state.
	for i, r := range []struct {
		host  string
		state sandbox.State
	}{{"a", sandbox.StateRunning}, {"a", sandbox.StateDeleted}, {"b", sandbox.StateRunning}, {"a", sandbox.StatePaused}} {
		sb := &Sandbox{Sandbox: sandbox.Sandbox{ID: sandbox.NewID(), State: r.state, Host: r.host, CreatedAt: now.Add(time.Duration(i) * time.Second)}}
		if err := s.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	on, err := s.SandboxesOn(ctx, "a", sandbox.StateRunning, sandbox.StatePaused)
	if err != nil || len(on) != 2 || on[0].State != sandbox.StateRunning || on[1].State != sandbox.StatePaused || on[0].Host != "a" {
		t.Fatalf("SandboxesOn(a, running, paused): %+v %v", on, err)
	}
	if all, err := s.SandboxesOn(ctx, "a"); err != nil || len(all) != 3 {
		t.Fatalf("SandboxesOn(a): %d %v", len(all), err)
	}
	// A sandbox moves with its record.
	on[0].Host = "b"
	s.PutSandbox(ctx, on[0])
	if l, _ := s.SandboxesOn(ctx, "b"); len(l) != 2 {
		t.Fatalf("after a move: %d on b", len(l))
	}
}

// A notice reaches every listener once its transaction commits, never
// when it rolls back; on PostgreSQL also a listener of another store (a
// second host).
func TestNotify(t *testing.T) { forEachStore(t, testNotify) }

func testNotify(t *testing.T, s *DB, reopen func() *DB) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type got struct{ topic, payload string }
	listen := func(st *DB) chan got {
		c := make(chan got, 16)
		st.Listen(ctx, func(topic, payload string) { c <- got{topic, payload} })
		return c
	}
	mine := listen(s)
	others := []chan got{mine}
	if s.pg {
		others = append(others, listen(reopen()))
	}
	time.Sleep(200 * time.Millisecond) // (PostgreSQL's LISTEN is on its way)
	if err := s.Update(ctx, func(tx Tx) error {
		return tx.Notify(ctx, "key", "committed")
	}); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	s.Update(ctx, func(tx Tx) error {
		tx.Notify(ctx, "key", "never")
		return boom
	})
	if err := s.Notify(ctx, "key", "direct"); err != nil {
		t.Fatal(err)
	}
	for i, c := range others {
		for _, want := range []string{"committed", "direct"} {
			select {
			case g := <-c:
				if g.topic != "key" || g.payload != want {
					t.Fatalf("listener %d: %q %q, want key %q", i, g.topic, g.payload, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("listener %d: no notice %q", i, want)
			}
		}
	}
	if err := s.Notify(ctx, "a topic", "x"); err == nil {
		t.Fatal("a topic with a space was taken")
	}
	if err := s.Notify(ctx, "key", strings.Repeat("x", maxNotice)); err == nil {
		t.Fatal("an oversized notice was taken")
	}
	select {
	case g := <-mine:
		t.Fatalf("unexpected notice %+v", g)
	case <-time.After(100 * time.Millisecond):
	}
	if !s.pg {
		return
	}
	// A listener whose connection dies listens again on another, and says
	// that it may have missed changes.
	if _, err := s.db.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'LISTEN harebox' AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	for i, c := range others {
		select {
		case g := <-c:
			if g != (got{}) {
				t.Fatalf("listener %d after its connection died: %+v, want the missed-changes notice", i, g)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("listener %d: no missed-changes notice", i)
		}
	}
	if err := s.Notify(ctx, "key", "again"); err != nil {
		t.Fatal(err)
	}
	for i, c := range others {
		select {
		case g := <-c:
			if g.payload != "again" {
				t.Fatalf("listener %d: %+v", i, g)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("listener %d: nothing after listening again", i)
		}
	}
}
