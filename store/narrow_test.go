package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// accounts is a domain's narrow view of a transaction.
type accounts interface {
	PutAccount(ctx context.Context, a *Account) error
	GetAccount(ctx context.Context, id string) (*Account, error)
}

// A narrowed store's transactions are the store's: what fn writes commits
// with it, or not at all when fn fails; the rest of the Store is there.
func TestNarrow(t *testing.T) {
	ctx := context.Background()
	s, err := OpenSQLite(ctx, filepath.Join(t.TempDir(), "n.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n := Narrow(s, func(tx Tx) accounts { return tx })
	now := time.Now().UTC()
	if err := n.Update(ctx, func(tx accounts) error {
		return tx.PutAccount(ctx, &Account{ID: "acc_kept", Name: "kept", CreatedAt: now})
	}); err != nil {
		t.Fatal(err)
	}
	failed := errors.New("on purpose")
	if err := n.Update(ctx, func(tx accounts) error {
		if err := tx.PutAccount(ctx, &Account{ID: "acc_gone", Name: "gone", CreatedAt: now}); err != nil {
			return err
		}
		return failed
	}); !errors.Is(err, failed) {
		t.Fatalf("a failed transaction: %v", err)
	}
	if a, err := n.GetAccount(ctx, "acc_kept"); err != nil || a.Name != "kept" {
		t.Fatalf("the committed account, read outside a transaction: %+v %v", a, err)
	}
	if _, err := n.GetAccount(ctx, "acc_gone"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the rolled-back account: %v", err)
	}
}
