package clone

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// meterCalls records what Snapshots charges.
type meterCalls struct {
	mu    sync.Mutex
	calls []string
}

func (m *meterCalls) Snapshot(_ context.Context, s *store.Snapshot, admit, final bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case admit:
		m.calls = append(m.calls, "admit "+s.ID)
	case final:
		m.calls = append(m.calls, "final "+s.ID)
	}
	return nil
}

// ownEnvs are the sources' own envs, read only under their data key.
type ownEnvs map[string]string

func (e ownEnvs) OwnEnv(_ context.Context, sandboxID string, key []byte) ([]byte, error) {
	if key == nil {
		return nil, errors.New("read without the source's key")
	}
	if v, ok := e[sandboxID]; ok {
		return []byte(v), nil
	}
	return nil, nil
}

type audits struct {
	mu      sync.Mutex
	entries []string
}

func (a *audits) Record(_ context.Context, action, _, target string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := action + " " + target
	if err != nil {
		s += ": " + err.Error()
	}
	a.entries = append(a.entries, s)
}

// elsewhere names the snapshots whose files another host has.
type elsewhere map[string]bool

func (e elsewhere) SnapshotHere(_ context.Context, id string) error {
	if e[id] {
		return sandbox.Errorf(sandbox.ErrUnavailable, "", "snapshot %s is on another host", id)
	}
	return nil
}

// stores are a real store and secret store in a new directory.
func stores(t *testing.T) (dir string, db *store.DB, sec *secrets.Sealed) {
	t.Helper()
	dir = t.TempDir()
	db, err := store.OpenSQLite(context.Background(), filepath.Join(dir, "harebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if sec, err = secrets.NewSealed(db, filepath.Join(dir, "master.key")); err != nil {
		t.Fatal(err)
	}
	return dir, db, sec
}

// TestSnapshots, over the real store and secret store: a snapshot added
// is charged, its key and its source's env sealed under it are kept, and
// a create that opens it gets both and its source's defaults; a principal
// sees only its account's; a delete waits for the creates that use it and
// for the host that has its files, then erases its key, env, files and
// record, and ends its charge; a name is the account's once; directories
// without a record are pruned.
func TestSnapshots(t *testing.T) {
	ctx := context.Background()
	dir, db, sec := stores(t)
	m, au, away := &meterCalls{}, &audits{}, elsewhere{}
	snaps := NewSnapshots(SnapshotOptions{Store: db, Secrets: sec, Meter: m, Audit: au, Hosts: away,
		Envs: ownEnvs{"sbx_src": `{"OWN":"source-env"}`}, Dir: filepath.Join(dir, "snapshots"), Encrypt: true})

	add := func(id, name string) (*store.Snapshot, []byte) {
		t.Helper()
		key, err := NewKey(true)
		if err != nil || len(key) != secrets.DataKeySize {
			t.Fatalf("key: %d bytes, %v", len(key), err)
		}
		if err := os.MkdirAll(snaps.Dir(id), 0o700); err != nil {
			t.Fatal(err)
		}
		s := &store.Snapshot{
			Snapshot: sandbox.Snapshot{ID: id, Name: name, AccountID: "acc_a", ProjectID: "prj_a", SandboxID: "sbx_src",
				Image: "default", Size: sandbox.Presets["small"], Labels: map[string]string{"team": "red"}, CreatedAt: time.Now().UTC()},
			Dir:    snaps.Dir(id),
			Source: store.SnapshotSource{FleetID: "flt_a", Monitoring: true},
		}
		if err := snaps.Add(ctx, s, key, []byte("the source's data key")); err != nil {
			t.Fatal(err)
		}
		return s, key
	}
	id := sandbox.NewSnapshotID()
	s, key := add(id, "base")
	if err := snaps.NameFree(ctx, "acc_a", "base"); !errors.Is(err, sandbox.ErrExists) {
		t.Errorf("a name the account has: %v", err)
	}
	if err := snaps.NameFree(ctx, "acc_b", "base"); err != nil {
		t.Errorf("a name another account has: %v", err)
	}
	if got, err := snaps.Get(ctx, id); err != nil || got.Name != "base" {
		t.Fatalf("get: %+v %v", got, err)
	}
	other := authz.WithPrincipal(ctx, authz.Principal{AccountID: "acc_b", KeyID: "key_b"})
	if _, err := snaps.Get(other, id); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("another account's snapshot: %v", err)
	}
	if l, err := snaps.List(other, ""); err != nil || len(l) != 0 {
		t.Errorf("another account lists %d: %v", len(l), err)
	}
	if l, err := snaps.List(ctx, "sbx_src"); err != nil || len(l) != 1 {
		t.Errorf("the source's snapshots: %d %v", len(l), err)
	}

	req := sandbox.CreateRequest{Snapshot: id, Labels: map[string]string{"run": "1"}}
	o, err := snaps.Open(ctx, &req)
	if err != nil {
		t.Fatal(err)
	}
	if string(o.Key) != string(key) || o.Env["OWN"] != "source-env" || o.Snap.ID != id {
		t.Errorf("opened: key %t, env %v", string(o.Key) == string(key), o.Env)
	}
	if req.Project != "prj_a" || req.Fleet != "flt_a" || req.Labels["team"] != "red" || req.Labels["run"] != "1" || req.Monitoring == nil || !*req.Monitoring {
		t.Errorf("the request's defaults: %+v", req)
	}
	if _, err := snaps.Open(ctx, &sandbox.CreateRequest{Snapshot: id, Image: "minimal"}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("an image with a snapshot: %v", err)
	}
	if err := snaps.Delete(ctx, id); !errors.Is(err, sandbox.ErrState) {
		t.Errorf("a delete while a create uses it: %v", err)
	}
	o.Done()
	o.Done() // (once)
	away[id] = true
	if err := snaps.Delete(ctx, id); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Errorf("a delete of a snapshot on another host: %v", err)
	}
	delete(away, id)
	if err := snaps.Delete(other, id); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("another account's delete: %v", err)
	}
	if err := snaps.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.DataKey(ctx, sec, scope(id)); !errors.Is(err, secrets.ErrNotFound) {
		t.Errorf("the key after the delete: %v", err)
	}
	if _, err := sec.Get(ctx, scope(id), envName); !errors.Is(err, secrets.ErrNotFound) {
		t.Errorf("the env after the delete: %v", err)
	}
	if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
		t.Errorf("the files after the delete: %v", err)
	}
	if _, err := snaps.Open(ctx, &sandbox.CreateRequest{Snapshot: id}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("open after the delete: %v", err)
	}
	if want := []string{"admit " + id, "final " + id}; len(m.calls) != 2 || m.calls[0] != want[0] || m.calls[1] != want[1] {
		t.Errorf("charged: %v", m.calls)
	}
	if n := len(au.entries); n != 4 || au.entries[n-1] != "deleteSnapshot "+id {
		t.Errorf("audited: %v", au.entries)
	}

	kept, _ := add(sandbox.NewSnapshotID(), "")
	stray := snaps.Dir(sandbox.NewSnapshotID())
	if err := os.MkdirAll(stray, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := snaps.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stray); !os.IsNotExist(err) {
		t.Errorf("a directory without a record after the prune: %v", err)
	}
	if _, err := os.Stat(kept.Dir); err != nil {
		t.Errorf("a snapshot's files after the prune: %v", err)
	}
}
