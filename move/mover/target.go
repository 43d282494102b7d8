package mover

import (
	"context"
	"os"
	"time"

	"github.com/harebox/harebox/move"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// The target's side of a move (Service as move.Target), and what
// finishes the moves a host's death cut short.

var _ move.Target = (*Service)(nil)

// Finish finishes the moves that a host's death cut short, on this host's
// hibernated and stopped sandboxes: at start (restart), one this host was
// sending is rolled back (resumed here as it was; the target drops what
// it got), one handed to this host is taken up at once, one this host was
// resuming after its move is resumed, and one this host handed to another
// before it died is taken up there (asked now, as it would have been);
// every interval after (Run), one handed to this host
// that its source did not ask this host to take up within Stale is taken
// up.
func (s *Service) Finish(ctx context.Context, restart bool) {
	if restart {
		// (After this host's own rollbacks, which are quick; each ask
		// waits for a resume on the other host.)
		defer func() { go s.handOn(ctx) }()
	}
	recs, err := s.o.Store.SandboxesOn(ctx, s.o.Hosts.Name(), sandbox.StateHibernated, sandbox.StateStopped)
	if err != nil {
		s.o.Log.Warn("moves: listing this host's hibernated sandboxes", "err", err)
		return
	}
	for _, rec := range recs {
		m := markOf(rec)
		if m == nil {
			continue
		}
		if _, live := s.o.Runtime.Live(rec.ID); live {
			continue
		}
		switch {
		case restart && m.Stage == stageSending:
			s.o.Log.Warn("rolling back a move this host died in", "id", rec.ID, "to", m.To)
			if s.o.Client != nil {
				if h, _, err := s.target(ctx, m.To); err == nil {
					s.o.Client.Drop(ctx, h, rec.ID)
				}
			}
			if err := s.o.Store.PutSandbox(ctx, withMark(rec, nil)); err != nil || !m.Resume {
				continue
			}
			if _, err := s.o.Runtime.Wake(ctx, rec); err != nil {
				s.o.Log.Warn("rolling back a move: the sandbox did not resume (it stays hibernated)", "id", rec.ID, "err", err)
			} else if m.Paused {
				s.o.Runtime.Pause(ctx, rec.ID)
			}
		case restart && m.Stage == stageWaking:
			s.o.Log.Warn("resuming a moved sandbox this host died resuming", "id", rec.ID, "from", m.From)
			s.o.Volumes.Arrived(ctx, rec)
			if _, err := s.wake(ctx, rec, m); err != nil {
				s.o.Log.Warn("a moved sandbox did not resume (it stays hibernated)", "id", rec.ID, "err", err)
			}
		case m.Stage == stageHanded && (restart || s.o.Now().Sub(m.At) >= s.o.Stale):
			s.o.Log.Warn("taking up a sandbox whose move's source did not", "id", rec.ID, "from", m.From)
			if _, err := s.Adopt(ctx, rec.ID, move.Adoption{Resume: m.Resume, Paused: m.Paused}); err != nil {
				s.o.Log.Warn("a moved sandbox did not resume (it stays hibernated)", "id", rec.ID, "err", err)
			}
		}
	}
}

// handOn asks the targets of the moves this host handed over, and died
// before it asked them, to take their sandboxes up.
func (s *Service) handOn(ctx context.Context) {
	if s.o.Client == nil {
		return
	}
	all, err := s.o.Store.ListSandboxes(ctx)
	if err != nil {
		s.o.Log.Warn("moves: listing the sandboxes", "err", err)
		return
	}
	for _, rec := range all {
		m := markOf(rec)
		if m == nil || m.Stage != stageHanded || m.From != s.o.Hosts.Name() || rec.Host != m.To || !kept(rec.State) {
			continue
		}
		h, _, err := s.target(ctx, m.To)
		if err != nil {
			continue // (it takes it up on its own when it can)
		}
		s.o.Log.Info("asking the target of a move this host died in to take it up", "id", rec.ID, "to", m.To)
		actx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		_, err = s.o.Client.Adopt(actx, h, rec.ID, move.Adoption{Resume: m.Resume, Paused: m.Paused})
		cancel()
		if err != nil {
			s.o.Log.Warn("a moved sandbox did not resume on its target (it stays hibernated there)", "id", rec.ID, "to", m.To, "err", err)
		}
	}
}

// Run runs Finish at start and then every Every, until ctx ends.
func (s *Service) Run(ctx context.Context) {
	s.Finish(ctx, true)
	t := time.NewTicker(s.o.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Finish(ctx, false)
		}
	}
}

// PruneVolumes removes, at start, the volumes' files that a move a death
// cut short left here (volume.Service.Prune, by the marks a move writes),
// but those of a volume whose sandbox the store says moves here (its
// source may yet hand it over, or just did).
func (s *Service) PruneVolumes(ctx context.Context) {
	// (A move to this host, at any stage: its source may have handed it
	// over since the volume's record was read.)
	coming := func(v *store.Volume) bool {
		for _, a := range v.Attachments {
			if rec, err := s.o.Store.GetSandbox(ctx, a.SandboxID); err != nil {
				return true // (unknown: kept)
			} else if m := markOf(rec); m != nil && m.To == s.o.Hosts.Name() {
				return true
			}
		}
		return false
	}
	if err := s.o.Volumes.Prune(ctx, coming); err != nil {
		s.o.Log.Warn("moves: the volumes' files a move left", "err", err)
	}
}

// FilesDir is where sandbox id's files go once received: its hibernation
// files, or a stopped one's machine directory.
func (s *Service) FilesDir(id string, stopped bool) string {
	if stopped {
		return s.machineDir(id)
	}
	return s.o.Files.Dir(id)
}

// IncomingDir is where sandbox id's files are written first.
func (s *Service) IncomingDir(id string) string { return s.o.Files.IncomingDir(id) }

// Check says whether this host can take sandbox id: the same image
// build, room for it, and the sandbox not here already.
func (s *Service) Check(ctx context.Context, id string, c move.Check) (move.Ready, error) {
	rec, err := s.o.Runtime.Record(ctx, id)
	if err != nil {
		return move.Ready{}, err
	}
	name := s.o.Hosts.Name()
	if !s.o.Hosts.Foreign(rec) {
		return move.Ready{}, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is on host %s already", id, name)
	}
	if sum, err := manifestSum(c.Image); err != nil || sum != c.Manifest {
		return move.Ready{}, sandbox.Errorf(sandbox.ErrState, "", "host %s does not have the image build %s the sandbox runs (the same build: copy its directory there)", name, c.Image)
	}
	if err := s.o.Runtime.Fits(c.Size); err != nil {
		return move.Ready{}, err
	}
	return move.Ready{StateDir: s.machineDir(id)}, nil
}

// Adopt takes up sandbox id, which the store says is this host's now, and
// resumes it if it ran (paused again if it was): as the store's mark
// says, whatever the caller asks (a.Resume and a.Paused are the same
// when the caller is the source).
func (s *Service) Adopt(ctx context.Context, id string, a move.Adoption) (*sandbox.Sandbox, error) {
	// Once begun it finishes, whether its caller (the source, over the
	// internal endpoint) waits or dies: the mark comes off before the
	// resume, so a resume cut short would leave the sandbox hibernated.
	ctx = context.WithoutCancel(ctx)
	rec, err := s.o.Runtime.Record(ctx, id)
	if err != nil {
		return nil, err
	}
	if s.o.Hosts.Foreign(rec) {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is on host %s", id, rec.Host)
	}
	// The mark handed to this host moves on once (to waking, or off for
	// a sandbox that stays kept), in a transaction that finds it there: of
	// two who would take the sandbox up (the source's ask and Finish), or
	// a delete meanwhile, one wins. How it resumes is what the mark says,
	// not the caller.
	var m *mark
	err = s.o.Store.Update(ctx, func(tx store.Tx) error {
		cur, err := tx.GetSandbox(ctx, id)
		if err != nil {
			return err
		}
		if m = markOf(cur); m == nil || m.Stage != stageHanded || m.To != s.o.Hosts.Name() || s.o.Hosts.Foreign(cur) || !kept(cur.State) {
			m = nil
			return nil
		}
		rec = withMark(cur, nil)
		if m.Resume { // (what Finish resumes if this host dies in the resume)
			w := *m
			w.Stage, w.At = stageWaking, s.o.Now().UTC()
			rec = withMark(cur, &w)
		}
		return tx.PutSandbox(ctx, rec)
	})
	if err != nil {
		return nil, err
	}
	if m == nil { // (taken up already, being resumed, or deleted)
		if sb, live := s.o.Runtime.Live(id); live {
			return sb, nil
		}
		cur, err := s.o.Runtime.Record(ctx, id)
		if err != nil {
			return nil, err
		}
		return &cur.Sandbox, nil
	}
	// From here it is this host's like any other: a resume that fails
	// leaves it hibernated here.
	s.o.Step("move-waking", id)
	s.o.Volumes.Arrived(ctx, rec)
	if !m.Resume {
		s.o.Runtime.TakeUp(ctx, rec)
		return &rec.Sandbox, nil
	}
	return s.wake(ctx, rec, m)
}

// wake resumes sandbox rec, taken up here (its mark says stageWaking), as
// it was before its move (m). One that does not resume stays hibernated
// here, unmarked, as any resume that fails leaves it.
func (s *Service) wake(ctx context.Context, rec *store.Sandbox, m *mark) (*sandbox.Sandbox, error) {
	sb, err := s.o.Runtime.Wake(ctx, rec)
	if err != nil {
		s.unmark(ctx, rec.ID, stageWaking)
		return nil, err
	}
	if !m.Paused {
		return sb, nil
	}
	return s.o.Runtime.Pause(ctx, rec.ID)
}

// unmark takes off sandbox id's mark if it is still at stage (a resume
// that failed before it wrote the record).
func (s *Service) unmark(ctx context.Context, id, stage string) {
	err := s.o.Store.Update(ctx, func(tx store.Tx) error {
		cur, err := tx.GetSandbox(ctx, id)
		if err != nil {
			return err
		}
		if m := markOf(cur); m == nil || m.Stage != stage || m.To != s.o.Hosts.Name() {
			return nil
		}
		return tx.PutSandbox(ctx, withMark(cur, nil))
	})
	if err != nil {
		s.o.Log.Warn("moves: taking off a move's mark", "id", id, "err", err)
	}
}

// Receiving says whether this host expects sandbox id's files: the store
// says its source is sending them here.
func (s *Service) Receiving(ctx context.Context, id string) error {
	rec, err := s.o.Runtime.Record(ctx, id)
	if err != nil {
		return err
	}
	if m := markOf(rec); m == nil || m.Stage != stageSending || m.To != s.o.Hosts.Name() || !s.o.Hosts.Foreign(rec) {
		return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is not being moved to host %s", id, s.o.Hosts.Name())
	}
	return nil
}

// VolumeIncoming is where the files of volume vol, which moves here with
// sandbox id, are written first: only while the store says id is on its
// way here, with vol.
func (s *Service) VolumeIncoming(ctx context.Context, id, vol string) (string, error) {
	if err := s.Receiving(ctx, id); err != nil {
		return "", err
	}
	rec, err := s.o.Runtime.Record(ctx, id)
	if err != nil {
		return "", err
	}
	return s.o.Volumes.Incoming(ctx, rec, vol)
}

// VolumeReceived puts volume vol's files, received whole into in, in
// place.
func (s *Service) VolumeReceived(vol, in string) error { return s.o.Volumes.Received(vol, in) }

// Drop removes what this host received of sandbox id (its volumes'
// files too), unless the store says it is this host's.
func (s *Service) Drop(ctx context.Context, id string) error {
	rec, err := s.o.Runtime.Record(ctx, id)
	if err == nil && !s.o.Hosts.Foreign(rec) {
		return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is this host's", id)
	}
	if err == nil {
		s.o.Volumes.Drop(ctx, rec)
	}
	os.RemoveAll(s.o.Files.IncomingDir(id))
	os.RemoveAll(s.machineDir(id)) // (a stopped one's)
	return s.o.Files.Remove(id)
}
