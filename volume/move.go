package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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
	return filepath.Join(s.o.Dir, incoming+id), nil
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
	for _, e := range ents {
		if !e.Type().IsRegular() || !Owns(id, e.Name()) {
			return sandbox.Errorf(sandbox.ErrInvalid, "", "a move of volume %s carries its own files only, not %q", id, e.Name())
		}
	}
	s.removeFiles(id) // (what an earlier move that failed left)
	for _, e := range ents {
		if err := os.Rename(filepath.Join(in, e.Name()), filepath.Join(s.o.Dir, e.Name())); err != nil {
			s.removeFiles(id)
			return err
		}
	}
	return nil
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
	}
}

// Strays are the volumes that have files here but live on another host:
// what a move left (the files of a volume that moved away, or of one
// whose move here did not finish), or files on their way in.
func (s *Service) Strays(ctx context.Context) ([]*store.Volume, error) {
	all, err := s.o.Store.ListVolumes(ctx, "")
	if err != nil {
		return nil, err
	}
	var out []*store.Volume
	for _, v := range all {
		if v.Host == s.o.Host {
			continue
		}
		if _, err := os.Stat(filepath.Join(s.o.Dir, incoming+v.ID)); err == nil || len(s.files(v.ID)) > 0 {
			out = append(out, v)
		}
	}
	return out, nil
}

// RemoveStray removes stray volume id's files here (not its key).
func (s *Service) RemoveStray(id string) {
	os.RemoveAll(filepath.Join(s.o.Dir, incoming+id))
	s.removeFiles(id)
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
