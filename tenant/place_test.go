package tenant

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// place runs Place in a transaction of a real store, as a create does.
func place(t *testing.T, s *Service, db store.Store, ctx context.Context, req sandbox.CreateRequest) (*store.Sandbox, error) {
	t.Helper()
	rec := &store.Sandbox{Sandbox: sandbox.Sandbox{ID: sandbox.NewID(), Labels: req.Labels}}
	err := db.Update(ctx, func(tx store.Tx) error {
		_, err := s.Place(ctx, tx, &req, rec)
		return err
	})
	return rec, err
}

func TestPlace(t *testing.T) {
	ctx := context.Background()
	db, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s := New(db)
	acc, err := s.EnsureDefault(ctx)
	if err != nil {
		t.Fatal(err)
	}
	web, err := s.CreateProject(ctx, acc.ID, CreateRequest{Name: "web"})
	if err != nil {
		t.Fatal(err)
	}
	ci, err := s.CreateFleet(ctx, acc.ID, web.ID, CreateRequest{Name: "ci"})
	if err != nil {
		t.Fatal(err)
	}

	rec, err := place(t, s, db, ctx, sandbox.CreateRequest{})
	if err != nil || rec.AccountID != acc.ID || rec.Project != DefaultName {
		t.Fatalf("the operator's create without a project: %+v, %v; want the default account's default project", rec, err)
	}
	rec, err = place(t, s, db, ctx, sandbox.CreateRequest{Project: "web", Fleet: "ci"})
	if err != nil || rec.ProjectID != web.ID || rec.FleetID != ci.ID || rec.Fleet != "ci" {
		t.Fatalf("project web, fleet ci: %+v, %v", rec, err)
	}
	for _, c := range []struct {
		req   sandbox.CreateRequest
		field string
	}{
		{sandbox.CreateRequest{Project: "nope"}, "project"},
		{sandbox.CreateRequest{Project: "web", Fleet: "nope"}, "fleet"},
		{sandbox.CreateRequest{AccountID: "nope"}, "account_id"},
	} {
		_, err := place(t, s, db, ctx, c.req)
		if !errors.Is(err, sandbox.ErrInvalid) || sandbox.FieldOf(err) != c.field {
			t.Errorf("%+v: %v, want invalid on %s", c.req, err, c.field)
		}
	}

	// A key's scope: its one project is the default, its labels are forced.
	key := authz.Principal{AccountID: acc.ID, Scope: authz.Scope{Projects: []string{web.ID}, Labels: map[string]string{"team": "red"}}}
	kctx := authz.WithPrincipal(ctx, key)
	rec, err = place(t, s, db, kctx, sandbox.CreateRequest{Labels: map[string]string{"job": "1"}})
	if err != nil || rec.ProjectID != web.ID || rec.Labels["team"] != "red" || rec.Labels["job"] != "1" {
		t.Fatalf("a scoped key's create: %+v, %v; want project web with team=red forced beside job=1", rec, err)
	}
	if _, err := place(t, s, db, kctx, sandbox.CreateRequest{Labels: map[string]string{"team": "blue"}}); !errors.Is(err, sandbox.ErrInvalid) || sandbox.FieldOf(err) != "labels[team]" {
		t.Fatalf("a label against the key's own: %v, want invalid on labels[team]", err)
	}
	if _, err := place(t, s, db, kctx, sandbox.CreateRequest{Project: DefaultName}); err == nil {
		t.Fatal("a key scoped to project web created in the default project")
	}
	some := authz.WithPrincipal(ctx, authz.Principal{AccountID: acc.ID, Scope: authz.Scope{Sandboxes: []string{rec.ID}}})
	if _, err := place(t, s, db, some, sandbox.CreateRequest{}); !errors.Is(err, sandbox.ErrForbidden) {
		t.Fatalf("a key limited to some sandboxes: %v, want forbidden", err)
	}
}
