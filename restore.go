package harebox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// origin is what a sandbox is restored from.
type origin struct {
	snap *store.Snapshot
	key  []byte            // the snapshot's key (nil without crypto-erase)
	env  map[string]string // the source's own env
	done func()            // ends the snapshot's use
	// wake: the sandbox's own hibernation, not a clone: it keeps its
	// machine-id and gets only its new network.
	wake bool
	// golden: an engine's golden snapshot, of no account.
	golden bool
}

// useSnapshot marks a snapshot in use by a create, so that a delete
// waits its turn; it fails when the snapshot is being deleted.
func (e *Engine) useSnapshot(id string) (func(), error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.snapUse == nil {
		e.snapUse = map[string]int{}
	}
	if e.snapUse[id] < 0 {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "snapshot", "no snapshot %q", id)
	}
	e.snapUse[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			defer e.mu.Unlock()
			if e.snapUse[id]--; e.snapUse[id] == 0 {
				delete(e.snapUse, id)
			}
		})
	}, nil
}

// openSnapshot finds the snapshot a create names, checks that the caller
// sees it and fills the request's defaults from its source.
func (e *Engine) openSnapshot(ctx context.Context, req *sandbox.CreateRequest) (*origin, error) {
	if req.Image != "" || req.Size != (sandbox.Size{}) {
		field := "image"
		if req.Size != (sandbox.Size{}) {
			field = "size"
		}
		return nil, sandbox.Errorf(sandbox.ErrInvalid, field, "a sandbox made from a snapshot has the snapshot's image and size")
	}
	snap, err := e.snapshotRecord(ctx, req.Snapshot)
	if err != nil {
		var se *sandbox.Error
		if errors.As(err, &se) && se.Kind == sandbox.ErrNotFound {
			se.Field = "snapshot"
		}
		return nil, err
	}
	done, err := e.useSnapshot(snap.ID)
	if err != nil {
		return nil, err
	}
	o := &origin{snap: snap, done: done}
	if err := e.loadOrigin(ctx, o); err != nil {
		done()
		return nil, err
	}
	src := snap.Source
	if req.Project == "" {
		req.Project = snap.ProjectID
	}
	if req.AccountID == "" && authz.From(ctx).Operator {
		req.AccountID = snap.AccountID
	}
	if req.Fleet == "" {
		req.Fleet = src.FleetID
	}
	if req.Environment == "" && !req.NoEnv {
		req.Environment = src.Environment
	}
	req.ThirdParty = req.ThirdParty || src.ThirdParty
	req.NoEnv = req.NoEnv || src.NoEnv
	if req.Firewall == nil && src.Policy != nil {
		req.Firewall = src.Policy
	}
	if req.Monitoring == nil {
		req.Monitoring = &src.Monitoring
	}
	labels := map[string]string{}
	for k, v := range snap.Labels {
		labels[k] = v
	}
	for k, v := range req.Labels {
		labels[k] = v
	}
	if len(labels) > 0 {
		req.Labels = labels
	}
	return o, nil
}

// loadOrigin reads a snapshot's key and its source's own env.
func (e *Engine) loadOrigin(ctx context.Context, o *origin) error {
	k, err := secrets.DataKey(ctx, e.sec, snapshotScope(o.snap.ID))
	switch {
	case errors.Is(err, secrets.ErrNotFound):
		if e.encrypt {
			return sandbox.Errorf(sandbox.ErrInvalid, "snapshot", "snapshot %s has no key (it was not encrypted)", o.snap.ID)
		}
	case err != nil:
		return err
	default:
		o.key = k
	}
	raw, err := e.sec.Get(ctx, snapshotScope(o.snap.ID), snapshotEnvName)
	if errors.Is(err, secrets.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if raw, err = open(o.key, snapshotEnvName, raw); err != nil {
		return fmt.Errorf("snapshot %s: sealed env: %w", o.snap.ID, err)
	}
	return json.Unmarshal(raw, &o.env)
}

// snapshotRecord returns a snapshot the caller may see, or ErrNotFound.
func (e *Engine) snapshotRecord(ctx context.Context, id string) (*store.Snapshot, error) {
	if !sandbox.ValidSnapshotID(id) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no snapshot %q", id)
	}
	s, err := e.store.GetSnapshot(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no snapshot %q", id)
	}
	if err != nil {
		return nil, err
	}
	if p := authz.From(ctx); !p.Operator && !authz.Visible(p, snapshotTarget(&s.Snapshot)) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no snapshot %q", id)
	}
	return s, nil
}
