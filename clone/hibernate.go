package clone

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/monitor"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Hibernation. The engine hibernates a running or paused sandbox (under
// its lock: its record says hibernated before its VMM goes) and wakes it
// (admitted again as a create is); Hibernation holds its files: its
// memory, device state and disk written into DATA_DIR/hibernated/<id> (a
// snapshot under the sandbox's own data key), the origin a wake restores
// it from (under the same ID, key and machine-id, on a fresh network
// attachment), and what a crash left of either. Nothing of this lives in
// a process: a hibernated sandbox resumes after hareboxd restarts and
// after the host reboots.

// SandboxStore is what Hibernation needs of the store.
type SandboxStore interface {
	GetSandbox(ctx context.Context, id string) (*store.Sandbox, error)
	PutSandbox(ctx context.Context, s *store.Sandbox) error
}

// HibernationOptions are Hibernation's parts.
type HibernationOptions struct {
	Hypervisor hypervisor.Hypervisor
	Network    network.Network
	Store      SandboxStore
	// Dir holds the hibernated sandboxes' files (DATA_DIR/hibernated).
	Dir string
	// Foreign reports whether a record is another host's (a sandbox that
	// moved away, or one whose move here did not finish): Prune removes
	// its files here. Nil: none is.
	Foreign func(*store.Sandbox) bool
	Log     *slog.Logger
}

// Hibernation holds the hibernated sandboxes' files.
type Hibernation struct{ o HibernationOptions }

// NewHibernation returns the hibernation files under o.Dir.
func NewHibernation(o HibernationOptions) *Hibernation {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &Hibernation{o: o}
}

func (h *Hibernation) dir(id string) string { return filepath.Join(h.o.Dir, id) }

// Dir is where sandbox id's hibernation files are.
func (h *Hibernation) Dir(id string) string { return h.dir(id) }

// IncomingDir is where sandbox id's hibernation files are written as
// they arrive from another host (package move), before they move to Dir
// whole; Prune removes what a move cut short left there.
func (h *Hibernation) IncomingDir(id string) string {
	return filepath.Join(h.o.Dir, incoming+id)
}

// incoming starts the name of a move's files on their way in.
const incoming = ".incoming-"

// Prepare makes room for sandbox id's hibernation files: those of a
// hibernate that failed before go.
func (h *Hibernation) Prepare(id string) error {
	dir := h.dir(id)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	os.RemoveAll(dir)
	return nil
}

// Write writes machine m of sandbox id, under its data key, into its
// hibernation files, and returns what they take on disk. It leaves m
// paused; on failure no files are left.
func (h *Hibernation) Write(ctx context.Context, m hypervisor.Machine, id string, key []byte) (int64, error) {
	dir := h.dir(id)
	if err := m.Snapshot(ctx, dir, key); err != nil {
		os.RemoveAll(dir)
		return 0, err
	}
	return monitor.DiskUse(dir), nil
}

// Bytes is what sandbox id's hibernation files take on disk.
func (h *Hibernation) Bytes(id string) int64 { return monitor.DiskUse(h.dir(id)) }

// Remove removes sandbox id's hibernation files.
func (h *Hibernation) Remove(id string) error { return os.RemoveAll(h.dir(id)) }

// Origin is what sandbox id wakes from: its hibernation files, under its
// data key.
func (h *Hibernation) Origin(id string, key []byte) (*Origin, error) {
	dir := h.dir(id)
	if _, err := os.Stat(dir); err != nil {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "sandbox %s: its hibernation files are gone: %v", id, err)
	}
	return &Origin{Snap: &store.Snapshot{Dir: dir}, Key: key, Wake: true}, nil
}

// Finish, at start, stops a VMM that a hibernated sandbox's record still
// names: one a hibernate did not get to stop, or one a wake had launched
// when the engine died. Its files stay.
func (h *Hibernation) Finish(ctx context.Context, rec *store.Sandbox) {
	if rec.Handle != nil {
		h.o.Log.Warn("finishing a hibernate (or a resume) the engine died in", "id", rec.ID)
		if m, err := h.o.Hypervisor.Attach(ctx, *rec.Handle); err == nil {
			m.Kill(ctx)
			m.Wait(ctx)
			m.Cleanup(ctx)
		}
		rec.Handle = nil
		h.o.Store.PutSandbox(ctx, rec)
	}
	procs.KillVMMs(rec.StateDir)
	os.RemoveAll(rec.StateDir)
	h.o.Network.Detach(ctx, rec.ID)
}

// Prune removes hibernation files whose sandbox is not hibernated (a
// hibernate that failed, or that a crash cut short before its record said
// so), or not on this host (it moved away, or its move here failed), and
// the files of moves that did not arrive whole.
func (h *Hibernation) Prune(ctx context.Context) error {
	ents, err := os.ReadDir(h.o.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, d := range ents {
		rec, err := h.o.Store.GetSandbox(ctx, d.Name())
		if strings.HasPrefix(d.Name(), incoming) || errors.Is(err, store.ErrNotFound) ||
			(err == nil && (rec.State != sandbox.StateHibernated || (h.o.Foreign != nil && h.o.Foreign(rec)))) {
			h.o.Log.Info("removing hibernation files of a sandbox that is not hibernated", "id", d.Name())
			os.RemoveAll(filepath.Join(h.o.Dir, d.Name()))
		}
	}
	return nil
}
