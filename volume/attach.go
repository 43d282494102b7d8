package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/voldisk"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// Attachments: what the runtime calls at fixed points of a sandbox's
// life (placement, admission, every boot, a snapshot, delete), and what
// the deployment calls when a host goes.

// Host is the host of the volumes a create names, where it must run
// (placement sends it there): "" when it names none, or one this
// principal cannot see (the create says so). Volumes of two hosts are
// refused: they cannot meet in one sandbox.
func (s *Service) Host(ctx context.Context, accountRef, projectRef string, mounts []sandbox.VolumeMount) (string, error) {
	host, first := "", ""
	err := s.db.Update(ctx, func(tx Tx) error {
		host, first = "", ""
		_, proj, err := s.o.Tenants.ProjectIn(ctx, tx, accountRef, projectRef)
		if err != nil {
			return nil
		}
		for _, m := range mounts {
			v, err := tx.VolumeByName(ctx, proj.ID, m.Name)
			if err != nil {
				continue
			}
			if host != "" && v.Host != host {
				return sandbox.Errorf(sandbox.ErrInvalid, "volumes", "volumes %q and %q live on different hosts (%s, %s): a sandbox attaches volumes of one host", first, v.Name, host, v.Host)
			}
			host, first = v.Host, v.Name
		}
		return nil
	})
	return host, err
}

// HostOf is the host of a volume (by ID, or name in the project): where
// its resize and delete are served; "" when this principal cannot see it.
func (s *Service) HostOf(ctx context.Context, accountRef, projectRef, ref string) string {
	host := ""
	s.db.Update(ctx, func(tx Tx) error {
		if v, _, err := s.find(ctx, tx, "getVolume", accountRef, projectRef, ref); err == nil {
			host = v.Host
		}
		return nil
	})
	return host
}

// DropHost forgets the volumes of a host removed from the deployment:
// their keys are erased (what their files held, on that host's disks,
// is ciphertext without a key), their charges end, their records go.
func (s *Service) DropHost(ctx context.Context, host string) error {
	all, err := s.o.Store.ListVolumes(ctx, "")
	if err != nil {
		return err
	}
	var errs []error
	for _, v := range all {
		if v.Host != host {
			continue
		}
		if err := secrets.EraseDataKey(ctx, s.o.Secrets, scope(v.ID)); err != nil {
			errs = append(errs, err)
			continue
		}
		if s.o.Meter != nil {
			s.o.Meter.Volume(ctx, v, v.SizeGB, 0, false)
		}
		if err := s.o.Store.DeleteVolume(ctx, v.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
			errs = append(errs, err)
		}
		s.o.Audit.Record(ctx, "deleteVolume", v.AccountID, v.ID, nil)
	}
	return errors.Join(errs...)
}

// MaxLayers bounds a volume's layers: each reader that attaches beside a
// writer adds one, until nothing holds the volume and they are folded.
const MaxLayers = 32

// busyLayering is a volume's Busy while its writer moves onto a new
// layer for a reader (Layer).
const busyLayering = "giving its writer a new layer"

// Layering is a writer that must move onto a new layer before the
// reader that claimed the layer under it plugs that in (Layer): the
// writer is running, and its machine still writes there.
type Layering struct {
	Volume string // its ID
	Writer string // the writer sandbox's ID
	Path   string // where the writer has it mounted
	Layer  int    // the writer's new layer
	// Share: another reader's create moves the writer; this one waits
	// for it (Await), then moves it if that failed.
	Share bool
}

// Claim attaches the volumes mounts names to sandbox rec (placed in its
// project already), in the create's transaction tx: each must be in the
// project, on this host, and free for the attachment asked (a writer
// wants no other writer). It records them on rec. A reader beside a
// writer claims the layer the writer writes, and the writer a new one
// over it: the writers that must move while they run are returned, and
// the runtime moves them (Layer) before the reader plugs its layer in.
func (s *Service) Claim(ctx context.Context, tx Tx, rec *store.Sandbox, mounts []sandbox.VolumeMount) ([]Layering, error) {
	if len(mounts) == 0 {
		return nil, nil
	}
	if err := authz.Allowed(authz.From(ctx), "getVolume"); err != nil {
		return nil, err
	}
	if s.o.NotTaken != "" {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "volumes", "%s", s.o.NotTaken)
	}
	seenName, seenPath := map[string]bool{}, map[string]bool{}
	for i, m := range mounts {
		field := fmt.Sprintf("volumes[%d]", i)
		if seenName[m.Name] || seenPath[m.Path] {
			return nil, sandbox.Errorf(sandbox.ErrInvalid, field, "volume %q or path %s is given twice", m.Name, m.Path)
		}
		seenName[m.Name], seenPath[m.Path] = true, true
		if filepath.Clean(m.Path) != m.Path || !layout.VolumeMountAllowed(m.Path) {
			return nil, sandbox.Errorf(sandbox.ErrInvalid, field+".path", "path %q: want a clean absolute path, not / nor over the system's own trees (/etc, /usr, /proc, ...)", m.Path)
		}
	}
	var moves []Layering
	for i, m := range mounts {
		field := fmt.Sprintf("volumes[%d]", i)
		v, err := tx.VolumeByName(ctx, rec.ProjectID, m.Name)
		if errors.Is(err, store.ErrNotFound) {
			return nil, sandbox.Errorf(sandbox.ErrNotFound, field+".name", "no volume %q in project %q", m.Name, rec.Project)
		}
		if err != nil {
			return nil, err
		}
		if v.Host != s.o.Host {
			return nil, sandbox.Errorf(sandbox.ErrUnavailable, field, "volume %q lives on host %s: create the sandbox there", m.Name, v.Host)
		}
		w := slices.IndexFunc(v.Attachments, func(a model.VolumeAttachment) bool { return !a.ReadOnly })
		if w >= 0 && !m.ReadOnly {
			return nil, sandbox.Errorf(sandbox.ErrState, field, "volume %q is attached to sandbox %s (read-write): it has one writer at a time (attach it read-only beside it)", m.Name, v.Attachments[w].SandboxID)
		}
		if v.Busy == busyLayering && w >= 0 {
			// Readers that come while the writer moves for another take
			// the layer it leaves too (the clones of a fork, say).
			a := v.Attachments[w]
			v.Attachments = append(v.Attachments, model.VolumeAttachment{SandboxID: rec.ID, Path: m.Path, ReadOnly: true, Layer: a.Layer - 1})
			if err := tx.PutVolume(ctx, v); err != nil {
				return nil, err
			}
			moves = append(moves, Layering{Volume: v.ID, Writer: a.SandboxID, Path: a.Path, Layer: a.Layer, Share: true})
			continue
		}
		if v.Busy != "" {
			return nil, sandbox.Errorf(sandbox.ErrState, field, "volume %q is %s: try again in a moment", m.Name, v.Busy)
		}
		// A writer writes to the top layer, or to a new one over it when
		// readers hold the top: they go on seeing what they saw. A reader
		// beside a writer takes the writer's layer, and the writer a new
		// one.
		layer := v.Layers
		newLayer := w >= 0 || !m.ReadOnly && slices.ContainsFunc(v.Attachments, func(a model.VolumeAttachment) bool { return a.Layer == v.Layers })
		if newLayer && v.Layers >= MaxLayers {
			return nil, sandbox.Errorf(sandbox.ErrState, field, "volume %q has %d layers, the most it takes (one for each reader that attached beside a writer): they are folded once no sandbox holds it", m.Name, v.Layers)
		}
		switch {
		case w >= 0:
			move, err := s.writerMoves(ctx, tx, field, v, &v.Attachments[w])
			if err != nil {
				return nil, err
			}
			layer = v.Attachments[w].Layer
			v.Layers++
			v.Attachments[w].Layer = v.Layers
			if move {
				v.Busy = busyLayering
				moves = append(moves, Layering{Volume: v.ID, Writer: v.Attachments[w].SandboxID, Path: v.Attachments[w].Path, Layer: v.Layers})
			}
		case newLayer:
			v.Layers++
			layer = v.Layers
		}
		v.Attachments = append(v.Attachments, model.VolumeAttachment{SandboxID: rec.ID, Path: m.Path, ReadOnly: m.ReadOnly, Layer: layer})
		if err := tx.PutVolume(ctx, v); err != nil {
			return nil, err
		}
	}
	rec.Volumes = slices.Clone(mounts)
	return moves, nil
}

// writerMoves says whether the writer a of volume v must move onto a
// new layer while it runs, for a reader to attach beside it; one whose
// machine does not run opens its new layer when it next boots. A paused
// writer, or one being made or started, is refused: its filesystem
// cannot be frozen now.
func (s *Service) writerMoves(ctx context.Context, tx Tx, field string, v *store.Volume, a *model.VolumeAttachment) (bool, error) {
	w, err := tx.GetSandbox(ctx, a.SandboxID)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	switch w.State {
	case sandbox.StateRunning:
		return true, nil
	case sandbox.StateStopped, sandbox.StateHibernated, sandbox.StateLost, sandbox.StateDeleted:
		return false, nil
	case sandbox.StatePaused:
		return false, sandbox.Errorf(sandbox.ErrState, field, "volume %q's writer, sandbox %s, is paused: a reader attaches beside a writer that runs (the host freezes its filesystem for a moment) or is stopped; resume it", v.Name, w.ID)
	default:
		return false, sandbox.Errorf(sandbox.ErrState, field, "volume %q's writer, sandbox %s, is %s: try again in a moment", v.Name, w.ID, w.State)
	}
}

// Layer moves writer l's writes onto its new layer, in its running
// machine m, whose guest (agent c) freezes the volume's filesystem
// meanwhile: the layer under it is then clean and no longer written,
// for the reader that claimed it. The caller holds the writer's
// lifecycle lock. Whatever comes of it, Layered must follow.
func (s *Service) Layer(ctx context.Context, l Layering, m hypervisor.Machine, c *agentclient.Client) error {
	key, err := secrets.DataKey(ctx, s.o.Secrets, scope(l.Volume))
	if err != nil {
		return err
	}
	if err := s.ensure(ctx, l.Volume, l.Layer, key); err != nil {
		return err
	}
	fctx, cancel := context.WithTimeout(ctx, freezeFor)
	defer cancel()
	if err := c.FreezeVolume(fctx, l.Path, freezeFor); err != nil {
		return fmt.Errorf("volume %s: its writer %s did not freeze it: %w", l.Volume, l.Writer, err)
	}
	defer func() {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := c.ThawVolume(tctx, l.Path); err != nil {
			s.o.Log.Warn("volume: its writer did not thaw it (it thaws by itself)", "volume", l.Volume, "sandbox", l.Writer, "err", err)
		}
	}()
	if err := m.LayerVolume(fctx, Serial(l.Volume), s.layer(l.Volume, l.Layer)); err != nil {
		return fmt.Errorf("volume %s: a new layer for its writer %s: %w", l.Volume, l.Writer, err)
	}
	return nil
}

// freezeFor bounds how long a writer's filesystem stays frozen for a
// new layer.
const freezeFor = 10 * time.Second

// Await waits for the end of the Layering another reader's create
// started, which l shares.
func (s *Service) Await(ctx context.Context, l Layering) error {
	ctx, cancel := context.WithTimeout(ctx, freezeFor+10*time.Second)
	defer cancel()
	for {
		v, err := s.o.Store.GetVolume(ctx, l.Volume)
		if errors.Is(err, store.ErrNotFound) || err == nil && v.Busy != busyLayering {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return sandbox.Errorf(sandbox.ErrUnavailable, "volumes", "volume %s: its writer %s takes too long to move onto a new layer", l.Volume, l.Writer)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Layered ends a Layering: the volume is no longer busy. A writer that
// did not move keeps its new layer in the record (where it writes is
// under it): it is empty, so what the writer reads is the same, its
// next boot writes there, and a next Layer puts a layer over whatever
// its machine writes now.
func (s *Service) Layered(ctx context.Context, l Layering) error {
	return s.db.Update(context.WithoutCancel(ctx), func(tx Tx) error {
		v, err := tx.GetVolume(ctx, l.Volume)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil || v.Busy != busyLayering {
			return err
		}
		v.Busy = ""
		return tx.PutVolume(ctx, v)
	})
}

// Release gives back every attachment of sandbox id; a volume that
// nothing holds then has its layers folded.
func (s *Service) Release(ctx context.Context, rec *store.Sandbox) error {
	if len(rec.Volumes) == 0 {
		return nil
	}
	var free []string
	err := s.db.Update(ctx, func(tx Tx) error {
		free = free[:0]
		for _, m := range rec.Volumes {
			v, err := tx.VolumeByName(ctx, rec.ProjectID, m.Name)
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			n := len(v.Attachments)
			v.Attachments = slices.DeleteFunc(v.Attachments, func(a model.VolumeAttachment) bool { return a.SandboxID == rec.ID })
			if len(v.Attachments) == n {
				continue
			}
			v.UsedBytes = s.use(v)
			if err := tx.PutVolume(ctx, v); err != nil {
				return err
			}
			if len(v.Attachments) == 0 && v.Layers > 0 {
				free = append(free, v.ID)
			}
		}
		return nil
	})
	for _, id := range free {
		s.fold(context.WithoutCancel(ctx), id)
	}
	return err
}

// fold folds the layers of volume id into its first file, if nothing
// holds it; meanwhile it is busy ("folding"): not attached, resized or
// deleted.
func (s *Service) fold(ctx context.Context, id string) {
	var v *store.Volume
	if err := s.db.Update(ctx, func(tx Tx) error {
		v = nil
		cur, err := tx.GetVolume(ctx, id)
		if err != nil || len(cur.Attachments) > 0 || cur.Busy != "" || cur.Layers == 0 {
			return err
		}
		cur.Busy = "folding its layers"
		v = cur
		return tx.PutVolume(ctx, cur)
	}); err != nil || v == nil {
		return
	}
	key, err := secrets.DataKey(ctx, s.o.Secrets, scope(id))
	if err == nil {
		err = voldisk.Fold(ctx, s.o.Tools, s.existing(id, v.Layers), key)
	}
	if err != nil {
		s.o.Log.Warn("volume: folding its layers failed; they stay", "volume", id, "err", err)
	}
	s.db.Update(ctx, func(tx Tx) error {
		cur, gerr := tx.GetVolume(ctx, id)
		if gerr != nil {
			return gerr
		}
		cur.Busy = ""
		if err == nil {
			cur.Layers = 0
		}
		cur.UsedBytes = s.use(cur)
		return tx.PutVolume(ctx, cur)
	})
}

// existing is a volume's chain from layer n down, without the layers
// never made (a writer whose create failed before it mounted one).
func (s *Service) existing(id string, n int) []string {
	var out []string
	for _, p := range s.chain(id, n) {
		if _, err := os.Stat(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// ensure makes the layers of volume id up to n that were never made,
// each empty over the one under it.
func (s *Service) ensure(ctx context.Context, id string, n int, key []byte) error {
	s.layersMu.Lock()
	defer s.layersMu.Unlock()
	for i := 1; i <= n; i++ {
		p := s.layer(id, i)
		if _, err := os.Stat(p); err == nil {
			continue
		}
		if err := voldisk.Layer(ctx, s.o.Tools, s.layer(id, i-1), p, key); err != nil {
			return fmt.Errorf("volume %s: layer %d: %w", id, i, err)
		}
	}
	return nil
}

// Mount plugs rec's volumes into its machine m and has the guest mount
// them (at every boot: create, start, restore).
func (s *Service) Mount(ctx context.Context, rec *store.Sandbox, m hypervisor.Machine, c *agentclient.Client) error {
	for _, vm := range rec.Volumes {
		v, err := s.o.Store.VolumeByName(ctx, rec.ProjectID, vm.Name)
		if err != nil {
			return fmt.Errorf("volume %s: %w", vm.Name, err)
		}
		key, err := secrets.DataKey(ctx, s.o.Secrets, scope(v.ID))
		if err != nil {
			return fmt.Errorf("volume %s: %w", vm.Name, err)
		}
		layer := 0
		for _, a := range v.Attachments {
			if a.SandboxID == rec.ID && a.Path == vm.Path {
				layer = a.Layer
			}
		}
		if err := s.ensure(ctx, v.ID, layer, key); err != nil {
			return err
		}
		chain := s.chain(v.ID, layer)
		hv := hypervisor.Volume{ID: Serial(v.ID), Path: chain[0], Backing: chain[1:], Key: key, ReadOnly: vm.ReadOnly}
		if err := m.PlugVolume(ctx, hv); err != nil && !errors.Is(err, hypervisor.ErrExists) {
			return fmt.Errorf("volume %s: %w", vm.Name, err)
		}
		if err := c.MountVolume(ctx, hv.ID, vm.Path, vm.ReadOnly, ""); err != nil {
			return fmt.Errorf("volume %s at %s: %w", vm.Name, vm.Path, err)
		}
	}
	return nil
}

// Detach has the guest sync and unmount rec's volumes and takes them out
// of its machine m, for a snapshot of it (the backend snapshots no
// volume: a clone attaches its own). Mount attaches them again. On an
// error, those it had detached are attached again.
func (s *Service) Detach(ctx context.Context, rec *store.Sandbox, m hypervisor.Machine, c *agentclient.Client) error {
	for i, vm := range rec.Volumes {
		unmounted := false
		err := c.UnmountVolume(ctx, vm.Path)
		if err == nil {
			unmounted = true
			var v *store.Volume
			if v, err = s.o.Store.VolumeByName(ctx, rec.ProjectID, vm.Name); err == nil {
				err = m.UnplugVolume(ctx, Serial(v.ID))
			}
		}
		if err != nil {
			// (Those before it, and it if it was unmounted: Mount plugs
			// again only what is not plugged.)
			done := *rec
			done.Volumes = rec.Volumes[:i]
			if unmounted {
				done.Volumes = rec.Volumes[:i+1]
			}
			s.Mount(context.WithoutCancel(ctx), &done, m, c)
			return fmt.Errorf("volume %s: detach for a snapshot: %w", vm.Name, err)
		}
	}
	return nil
}

// Unmount has the guest sync and unmount rec's volumes, so that what it
// wrote is on their disks before its machine goes (best effort: a guest
// that does not answer loses what it did not sync itself).
func (s *Service) Unmount(ctx context.Context, rec *store.Sandbox, c *agentclient.Client) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, vm := range rec.Volumes {
		c.UnmountVolume(ctx, vm.Path)
	}
}
