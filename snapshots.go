package harebox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// Snapshots and forks.
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

func snapshotScope(id string) string { return "snapshot/" + id }

func (e *Engine) snapshotsDir() string { return filepath.Join(e.opts.DataDir, "snapshots") }

func snapshotTarget(s *sandbox.Snapshot) authz.Target {
	return authz.Target{AccountID: s.AccountID, ProjectID: s.ProjectID, SandboxID: s.SandboxID, Labels: s.Labels}
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
	raw, err := e.sec.Get(ctx, snapshotScope(o.snap.ID), sandboxEnvName)
	if errors.Is(err, secrets.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if raw, err = open(o.key, sandboxEnvName, raw); err != nil {
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

// newIdentity gives a restored guest what must differ from its source's:
// fresh kernel entropy, a new machine-id and its own network. A woken
// sandbox (wake) is its own source: it gets only its network.
func (e *Engine) newIdentity(ctx context.Context, c *agentclient.Client, att *network.Attachment, wake bool) error {
	if wake {
		if att != nil && att.Cmdline != "" {
			return c.SetNetwork(ctx, att.Cmdline)
		}
		return nil
	}
	entropy := make([]byte, 64)
	id := make([]byte, 16)
	if _, err := rand.Read(entropy); err != nil {
		return err
	}
	if _, err := rand.Read(id); err != nil {
		return err
	}
	if err := c.Reseed(ctx, entropy, hex.EncodeToString(id), ""); err != nil {
		return err
	}
	if att != nil && att.Cmdline != "" {
		if err := c.SetNetwork(ctx, att.Cmdline); err != nil {
			return err
		}
	}
	return nil
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
		var v int
		if err := json.Unmarshal(r.Extra[envVersionKey], &v); err == nil {
			s.Source.Environment = r.EnvironmentID + "@" + strconv.Itoa(v)
		}
	}
	return s, nil
}

// sourceEnv is the source's own env, opened, or nil.
func (e *Engine) sourceEnv(ctx context.Context, b *box) ([]byte, error) {
	raw, err := e.sec.Get(ctx, sandboxScope(b.rec.ID), sandboxEnvName)
	if errors.Is(err, secrets.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return open(b.key, sandboxEnvName, raw)
}

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
	if _, err := e.settleSnapshot(ctx, s, true, false); err != nil {
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
	raw, err := e.sourceEnv(ctx, b)
	if err != nil {
		return err
	}
	if raw != nil {
		if raw, err = seal(key, sandboxEnvName, raw); err != nil {
			return err
		}
		if err := e.sec.Put(ctx, scope, sandboxEnvName, raw); err != nil {
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
	if err := e.sec.Delete(ctx, scope, sandboxEnvName); err != nil && !errors.Is(err, secrets.ErrNotFound) {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(s.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := e.store.DeleteSnapshot(ctx, s.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		errs = append(errs, err)
	}
	// Its storage is charged up to now, and its reservation ends.
	if _, err := e.settleSnapshot(ctx, s, false, true); err != nil {
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
	if err := mayCreate(authz.From(ctx)); err != nil {
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
	dir := filepath.Join(e.snapshotsDir(), sid)
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
		if key, err = snapshotKey(b); err != nil {
			return err
		}
		if s, err = e.takeSnapshot(context.WithoutCancel(ctx), b, sid, "", dir, key); err != nil {
			return err
		}
		srcEnv, err = e.sourceEnv(ctx, b)
		return err
	}()
	if err != nil {
		return nil, err
	}
	// The fork's snapshot is never stored, nor its key: the clones need
	// nothing of it once they run, and a crash leaves only its files
	// (removed at start), which no key opens any more.
	defer os.RemoveAll(dir)
	o := &origin{snap: s, key: key, done: func() {}}
	if srcEnv != nil {
		if err := json.Unmarshal(srcEnv, &o.env); err != nil {
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
		creq := sandbox.CreateRequest{
			Project: s.ProjectID, Fleet: s.Source.FleetID, Environment: s.Source.Environment,
			ThirdParty: s.Source.ThirdParty, NoEnv: s.Source.NoEnv, Firewall: s.Source.Policy,
			Monitoring: &s.Source.Monitoring, TTLSeconds: req.TTLSeconds, Labels: mergeLabels(s.Labels, req.Labels),
		}
		if creq.NoEnv {
			creq.Environment = ""
		}
		if authz.From(ctx).Operator {
			creq.AccountID = s.AccountID
		}
		if req.Name != "" {
			creq.Name = fmt.Sprintf("%s-%d", req.Name, i+1)
		}
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

func mergeLabels(a, b map[string]string) map[string]string {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := make(map[string]string, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
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
