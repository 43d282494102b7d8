package clone

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
)

// Sources is how Take and Fork reach the engine's sandboxes.
type Sources interface {
	// Check authorizes action on sandbox id for the principal in ctx (a
	// sandbox it may not see is not found).
	Check(ctx context.Context, action, id string) error
	// Hold calls fn with sandbox id held (under its lock), live here.
	Hold(ctx context.Context, id string, fn func(*Source) error) error
	// AccountOf is sandbox id's account, for its audit entries.
	AccountOf(ctx context.Context, id string) string
	// Create makes a sandbox restored from o (it records itself).
	Create(ctx context.Context, req sandbox.CreateRequest, o *Origin) (*sandbox.Sandbox, error)
	Delete(ctx context.Context, id string) error
}

// Source is a sandbox held for its snapshot.
type Source struct {
	Rec    *store.Sandbox
	Key    []byte          // its data key (nil without crypto-erase)
	Policy json.RawMessage // its firewall policy, which clones get
	// Write writes its snapshot into dir under key: the guest's
	// filesystems synced first, a running VM paused only while it is
	// written.
	Write func(ctx context.Context, dir string, key []byte) error
}

// MayTake refuses a sandbox that cannot be snapshotted (nor hibernated).
func (s *Snapshots) MayTake(rec *store.Sandbox) error {
	if !rec.Snapshots {
		return sandbox.Errorf(sandbox.ErrInvalid, "snapshots", "sandbox %s was created with snapshots off: it cannot be snapshotted or forked", rec.ID)
	}
	if !s.o.Capable {
		return sandbox.Errorf(sandbox.ErrInvalid, "", "this hypervisor backend cannot snapshot sandboxes")
	}
	switch rec.State {
	case sandbox.StateRunning, sandbox.StatePaused:
		return nil
	}
	return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is %s: only a running or paused sandbox can be snapshotted", rec.ID, rec.State)
}

// write takes src's snapshot id into dir under key (a snapshot that
// started finishes, whatever ctx does).
func (s *Snapshots) write(ctx context.Context, src *Source, id, name, dir string, key []byte) (*store.Snapshot, error) {
	if err := s.MayTake(src.Rec); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, err
	}
	if err := src.Write(context.WithoutCancel(ctx), dir, key); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return Record(src.Rec, id, name, dir, src.Policy), nil
}

// Take snapshots a running or paused sandbox (paused only while it is
// written) and keeps the snapshot, for the principal in ctx.
func (s *Snapshots) Take(ctx context.Context, id string, req sandbox.SnapshotRequest) (_ *sandbox.Snapshot, err error) {
	defer func() { s.o.Audit.Record(ctx, "createSnapshot", s.o.Sources.AccountOf(ctx, id), id, err) }()
	if err := s.o.Sources.Check(ctx, "createSnapshot", id); err != nil {
		return nil, err
	}
	if err := sandbox.Validate(&req); err != nil {
		return nil, err
	}
	var sn *store.Snapshot
	err = s.o.Sources.Hold(ctx, id, func(src *Source) error {
		if err := s.NameFree(ctx, src.Rec.AccountID, req.Name); err != nil {
			return err
		}
		sid := sandbox.NewSnapshotID()
		key, err := NewKey(src.Key != nil)
		if err != nil {
			return err
		}
		ctx := context.WithoutCancel(ctx)
		if sn, err = s.write(ctx, src, sid, req.Name, s.Dir(sid), key); err != nil {
			return err
		}
		sn.KeyID, sn.KeyAncestors = src.Rec.KeyID, src.Rec.KeyAncestors
		return s.Add(ctx, sn, key, src.Key)
	})
	if err != nil {
		return nil, err
	}
	s.o.Log.Info("snapshot taken", "id", sn.ID, "sandbox", id, "bytes", sn.Bytes)
	return &sn.Snapshot, nil
}

// forkParallel bounds the clones of one fork restored at once.
const forkParallel = 4

// Fork makes req.Count new sandboxes from a running or paused sandbox: one
// snapshot (the source is paused only while it is written), then a clone
// restored from it for each. Either every clone is made or none is.
func (s *Snapshots) Fork(ctx context.Context, id string, req sandbox.ForkRequest) (out []*sandbox.Sandbox, err error) {
	defer func() { s.o.Audit.Record(ctx, "forkSandbox", s.o.Sources.AccountOf(ctx, id), id, err) }()
	if err := s.o.Sources.Check(ctx, "forkSandbox", id); err != nil {
		return nil, err
	}
	// The clones are creates: the caller must be allowed those too
	// (checked again, with their place, as each is admitted).
	if err := tenant.MayCreate(authz.From(ctx)); err != nil {
		return nil, err
	}
	if err := sandbox.Validate(&req); err != nil {
		return nil, err
	}
	if req.Count == 0 {
		req.Count = 1
	}
	sid := sandbox.NewSnapshotID()
	dir := s.Dir(sid)
	o := &Origin{Done: func() {}}
	err = s.o.Sources.Hold(ctx, id, func(src *Source) error {
		var err error
		if o.Key, err = NewKey(src.Key != nil); err != nil {
			return err
		}
		if o.Snap, err = s.write(ctx, src, sid, "", dir, o.Key); err != nil {
			return err
		}
		env, err := s.o.Envs.OwnEnv(ctx, src.Rec.ID, src.Key)
		if err != nil || env == nil {
			return err
		}
		if err := json.Unmarshal(env, &o.Env); err != nil {
			return fmt.Errorf("sandbox %s: env: %w", id, err)
		}
		return nil
	})
	// The fork's snapshot is never stored, nor its key: the clones need
	// nothing of it once they run, and a crash leaves only its files
	// (removed at start), which no key opens any more.
	if o.Snap != nil {
		defer os.RemoveAll(dir)
	}
	if err != nil {
		return nil, err
	}
	type result struct {
		sb  *sandbox.Sandbox
		err error
	}
	results := make([]result, req.Count)
	var wg sync.WaitGroup
	sem := make(chan struct{}, forkParallel)
	for i := range req.Count {
		creq := ForkRequest(o.Snap, req, i, authz.From(ctx).Operator)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			sb, err := s.o.Sources.Create(ctx, creq, o)
			results[i] = result{sb, err}
		}()
	}
	wg.Wait()
	var errs []error
	for _, r := range results {
		if r.err != nil {
			errs = append(errs, r.err)
		} else {
			out = append(out, r.sb)
		}
	}
	if len(errs) > 0 {
		for _, sb := range out {
			if derr := s.o.Sources.Delete(context.WithoutCancel(ctx), sb.ID); derr != nil {
				s.o.Log.Warn("fork: delete of a clone after a failed sibling", "id", sb.ID, "err", derr)
			}
		}
		return nil, errs[0]
	}
	s.o.Log.Info("sandbox forked", "id", id, "clones", len(out))
	return out, nil
}
