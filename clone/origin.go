package clone

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
)

// Origin is what a sandbox is restored from.
type Origin struct {
	Snap *store.Snapshot
	Key  []byte            // the snapshot's key (nil without crypto-erase)
	Env  map[string]string // the source's own env
	Done func()            // ends the snapshot's use
	// Wake: the sandbox's own hibernation, not a clone: it keeps its
	// machine-id and gets only its new network.
	Wake bool
	// Golden: a golden snapshot, of no account.
	Golden bool
	// SharedMemory: the restore shares the snapshot's memory with the
	// other restores of it (hypervisor.Spec.SharedMemory; golden only).
	SharedMemory bool
}

// Open finds the snapshot a create names, checks that the principal in
// ctx sees it, marks it in use until the Origin's Done (so that a delete
// waits its turn) and fills the request's defaults from its source.
func (s *Snapshots) Open(ctx context.Context, req *sandbox.CreateRequest) (*Origin, error) {
	if req.Image != "" || req.Size != (sandbox.Size{}) {
		field := "image"
		if req.Size != (sandbox.Size{}) {
			field = "size"
		}
		return nil, sandbox.Errorf(sandbox.ErrInvalid, field, "a sandbox made from a snapshot has the snapshot's image and size")
	}
	snap, err := s.record(ctx, req.Snapshot)
	if err != nil {
		var se *sandbox.Error
		if errors.As(err, &se) && se.Kind == sandbox.ErrNotFound {
			se.Field = "snapshot"
		}
		return nil, err
	}
	done, err := s.inUse(snap.ID)
	if err != nil {
		return nil, err
	}
	o := &Origin{Snap: snap, Done: done}
	if err := s.load(ctx, o); err != nil {
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
	if req.Volumes == nil {
		req.Volumes = src.Volumes
	}
	if req.Site == "" && req.Country == "" {
		req.Site, req.Country = src.Site.Name, src.Site.Country
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

// inUse marks a snapshot in use by a create, so that a delete waits its
// turn; it fails when the snapshot is being deleted.
func (s *Snapshots) inUse(id string) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.use[id] < 0 {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "snapshot", "no snapshot %q", id)
	}
	s.use[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.use[id]--; s.use[id] == 0 {
				delete(s.use, id)
			}
		})
	}, nil
}

// load reads a snapshot's key and its source's own env.
func (s *Snapshots) load(ctx context.Context, o *Origin) error {
	k, err := secrets.DataKey(ctx, s.o.Secrets, scope(o.Snap.ID))
	switch {
	case errors.Is(err, secrets.ErrNotFound):
		if s.o.Encrypt {
			return sandbox.Errorf(sandbox.ErrInvalid, "snapshot", "snapshot %s has no key (it was not encrypted)", o.Snap.ID)
		}
	case err != nil:
		return err
	default:
		o.Key = k
	}
	raw, err := s.o.Secrets.Get(ctx, scope(o.Snap.ID), envName)
	if errors.Is(err, secrets.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if raw, err = sandboxkeys.Open(o.Key, envName, raw); err != nil {
		return fmt.Errorf("snapshot %s: sealed env: %w", o.Snap.ID, err)
	}
	return json.Unmarshal(raw, &o.Env)
}
