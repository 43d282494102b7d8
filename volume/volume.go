// Package volume keeps a project's volumes: named disks that outlive
// sandboxes, each an ext4 filesystem in a file encrypted under the
// volume's own data key (hypervisor/voldisk), on the host that made it.
// Deleting a volume erases its key first: what its file held is then
// unreadable, and the file goes after.
//
// A volume is attached to sandboxes at create: one writer at a time, and
// readers that see it as it was when they attached (a writer beside them
// writes to a layer of its own; a reader beside a running writer takes
// the layer the writer leaves for a new one, while its filesystem is
// frozen: Layer). The attachments are in the volume's record, claimed in
// the create's own transaction (Claim) and given back when the sandbox is
// deleted (Release); the runtime plugs and mounts them at every boot
// (Mount).
package volume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/hypervisor/voldisk"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
)

// IDPrefix starts every volume ID.
const IDPrefix = "vol_"

// Tx is what the volume calls need of a store transaction.
type Tx interface {
	tenant.Resolver
	PutVolume(ctx context.Context, v *store.Volume) error
	GetVolume(ctx context.Context, id string) (*store.Volume, error)
	VolumeByName(ctx context.Context, projectID, name string) (*store.Volume, error)
	ListVolumes(ctx context.Context, projectID string) ([]*store.Volume, error)
	DeleteVolume(ctx context.Context, id string) error
	GetSandbox(ctx context.Context, id string) (*store.Sandbox, error)
}

// Options configure a Service.
type Options struct {
	Store   store.Store
	Tenants *tenant.Service
	Secrets secrets.Store
	// Dir holds the volumes' files (DATA_DIR/volumes).
	Dir   string
	Tools voldisk.Tools
	// Host is this host's name: volumes made here are its.
	Host string
	// MaxGB bounds one volume's size; default 100.
	MaxGB int
	// ProjectGB bounds the sizes of a project's volumes together (its
	// quota); default 1000.
	ProjectGB int
	// Capacity is the host's disk admission: a volume's size is
	// reserved in it as a sandbox's disk is, for as long as it exists.
	// Nil: none.
	Capacity Capacity
	// Meter charges volumes' disks to the budgets; nil: none.
	Meter Meter
	// Audit, if set, records every change.
	Audit *audit.Log
	// NotTaken says why this host's machines take no volumes ("" if they
	// do: hypervisor.Capabilities.Volumes): a create that attaches one is
	// refused before anything is made.
	NotTaken string
	Log      *slog.Logger
}

// Capacity is the host's admission (capacity.Host).
type Capacity interface {
	Reserve(res sandbox.Resources) error
	Force(res sandbox.Resources) error
	Release(res sandbox.Resources)
}

// Meter charges a volume's disk (meter.Service.Volume): heldGB up to now,
// nextGB reserved next (0: it is gone); with admit, a budget without room
// refuses (sandbox.ErrBudget).
type Meter interface {
	Volume(ctx context.Context, v *store.Volume, heldGB, nextGB int, admit bool) error
}

// Service manages volumes for the principal in the context.
type Service struct {
	o     Options
	maker *voldisk.Maker
	// layersMu: one layer made at a time.
	layersMu sync.Mutex
	// held are the volumes whose disk this host has reserved (its own,
	// and those that moved here): a volume that moves away gives its
	// size back once, one that arrives takes it once.
	heldMu sync.Mutex
	held   map[string]bool
	db     interface {
		Update(ctx context.Context, fn func(tx Tx) error) error
	}
}

// New returns a service.
func New(o Options) *Service {
	if o.MaxGB == 0 {
		o.MaxGB = 100
	}
	if o.ProjectGB == 0 {
		o.ProjectGB = 1000
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Dir != "" {
		// What earlier versions kept here to copy new volume files from
		// (an empty base and its encrypted template) is no longer used.
		old, _ := filepath.Glob(filepath.Join(o.Dir, "..zero.raw.*.luks-template"))
		for _, p := range append(old, filepath.Join(o.Dir, ".zero.raw")) {
			os.Remove(p)
		}
	}
	return &Service{o: o, maker: &voldisk.Maker{Tools: o.Tools}, db: store.Narrow(o.Store, func(tx store.Tx) Tx { return tx }), held: map[string]bool{}}
}

// View is a volume as the API shows it.
type View struct {
	*store.Volume
	Project string `json:"project"`
}

// CreateRequest makes a volume.
type CreateRequest struct {
	Project string `json:"project,omitempty" validate:"max=64"`
	Name    string `json:"name" validate:"required,max=63,dnslabel"`
	SizeGB  int    `json:"size_gb" validate:"gte=1"`
}

func scope(id string) string { return "volume/" + id }

// Serial is the disk serial the guest finds volume id by: the last 20
// characters of its ID (random ones), unique among a machine's volumes.
func Serial(id string) string { return id[len(id)-20:] }

func (s *Service) path(id string) string { return filepath.Join(s.o.Dir, id+".qcow2") }

// Create makes a volume: its key, its file, its record.
func (s *Service) Create(ctx context.Context, accountRef string, r CreateRequest) (out *View, err error) {
	defer func() {
		target, account := r.Name, ""
		if out != nil {
			target, account = out.ID, out.AccountID
		}
		s.o.Audit.Record(ctx, "createVolume", account, target, err)
	}()
	if err := authz.Allowed(authz.From(ctx), "createVolume"); err != nil {
		return nil, err
	}
	if err := sandbox.Validate(&r); err != nil {
		return nil, err
	}
	if r.SizeGB > s.o.MaxGB {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "size_gb", "size_gb %d: at most %d on this host", r.SizeGB, s.o.MaxGB)
	}
	v := &store.Volume{ID: tenant.NewID(IDPrefix), Name: r.Name, SizeGB: r.SizeGB, Host: s.o.Host,
		CreatedAt: time.Now().UTC(), Attachments: []model.VolumeAttachment{}}
	var proj *store.Project
	// The name is checked before the file is made (a second check, in the
	// transaction that stores it, catches a race).
	if err := s.db.Update(ctx, func(tx Tx) error {
		var err error
		if _, proj, err = s.o.Tenants.ProjectIn(ctx, tx, accountRef, r.Project); err != nil {
			return sandbox.Errorf(sandbox.ErrInvalid, "project", "%v", err)
		}
		if _, err := tx.VolumeByName(ctx, proj.ID, r.Name); err == nil {
			return sandbox.Errorf(sandbox.ErrExists, "name", "a volume named %q exists in project %q", r.Name, proj.Name)
		}
		return s.withinQuota(ctx, tx, proj, r.SizeGB)
	}); err != nil {
		return nil, err
	}
	v.AccountID, v.ProjectID = proj.AccountID, proj.ID
	undo, err := s.admit(ctx, v, 0, r.SizeGB)
	if err != nil {
		return nil, err
	}
	made := false
	defer func() {
		if !made {
			undo()
		}
	}()
	if err := os.MkdirAll(s.o.Dir, 0o700); err != nil {
		return nil, err
	}
	key, err := secrets.NewDataKey(ctx, s.o.Secrets, scope(v.ID))
	if err != nil {
		return nil, err
	}
	if err := s.maker.Create(ctx, s.path(v.ID), int64(r.SizeGB)<<30, key, layout.VolumeUUID(Serial(v.ID))); err != nil {
		secrets.EraseDataKey(context.WithoutCancel(ctx), s.o.Secrets, scope(v.ID))
		return nil, fmt.Errorf("volume %s: %w", r.Name, err)
	}
	v.UsedBytes = s.use(v)
	if err := s.db.Update(ctx, func(tx Tx) error {
		if err := tx.PutVolume(ctx, v); err != nil {
			if errors.Is(err, store.ErrConflict) {
				return sandbox.Errorf(sandbox.ErrExists, "name", "a volume named %q exists in project %q", r.Name, proj.Name)
			}
			return err
		}
		return nil
	}); err != nil {
		s.erase(context.WithoutCancel(ctx), v.ID)
		return nil, err
	}
	made = true
	s.hold(v.ID, true)
	return &View{Volume: v, Project: proj.Name}, nil
}

// withinQuota refuses moreGB of volumes in proj past its quota.
func (s *Service) withinQuota(ctx context.Context, tx Tx, proj *store.Project, moreGB int) error {
	all, err := tx.ListVolumes(ctx, proj.ID)
	if err != nil {
		return err
	}
	held := 0
	for _, v := range all {
		held += v.SizeGB
	}
	if held+moreGB > s.o.ProjectGB {
		return sandbox.Errorf(sandbox.ErrCapacity, "size_gb", "project %q holds %d GB of volumes; %d more would pass its quota of %d GB", proj.Name, held, moreGB, s.o.ProjectGB)
	}
	return nil
}

// admit reserves a volume's growth from fromGB to toGB on the host's disk
// and in its budgets; undo takes both back.
func (s *Service) admit(ctx context.Context, v *store.Volume, fromGB, toGB int) (undo func(), err error) {
	more := sandbox.Resources{DiskGB: toGB - fromGB}
	if s.o.Capacity != nil {
		if err := s.o.Capacity.Reserve(more); err != nil {
			return nil, fmt.Errorf("volume %s: %w", v.Name, err)
		}
	}
	if s.o.Meter != nil {
		if err := s.o.Meter.Volume(ctx, v, fromGB, toGB, true); err != nil {
			if s.o.Capacity != nil {
				s.o.Capacity.Release(more)
			}
			return nil, err
		}
	}
	return func() {
		if s.o.Meter != nil {
			s.o.Meter.Volume(context.WithoutCancel(ctx), v, fromGB, fromGB, false)
		}
		if s.o.Capacity != nil {
			s.o.Capacity.Release(more)
		}
	}, nil
}

// Adopt takes this host's volumes back at start: their sizes reserved
// on its disk again, and what a crash interrupted finished (a resize or
// a fold left half way is done again or undone, and layers nothing
// holds are folded).
func (s *Service) Adopt(ctx context.Context) error {
	all, err := s.o.Store.ListVolumes(ctx, "")
	if err != nil {
		return err
	}
	for _, v := range all {
		if v.Host != s.o.Host {
			continue
		}
		if s.hold(v.ID, true) && s.o.Capacity != nil {
			s.o.Capacity.Force(sandbox.Resources{DiskGB: v.SizeGB})
		}
		if v.Busy != "" {
			if err := s.db.Update(ctx, func(tx Tx) error {
				cur, err := tx.GetVolume(ctx, v.ID)
				if err != nil {
					return err
				}
				cur.Busy = ""
				return tx.PutVolume(ctx, cur)
			}); err != nil {
				return err
			}
		}
		if v.Layers > 0 {
			s.fold(ctx, v.ID)
		}
	}
	return nil
}

// erase destroys a volume's key, then its file.
func (s *Service) erase(ctx context.Context, id string) error {
	if err := secrets.EraseDataKey(ctx, s.o.Secrets, scope(id)); err != nil {
		return err
	}
	for _, p := range s.files(id) {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	return nil
}

// layer is the file of a volume's layer n (0: its first).
func (s *Service) layer(id string, n int) string {
	if n == 0 {
		return s.path(id)
	}
	return filepath.Join(s.o.Dir, fmt.Sprintf("%s.%d.qcow2", id, n))
}

// chain is a volume's files from layer n down to its first.
func (s *Service) chain(id string, n int) []string {
	var out []string
	for i := n; i >= 0; i-- {
		out = append(out, s.layer(id, i))
	}
	return out
}

// use is what a volume's files take on the disk.
func (s *Service) use(v *store.Volume) int64 {
	var n int64
	for _, p := range s.chain(v.ID, v.Layers) {
		n += fileUse(p)
	}
	return n
}

// fileUse is what a file takes on the disk.
func fileUse(path string) int64 {
	var n int64
	if fi, err := os.Stat(path); err == nil {
		if st, ok := fi.Sys().(interface{ Blocks() int64 }); ok {
			n = st.Blocks() * 512
		} else {
			n = fi.Size()
		}
	}
	return n
}

// find resolves a volume reference (ID, or name in the project) for
// action, with its project. Another project's volume is not found.
func (s *Service) find(ctx context.Context, tx Tx, action, accountRef, projectRef, ref string) (*store.Volume, *store.Project, error) {
	if err := authz.Allowed(authz.From(ctx), action); err != nil {
		return nil, nil, err
	}
	var v *store.Volume
	var err error
	if tenant.ValidID(IDPrefix, ref) {
		if v, err = tx.GetVolume(ctx, ref); err == nil && projectRef == "" {
			projectRef = v.ProjectID
		}
	}
	_, proj, perr := s.o.Tenants.ProjectIn(ctx, tx, accountRef, projectRef)
	if perr != nil {
		return nil, nil, perr
	}
	if v == nil {
		v, err = tx.VolumeByName(ctx, proj.ID, ref)
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && v.ProjectID != proj.ID) {
		return nil, nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no volume %q in project %q", ref, proj.Name)
	}
	return v, proj, err
}

// List lists a project's volumes.
func (s *Service) List(ctx context.Context, accountRef, projectRef string) ([]*View, error) {
	if err := authz.Allowed(authz.From(ctx), "listVolumes"); err != nil {
		return nil, err
	}
	out := []*View{}
	err := s.db.Update(ctx, func(tx Tx) error {
		out = out[:0]
		_, proj, err := s.o.Tenants.ProjectIn(ctx, tx, accountRef, projectRef)
		if err != nil {
			return err
		}
		all, err := tx.ListVolumes(ctx, proj.ID)
		for _, v := range all {
			out = append(out, s.view(v, proj))
		}
		return err
	})
	return out, err
}

// view is v as shown, with what its file takes now if it is here.
func (s *Service) view(v *store.Volume, proj *store.Project) *View {
	if v.Host == s.o.Host {
		v.UsedBytes = s.use(v)
	}
	return &View{Volume: v, Project: proj.Name}
}

// Get returns a volume.
func (s *Service) Get(ctx context.Context, accountRef, projectRef, ref string) (*View, error) {
	var out *View
	err := s.db.Update(ctx, func(tx Tx) error {
		v, proj, err := s.find(ctx, tx, "getVolume", accountRef, projectRef, ref)
		if err == nil {
			out = s.view(v, proj)
		}
		return err
	})
	return out, err
}

// Resize grows a volume that no sandbox has attached; the filesystem
// grows into it when a sandbox next mounts it writable.
func (s *Service) Resize(ctx context.Context, accountRef, projectRef, ref string, sizeGB int) (out *View, err error) {
	var v *store.Volume
	defer func() {
		target, account := ref, ""
		if v != nil {
			target, account = v.ID, v.AccountID
		}
		s.o.Audit.Record(ctx, "resizeVolume", account, target, err)
	}()
	var proj *store.Project
	if err := s.db.Update(ctx, func(tx Tx) error {
		var err error
		v, proj, err = s.find(ctx, tx, "resizeVolume", accountRef, projectRef, ref)
		return err
	}); err != nil {
		return nil, err
	}
	switch {
	case sizeGB < v.SizeGB:
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "size_gb", "size_gb %d: a volume only grows (it is %d)", sizeGB, v.SizeGB)
	case sizeGB > s.o.MaxGB:
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "size_gb", "size_gb %d: at most %d on this host", sizeGB, s.o.MaxGB)
	case len(v.Attachments) > 0:
		return nil, sandbox.Errorf(sandbox.ErrState, "", "volume %s is attached to %s: it grows while no sandbox has it", v.Name, v.Attachments[0].SandboxID)
	case v.Busy != "":
		return nil, sandbox.Errorf(sandbox.ErrState, "", "volume %s is %s: try again in a moment", v.Name, v.Busy)
	case v.Layers > 0:
		return nil, sandbox.Errorf(sandbox.ErrState, "", "volume %s still has layers to fold: try again in a moment", v.Name)
	case v.Host != s.o.Host:
		return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "volume %s lives on host %s", v.Name, v.Host)
	}
	key, err := secrets.DataKey(ctx, s.o.Secrets, scope(v.ID))
	if err != nil {
		return nil, err
	}
	// The record is claimed first, so that no create attaches the volume
	// while its file grows.
	oldGB := v.SizeGB
	if err := s.db.Update(ctx, func(tx Tx) error {
		cur, err := tx.GetVolume(ctx, v.ID)
		if err != nil {
			return err
		}
		if len(cur.Attachments) > 0 || cur.Busy != "" || cur.Layers > 0 {
			return sandbox.Errorf(sandbox.ErrState, "", "volume %s was attached meanwhile", v.Name)
		}
		if err := s.withinQuota(ctx, tx, proj, sizeGB-cur.SizeGB); err != nil {
			return err
		}
		cur.Busy = "resizing"
		v = cur
		return tx.PutVolume(ctx, cur)
	}); err != nil {
		return nil, err
	}
	undo, gerr := s.admit(ctx, v, oldGB, sizeGB)
	if gerr == nil {
		if gerr = voldisk.Grow(ctx, s.o.Tools, s.path(v.ID), int64(sizeGB)<<30, key); gerr != nil {
			undo()
		}
	}
	err = s.db.Update(context.WithoutCancel(ctx), func(tx Tx) error {
		cur, err := tx.GetVolume(ctx, v.ID)
		if err != nil {
			return err
		}
		cur.Busy = ""
		if gerr == nil {
			cur.SizeGB = sizeGB
		}
		v = cur
		return tx.PutVolume(ctx, cur)
	})
	if gerr != nil {
		return nil, gerr
	}
	return s.view(v, proj), err
}

// Delete erases a volume that no sandbox has attached: its key, its
// file, its record.
func (s *Service) Delete(ctx context.Context, accountRef, projectRef, ref string) (err error) {
	var v *store.Volume
	defer func() {
		target, account := ref, ""
		if v != nil {
			target, account = v.ID, v.AccountID
		}
		s.o.Audit.Record(ctx, "deleteVolume", account, target, err)
	}()
	if err := s.db.Update(ctx, func(tx Tx) error {
		var err error
		if v, _, err = s.find(ctx, tx, "deleteVolume", accountRef, projectRef, ref); err != nil {
			return err
		}
		if len(v.Attachments) > 0 {
			return sandbox.Errorf(sandbox.ErrState, "", "volume %s is attached to sandbox %s: delete or stop using it first", v.Name, v.Attachments[0].SandboxID)
		}
		if v.Busy != "" {
			return sandbox.Errorf(sandbox.ErrState, "", "volume %s is %s: try again in a moment", v.Name, v.Busy)
		}
		if v.Host != s.o.Host {
			return sandbox.Errorf(sandbox.ErrUnavailable, "", "volume %s lives on host %s: delete it there", v.Name, v.Host)
		}
		return tx.DeleteVolume(ctx, v.ID)
	}); err != nil {
		return err
	}
	octx := context.WithoutCancel(ctx)
	if s.o.Meter != nil {
		s.o.Meter.Volume(octx, v, v.SizeGB, 0, false)
	}
	if s.hold(v.ID, false) && s.o.Capacity != nil {
		s.o.Capacity.Release(sandbox.Resources{DiskGB: v.SizeGB})
	}
	return s.erase(octx, v.ID)
}
