package harebox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/move"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Moving a sandbox to another host of the deployment: this host (the
// source) hibernates it, holding its box so that nothing else runs it
// here meanwhile; sends its hibernation files, sealed under its data key,
// to the target over the internal endpoint (package move); then makes it
// the target's in the store, in one write (the move's point of no
// return), and has the target resume it. Its ID, record, keys, URLs,
// environment, history and budgets are in the store the hosts share;
// only its files travel. A move that fails before that write leaves it
// here, resumed as it was; one that fails after leaves it hibernated on
// the target, which resumes it on the next resume.

// Move moves sandbox id to host to: the operator only. A running or
// paused sandbox resumes there as it was, its processes running on; a
// hibernated or stopped one stays so there (a stopped one's disk goes).
func (e *Engine) Move(ctx context.Context, id, to string) (_ *move.Result, err error) {
	defer e.audited(ctx, "moveSandbox", id, &err)
	if err := e.check(ctx, "moveSandbox", id); err != nil {
		return nil, err
	}
	if e.mover == nil {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "to", "this host cannot move sandboxes: it has no internal endpoint (several hosts, with --internal-listen)")
	}
	host, err := e.moveTarget(ctx, to)
	if err != nil {
		return nil, err
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	switch {
	case !movable(rec.State):
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is %s: a running, paused, hibernated or stopped sandbox moves", id, rec.State)
	case rec.State == sandbox.StateStopped && !rec.Kept:
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s stopped on its own: its disk is gone, nothing moves", id)
	case len(rec.Volumes) > 0:
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s has volumes, which live on this host: a sandbox with volumes does not move", id)
	}
	img, err := e.imageOf(rec)
	if err != nil {
		return nil, err
	}
	manifest, err := manifestSum(img.Dir)
	if err != nil {
		return nil, err
	}
	ck := move.Check{Image: img.Dir, Manifest: manifest}
	if resumes(rec.State) {
		ck.Size = rec.Size // (a kept one holds no capacity there)
	}
	ready, err := e.mover.Check(ctx, host, id, ck)
	if err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx) // a move that started finishes
	start := time.Now()
	b, from, err := e.holdForMove(ctx, id)
	if err != nil {
		return nil, err
	}
	stateDir := b.rec.StateDir // (this host's; the record names the target's next)
	mark := moveMark{From: e.hosts.Name(), To: to, Resume: resumes(from), Paused: from == sandbox.StatePaused, Stage: stageSending}
	if err := e.handOver(ctx, b, host, ready, mark); err != nil {
		if cur, rerr := e.readBack(ctx, id); rerr != nil || e.hosts.Foreign(cur) {
			// The write may have been made (its answer lost): the
			// sandbox stays hibernated, and whichever host the store
			// says has it finishes the move (finishMoves).
			e.boxes.forget(id)
			b.gone = sandbox.Errorf(sandbox.ErrUnavailable, "", "sandbox %s was being moved: ask again", id)
			b.mu.Unlock()
			return nil, fmt.Errorf("sandbox %s: its move to %s did not finish: %w", id, to, err)
		}
		e.log.Warn("move: the sandbox stays here", "id", id, "to", to, "err", err)
		e.mover.Drop(ctx, host, id)
		return nil, e.keepHere(ctx, b, from, err)
	}
	atStep("move-handed", id)
	// The target's now: nothing of it stays here.
	e.meter.Final(ctx, b.rec)
	e.urls.Left(id)
	e.boxes.forget(id)
	b.gone = sandbox.Errorf(sandbox.ErrUnavailable, "", "sandbox %s moved to host %s: ask again", id, to)
	b.mu.Unlock()
	if err := e.hibernation.Remove(id); err != nil {
		e.log.Warn("move: removing the hibernation files", "id", id, "err", err)
	}
	os.RemoveAll(stateDir)
	e.log.Info("sandbox moved", "id", id, "to", to)
	sb, err := e.mover.Adopt(ctx, host, id, move.Adoption{Resume: mark.Resume, Paused: mark.Paused})
	if err != nil {
		return nil, fmt.Errorf("sandbox %s moved to host %s, %s, but did not resume there (resume it): %w", id, to, b.rec.State, err)
	}
	return &move.Result{Sandbox: sb, From: e.hosts.Name(), To: to, PausedMS: time.Since(start).Milliseconds()}, nil
}

// readBack reads sandbox id's record, trying for up to 30 s: after a
// store write whose answer was lost, what the store says decides where
// the sandbox is.
func (e *Engine) readBack(ctx context.Context, id string) (*store.Sandbox, error) {
	bo := backoff.NewExponentialBackOff()
	bo.MaxElapsedTime = 30 * time.Second
	return backoff.RetryWithData(func() (*store.Sandbox, error) { return e.store.GetSandbox(ctx, id) }, backoff.WithContext(bo, ctx))
}

// moveTarget is host name's address, if it is another host that is up.
func (e *Engine) moveTarget(ctx context.Context, name string) (move.Host, error) {
	if name == e.hosts.Name() {
		return move.Host{}, sandbox.Errorf(sandbox.ErrInvalid, "to", "host %s is this one", name)
	}
	h, err := e.hosts.Get(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return move.Host{}, sandbox.Errorf(sandbox.ErrNotFound, "to", "no host %q", name)
	}
	if err != nil {
		return move.Host{}, err
	}
	if !h.Up || !e.opts.Now().Before(h.LeaseUntil) || h.Address == "" {
		return move.Host{}, sandbox.Errorf(sandbox.ErrUnavailable, "to", "host %s is down or has no internal endpoint", name)
	}
	return move.Host{Name: h.Name, Address: h.Address}, nil
}

// holdForMove hibernates sandbox id if it runs (or is paused), and holds
// its box, locked and registered, so that no other call runs it here
// until the move is done. It returns the state the sandbox was in.
func (e *Engine) holdForMove(ctx context.Context, id string) (*box, sandbox.State, error) {
	if b := e.boxes.get(id); b != nil {
		b.mu.Lock()
		from := b.rec.State
		if b.gone != nil || (from != sandbox.StateRunning && from != sandbox.StatePaused) {
			b.mu.Unlock()
			return nil, "", sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is busy (%s): try again", id, from)
		}
		if err := e.hibernate(ctx, b, true); err != nil {
			if b.rec.State == sandbox.StateHibernated { // (its VM gone: kept, not held)
				snap := *b.rec
				e.boxes.drop(id, &snap)
			}
			b.mu.Unlock()
			return nil, "", err
		}
		return b, from, nil
	}
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, "", err
	}
	b := &box{rec: rec, deleting: make(chan struct{})}
	b.mu.Lock()
	prev, ok := e.boxes.take(b)
	if !ok {
		b.mu.Unlock()
		return nil, "", sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is busy: try again", id)
	}
	// It may have been resumed or deleted since it was read.
	if cur, err := e.store.GetSandbox(ctx, id); err != nil || cur.State != rec.State || !cur.Kept || e.hosts.Foreign(cur) {
		e.boxes.drop(id, prev)
		b.mu.Unlock()
		return nil, "", sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is no longer %s here", id, rec.State)
	}
	return b, rec.State, nil
}

// handOver sends held sandbox b's files to host, then makes it the
// host's in the store.
func (e *Engine) handOver(ctx context.Context, b *box, host move.Host, ready move.Ready, mark moveMark) error {
	id := b.rec.ID
	// Its record says it is being sent: a host that dies from here on
	// rolls it back when it starts again.
	if err := e.store.PutSandbox(ctx, withMark(copyRecord(b.rec), &mark)); err != nil {
		return err
	}
	atStep("move-sending", id)
	dir, stopped := e.hibernation.Dir(id), b.rec.State == sandbox.StateStopped
	if stopped {
		dir = b.rec.StateDir
	}
	if err := e.mover.Send(ctx, host, id, dir, stopped, notMoved); err != nil {
		return err
	}
	return e.store.Update(ctx, func(tx store.Tx) error {
		cur, err := tx.GetSandbox(ctx, id)
		if err != nil {
			return err
		}
		if cur.State != b.rec.State || e.hosts.Foreign(cur) {
			return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s changed during its move (%s on %s)", id, cur.State, cur.Host)
		}
		// Handed over: the target takes it up, when asked or, if this
		// host dies before it asks, on its own (finishMoves).
		mark.Stage, mark.At = stageHanded, e.opts.Now().UTC()
		cur.Host, cur.StateDir = host.Name, ready.StateDir
		return tx.PutSandbox(ctx, withMark(cur, &mark))
	})
}

// keepHere lets go of held box b after a move that failed before the
// sandbox was the target's, and resumes it as it was (from).
func (e *Engine) keepHere(ctx context.Context, b *box, from sandbox.State, cause error) error {
	id := b.rec.ID
	if err := e.store.PutSandbox(ctx, b.rec); err != nil { // (without the mark handOver wrote)
		e.log.Warn("move: clearing the sandbox's move", "id", id, "err", err)
	}
	snap := *b.rec
	e.boxes.drop(id, &snap)
	b.gone = sandbox.Errorf(sandbox.ErrState, "", "sandbox %s was being moved: try again", id)
	b.mu.Unlock()
	if !resumes(from) {
		return cause
	}
	if _, err := e.wake(ctx, &snap); err != nil {
		return fmt.Errorf("%w (and it did not resume here, where it stays hibernated: %v)", cause, err)
	}
	if from == sandbox.StatePaused {
		e.pause(ctx, id)
	}
	return cause
}

// movable says whether a sandbox in state moves, and resumes whether it
// runs (or is paused) there after.
func movable(st sandbox.State) bool { return resumes(st) || kept(st) }
func resumes(st sandbox.State) bool {
	return st == sandbox.StateRunning || st == sandbox.StatePaused
}
func kept(st sandbox.State) bool { return st == sandbox.StateHibernated || st == sandbox.StateStopped }

// notMoved names what of a stopped sandbox's machine directory stays:
// what belongs to its last VMM's process (its pid file), and its state
// record, which names paths of this host (the target's next launch
// writes its own). What a move carries of it is its disks (the backend's
// overlays, sealed under its data key) and its console log.
func notMoved(rel string) bool {
	return strings.HasSuffix(rel, ".pid") || rel == "state.json"
}

// moveMark is what a sandbox's record says of its move in flight (its
// extras, under moveKey): where from and to, how it was, and how far.
type moveMark struct {
	From   string    `json:"from"`
	To     string    `json:"to"`
	Resume bool      `json:"resume"`
	Paused bool      `json:"paused"`
	Stage  string    `json:"stage"`
	At     time.Time `json:"at,omitzero"`
}

const (
	moveKey = "move"
	// stageSending: hibernated on the source, its files on their way;
	// stageHanded: the target's, not yet taken up there.
	stageSending = "sending"
	stageHanded  = "handed"
)

// moveStale is how long a sandbox handed over waits for its source to ask
// the target to take it up before the target does it on its own.
var moveStale = 30 * time.Second

// moveEvery is how often finishMoves looks.
var moveEvery = 10 * time.Second

// withMark sets (or with nil, clears) rec's move mark, and returns rec.
func withMark(rec *store.Sandbox, m *moveMark) *store.Sandbox {
	if m == nil {
		delete(rec.Extra, moveKey)
		return rec
	}
	raw, _ := json.Marshal(m)
	if rec.Extra == nil {
		rec.Extra = map[string]json.RawMessage{}
	}
	rec.Extra[moveKey] = raw
	return rec
}

// copyRecord is a copy of rec whose extras can change.
func copyRecord(rec *store.Sandbox) *store.Sandbox {
	c := *rec
	c.Extra = maps.Clone(rec.Extra)
	return &c
}

func moveMarkOf(rec *store.Sandbox) *moveMark {
	var m moveMark
	if raw, ok := rec.Extra[moveKey]; !ok || json.Unmarshal(raw, &m) != nil {
		return nil
	}
	return &m
}

// manifestSum is the SHA-256 of an image build's manifest: two hosts
// have the same build when they have the same directory and this.
func manifestSum(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, images.ManifestFile))
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}
