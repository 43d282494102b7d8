package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/harebox/harebox/sandbox"
)

func TestURLs(t *testing.T) { forEachStore(t, testURLs) }

func testURLs(t *testing.T, s *DB, _ func() *DB) {
	ctx := context.Background()
	u := &URL{URL: sandbox.URL{ID: sandbox.NewURLID(), SandboxID: "sbx_a", Port: 8080, Auth: "token", CreatedAt: time.Now()}, TokenHash: "ab"}
	if err := s.PutURL(ctx, u); err != nil {
		t.Fatal(err)
	}
	dup := *u
	dup.ID = sandbox.NewURLID()
	if err := s.PutURL(ctx, &dup); !errors.Is(err, ErrConflict) {
		t.Errorf("second URL for the port: %v, want ErrConflict", err)
	}
	u.TokenHash = "cd" // a rotation replaces the record
	if err := s.PutURL(ctx, u); err != nil {
		t.Fatal(err)
	}
	other := &URL{URL: sandbox.URL{ID: sandbox.NewURLID(), SandboxID: "sbx_b", Port: 8080, CreatedAt: time.Now()}, TokenHash: "ef"}
	if err := s.PutURL(ctx, other); err != nil {
		t.Fatal(err)
	}
	if l, err := s.ListURLs(ctx, "sbx_a"); err != nil || len(l) != 1 || l[0].TokenHash != "cd" {
		t.Errorf("ListURLs(sbx_a) = %v, %v", l, err)
	}
	if l, _ := s.ListURLs(ctx, ""); len(l) != 2 {
		t.Errorf("ListURLs() = %d records", len(l))
	}
	if err := s.DeleteURL(ctx, u.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteURL(ctx, u.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
	if _, err := s.GetURL(ctx, u.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("get deleted: %v", err)
	}
}
