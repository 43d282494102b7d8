package harebox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/clone"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Snapshots: the engine takes a snapshot of a sandbox (Snapshot, and
// Fork in fork.go); package clone keeps it (records, keys, sealed envs,
// files, the creates that use it) and answers the calls on snapshots.

// snapshotHosts implements clone.Hosts.
type snapshotHosts struct{ e *Engine }

func (h snapshotHosts) SnapshotHere(ctx context.Context, id string) error {
	host, err := h.e.SnapshotElsewhere(ctx, id)
	if err != nil || host == nil {
		return err
	}
	return elsewhereErr("snapshot "+id, host.Name)
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
	return clone.Record(b.rec, id, name, dir, b.rec.Extra[policyKey]), nil
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
	if err := e.snaps.NameFree(ctx, b.rec.AccountID, req.Name); err != nil {
		return nil, err
	}
	sid := sandbox.NewSnapshotID()
	ctx = context.WithoutCancel(ctx) // a snapshot that started finishes
	key, err := clone.NewKey(b.key != nil)
	if err != nil {
		return nil, err
	}
	s, err := e.takeSnapshot(ctx, b, sid, req.Name, e.snaps.Dir(sid), key)
	if err != nil {
		return nil, err
	}
	s.KeyID, s.KeyAncestors = b.rec.KeyID, b.rec.KeyAncestors
	if err := e.snaps.Add(ctx, s, key, b.key); err != nil {
		return nil, err
	}
	e.log.Info("snapshot taken", "id", sid, "sandbox", id, "bytes", s.Bytes)
	return &s.Snapshot, nil
}

// GetSnapshot returns a snapshot.
func (e *Engine) GetSnapshot(ctx context.Context, id string) (*sandbox.Snapshot, error) {
	return e.snaps.Get(ctx, id)
}

// ListSnapshots returns the snapshots the caller sees, oldest first; with
// sandboxID, only that sandbox's.
func (e *Engine) ListSnapshots(ctx context.Context, sandboxID string) ([]*sandbox.Snapshot, error) {
	return e.snaps.List(ctx, sandboxID)
}

// DeleteSnapshot erases a snapshot's key and removes its files (see
// clone.Snapshots.Delete).
func (e *Engine) DeleteSnapshot(ctx context.Context, id string) error {
	return e.snaps.Delete(ctx, id)
}
