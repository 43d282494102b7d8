package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"
)

// CandidateBudgets reads what may cover a sandbox through the indexed
// columns: the account's budgets, its project's, fleet's and keys', and the
// label budgets one of its labels indexes; never another account's.
func TestCandidateBudgets(t *testing.T) { forEachStore(t, testCandidateBudgets) }

func testCandidateBudgets(t *testing.T, s *DB, _ func() *DB) {
	ctx := context.Background()
	now := time.Now().UTC()
	put := func(id, account, kind, ref string, labels map[string]string) {
		t.Helper()
		if err := s.PutBudget(ctx, &Budget{ID: id, AccountID: account, Scope: BudgetScope{Kind: kind, Ref: ref, Labels: labels}, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	put("acct", "a", "account", "", nil)
	put("other-acct", "b", "account", "", nil)
	put("proj", "a", "project", "p1", nil)
	put("proj2", "a", "project", "p2", nil)
	put("fleet", "a", "fleet", "f1", nil)
	put("key", "a", "key", "k1", nil)
	put("parent-key", "a", "key", "k0", nil)
	put("red", "a", "label", "", map[string]string{"team": "red"})
	put("red-web", "a", "label", "", map[string]string{"tier": "web", "team": "red"})
	put("blue", "a", "label", "", map[string]string{"team": "blue"})
	ids := func(bs []*Budget) []string {
		var out []string
		for _, b := range bs {
			out = append(out, b.ID)
		}
		sort.Strings(out)
		return out
	}
	got, err := s.CandidateBudgets(ctx, "a", "p1", "f1", []string{"k1", "k0"}, map[string]string{"team": "red", "tier": "web"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"acct", "fleet", "key", "parent-key", "proj", "red", "red-web"}
	if g := ids(got); fmt.Sprint(g) != fmt.Sprint(want) {
		t.Fatalf("candidates: %v, want %v", g, want)
	}
	got, _ = s.CandidateBudgets(ctx, "a", "p2", "", nil, nil)
	if g := ids(got); len(g) != 2 || g[0] != "acct" || g[1] != "proj2" {
		t.Fatalf("candidates without fleet, keys or labels: %v", g)
	}
	// Reservations and usage round-trip.
	if err := s.PutReservation(ctx, &Reservation{SandboxID: "sbx", Amount: 5, Budgets: []string{"acct"}, From: now}); err != nil {
		t.Fatal(err)
	}
	if r, err := s.GetReservation(ctx, "sbx"); err != nil || r.Amount != 5 || !r.From.Equal(now) {
		t.Fatalf("reservation: %+v %v", r, err)
	}
	s.DeleteReservation(ctx, "sbx")
	if _, err := s.GetReservation(ctx, "sbx"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted reservation: %v", err)
	}
	u := Usage{SandboxID: "sbx", AccountID: "a", Labels: map[string]string{"team": "red"}, Start: now.Add(-time.Minute), End: now, VCPUs: 2, Paused: true, Cost: 42}
	if err := s.AddUsage(ctx, u); err != nil {
		t.Fatal(err)
	}
	for f, n := range map[UsageFilter]int{{AccountID: "a"}: 1, {AccountID: "b"}: 0, {From: now}: 0, {To: now.Add(-time.Minute)}: 0, {From: now.Add(-time.Second)}: 1} {
		l, err := s.QueryUsage(ctx, f)
		if err != nil || len(l) != n {
			t.Errorf("QueryUsage(%+v): %d rows, want %d (%v)", f, len(l), n, err)
		}
	}
	l, _ := s.ListUsage(ctx, "sbx")
	if len(l) != 1 || l[0].Cost != 42 || !l[0].Paused || l[0].Labels["team"] != "red" || !l[0].End.Equal(now) {
		t.Fatalf("usage: %+v", l)
	}
}
