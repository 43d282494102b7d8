package clone

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// sources lends one running sandbox, sbx_src; the failAt-th Create (from
// 1; 0 never) fails.
type sources struct {
	src     *store.Sandbox
	failAt  int
	mu      sync.Mutex
	creates int
	writes  []string // the directories written
	made    []string
	deleted []string
}

func (f *sources) Check(_ context.Context, _, id string) error {
	if id != f.src.ID {
		return sandbox.Errorf(sandbox.ErrNotFound, "", "no sandbox %q", id)
	}
	return nil
}

func (f *sources) Hold(_ context.Context, id string, fn func(*Source) error) error {
	return fn(&Source{Rec: f.src, Key: []byte("the source's data key........32b"), Policy: []byte(`{"default_outbound":"deny"}`),
		Write: func(_ context.Context, dir string, key []byte) error {
			f.mu.Lock()
			f.writes = append(f.writes, dir)
			f.mu.Unlock()
			if len(key) != secrets.DataKeySize {
				return errors.New("a snapshot written without its own key")
			}
			if err := os.Mkdir(dir, 0o700); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(dir, "memory"), []byte("memory"), 0o600)
		}})
}

func (f *sources) AccountOf(context.Context, string) string { return f.src.AccountID }

func (f *sources) Create(_ context.Context, req sandbox.CreateRequest, o *Origin) (*sandbox.Sandbox, error) {
	if o.Env["OWN"] != "source-env" || o.Snap == nil || o.Key == nil {
		return nil, errors.New("a clone restored without its source's env, snapshot or key")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.creates++; f.creates == f.failAt {
		return nil, sandbox.Errorf(sandbox.ErrCapacity, "", "host is full")
	}
	id := sandbox.NewID()
	f.made = append(f.made, id)
	return &sandbox.Sandbox{ID: id}, nil
}

func (f *sources) Delete(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, id)
	return nil
}

// TestTakeAndFork, over the real store and secret store: Take writes the
// held source's snapshot under a new key and keeps it; a source created
// with snapshots off is refused before anything is written; a fork's
// clones get the source's own env, and a fork with a failed clone deletes
// the clones it made; a fork's files never outlive it.
func TestTakeAndFork(t *testing.T) {
	ctx := context.Background()
	dir, db, sec := stores(t)
	src := &store.Sandbox{Sandbox: sandbox.Sandbox{ID: "sbx_src", AccountID: "acc_a", ProjectID: "prj_a", State: sandbox.StateRunning,
		Image: "default", Size: sandbox.Presets["small"], Snapshots: true}}
	f := &sources{src: src}
	au := &audits{}
	snaps := NewSnapshots(SnapshotOptions{Store: db, Secrets: sec, Meter: &meterCalls{}, Audit: au, Hosts: elsewhere{}, Sources: f,
		Capable: true, Envs: ownEnvs{"sbx_src": `{"OWN":"source-env"}`}, Dir: filepath.Join(dir, "snapshots"), Encrypt: true})

	sn, err := snaps.Take(ctx, "sbx_src", sandbox.SnapshotRequest{Name: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := snaps.Get(ctx, sn.ID); err != nil || got.Name != "base" || got.SandboxID != "sbx_src" {
		t.Fatalf("the snapshot taken: %+v, %v", got, err)
	}
	if _, err := snaps.Take(ctx, "sbx_src", sandbox.SnapshotRequest{Name: "base"}); !errors.Is(err, sandbox.ErrExists) {
		t.Errorf("a second snapshot named base: %v", err)
	}
	if _, err := snaps.Take(ctx, "sbx_other", sandbox.SnapshotRequest{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a sandbox the principal may not see: %v", err)
	}
	src.Snapshots = false
	if _, err := snaps.Fork(ctx, "sbx_src", sandbox.ForkRequest{}); !errors.Is(err, sandbox.ErrInvalid) || sandbox.FieldOf(err) != "snapshots" {
		t.Errorf("a fork of a sandbox created with snapshots off: %v", err)
	}
	if len(f.writes) != 1 {
		t.Fatalf("%d snapshots written, want only Take's", len(f.writes))
	}
	src.Snapshots = true

	clones, err := snaps.Fork(ctx, "sbx_src", sandbox.ForkRequest{Count: 3})
	if err != nil || len(clones) != 3 {
		t.Fatalf("fork of 3: %d clones, %v", len(clones), err)
	}
	f.creates, f.failAt, f.made = 0, 2, nil
	if _, err := snaps.Fork(ctx, "sbx_src", sandbox.ForkRequest{Count: 3}); !errors.Is(err, sandbox.ErrCapacity) {
		t.Fatalf("a fork whose clone 2 fails: %v, want its error", err)
	}
	if len(f.made) != 2 || len(f.deleted) != 2 {
		t.Fatalf("the failed fork made %d clones and deleted %d, want both 2 (all or none)", len(f.made), len(f.deleted))
	}
	for _, d := range f.writes[1:] {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a fork's snapshot directory %s outlived it: %v", d, err)
		}
	}
	if _, err := os.Stat(f.writes[0]); err != nil {
		t.Errorf("the kept snapshot's directory: %v", err)
	}
	au.mu.Lock()
	defer au.mu.Unlock()
	if len(au.entries) < 6 || au.entries[0] != "createSnapshot sbx_src" {
		t.Errorf("audit entries %q, want each call recorded", au.entries)
	}
}
