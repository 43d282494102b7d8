package sandboxrt

import (
	"context"
	"os"
	"path/filepath"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/clone"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/sandbox"
)

// Snapshots and forks are package clone's (Snapshots: Take, Fork, and the
// calls on snapshots); the engine lends it its sandboxes, held under their
// locks, and writes a held sandbox's snapshot.

// snapshotSources implements clone.Sources and clone.Hosts.
type snapshotSources struct{ e *Runtime }

func (s snapshotSources) Check(ctx context.Context, action, id string) error {
	return s.e.check(ctx, action, id)
}

func (s snapshotSources) Hold(ctx context.Context, id string, fn func(*clone.Source) error) error {
	e := s.e
	b, err := e.liveOrErr(ctx, id)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gone != nil {
		return b.gone
	}
	return fn(&clone.Source{Rec: b.rec, Key: b.keys.Data, Policy: b.rec.Extra[firewall.RecordKey],
		Write: func(ctx context.Context, dir string, key []byte) error { return e.writeSnapshot(ctx, b, dir, key) }})
}

func (s snapshotSources) AccountOf(ctx context.Context, id string) string {
	return s.e.accountOf(ctx, id)
}

func (s snapshotSources) Create(ctx context.Context, req sandbox.CreateRequest, o *clone.Origin) (*sandbox.Sandbox, error) {
	return s.e.create(ctx, req, o)
}

func (s snapshotSources) Delete(ctx context.Context, id string) error { return s.e.Delete(ctx, id) }

func (s snapshotSources) SnapshotHere(ctx context.Context, id string) error {
	host, err := s.e.hosts.SnapshotElsewhere(ctx, id)
	if err != nil || host == nil {
		return err
	}
	return elsewhereErr("snapshot "+id, host.Name)
}

// writeSnapshot writes b's snapshot into dir under key (nil exactly when
// b has no data key). A running sandbox is paused only while the backend
// writes; the caller holds b.mu.
func (e *Runtime) writeSnapshot(ctx context.Context, b *box, dir string, key []byte) error {
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
	// Its volumes are not the snapshot's: they are detached while it is
	// written (a process with a file open on one loses it), recorded in
	// it, and attached again.
	detached := len(b.rec.Volumes) > 0
	if detached {
		if err := e.detachVolumes(ctx, b); err != nil {
			return err
		}
	}
	if wasRunning {
		markPaused(b.rec.StateDir)
	}
	err := b.m.Snapshot(ctx, dir, key)
	if wasRunning {
		if rerr := b.m.Resume(context.WithoutCancel(ctx)); rerr != nil && err == nil {
			err = rerr
		}
		unmarkPaused(b.rec.StateDir) // (held paused no longer: a later pause is its user's)
	}
	if detached {
		c, merr := b.client(context.WithoutCancel(ctx), e)
		if merr == nil {
			merr = e.volumes.Mount(context.WithoutCancel(ctx), b.rec, b.m, c)
		}
		if merr != nil && err == nil {
			err = merr
		}
	}
	if err != nil {
		return err
	}
	return nil
}

// pausedMark is a file in a machine's directory while the engine holds
// the machine paused for a snapshot or a hibernate of it running: an
// engine that dies meanwhile leaves the machine paused, and the next one
// resumes it (adopt), rather than leave paused a sandbox no one paused.
const pausedMark = "paused-for-snapshot"

func markPaused(dir string)   { os.WriteFile(filepath.Join(dir, pausedMark), nil, 0o600) }
func unmarkPaused(dir string) { os.Remove(filepath.Join(dir, pausedMark)) }

// detachVolumes detaches b's volumes from its running machine for a
// snapshot of it; a paused one cannot unmount them: it is refused.
func (e *Runtime) detachVolumes(ctx context.Context, b *box) error {
	if b.rec.State != sandbox.StateRunning {
		return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is %s and has volumes attached: its guest must unmount them for a snapshot; resume it first", b.rec.ID, b.rec.State)
	}
	c, err := b.client(ctx, e)
	if err != nil {
		return err
	}
	return e.volumes.Detach(ctx, b.rec, b.m, c)
}
