package clone

import (
	"context"
	"crypto/rand"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
)

// Snapshots. Take and Fork (take.go) snapshot a sandbox the engine holds
// for them; Snapshots keeps it.
//
// A snapshot is the backend's files (memory, device state, a copy of the
// disk's own writes) under DATA_DIR/snapshots/<id>, written under the
// snapshot's own random key, kept in the secret store with the source's
// own env sealed under it: it lives on when its source is deleted (whose
// key opens none of it), and deleting it erases its key first. A
// sandbox made from a snapshot (create with Snapshot, or Fork) gets its
// own data key: its disk is re-made under it when it is restored (the
// backend copies the snapshot's writes into the clone's own overlay), so a
// clone needs nothing of its snapshot once it runs, and a snapshot can be
// deleted while its clones live. Every clone gets a new machine-id, fresh
// kernel entropy, its own network (address, MAC, firewall chain with the
// source's policy), its own placeholders and credentials CA.

// SnapshotStore is what Snapshots needs of the store.
type SnapshotStore interface {
	PutSnapshot(ctx context.Context, s *store.Snapshot) error
	GetSnapshot(ctx context.Context, id string) (*store.Snapshot, error)
	ListSnapshots(ctx context.Context) ([]*store.Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error
}

// Meter charges a snapshot's storage (budget/meter): admit reserves it
// against its source's budgets, final charges it up to now and ends its
// reservation.
type Meter interface {
	Snapshot(ctx context.Context, s *store.Snapshot, admit, final bool) error
}

// Envs reads a sandbox's own env (guestenv), which its snapshot keeps.
type Envs interface {
	OwnEnv(ctx context.Context, sandboxID string, key []byte) ([]byte, error)
}

// Audit records a change (audit.Log).
type Audit interface {
	Record(ctx context.Context, action, accountID, target string, err error)
}

// Hosts is what Snapshots needs of the engine.
type Hosts interface {
	// SnapshotHere returns nil when snapshot id's files are on this host
	// (or it has no record), else the error to answer with: another host
	// has them.
	SnapshotHere(ctx context.Context, id string) error
}

// SnapshotOptions are Snapshots' parts.
type SnapshotOptions struct {
	Store   SnapshotStore
	Secrets secrets.Store
	Meter   Meter
	Envs    Envs
	Audit   Audit
	Hosts   Hosts
	Sources Sources
	// Capable: the hypervisor backend snapshots machines.
	Capable bool
	// Dir holds the snapshots' files (DATA_DIR/snapshots).
	Dir string
	// Encrypt: every snapshot has a key (crypto-erase is on).
	Encrypt bool
	Log     *slog.Logger
}

// Snapshots keeps the snapshots: their records, keys and sealed envs,
// their files, and the creates that restore from each.
type Snapshots struct {
	o  SnapshotOptions
	mu sync.Mutex
	// use counts the creates restoring from each snapshot; -1 marks one
	// being deleted.
	use map[string]int
}

// NewSnapshots returns the snapshots kept in o's store.
func NewSnapshots(o SnapshotOptions) *Snapshots {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Snapshots{o: o, use: map[string]int{}}
}

func scope(id string) string { return "snapshot/" + id }

// envName is the secret a snapshot keeps its source's own env under, in
// its own scope, sealed under its own key.
const envName = "env"

// Dir is where snapshot id's files go.
func (s *Snapshots) Dir(id string) string { return filepath.Join(s.o.Dir, id) }

func target(sn *sandbox.Snapshot) authz.Target {
	return authz.Target{AccountID: sn.AccountID, ProjectID: sn.ProjectID, SandboxID: sn.SandboxID, Labels: sn.Labels}
}

// NewKey is a new snapshot's own key: random, or nil for a source
// without a data key (keyed false: crypto-erase off).
func NewKey(keyed bool) ([]byte, error) {
	if !keyed {
		return nil, nil
	}
	k := make([]byte, secrets.DataKeySize)
	_, err := rand.Read(k)
	return k, err
}

// NameFree refuses a snapshot name the account already has.
func (s *Snapshots) NameFree(ctx context.Context, accountID, name string) error {
	if name == "" {
		return nil
	}
	all, err := s.o.Store.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	for _, sn := range all {
		if sn.AccountID == accountID && sn.Name == name {
			return sandbox.Errorf(sandbox.ErrExists, "name", "snapshot %s is already named %q", sn.ID, name)
		}
	}
	return nil
}

// Add keeps a snapshot the engine took into its files (sn.Dir): its
// storage is admitted against its source's budgets, as a create, then
// its key, its source's own env (read under sourceKey, the source's data
// key) sealed under it, and its record are stored. On failure nothing of
// it is left.
func (s *Snapshots) Add(ctx context.Context, sn *store.Snapshot, key, sourceKey []byte) error {
	if err := s.o.Meter.Snapshot(ctx, sn, true, false); err != nil {
		os.RemoveAll(sn.Dir)
		return err
	}
	if err := s.keep(ctx, sn, key, sourceKey); err != nil {
		s.Drop(ctx, sn)
		return err
	}
	return nil
}

// keep stores a snapshot's key, its source's env sealed under it and
// then its record.
func (s *Snapshots) keep(ctx context.Context, sn *store.Snapshot, key, sourceKey []byte) error {
	sc := scope(sn.ID)
	if key != nil {
		if err := secrets.KeepDataKey(ctx, s.o.Secrets, sc, key); err != nil {
			return err
		}
	}
	raw, err := s.o.Envs.OwnEnv(ctx, sn.SandboxID, sourceKey)
	if err != nil {
		return err
	}
	if raw != nil {
		if raw, err = sandboxkeys.Seal(key, envName, raw); err != nil {
			return err
		}
		if err := s.o.Secrets.Put(ctx, sc, envName, raw); err != nil {
			return err
		}
	}
	return s.o.Store.PutSnapshot(ctx, sn)
}

// Drop erases a snapshot's key, then its env, files and record.
func (s *Snapshots) Drop(ctx context.Context, sn *store.Snapshot) error {
	sc := scope(sn.ID)
	var errs []error
	if err := secrets.EraseDataKey(ctx, s.o.Secrets, sc); err != nil {
		errs = append(errs, err)
	}
	if err := s.o.Secrets.Delete(ctx, sc, envName); err != nil && !errors.Is(err, secrets.ErrNotFound) {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(sn.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := s.o.Store.DeleteSnapshot(ctx, sn.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		errs = append(errs, err)
	}
	// Its storage is charged up to now, and its reservation ends.
	if err := s.o.Meter.Snapshot(ctx, sn, false, true); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Get returns a snapshot, for the principal in ctx.
func (s *Snapshots) Get(ctx context.Context, id string) (*sandbox.Snapshot, error) {
	if err := authz.Allowed(authz.From(ctx), "getSnapshot"); err != nil {
		return nil, err
	}
	sn, err := s.record(ctx, id)
	if err != nil {
		return nil, err
	}
	return &sn.Snapshot, nil
}

// List returns the snapshots the principal in ctx sees, oldest first;
// with sandboxID, only that sandbox's.
func (s *Snapshots) List(ctx context.Context, sandboxID string) ([]*sandbox.Snapshot, error) {
	p := authz.From(ctx)
	if err := authz.Allowed(p, "listSnapshots"); err != nil {
		return nil, err
	}
	all, err := s.o.Store.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	out := []*sandbox.Snapshot{}
	for _, sn := range all {
		if sandboxID != "" && sn.SandboxID != sandboxID {
			continue
		}
		if p.Operator || authz.Visible(p, target(&sn.Snapshot)) {
			out = append(out, &sn.Snapshot)
		}
	}
	return out, nil
}

// Delete erases a snapshot's key and removes its files, for the
// principal in ctx (audited). Its clones are not touched (they need
// nothing of it); a create from it in flight makes the delete fail with
// ErrState.
func (s *Snapshots) Delete(ctx context.Context, id string) (err error) {
	p := authz.From(ctx)
	acc := ""
	defer func() { s.o.Audit.Record(ctx, "deleteSnapshot", acc, id, err) }()
	if err := authz.Allowed(p, "deleteSnapshot"); err != nil {
		return err
	}
	sn, err := s.record(ctx, id)
	if err != nil {
		return err
	}
	acc = sn.AccountID
	if err := authz.Decide(p, "deleteSnapshot", target(&sn.Snapshot)); err != nil {
		return err
	}
	if err := s.o.Hosts.SnapshotHere(ctx, id); err != nil {
		return err
	}
	s.mu.Lock()
	if s.use[id] != 0 {
		s.mu.Unlock()
		return sandbox.Errorf(sandbox.ErrState, "", "snapshot %s is in use by a create; try again when it is done", id)
	}
	s.use[id] = -1 // refuses new uses while it goes
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.use, id)
		s.mu.Unlock()
	}()
	if err := s.Drop(context.WithoutCancel(ctx), sn); err != nil {
		return err
	}
	s.o.Log.Info("snapshot deleted", "id", id)
	return nil
}

// Prune removes snapshot directories without a record: a fork's, or a
// snapshot's whose store failed, left by a crash.
func (s *Snapshots) Prune(ctx context.Context) error {
	ents, err := os.ReadDir(s.o.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	all, err := s.o.Store.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, sn := range all {
		known[filepath.Base(sn.Dir)] = true
	}
	for _, d := range ents {
		if !known[d.Name()] {
			s.o.Log.Info("removing a snapshot directory without a record", "dir", d.Name())
			os.RemoveAll(filepath.Join(s.o.Dir, d.Name()))
		}
	}
	return nil
}

// record returns a snapshot the principal in ctx may see, or ErrNotFound.
func (s *Snapshots) record(ctx context.Context, id string) (*store.Snapshot, error) {
	if !sandbox.ValidSnapshotID(id) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no snapshot %q", id)
	}
	sn, err := s.o.Store.GetSnapshot(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no snapshot %q", id)
	}
	if err != nil {
		return nil, err
	}
	if p := authz.From(ctx); !p.Operator && !authz.Visible(p, target(&sn.Snapshot)) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no snapshot %q", id)
	}
	return sn, nil
}
