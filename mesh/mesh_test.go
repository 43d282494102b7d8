package mesh_test

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"

	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/mesh"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

func open(t *testing.T) *store.DB {
	t.Helper()
	db, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// join creates sandbox id (named name) in proj as a create does: its
// record placed and joined in one transaction.
func join(t *testing.T, db *store.DB, s *mesh.Service, proj *model.Project, id, name string, req sandbox.CreateRequest) (*store.Sandbox, error) {
	t.Helper()
	rec := &store.Sandbox{Sandbox: sandbox.Sandbox{ID: id, Name: name, ProjectID: proj.ID, Project: proj.Name}}
	err := db.Update(context.Background(), func(tx store.Tx) error {
		if err := s.Join(context.Background(), tx, &req, proj, rec); err != nil {
			return err
		}
		return tx.PutSandbox(context.Background(), rec)
	})
	return rec, err
}

func TestJoinAndLookup(t *testing.T) {
	ctx := context.Background()
	db := open(t)
	s, err := mesh.New(mesh.Options{Store: db, Pool: netip.MustParsePrefix("10.240.0.0/20"), Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	a := &model.Project{ID: "prj_a", Name: "Alpha", Mesh: true}
	b := &model.Project{ID: "prj_b", Name: "beta", Mesh: true}
	off := &model.Project{ID: "prj_c", Name: "gamma"}

	web, err := join(t, db, s, a, "sbx_web", "Web", sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if web.MeshAddress != "10.240.0.1" || web.MeshName != "web.alpha.internal" {
		t.Errorf("first of project a: %s %s", web.MeshAddress, web.MeshName)
	}
	if m := mesh.Of(web); m == nil || m.Addr.String() != "10.240.0.1" || m.Project.String() != "10.240.0.0/22" {
		t.Errorf("its mesh: %+v", m)
	}
	// Unnamed: its ID, as a DNS label.
	db2, _ := join(t, db, s, a, "sbx_01abc", "", sandbox.CreateRequest{})
	if db2.MeshAddress != "10.240.0.2" || db2.MeshName != "sbx-01abc.alpha.internal" {
		t.Errorf("second: %s %s", db2.MeshAddress, db2.MeshName)
	}
	// Another project: the next range.
	bw, _ := join(t, db, s, b, "sbx_bw", "web", sandbox.CreateRequest{})
	if bw.MeshAddress != "10.240.4.1" {
		t.Errorf("project b's first: %s", bw.MeshAddress)
	}
	// Off by the request, or by the project; on by the request.
	no := false
	if r, _ := join(t, db, s, a, "sbx_no", "", sandbox.CreateRequest{Mesh: &no}); r.MeshAddress != "" || mesh.Of(r) != nil {
		t.Errorf("mesh: false: %s", r.MeshAddress)
	}
	if r, _ := join(t, db, s, off, "sbx_off", "", sandbox.CreateRequest{}); r.MeshAddress != "" {
		t.Errorf("a project without the mesh: %s", r.MeshAddress)
	}
	yes := true
	if r, _ := join(t, db, s, off, "sbx_on", "", sandbox.CreateRequest{Mesh: &yes}); r.MeshAddress == "" {
		t.Error("mesh: true in a project without it: no address")
	}
	// The pool (a /20) holds four projects' ranges: a fifth is refused.
	if _, err := join(t, db, s, &model.Project{ID: "prj_d", Name: "delta", Mesh: true}, "sbx_d", "", sandbox.CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := join(t, db, s, &model.Project{ID: "prj_e", Name: "epsilon", Mesh: true}, "sbx_e", "", sandbox.CreateRequest{}); !errors.Is(err, sandbox.ErrCapacity) {
		t.Errorf("a full pool: %v", err)
	}

	for _, c := range []struct {
		asker, name string
		want        string
	}{
		{"sbx_01abc", "web.alpha.internal", "10.240.0.1"},
		{"sbx_01abc", "WEB.Alpha.internal.", "10.240.0.1"},
		{"sbx_web", "sbx-01abc.alpha.internal", "10.240.0.2"},
		{"sbx_bw", "web.alpha.internal", ""}, // another project's
		{"sbx_bw", "web.beta.internal", "10.240.4.1"},
		{"sbx_no", "web.alpha.internal", ""}, // off the mesh
		{"sbx_web", "nobody.alpha.internal", ""},
		{"sbx_web", "web.alpha.example", ""},
		{"sbx_web", "x.web.alpha.internal", ""},
		{"sbx_gone", "web.alpha.internal", ""},
	} {
		got, ok := s.Lookup(ctx, c.asker, c.name)
		if (c.want == "") == ok || (ok && got.String() != c.want) {
			t.Errorf("Lookup(%s, %s) = %v %v, want %q", c.asker, c.name, got, ok, c.want)
		}
	}

	// Leaving frees the name at once, and the address for the next.
	if err := s.Leave(ctx, "sbx_web"); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Lookup(ctx, "sbx_01abc", "web.alpha.internal"); ok {
		t.Error("a left sandbox's name still resolves")
	}
	if r, _ := join(t, db, s, a, "sbx_next", "", sandbox.CreateRequest{}); r.MeshAddress != "10.240.0.1" {
		t.Errorf("after a leave: %s, want the freed 10.240.0.1", r.MeshAddress)
	}
}

func TestJoinRefused(t *testing.T) {
	db := open(t)
	s, err := mesh.New(mesh.Options{Store: db})
	if err != nil {
		t.Fatal(err)
	}
	_, err = join(t, db, s, &model.Project{ID: "prj_a", Name: "a", Mesh: true}, "sbx_a", "", sandbox.CreateRequest{})
	if !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("a server without the mesh: %v", err)
	}
	for _, p := range []string{"10.240.0.0/23", "fd00::/48", "10.240.0.1/16"} {
		if _, err := mesh.New(mesh.Options{Store: db, Pool: netip.MustParsePrefix(p)}); err == nil {
			t.Errorf("pool %s: accepted", p)
		}
	}
}

// stale is a transaction whose first reads see none of the addresses
// and ranges taken: what a create sees when another host's took them
// between its read and its write. Later reads see the store.
type stale struct {
	store.Tx
	read map[string]bool
}

func (s stale) MeshAddresses(ctx context.Context, p string) ([]*store.MeshAddress, error) {
	if !s.read["addresses"] {
		s.read["addresses"] = true
		return nil, nil
	}
	return s.Tx.MeshAddresses(ctx, p)
}

func (s stale) MeshRanges(ctx context.Context) (map[string]string, error) {
	if !s.read["ranges"] {
		s.read["ranges"] = true
		return map[string]string{}, nil
	}
	return s.Tx.MeshRanges(ctx)
}

// TestJoinRace: an address or range another host's create took between
// the read and the write is skipped, in the same transaction.
func TestJoinRace(t *testing.T) {
	ctx := context.Background()
	db := open(t)
	s, err := mesh.New(mesh.Options{Store: db, Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	a := &model.Project{ID: "prj_a", Name: "a", Mesh: true}
	b := &model.Project{ID: "prj_b", Name: "b", Mesh: true}
	if _, err := join(t, db, s, a, "sbx_1", "", sandbox.CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		proj *model.Project
		id   string
		want string
	}{{a, "sbx_2", "10.240.0.2"}, {b, "sbx_3", "10.240.4.1"}} {
		rec := &store.Sandbox{Sandbox: sandbox.Sandbox{ID: c.id, ProjectID: c.proj.ID, Project: c.proj.Name}}
		if err := db.Update(ctx, func(tx store.Tx) error {
			return s.Join(ctx, stale{tx, map[string]bool{}}, &sandbox.CreateRequest{}, c.proj, rec)
		}); err != nil || rec.MeshAddress != c.want {
			t.Errorf("%s: %s %v, want %s", c.id, rec.MeshAddress, err, c.want)
		}
	}
}

// TestRules: a sandbox's mesh rules resolved to its peers' addresses (by
// fleet and labels, itself and other projects left out), and the
// project's default.
func TestRules(t *testing.T) {
	ctx := context.Background()
	db := open(t)
	s, err := mesh.New(mesh.Options{Store: db, Pool: netip.MustParsePrefix("10.240.0.0/20"), Enabled: true})
	if err != nil {
		t.Fatal(err)
	}
	a := &model.Project{ID: "prj_a", Name: "alpha", Mesh: true}
	b := &model.Project{ID: "prj_b", Name: "beta", Mesh: true}
	for _, p := range []*model.Project{a, b} {
		if err := db.PutProject(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	boxes := map[string]*store.Sandbox{}
	for _, c := range []struct {
		id     string
		proj   *model.Project
		fleet  string
		labels map[string]string
	}{
		{"sbx_me", a, "", nil},
		{"sbx_db", a, "data", map[string]string{"tier": "db"}},
		{"sbx_cache", a, "data", map[string]string{"tier": "cache"}},
		{"sbx_web", a, "", map[string]string{"tier": "db"}},
		{"sbx_other", b, "data", map[string]string{"tier": "db"}},
	} {
		rec := &store.Sandbox{Sandbox: sandbox.Sandbox{ID: c.id, ProjectID: c.proj.ID, Project: c.proj.Name, Fleet: c.fleet, Labels: c.labels}}
		err := db.Update(ctx, func(tx store.Tx) error {
			if err := s.Join(ctx, tx, &sandbox.CreateRequest{}, c.proj, rec); err != nil {
				return err
			}
			return tx.PutSandbox(ctx, rec)
		})
		if err != nil {
			t.Fatal(err)
		}
		boxes[c.id] = rec
	}
	addr := func(id string) netip.Addr { return netip.MustParseAddr(boxes[id].MeshAddress) }
	p, err := firewall.Parse([]byte(`{"default_outbound":"allow","mesh":[
	  {"action":"allow","protocol":"tcp","ports":"5432","fleet":"data","labels":{"tier":"db"}},
	  {"action":"deny","labels":{"tier":"db"}},
	  {"action":"allow","fleet":"nobody"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	me := boxes["sbx_me"]
	m, err := s.Rules(ctx, me, mesh.Of(me), p)
	if err != nil {
		t.Fatal(err)
	}
	if m.Addr != addr("sbx_me") || m.Deny || len(m.Rules) != 3 {
		t.Fatalf("resolved: %+v", m)
	}
	if r := m.Rules[0]; !r.Allow || r.Protocol != firewall.TCP || r.Ports != "5432" || !slices.Equal(r.Peers, []netip.Addr{addr("sbx_db")}) {
		t.Errorf("rule 0: %+v", r)
	}
	if r := m.Rules[1]; r.Allow || r.Protocol != firewall.Any || !slices.Equal(r.Peers, []netip.Addr{addr("sbx_db"), addr("sbx_web")}) {
		t.Errorf("rule 1: %+v", r)
	}
	if r := m.Rules[2]; len(r.Peers) != 0 {
		t.Errorf("rule 2 (no such fleet): %+v", r)
	}
	if err := m.Validate(); err != nil {
		t.Errorf("resolved mesh does not validate: %v", err)
	}
	// The project's default, and no rules.
	a.MeshDefault = "deny"
	if err := db.PutProject(ctx, a); err != nil {
		t.Fatal(err)
	}
	if m, err := s.Rules(ctx, me, mesh.Of(me), firewall.Default()); err != nil || !m.Deny || len(m.Rules) != 0 {
		t.Errorf("with the project's default deny and no rules: %+v %v", m, err)
	}
	// A peer that left is gone from the rules.
	if err := s.Leave(ctx, "sbx_db"); err != nil {
		t.Fatal(err)
	}
	if m, err := s.Rules(ctx, me, mesh.Of(me), p); err != nil || len(m.Rules[0].Peers) != 0 || !slices.Equal(m.Rules[1].Peers, []netip.Addr{addr("sbx_web")}) {
		t.Errorf("after sbx_db left: %+v %v", m, err)
	}
}
