// Package mover moves sandboxes between the hosts of a deployment: the
// source's side of a move, the target's, what finishes the moves a
// host's death cut short, and draining a host. The wire between the
// hosts is package move's; the sandbox runtime (package harebox) holds,
// wakes and lets go of the sandboxes for it (Runtime).
//
// A move: the source hibernates the sandbox, holding it so that nothing
// else runs it there meanwhile; sends its hibernation files, sealed under
// its data key, to the target; then makes it the target's in the store,
// in one write (the move's point of no return), and has the target resume
// it. Its ID, record, keys, URLs, environment, history and budgets are in
// the store the hosts share; only its files travel, and its volumes'
// (package volume: a volume moves with the sandbox that alone holds it,
// its record handed over in the same write). A move that fails
// before that write leaves it on the source, resumed as it was; one that
// fails after leaves it hibernated on the target, which resumes it on the
// next resume (or on its own: Service.Run).
package mover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/move"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Runtime is this host's sandbox runtime, as a move needs it.
type Runtime interface {
	// Record is sandbox id's stored record (a missing one, or a
	// malformed ID, is ErrNotFound).
	Record(ctx context.Context, id string) (*store.Sandbox, error)
	// Hold hibernates sandbox id if it runs (or is paused) and holds it,
	// registered and locked, so that nothing else runs it here until the
	// move lets go of it. It returns the state the sandbox was in.
	Hold(ctx context.Context, id string) (Held, sandbox.State, error)
	// Wake resumes a hibernated sandbox of this host; Pause pauses a
	// running one.
	Wake(ctx context.Context, rec *store.Sandbox) (*sandbox.Sandbox, error)
	Pause(ctx context.Context, id string) (*sandbox.Sandbox, error)
	// TakeUp makes a kept (hibernated or stopped) sandbox that came from
	// another host one of this host's: its URLs, its metering, its place
	// among the kept.
	TakeUp(ctx context.Context, rec *store.Sandbox)
	// Live is the sandbox as it is if it has a live box here.
	Live(id string) (*sandbox.Sandbox, bool)
	// ImageDir is the directory of the image build rec runs.
	ImageDir(rec *store.Sandbox) (string, error)
	// Fits says whether this host has room for size now.
	Fits(size sandbox.Resources) error
}

// Held is a sandbox a move holds (Runtime.Hold). Handed, Lost or Keep
// lets go of it, once.
type Held interface {
	// Record is its record as this host has it.
	Record() *store.Sandbox
	// Handed: it is host to's now, and nothing of it stays here.
	Handed(ctx context.Context, to string)
	// Lost: the host that has it is not known here (a store write whose
	// answer was lost); whichever the store says finishes the move.
	Lost()
	// Keep: it stays here, kept (hibernated or stopped) as its record
	// says; Keep returns that record.
	Keep() *store.Sandbox
}

// Store is what moves need of the store.
type Store interface {
	GetSandbox(ctx context.Context, id string) (*store.Sandbox, error)
	PutSandbox(ctx context.Context, rec *store.Sandbox) error
	ListSandboxes(ctx context.Context) ([]*store.Sandbox, error)
	SandboxesOn(ctx context.Context, host string, states ...sandbox.State) ([]*store.Sandbox, error)
	Update(ctx context.Context, fn func(tx store.Tx) error) error
}

// Hosts is the deployment's hosts (cluster.Registry).
type Hosts interface {
	Name() string
	Get(ctx context.Context, name string) (*cluster.Host, error)
	Foreign(rec *store.Sandbox) bool
	Place(ctx context.Context, size sandbox.Resources, where sandbox.Site) (*cluster.Host, error)
	SetDraining(ctx context.Context, on bool) error
}

// Files is where this host keeps hibernated sandboxes' files
// (clone.Hibernation).
type Files interface {
	Dir(id string) string
	IncomingDir(id string) string
	Remove(id string) error
}

// Volumes are this host's volumes (package volume): a volume moves with
// the sandbox that alone holds it.
type Volumes interface {
	// Moving returns the volumes of sandbox rec, which move with it (an
	// error if another sandbox holds one too).
	Moving(ctx context.Context, rec *store.Sandbox) ([]*store.Volume, error)
	// Dir is where their files are; Owns says whether a file there (by
	// name) is volume id's.
	Dir() string
	Owns(id, name string) bool
	// Hand makes vs host to's, in the move's transaction; Left lets go of
	// them here afterwards (their files; not their keys).
	Hand(ctx context.Context, tx store.Tx, rec *store.Sandbox, vs []*store.Volume, to string) error
	Left(vs []*store.Volume)
	// The target's side: Incoming is where volume id's files, which
	// move here with sandbox rec, are written first; Received puts them
	// in place; Arrived takes rec's volumes up once rec is this host's;
	// Drop removes what a move that did not finish brought of them.
	Incoming(ctx context.Context, rec *store.Sandbox, id string) (string, error)
	Received(id, in string) error
	Arrived(ctx context.Context, rec *store.Sandbox)
	Drop(ctx context.Context, rec *store.Sandbox)
	// Leaving marks volume id's files as on their way to host to;
	// Prune removes, at start, what moves left here (but what coming
	// says is on its way here).
	Leaving(id, to string) error
	Prune(ctx context.Context, coming func(v *store.Volume) bool) error
}

// Options configure a Service.
type Options struct {
	Store   Store
	Hosts   Hosts
	Runtime Runtime
	Files   Files
	Volumes Volumes
	// MachinesDir holds the sandboxes' machine directories (a stopped
	// one's files move from there).
	MachinesDir string
	// Client calls the other hosts; nil: this host has no internal
	// endpoint, and moves nothing away.
	Client *move.Client
	// Stale is how long a sandbox handed over waits for its source to ask
	// the target to take it up before the target does it on its own (0:
	// at once; the engine gives 30 s), and Every how often Run looks
	// (default 10 s).
	Stale, Every time.Duration
	Now          func() time.Time
	// Step, if set, is called at each step of a move with the sandbox's
	// ID (the crash tests stop an engine there).
	Step func(step, id string)
	Log  *slog.Logger
}

// Service moves this host's sandboxes to other hosts and takes up those
// moved here (as move.Target).
type Service struct {
	o Options
	// stopping: the host is shutting down (Stop).
	stopping atomic.Bool
}

// New returns a Service.
func New(o Options) *Service {
	if o.Every <= 0 {
		o.Every = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Step == nil {
		o.Step = func(string, string) {}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Service{o: o}
}

// Stop says that this host is shutting down: no move starts from here on
// (a drain's remaining sandboxes stay, saying so), and a move under way
// finishes, so that the server's shutdown waits for that one only.
func (s *Service) Stop() { s.stopping.Store(true) }

// Move moves sandbox id to host to. A running or paused sandbox resumes
// there as it was, its processes running on; a hibernated or stopped one
// stays so there (a stopped one's disk goes). The caller checks who may.
func (s *Service) Move(ctx context.Context, id, to string) (*move.Result, error) {
	if s.o.Client == nil {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "to", "this host cannot move sandboxes: it has no internal endpoint (several hosts, with --internal-listen)")
	}
	if s.stopping.Load() {
		return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "host %s is shutting down: it starts no move (drain it again once it is back)", s.o.Hosts.Name())
	}
	host, site, err := s.target(ctx, to)
	if err != nil {
		return nil, err
	}
	rec, err := s.o.Runtime.Record(ctx, id)
	if err != nil {
		return nil, err
	}
	switch asked := cluster.Asked(rec); {
	case !cluster.Within(site, asked):
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "to", "sandbox %s was created to run in %s: host %s is in %s", id, siteName(asked), to, siteName(site))
	case !movable(rec.State):
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is %s: a running, paused, hibernated or stopped sandbox moves", id, rec.State)
	case rec.State == sandbox.StateStopped && !rec.Kept:
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s stopped on its own: its disk is gone, nothing moves", id)
	}
	vols, err := s.o.Volumes.Moving(ctx, rec)
	if err != nil {
		return nil, err
	}
	img, err := s.o.Runtime.ImageDir(rec)
	if err != nil {
		return nil, err
	}
	manifest, err := manifestSum(img)
	if err != nil {
		return nil, err
	}
	ck := move.Check{Image: img, Manifest: manifest}
	if resumes(rec.State) {
		ck.Size = rec.Size // (a kept one holds no capacity there)
	}
	for _, v := range vols {
		ck.Size.DiskGB += v.SizeGB
	}
	ready, err := s.o.Client.Check(ctx, host, id, ck)
	if err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx) // a move that started finishes
	start := time.Now()
	held, from, err := s.o.Runtime.Hold(ctx, id)
	if err != nil {
		return nil, err
	}
	rec = held.Record()
	stateDir := rec.StateDir // (this host's; the record names the target's next)
	m := mark{From: s.o.Hosts.Name(), To: to, Resume: resumes(from), Paused: from == sandbox.StatePaused, Stage: stageSending}
	if err := s.handOver(ctx, rec, vols, host, site, ready, m); err != nil {
		if cur, rerr := s.readBack(ctx, id); rerr != nil || s.o.Hosts.Foreign(cur) {
			// The write may have been made (its answer lost): the
			// sandbox stays hibernated, and whichever host the store
			// says has it finishes the move (Finish).
			held.Lost()
			if cur != nil && cur.Host == to {
				s.o.Volumes.Left(vols) // (the target's: the write was made)
			}
			return nil, fmt.Errorf("sandbox %s: its move to %s did not finish: %w", id, to, err)
		}
		s.o.Log.Warn("move: the sandbox stays here", "id", id, "to", to, "err", err)
		s.o.Client.Drop(ctx, host, id)
		return nil, s.keepHere(ctx, held, from, err)
	}
	s.o.Step("move-handed", id)
	// The target's now: nothing of it stays here.
	state := rec.State
	held.Handed(ctx, to)
	s.o.Volumes.Left(vols)
	if err := s.o.Files.Remove(id); err != nil {
		s.o.Log.Warn("move: removing the hibernation files", "id", id, "err", err)
	}
	os.RemoveAll(stateDir)
	s.o.Log.Info("sandbox moved", "id", id, "to", to)
	sb, err := s.o.Client.Adopt(ctx, host, id, move.Adoption{Resume: m.Resume, Paused: m.Paused})
	if err != nil {
		return nil, fmt.Errorf("sandbox %s moved to host %s, %s, but did not resume there (resume it): %w", id, to, state, err)
	}
	return &move.Result{Sandbox: sb, From: s.o.Hosts.Name(), To: to, PausedMS: time.Since(start).Milliseconds()}, nil
}

// handOver sends held sandbox rec's files and its volumes' (vols) to host
// (of site), then makes them the host's in the store.
func (s *Service) handOver(ctx context.Context, rec *store.Sandbox, vols []*store.Volume, host move.Host, site sandbox.Site, ready move.Ready, m mark) error {
	id := rec.ID
	// Its record says it is being sent: a host that dies from here on
	// rolls it back when it starts again.
	if err := s.o.Store.PutSandbox(ctx, withMark(copyRecord(rec), &m)); err != nil {
		return err
	}
	s.o.Step("move-sending", id)
	dir, stopped := s.o.Files.Dir(id), rec.State == sandbox.StateStopped
	if stopped {
		dir = rec.StateDir
	}
	if err := s.o.Client.Send(ctx, host, id, dir, stopped, notMoved); err != nil {
		return err
	}
	for _, v := range vols {
		if err := s.o.Volumes.Leaving(v.ID, host.Name); err != nil {
			return err
		}
		if err := s.o.Client.SendVolume(ctx, host, id, v.ID, s.o.Volumes.Dir(), func(rel string) bool { return !s.o.Volumes.Owns(v.ID, rel) }); err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
	}
	s.o.Step("move-sent", id)
	return s.o.Store.Update(ctx, func(tx store.Tx) error {
		cur, err := tx.GetSandbox(ctx, id)
		if err != nil {
			return err
		}
		if cur.State != rec.State || s.o.Hosts.Foreign(cur) {
			return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s changed during its move (%s on %s)", id, cur.State, cur.Host)
		}
		// Handed over: the target takes it up, when asked or, if this
		// host dies before it asks, on its own (Finish).
		m.Stage, m.At = stageHanded, s.o.Now().UTC()
		cur.Host, cur.Site, cur.StateDir = host.Name, site, ready.StateDir
		if err := s.o.Volumes.Hand(ctx, tx, cur, vols, host.Name); err != nil {
			return err
		}
		return tx.PutSandbox(ctx, withMark(cur, &m))
	})
}

// keepHere lets go of held sandbox h after a move that failed before it
// was the target's, and resumes it as it was (from).
func (s *Service) keepHere(ctx context.Context, h Held, from sandbox.State, cause error) error {
	rec := h.Record()
	ClearMark(rec)                                         // (the hold's)
	if err := s.o.Store.PutSandbox(ctx, rec); err != nil { // (without the mark handOver wrote)
		s.o.Log.Warn("move: clearing the sandbox's move", "id", rec.ID, "err", err)
	}
	kept := h.Keep()
	if !resumes(from) {
		return cause
	}
	if _, err := s.o.Runtime.Wake(ctx, kept); err != nil {
		return fmt.Errorf("%w (and it did not resume here, where it stays hibernated: %v)", cause, err)
	}
	if from == sandbox.StatePaused {
		s.o.Runtime.Pause(ctx, kept.ID)
	}
	return cause
}

// readBack reads sandbox id's record, trying for up to 30 s: after a
// store write whose answer was lost, what the store says decides where
// the sandbox is.
func (s *Service) readBack(ctx context.Context, id string) (*store.Sandbox, error) {
	bo := backoff.NewExponentialBackOff()
	bo.MaxElapsedTime = 30 * time.Second
	return backoff.RetryWithData(func() (*store.Sandbox, error) { return s.o.Store.GetSandbox(ctx, id) }, backoff.WithContext(bo, ctx))
}

// target is host name's address and site, if it is another host that is
// up.
func (s *Service) target(ctx context.Context, name string) (move.Host, sandbox.Site, error) {
	if name == s.o.Hosts.Name() {
		return move.Host{}, sandbox.Site{}, sandbox.Errorf(sandbox.ErrInvalid, "to", "host %s is this one", name)
	}
	h, err := s.o.Hosts.Get(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return move.Host{}, sandbox.Site{}, sandbox.Errorf(sandbox.ErrNotFound, "to", "no host %q", name)
	}
	if err != nil {
		return move.Host{}, sandbox.Site{}, err
	}
	if !h.Up || !s.o.Now().Before(h.LeaseUntil) || h.Address == "" {
		return move.Host{}, sandbox.Site{}, sandbox.Errorf(sandbox.ErrUnavailable, "to", "host %s is down or has no internal endpoint", name)
	}
	return move.Host{Name: h.Name, Address: h.Address}, sandbox.Site{Name: h.Site, Country: h.Country}, nil
}

// siteName names a site, or what a create asked for, in errors.
func siteName(s sandbox.Site) string {
	switch {
	case s.Name != "" && s.Country != "":
		return "site " + s.Name + " (" + s.Country + ")"
	case s.Name != "":
		return "site " + s.Name
	default:
		return "country " + s.Country
	}
}

// Drain marks this host (name) draining, so that no new sandbox goes
// here, and moves its sandboxes one by one, with moveOne, to the hosts
// placement picks: within the site or country its create asked for, else
// within this host's site. A sandbox no host can take (or has room for),
// or that cannot move, stays, and the report says why. The caller checks
// who may.
func (s *Service) Drain(ctx context.Context, name string, moveOne func(ctx context.Context, id, to string) (*move.Result, error)) (*move.DrainReport, error) {
	ctx = context.WithoutCancel(ctx) // a drain that started finishes
	if err := s.o.Hosts.SetDraining(ctx, true); err != nil {
		return nil, err
	}
	recs, err := s.o.Store.SandboxesOn(ctx, name, sandbox.StateRunning, sandbox.StatePaused, sandbox.StateHibernated, sandbox.StateStopped)
	if err != nil {
		return nil, err
	}
	rep := &move.DrainReport{Host: name, Moved: []move.Moved{}, Stayed: []move.Stayed{}}
	for _, rec := range recs {
		var size sandbox.Resources
		if resumes(rec.State) {
			size = rec.Size // (a kept one holds no capacity there)
		}
		vols, err := s.o.Volumes.Moving(ctx, rec)
		if err != nil {
			rep.Stayed = append(rep.Stayed, move.Stayed{ID: rec.ID, Error: err.Error()})
			continue
		}
		for _, v := range vols {
			size.DiskGB += v.SizeGB // (its volumes go with it)
		}
		h, err := s.o.Hosts.Place(ctx, size, cluster.Asked(rec))
		if err == nil && h.Name == name {
			err = sandbox.Errorf(sandbox.ErrCapacity, "", "no other host has room for it")
		}
		var res *move.Result
		if err == nil {
			res, err = moveOne(ctx, rec.ID, h.Name)
		}
		if err != nil {
			rep.Stayed = append(rep.Stayed, move.Stayed{ID: rec.ID, Error: err.Error()})
			continue
		}
		rep.Moved = append(rep.Moved, move.Moved{ID: rec.ID, To: res.To, PausedMS: res.PausedMS})
	}
	return rep, nil
}

// machineDir is sandbox id's machine directory here.
func (s *Service) machineDir(id string) string { return filepath.Join(s.o.MachinesDir, id) }
