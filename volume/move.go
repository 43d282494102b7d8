package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/harebox/harebox/internal/fsync"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Moving volumes. A volume moves with the sandbox that alone holds it
// (package move/mover): its files travel with the sandbox's, sealed under
// the volume's own key already; its record names the target host in the
// move's own transaction; its key, in the store the hosts share, stays
// where it is. A volume that another sandbox holds too does not move, nor
// does the sandbox. Until that transaction the files the target received
// are not its own: a move that stops before it leaves them to be removed
// (Drop, Strays).

// Moving returns the volumes of sandbox rec, which move with it: refused
// (ErrState) when another sandbox holds one too, or one is busy.
func (s *Service) Moving(ctx context.Context, rec *store.Sandbox) ([]*store.Volume, error) {
	var out []*store.Volume
	for _, m := range rec.Volumes {
		v, err := s.o.Store.VolumeByName(ctx, rec.ProjectID, m.Name)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", m.Name, err)
		}
		if err := alone(v, rec.ID, s.o.Host); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// alone says whether volume v, on host, is held by sandbox id alone.
func alone(v *store.Volume, id, host string) error {
	switch {
	case v.Host != host:
		return sandbox.Errorf(sandbox.ErrState, "", "volume %s lives on host %s, not %s", v.Name, v.Host, host)
	case v.Busy != "":
		return sandbox.Errorf(sandbox.ErrState, "", "volume %s is %s: try again in a moment", v.Name, v.Busy)
	}
	for _, a := range v.Attachments {
		if a.SandboxID != id {
			return sandbox.Errorf(sandbox.ErrState, "", "volume %s is attached to sandbox %s too: a sandbox moves with its volumes only when no other sandbox holds them", v.Name, a.SandboxID)
		}
	}
	return nil
}

// Dir is where this host keeps its volumes' files.
func (s *Service) Dir() string { return s.o.Dir }

// Owns reports whether name, a file in Dir, is one of volume id's.
func Owns(id, name string) bool {
	return name == id+".qcow2" || (strings.HasPrefix(name, id+".") && strings.HasSuffix(name, ".qcow2"))
}

// Hand makes volumes vs, which sandbox rec holds alone, host to's, in the
// move's transaction tx: refused (ErrState) if one changed meanwhile.
func (s *Service) Hand(ctx context.Context, tx Tx, rec *store.Sandbox, vs []*store.Volume, to string) error {
	for _, v := range vs {
		cur, err := tx.GetVolume(ctx, v.ID)
		if err != nil {
			return fmt.Errorf("volume %s: %w", v.Name, err)
		}
		if err := alone(cur, rec.ID, s.o.Host); err != nil {
			return err
		}
		cur.Host = to
		if err := tx.PutVolume(ctx, cur); err != nil {
			return err
		}
	}
	return nil
}

// Left lets go of volumes vs here, which are another host's now: their
// files are removed (not their keys) and their disk is given back.
func (s *Service) Left(vs []*store.Volume) {
	for _, v := range vs {
		s.removeFiles(v.ID)
		os.Remove(s.mark(movingMark, v.ID))
		if s.hold(v.ID, false) && s.o.Capacity != nil {
			s.o.Capacity.Release(sandbox.Resources{DiskGB: v.SizeGB})
		}
	}
}

// Arrived takes up the volumes of sandbox rec, which moved here: their
// disk is reserved (once: at start, Adopt did it already).
func (s *Service) Arrived(ctx context.Context, rec *store.Sandbox) {
	for _, m := range rec.Volumes {
		v, err := s.o.Store.VolumeByName(ctx, rec.ProjectID, m.Name)
		if err != nil || v.Host != s.o.Host {
			continue
		}
		os.Remove(s.mark(arrivedMark, v.ID))
		if s.hold(v.ID, true) && s.o.Capacity != nil {
			s.o.Capacity.Force(sandbox.Resources{DiskGB: v.SizeGB})
		}
	}
}

// Incoming is where the files of volume id, held by sandbox rec that
// moves here, are written first; refused unless rec holds it alone on
// another host.
func (s *Service) Incoming(ctx context.Context, rec *store.Sandbox, id string) (string, error) {
	v, err := s.o.Store.GetVolume(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return "", sandbox.Errorf(sandbox.ErrNotFound, "", "no volume %s", id)
	}
	if err != nil {
		return "", err
	}
	held := false
	for _, m := range rec.Volumes {
		held = held || (v.ProjectID == rec.ProjectID && m.Name == v.Name)
	}
	if !held || v.Host == s.o.Host || alone(v, rec.ID, v.Host) != nil {
		return "", sandbox.Errorf(sandbox.ErrState, "", "volume %s does not move here with sandbox %s", id, rec.ID)
	}
	// (Received marks the files as come from this host.)
	if err := os.MkdirAll(s.o.Dir, 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(s.mark(arrivedMark, id), []byte(v.Host), 0o600); err != nil {
		return "", err
	}
	return filepath.Join(s.o.Dir, incoming+id), nil
}

// Marks of a move in the volumes' directory, each holding a host's name:
// movingMark, written by the source before it sends a volume's files,
// names the target; arrivedMark, written by the target before it takes
// them, names the source. They are what lets a host that starts remove
// a volume's files that a move left (Prune): only files whose volume's
// record names the host the mark names, so that a host whose name changed
// never loses volumes it holds.
const (
	movingMark  = ".moving-"
	arrivedMark = ".arrived-"
)

func (s *Service) mark(kind, id string) string { return filepath.Join(s.o.Dir, kind+id) }

func (s *Service) markOf(kind, id string) (string, bool) {
	b, err := os.ReadFile(s.mark(kind, id))
	return string(b), err == nil
}

// Leaving marks volume id's files here as on their way to host to (the
// source, before it sends them).
func (s *Service) Leaving(id, to string) error {
	return os.WriteFile(s.mark(movingMark, id), []byte(to), 0o600)
}

// incoming starts the name of a volume's files on their way in.
const incoming = ".incoming-"

// Received puts volume id's files, written whole into in (Incoming), in
// place: a file of another volume, or of another kind, is refused.
func (s *Service) Received(id, in string) error {
	defer os.RemoveAll(in)
	ents, err := os.ReadDir(in)
	if err != nil {
		return err
	}
	base := false
	for _, e := range ents {
		if !e.Type().IsRegular() || !Owns(id, e.Name()) {
			return sandbox.Errorf(sandbox.ErrInvalid, "", "a move of volume %s carries its own files only, not %q", id, e.Name())
		}
		base = base || e.Name() == id+".qcow2"
	}
	if !base {
		return sandbox.Errorf(sandbox.ErrInvalid, "", "a move of volume %s carries no %s.qcow2", id, id)
	}
	s.removeFiles(id) // (what an earlier move that failed left)
	for _, e := range ents {
		if err := os.Rename(filepath.Join(in, e.Name()), filepath.Join(s.o.Dir, e.Name())); err != nil {
			s.removeFiles(id)
			return err
		}
	}
	// On the disk before the source hears of it (and lets go of its copy).
	return fsync.Dir(s.o.Dir)
}

// Drop removes the files of sandbox rec's volumes that a move brought
// here, if they are not this host's (the move stopped before they were).
func (s *Service) Drop(ctx context.Context, rec *store.Sandbox) {
	for _, m := range rec.Volumes {
		v, err := s.o.Store.VolumeByName(ctx, rec.ProjectID, m.Name)
		if err != nil || v.Host == s.o.Host {
			continue
		}
		os.RemoveAll(filepath.Join(s.o.Dir, incoming+v.ID))
		s.removeFiles(v.ID)
		os.Remove(s.mark(arrivedMark, v.ID))
	}
}

// Prune removes, at start, what moves left here: files on their way in;
// a volume's files this host sent to a host whose record now names it
// (its source died before it let go of them); files it received for a
// move that did not finish (the record names the source they came
// from), but those of a volume coming says is on its way here. Files of
// another host's volume without such a mark stay (logged): a host whose
// name changed keeps what it holds.
func (s *Service) Prune(ctx context.Context, coming func(v *store.Volume) bool) error {
	ents, err := os.ReadDir(s.o.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), incoming) {
			os.RemoveAll(filepath.Join(s.o.Dir, e.Name()))
		}
	}
	all, err := s.o.Store.ListVolumes(ctx, "")
	if err != nil {
		return err
	}
	for _, v := range all {
		to, leaving := s.markOf(movingMark, v.ID)
		from, arrived := s.markOf(arrivedMark, v.ID)
		switch {
		case v.Host == s.o.Host: // (its move did not happen, or is done)
			os.Remove(s.mark(movingMark, v.ID))
			os.Remove(s.mark(arrivedMark, v.ID))
		case leaving && v.Host == to, arrived && v.Host == from && !coming(v):
			s.o.Log.Info("volume: removing the files a move left of a volume that lives on another host", "volume", v.ID, "host", v.Host)
			s.removeFiles(v.ID)
			os.Remove(s.mark(movingMark, v.ID))
			os.Remove(s.mark(arrivedMark, v.ID))
		case len(s.files(v.ID)) > 0 && !arrived:
			s.o.Log.Warn("volume: files here of a volume whose record names another host, and no move that left them: kept", "volume", v.ID, "host", v.Host)
		}
	}
	return nil
}

// files are volume id's files here.
func (s *Service) files(id string) []string {
	layers, _ := filepath.Glob(filepath.Join(s.o.Dir, id+".*.qcow2"))
	if _, err := os.Stat(s.path(id)); err == nil {
		layers = append(layers, s.path(id))
	}
	return layers
}

func (s *Service) removeFiles(id string) {
	for _, p := range s.files(id) {
		os.Remove(p)
	}
}

// hold marks volume id's disk reserved here (on) or given back, and
// reports whether that changed.
func (s *Service) hold(id string, on bool) bool {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	if s.held[id] == on {
		return false
	}
	if on {
		s.held[id] = true
	} else {
		delete(s.held, id)
	}
	return true
}
