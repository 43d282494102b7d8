package catalog_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/images/catalog"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// build writes a build of name into dir as images.Build lays it out.
func build(t *testing.T, dir, name, hash string, built time.Time) string {
	t.Helper()
	d := filepath.Join(dir, name+"-"+hash)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{images.KernelFile, images.InitrdFile} {
		if err := os.WriteFile(filepath.Join(d, f), []byte("never booted\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.Marshal(images.Image{Name: name, Kernel: images.KernelFile, Initrd: images.InitrdFile, InputHash: hash, BuiltAt: built})
	if err := os.WriteFile(filepath.Join(d, images.ManifestFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

// audits keeps the actions the catalog records, and how they ended.
type audits []string

func (a *audits) Record(_ context.Context, action, _, target string, err error) {
	outcome := "ok"
	if err != nil {
		outcome = model.Code(err)
	}
	*a = append(*a, action+" "+target+" "+outcome)
}

type fixture struct {
	cat     *catalog.Catalog
	db      *store.DB
	dir     string
	audit   *audits
	goldens []string
	pooled  []string
	// dropped are the builds DropGoldens was asked for.
	dropped []string
}

func newFixture(t *testing.T, pool map[string]int) *fixture {
	t.Helper()
	db, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "harebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	f := &fixture{db: db, dir: t.TempDir(), audit: &audits{}}
	f.cat = catalog.New(catalog.Options{Dir: f.dir, Owner: t.TempDir(), Pool: func() map[string]int { return pool }, Store: db, Audit: f.audit,
		Images:      map[string]images.Image{"builtin": {Name: "minimal", Dir: "/nowhere/builtin"}},
		Held:        func() ([]string, []string) { return f.goldens, f.pooled },
		DropGoldens: func(dir string) { f.dropped = append(f.dropped, dir) }})
	return f
}

// TestLookupAndList: a name is its newest build; the built-in images come
// first and under their own names; each name is listed once.
func TestLookupAndList(t *testing.T) {
	f := newFixture(t, nil)
	now := time.Now()
	build(t, f.dir, "app", "aaaa", now.Add(-time.Hour))
	newest := build(t, f.dir, "app", "bbbb", now)
	build(t, f.dir, "tool", "cccc", now)
	if img, err := f.cat.Lookup("app"); err != nil || img.Dir != newest {
		t.Fatalf("app: %s, %v; want %s", img.Dir, err, newest)
	}
	if img, err := f.cat.Lookup("builtin"); err != nil || img.Dir != "/nowhere/builtin" {
		t.Fatalf("builtin: %+v, %v", img, err)
	}
	var e *sandbox.Error
	if _, err := f.cat.Lookup("nope"); !errors.As(err, &e) || e.Kind != sandbox.ErrInvalid || e.Field != "image" {
		t.Fatalf("an unknown image: %v", err)
	}
	l, err := f.cat.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, img := range l {
		names = append(names, img.Name)
	}
	if !reflect.DeepEqual(names, []string{"app", "builtin", "tool"}) {
		t.Fatalf("listed %v", names)
	}
	ctx := authz.WithPrincipal(context.Background(), authz.Principal{AccountID: "acc", KeyID: "k", Scope: authz.Scope{Actions: []string{"getSandbox"}}})
	if _, err := f.cat.List(ctx); !errors.Is(err, sandbox.ErrForbidden) {
		t.Fatalf("a key without listImages: %v", err)
	}
}

// TestDelete: an image is deleted only when no sandbox that is not
// deleted, no snapshot or warm pool uses it, by the operator, its golden
// snapshots first; every attempt is audited.
func TestDelete(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, map[string]int{"pooled:small": 1})
	now := time.Now()
	app := build(t, f.dir, "app", "aaaa", now)
	build(t, f.dir, "pooled", "bbbb", now)
	refused := func(name, want string) {
		t.Helper()
		if err := f.cat.Delete(ctx, name); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("delete %s: %v, want %q", name, err, want)
		}
		if _, err := os.Stat(app); err != nil {
			t.Fatalf("delete %s removed a build: %v", name, err)
		}
	}
	key := authz.WithPrincipal(ctx, authz.Principal{AccountID: "acc", KeyID: "k", Scope: authz.Scope{Actions: []string{"everything"}}})
	if err := f.cat.Delete(key, "app"); !errors.Is(err, sandbox.ErrForbidden) {
		t.Fatalf("a key's delete: %v", err)
	}
	refused("builtin", "built-in")
	refused("pooled", "warm pool")

	put := func(id string, st sandbox.State) {
		t.Helper()
		if err := f.db.PutSandbox(ctx, &store.Sandbox{Sandbox: sandbox.Sandbox{ID: id, Image: "app", State: st, CreatedAt: now}, ImageDir: app}); err != nil {
			t.Fatal(err)
		}
	}
	put("sbx_gone", sandbox.StateDeleted)
	put("sbx_live", sandbox.StateStopped)
	refused("app", "sbx_live")
	put("sbx_live", sandbox.StateDeleted)
	if err := f.db.PutSnapshot(ctx, &store.Snapshot{Snapshot: sandbox.Snapshot{ID: "snp_1", Image: "app", CreatedAt: now}, ImageDir: app}); err != nil {
		t.Fatal(err)
	}
	refused("app", "snp_1")
	if err := f.db.DeleteSnapshot(ctx, "snp_1"); err != nil {
		t.Fatal(err)
	}

	if err := f.cat.Delete(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(app); !os.IsNotExist(err) {
		t.Fatalf("the build is still there: %v", err)
	}
	if len(f.dropped) != 1 || f.dropped[0] != app {
		t.Fatalf("golden snapshots dropped of %v, want only %s", f.dropped, app)
	}
	if err := f.cat.Delete(ctx, "app"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("delete again: %v", err)
	}
	if n := len(*f.audit); n != 7 || (*f.audit)[n-2] != "deleteImage app ok" {
		t.Fatalf("audited: %q", *f.audit)
	}
}

// TestInUse: the builds in use are the built-in images', those under
// sandboxes not deleted and snapshots, and those the engine holds.
func TestInUse(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, nil)
	now := time.Now()
	for id, st := range map[string]sandbox.State{"sbx_a": sandbox.StateRunning, "sbx_b": sandbox.StateDeleted} {
		if err := f.db.PutSandbox(ctx, &store.Sandbox{Sandbox: sandbox.Sandbox{ID: id, State: st, CreatedAt: now}, ImageDir: "/c/" + id}); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.db.PutSnapshot(ctx, &store.Snapshot{Snapshot: sandbox.Snapshot{ID: "snp_1", CreatedAt: now}, ImageDir: "/c/snap"}); err != nil {
		t.Fatal(err)
	}
	f.goldens, f.pooled = []string{"/c/golden", "/c/sbx_a"}, []string{"/c/pool"}
	got, err := f.cat.InUse(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"/c/golden", "/c/pool", "/c/sbx_a", "/c/snap", "/nowhere/builtin"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("in use: %v, want %v", got, want)
	}
}
