package harebox

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/clone"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
)

// Fork makes req.Count new sandboxes from a running or paused sandbox: one
// snapshot (the source is paused only while it is written), then a clone
// restored from it for each. Either every clone is made or none is.
func (e *Engine) Fork(ctx context.Context, id string, req sandbox.ForkRequest) (out []*sandbox.Sandbox, err error) {
	defer e.audited(ctx, "forkSandbox", id, &err)
	if err := e.check(ctx, "forkSandbox", id); err != nil {
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
	b, err := e.liveOrErr(ctx, id)
	if err != nil {
		return nil, err
	}
	sid := sandbox.NewSnapshotID()
	dir := e.snaps.Dir(sid)
	var (
		s      *store.Snapshot
		key    []byte
		srcEnv []byte
	)
	err = func() error {
		b.mu.Lock()
		defer b.mu.Unlock()
		if err := e.mayClone(b); err != nil {
			return err
		}
		var err error
		if key, err = clone.NewKey(b.key != nil); err != nil {
			return err
		}
		if s, err = e.takeSnapshot(context.WithoutCancel(ctx), b, sid, "", dir, key); err != nil {
			return err
		}
		srcEnv, err = e.guests.OwnEnv(ctx, b.rec.ID, b.key)
		return err
	}()
	if err != nil {
		return nil, err
	}
	// The fork's snapshot is never stored, nor its key: the clones need
	// nothing of it once they run, and a crash leaves only its files
	// (removed at start), which no key opens any more.
	defer os.RemoveAll(dir)
	o := &clone.Origin{Snap: s, Key: key, Done: func() {}}
	if srcEnv != nil {
		if err := json.Unmarshal(srcEnv, &o.Env); err != nil {
			return nil, fmt.Errorf("sandbox %s: env: %w", id, err)
		}
	}
	type result struct {
		sb  *sandbox.Sandbox
		err error
	}
	results := make([]result, req.Count)
	var wg sync.WaitGroup
	sem := make(chan struct{}, forkParallel)
	for i := range req.Count {
		creq := clone.ForkRequest(s, req, i, authz.From(ctx).Operator)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			sb, err := e.create(ctx, creq, o) // (it records itself)
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
		// All or nothing: the clones that were made go again.
		for _, sb := range out {
			if derr := e.Delete(context.WithoutCancel(ctx), sb.ID); derr != nil {
				e.log.Warn("fork: delete of a clone after a failed sibling", "id", sb.ID, "err", derr)
			}
		}
		return nil, errs[0]
	}
	e.log.Info("sandbox forked", "id", id, "clones", len(out))
	return out, nil
}

// forkParallel bounds the clones of one fork restored at once.
const forkParallel = 4
