package harebox

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/harebox/harebox/move"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// The target's side of a move (the engine as move.Target), and what
// finishes the moves a host's death cut short.

// finishMoves finishes the moves that a host's death cut short, on this
// host's hibernated and stopped sandboxes: at start (restart), one this host was
// sending is rolled back (resumed here as it was; the target drops what
// it got); at start and every interval after, one handed to this host
// that its source did not ask this host to take up within moveStale is
// taken up.
func (e *Engine) finishMoves(ctx context.Context, restart bool) {
	recs, err := e.store.SandboxesOn(ctx, e.hosts.Name(), sandbox.StateHibernated, sandbox.StateStopped)
	if err != nil {
		e.log.Warn("moves: listing this host's hibernated sandboxes", "err", err)
		return
	}
	for _, rec := range recs {
		m := moveMarkOf(rec)
		switch {
		case m == nil || e.boxes.get(rec.ID) != nil:
		case restart && m.Stage == stageSending:
			e.log.Warn("rolling back a move this host died in", "id", rec.ID, "to", m.To)
			if e.mover != nil {
				if h, err := e.moveTarget(ctx, m.To); err == nil {
					e.mover.Drop(ctx, h, rec.ID)
				}
			}
			if err := e.store.PutSandbox(ctx, withMark(rec, nil)); err != nil || !m.Resume {
				continue
			}
			if _, err := e.wake(ctx, rec); err != nil {
				e.log.Warn("rolling back a move: the sandbox did not resume (it stays hibernated)", "id", rec.ID, "err", err)
			} else if m.Paused {
				e.pause(ctx, rec.ID)
			}
		case m.Stage == stageHanded && e.opts.Now().Sub(m.At) >= moveStale:
			e.log.Warn("taking up a sandbox whose move's source did not", "id", rec.ID, "from", m.From)
			if _, err := (moveTarget{e}).Adopt(ctx, rec.ID, move.Adoption{Resume: m.Resume, Paused: m.Paused}); err != nil {
				e.log.Warn("a moved sandbox did not resume (it stays hibernated)", "id", rec.ID, "err", err)
			}
		}
	}
}

// runMoves runs finishMoves at start and then every interval.
func (e *Engine) runMoves(interval time.Duration) {
	defer e.wg.Done()
	e.finishMoves(e.ctx, true)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
			e.finishMoves(e.ctx, false)
		}
	}
}

// Moves serves this host's side of moves from other hosts (mount it on
// the internal endpoint only).
func (e *Engine) Moves() http.Handler { return move.NewReceiver(moveTarget{e}) }

// moveTarget is the engine as the host a sandbox moves to.
type moveTarget struct{ e *Engine }

func (t moveTarget) FilesDir(id string, stopped bool) string {
	if stopped {
		return filepath.Join(t.e.machinesDir(), id)
	}
	return t.e.hibernation.Dir(id)
}
func (t moveTarget) IncomingDir(id string) string { return t.e.hibernation.IncomingDir(id) }

// Check says whether this host can take sandbox id: the same image
// build, room for it, and the sandbox not here already.
func (t moveTarget) Check(ctx context.Context, id string, c move.Check) (move.Ready, error) {
	e := t.e
	rec, err := e.record(ctx, id)
	if err != nil {
		return move.Ready{}, err
	}
	if !e.hosts.Foreign(rec) {
		return move.Ready{}, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is on host %s already", id, e.hosts.Name())
	}
	if sum, err := manifestSum(c.Image); err != nil || sum != c.Manifest {
		return move.Ready{}, sandbox.Errorf(sandbox.ErrState, "", "host %s does not have the image build %s the sandbox runs (the same build: copy its directory there)", e.hosts.Name(), c.Image)
	}
	if err := e.capacity.Reserve(c.Size); err != nil {
		return move.Ready{}, err
	}
	e.capacity.Release(c.Size)
	return move.Ready{StateDir: filepath.Join(e.machinesDir(), id)}, nil
}

// Adopt takes up sandbox id, which the store says is this host's now, and
// resumes it if it ran (paused again if it was): as the store's mark
// says, whatever the caller asks (a.Resume and a.Paused are the same
// when the caller is the source).
func (t moveTarget) Adopt(ctx context.Context, id string, a move.Adoption) (*sandbox.Sandbox, error) {
	e := t.e
	rec, err := e.record(ctx, id)
	if err != nil {
		return nil, err
	}
	if e.hosts.Foreign(rec) {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is on host %s", id, rec.Host)
	}
	// The mark handed to this host is taken off once, in a transaction
	// that finds it there: of two who would take the sandbox up (the
	// source's ask and finishMoves), or a delete meanwhile, one wins.
	// How it resumes is what the mark says, not the caller.
	var m *moveMark
	err = e.store.Update(ctx, func(tx store.Tx) error {
		cur, err := tx.GetSandbox(ctx, id)
		if err != nil {
			return err
		}
		if m = moveMarkOf(cur); m == nil || m.Stage != stageHanded || m.To != e.hosts.Name() || e.hosts.Foreign(cur) || !kept(cur.State) {
			m = nil
			return nil
		}
		rec = withMark(cur, nil)
		return tx.PutSandbox(ctx, rec)
	})
	if err != nil {
		return nil, err
	}
	if m == nil { // (taken up already, or deleted)
		if b := e.boxes.get(id); b != nil {
			return b.view(), nil
		}
		cur, err := e.record(ctx, id)
		if err != nil {
			return nil, err
		}
		return &cur.Sandbox, nil
	}
	// From here it is this host's like any other: a resume that fails
	// leaves it hibernated here.
	if !m.Resume {
		if err := e.urls.Took(ctx, id); err != nil {
			e.log.Warn("move: loading the URLs of the sandbox taken up", "id", id, "err", err)
		}
		if err := e.meter.Keep(ctx, rec, rec.State); err != nil {
			e.log.Warn("move: metering the sandbox taken up", "id", id, "err", err)
		}
		e.boxes.drop(id, rec)
		return &rec.Sandbox, nil
	}
	sb, err := e.wake(ctx, rec)
	if err != nil || !m.Paused {
		return sb, err
	}
	return e.pause(ctx, id)
}

// Receiving says whether this host expects sandbox id's files: the store
// says its source is sending them here.
func (t moveTarget) Receiving(ctx context.Context, id string) error {
	e := t.e
	rec, err := e.record(ctx, id)
	if err != nil {
		return err
	}
	if m := moveMarkOf(rec); m == nil || m.Stage != stageSending || m.To != e.hosts.Name() || !e.hosts.Foreign(rec) {
		return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is not being moved to host %s", id, e.hosts.Name())
	}
	return nil
}

// Drop removes what this host received of sandbox id, unless the store
// says it is this host's.
func (t moveTarget) Drop(ctx context.Context, id string) error {
	e := t.e
	if rec, err := e.record(ctx, id); err == nil && !e.hosts.Foreign(rec) {
		return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is this host's", id)
	}
	os.RemoveAll(e.hibernation.IncomingDir(id))
	os.RemoveAll(filepath.Join(e.machinesDir(), id)) // (a stopped one's)
	return e.hibernation.Remove(id)
}
