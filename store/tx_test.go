package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
)

// Update commits all of fn's writes or none; names are unique in their
// parent; live sandboxes are counted per account, project and fleet.
func TestUpdateAndTenancy(t *testing.T) {
	ctx := context.Background()
	s, err := OpenSQLite(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now().UTC()
	boom := errors.New("boom")
	err = s.Update(ctx, func(tx Tx) error {
		if err := tx.PutAccount(ctx, &Account{ID: "acc_1", Name: "a", CreatedAt: now}); err != nil {
			return err
		}
		if err := tx.PutProject(ctx, &Project{ID: "prj_1", AccountID: "acc_1", Name: "web", CreatedAt: now}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if _, err := s.GetAccount(ctx, "acc_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a rolled-back account exists: %v", err)
	}
	if _, err := s.GetProject(ctx, "prj_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a rolled-back project exists: %v", err)
	}
	err = s.Update(ctx, func(tx Tx) error {
		if err := tx.PutAccount(ctx, &Account{ID: "acc_1", Name: "a", CreatedAt: now}); err != nil {
			return err
		}
		return tx.PutProject(ctx, &Project{ID: "prj_1", AccountID: "acc_1", Name: "web", CreatedAt: now})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutAccount(ctx, &Account{ID: "acc_2", Name: "a", CreatedAt: now}); !errors.Is(err, ErrConflict) {
		t.Fatalf("a second account named a: %v", err)
	}
	if err := s.PutProject(ctx, &Project{ID: "prj_2", AccountID: "acc_1", Name: "web", CreatedAt: now}); !errors.Is(err, ErrConflict) {
		t.Fatalf("a second project named web: %v", err)
	}
	if p, err := s.ProjectByName(ctx, "acc_1", "web"); err != nil || p.ID != "prj_1" {
		t.Fatalf("project by name: %+v %v", p, err)
	}
	for i, st := range []sandbox.State{sandbox.StateRunning, sandbox.StatePaused, sandbox.StateDeleted} {
		sb := &Sandbox{Sandbox: sandbox.Sandbox{ID: sandbox.NewID(), State: st, AccountID: "acc_1", ProjectID: "prj_1", FleetID: map[bool]string{true: "flt_1"}[i == 0], CreatedAt: now}}
		if err := s.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		acc, prj, flt string
		want          int
	}{{"acc_1", "", "", 2}, {"acc_1", "prj_1", "", 2}, {"acc_1", "prj_1", "flt_1", 1}, {"acc_2", "", "", 0}} {
		if n, err := s.CountLive(ctx, c.acc, c.prj, c.flt); err != nil || n != c.want {
			t.Errorf("CountLive(%q, %q, %q) = %d %v, want %d", c.acc, c.prj, c.flt, n, err, c.want)
		}
	}
	// A key keeps its hash, which its JSON never shows.
	k := &Key{ID: "key_1", AccountID: "acc_1", Scope: authz.Scope{Actions: []string{"exec"}}, CreatedAt: now, Hash: []byte{1, 2, 3}}
	if err := s.PutKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetKey(ctx, "key_1")
	if err != nil || string(got.Hash) != "\x01\x02\x03" || got.Scope.Actions[0] != "exec" {
		t.Fatalf("key: %+v %v", got, err)
	}
	if l, err := s.ListKeys(ctx, "acc_2"); err != nil || len(l) != 0 {
		t.Fatalf("another account's keys: %v %v", l, err)
	}
}
