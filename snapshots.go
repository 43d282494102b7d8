package harebox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/guestenv"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// Snapshots (forks are in fork.go, restores in restore.go).
//
// A snapshot is the backend's files (memory, device state, a copy of the
// disk's own writes) under DataDir/snapshots/<id>, written under the
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

func snapshotScope(id string) string { return "snapshot/" + id }

func (e *Engine) snapshotsDir() string { return filepath.Join(e.opts.DataDir, "snapshots") }

func snapshotTarget(s *sandbox.Snapshot) authz.Target {
	return authz.Target{AccountID: s.AccountID, ProjectID: s.ProjectID, SandboxID: s.SandboxID, Labels: s.Labels}
}

// mayClone refuses a snapshot of a sandbox that must not have one.
func (e *Engine) mayClone(b *box) error {
	if !b.rec.Snapshots {
		return sandbox.Errorf(sandbox.ErrInvalid, "snapshots", "sandbox %s was created with snapshots off: it cannot be snapshotted or forked", b.rec.ID)
	}
	if !e.snapshots {
		return sandbox.Errorf(sandbox.ErrInvalid, "", "this hypervisor backend cannot snapshot sandboxes")
	}
	switch b.rec.State {
	case sandbox.StateRunning, sandbox.StatePaused:
		return nil
	}
	return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is %s: only a running or paused sandbox can be snapshotted", b.rec.ID, b.rec.State)
}

// takeSnapshot writes b's snapshot into dir under key (nil exactly when
// b has no data key) and returns its record (not stored). A running
// sandbox is paused only while the backend writes; the caller holds b.mu.
func (e *Engine) takeSnapshot(ctx context.Context, b *box, id, name, dir string, key []byte) (*store.Snapshot, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, err
	}
	wasRunning := b.rec.State == sandbox.StateRunning
	if wasRunning {
		// The source flushes its dirty pages once, so that no clone
		// starts by writing them all back (seconds of I/O under TCG,
		// measured in BenchmarkFork). Memory and disk are taken at the
		// same paused instant either way, so they agree.
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		if c, err := b.client(sctx, e); err == nil {
			c.Exec(sctx, agentclient.ExecRequest{Argv: []string{"sync"}, User: "root", Timeout: 10 * time.Second}, nil)
		}
		cancel()
	}
	err := b.m.Snapshot(ctx, dir, key)
	if wasRunning {
		if rerr := b.m.Resume(context.WithoutCancel(ctx)); rerr != nil && err == nil {
			err = rerr
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, hvErr(fmt.Errorf("snapshot: %w", err))
	}
	r := b.rec
	s := &store.Snapshot{
		Snapshot: sandbox.Snapshot{
			ID: id, Name: name, AccountID: r.AccountID, ProjectID: r.ProjectID, SandboxID: r.ID,
			Image: r.Image, Size: r.Size, Labels: r.Labels, Bytes: diskUse(dir), CreatedAt: time.Now().UTC(),
		},
		Dir: dir, ImageDir: r.ImageDir,
		Source: store.SnapshotSource{
			FleetID: r.FleetID, ThirdParty: r.ThirdParty, NoEnv: r.NoEnv, Monitoring: r.Monitoring,
			Policy: r.Extra[policyKey],
		},
	}
	if r.EnvironmentID != "" {
		if v, err := guestenv.Version(r); err == nil {
			s.Source.Environment = r.EnvironmentID + "@" + strconv.Itoa(v)
		}
	}
	return s, nil
}

// snapshotEnvName is the secret a snapshot keeps its source's own env
// under, in its own scope, sealed under its own key.
const snapshotEnvName = "env"

// snapshotKey is a new snapshot's own key: random, or nil for a source
// without a data key (crypto-erase off).
func snapshotKey(b *box) ([]byte, error) {
	if b.key == nil {
		return nil, nil
	}
	k := make([]byte, secrets.DataKeySize)
	_, err := rand.Read(k)
	return k, err
}

// Snapshot takes a snapshot of a running or paused sandbox; a running
// one is paused only while it is written.
func (e *Engine) Snapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (_ *sandbox.Snapshot, err error) {
	defer e.audited(ctx, "createSnapshot", id, &err)
	if err := e.check(ctx, "createSnapshot", id); err != nil {
		return nil, err
	}
	if err := sandbox.Validate(&req); err != nil {
		return nil, err
	}
	b, err := e.liveOrErr(ctx, id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := e.mayClone(b); err != nil {
		return nil, err
	}
	if req.Name != "" {
		all, err := e.store.ListSnapshots(ctx)
		if err != nil {
			return nil, err
		}
		for _, s := range all {
			if s.AccountID == b.rec.AccountID && s.Name == req.Name {
				return nil, sandbox.Errorf(sandbox.ErrExists, "name", "snapshot %s is already named %q", s.ID, req.Name)
			}
		}
	}
	sid := sandbox.NewSnapshotID()
	ctx = context.WithoutCancel(ctx) // a snapshot that started finishes
	key, err := snapshotKey(b)
	if err != nil {
		return nil, err
	}
	s, err := e.takeSnapshot(ctx, b, sid, req.Name, filepath.Join(e.snapshotsDir(), sid), key)
	if err != nil {
		return nil, err
	}
	s.KeyID, s.KeyAncestors = b.rec.KeyID, b.rec.KeyAncestors
	// Its storage is admitted against its source's budgets, as a create.
	if err := e.meter.Snapshot(ctx, s, true, false); err != nil {
		os.RemoveAll(s.Dir)
		return nil, err
	}
	if err := e.keepSnapshot(ctx, s, b, key); err != nil {
		e.dropSnapshot(ctx, s)
		return nil, err
	}
	e.log.Info("snapshot taken", "id", sid, "sandbox", id, "bytes", s.Bytes)
	return &s.Snapshot, nil
}

// keepSnapshot stores a snapshot's key, its source's env sealed under it
// and then its record.
func (e *Engine) keepSnapshot(ctx context.Context, s *store.Snapshot, b *box, key []byte) error {
	scope := snapshotScope(s.ID)
	if key != nil {
		if err := secrets.KeepDataKey(ctx, e.sec, scope, key); err != nil {
			return err
		}
	}
	raw, err := e.guests.OwnEnv(ctx, b.rec.ID, b.key)
	if err != nil {
		return err
	}
	if raw != nil {
		if raw, err = seal(key, snapshotEnvName, raw); err != nil {
			return err
		}
		if err := e.sec.Put(ctx, scope, snapshotEnvName, raw); err != nil {
			return err
		}
	}
	return e.store.PutSnapshot(ctx, s)
}

// dropSnapshot erases a snapshot's key, then its env, files and record.
func (e *Engine) dropSnapshot(ctx context.Context, s *store.Snapshot) error {
	scope := snapshotScope(s.ID)
	var errs []error
	if err := secrets.EraseDataKey(ctx, e.sec, scope); err != nil {
		errs = append(errs, err)
	}
	if err := e.sec.Delete(ctx, scope, snapshotEnvName); err != nil && !errors.Is(err, secrets.ErrNotFound) {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(s.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := e.store.DeleteSnapshot(ctx, s.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		errs = append(errs, err)
	}
	// Its storage is charged up to now, and its reservation ends.
	if err := e.meter.Snapshot(ctx, s, false, true); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// GetSnapshot returns a snapshot.
func (e *Engine) GetSnapshot(ctx context.Context, id string) (*sandbox.Snapshot, error) {
	if err := authz.Allowed(authz.From(ctx), "getSnapshot"); err != nil {
		return nil, err
	}
	s, err := e.snapshotRecord(ctx, id)
	if err != nil {
		return nil, err
	}
	return &s.Snapshot, nil
}

// ListSnapshots returns the snapshots the caller sees, oldest first; with
// sandboxID, only that sandbox's.
func (e *Engine) ListSnapshots(ctx context.Context, sandboxID string) ([]*sandbox.Snapshot, error) {
	p := authz.From(ctx)
	if err := authz.Allowed(p, "listSnapshots"); err != nil {
		return nil, err
	}
	all, err := e.store.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	out := []*sandbox.Snapshot{}
	for _, s := range all {
		if sandboxID != "" && s.SandboxID != sandboxID {
			continue
		}
		if p.Operator || authz.Visible(p, snapshotTarget(&s.Snapshot)) {
			out = append(out, &s.Snapshot)
		}
	}
	return out, nil
}

// DeleteSnapshot erases a snapshot's key and removes its files. Its
// clones are not touched (they need nothing of it); a create from it in
// flight makes the delete fail with ErrState.
func (e *Engine) DeleteSnapshot(ctx context.Context, id string) (err error) {
	p := authz.From(ctx)
	acc := ""
	defer func() { e.audit.Record(ctx, "deleteSnapshot", acc, id, err) }()
	if err := authz.Allowed(p, "deleteSnapshot"); err != nil {
		return err
	}
	s, err := e.snapshotRecord(ctx, id)
	if err != nil {
		return err
	}
	acc = s.AccountID
	if err := authz.Decide(p, "deleteSnapshot", snapshotTarget(&s.Snapshot)); err != nil {
		return err
	}
	if h, err := e.SnapshotElsewhere(ctx, id); err != nil || h != nil {
		if err != nil {
			return err
		}
		return elsewhereErr("snapshot "+id, h.Name)
	}
	e.mu.Lock()
	if e.snapUse[id] != 0 {
		e.mu.Unlock()
		return sandbox.Errorf(sandbox.ErrState, "", "snapshot %s is in use by a create; try again when it is done", id)
	}
	if e.snapUse == nil {
		e.snapUse = map[string]int{}
	}
	e.snapUse[id] = -1 // refuses new uses while it goes
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.snapUse, id)
		e.mu.Unlock()
	}()
	if err := e.dropSnapshot(context.WithoutCancel(ctx), s); err != nil {
		return err
	}
	e.log.Info("snapshot deleted", "id", id)
	return nil
}

// pruneSnapshotDirs removes snapshot directories without a record: a
// fork's, or a snapshot's whose store failed, left by a crash.
func (e *Engine) pruneSnapshotDirs(ctx context.Context) error {
	ents, err := os.ReadDir(e.snapshotsDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	all, err := e.store.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, s := range all {
		known[filepath.Base(s.Dir)] = true
	}
	for _, d := range ents {
		if !known[d.Name()] {
			e.log.Info("removing a snapshot directory without a record", "dir", d.Name())
			os.RemoveAll(filepath.Join(e.snapshotsDir(), d.Name()))
		}
	}
	return nil
}
