package sandboxrt

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/internal/mounts"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets/sandboxkeys"
)

// Adopt runs at start: it re-attaches to sandboxes whose VMs still run,
// marks the ones whose VMs died as stopped, and cleans up what a crash left
// half-made (records in "creating", machine directories with no record).
func (e *Runtime) Adopt(ctx context.Context) error {
	recs, err := e.store.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	var live []string
	for _, rec := range recs {
		if e.hosts.Foreign(rec) {
			continue // (another host's)
		}
		if e.shared && rec.Host == "" && !exists(rec.StateDir) {
			// From before hosts, and nothing of it on this machine:
			// another host's (it takes it when it starts).
			continue
		}
		if rec.Host != e.hosts.Name() && rec.State != sandbox.StateDeleted {
			// A record from before hosts (or, on SQLite, from before the
			// machine was renamed): this host runs it.
			rec.Host = e.hosts.Name()
			e.store.PutSandbox(ctx, rec)
		}
		if rec.AccountID == "" {
			// A record from before tenancy: it belongs to the default
			// account's default project.
			if err := e.placeDefault(ctx, rec); err != nil {
				return err
			}
		}
		b := &box{rec: rec, deleting: make(chan struct{})}
		if rec.State != sandbox.StateDeleted && rec.State != sandbox.StateCreating {
			if erased, err := sandboxkeys.Erased(ctx, e.sec, rec.ID); err != nil {
				e.log.Warn("cannot tell whether the sandbox's key was erased", "id", rec.ID, "err", err)
			} else if erased || deleting(rec) {
				// A delete the engine died in: its record said so first
				// (or, from an engine before that, its key is erased and
				// its console identity is not yet). Finish it.
				e.log.Warn("finishing a delete the engine died in", "id", rec.ID)
				e.destroy(ctx, b)
				rec.State = sandbox.StateDeleted
				e.store.PutSandbox(ctx, rec)
				e.urls.Forget(ctx, rec.ID)
				continue
			}
		}
		switch rec.State {
		case sandbox.StateDeleted:
			continue
		case sandbox.StateStopped:
			// One stopped by Stop keeps its disk for Start; a VMM on it is
			// one a Start launched before the engine died.
			keep[rec.ID] = rec.Kept
			if rec.Kept {
				procs.KillVMMs(rec.StateDir)
				e.boxes.drop(rec.ID, rec)
			}
			continue
		case sandbox.StateHibernated:
			// Its memory and disk are in its hibernation files; a VMM on its
			// directory is the one a hibernate (or a resume) left behind
			// when the engine died.
			e.hibernation.Finish(ctx, rec)
			keep[rec.ID] = true
			e.boxes.drop(rec.ID, rec)
			continue
		case sandbox.StateCreating:
			e.log.Warn("cleaning up a sandbox whose create was interrupted", "id", rec.ID)
			e.destroy(ctx, b)
			rec.State, rec.Error = sandbox.StateDeleted, "the engine stopped while the sandbox was being created"
			e.store.PutSandbox(ctx, rec)
			continue
		}
		if rec.Handle == nil {
			e.stopped(ctx, b, "no machine handle was recorded")
			continue
		}
		m, err := e.hv.Attach(ctx, *rec.Handle)
		if errors.Is(err, hypervisor.ErrNotFound) && rec.Kept {
			// A Stop the engine died in: the sandbox is stopped, and keeps
			// its disk and key as asked.
			e.log.Warn("finishing a stop the engine died in", "id", rec.ID)
			procs.KillVMMs(rec.StateDir)
			e.net.Detach(ctx, rec.ID)
			rec.State, rec.Handle, rec.Error = sandbox.StateStopped, nil, ""
			e.store.PutSandbox(ctx, rec)
			keep[rec.ID] = true
			e.boxes.drop(rec.ID, rec)
			continue
		}
		if errors.Is(err, hypervisor.ErrNotFound) {
			e.log.Warn("sandbox VM is gone", "id", rec.ID, "err", err)
			e.stopped(ctx, b, "the VM stopped while the engine was not running")
			continue
		}
		if err != nil {
			// Not proof that the VM is gone (a busy QMP socket, a plugin
			// hiccup): leave it and its files alone; the next start retries.
			e.log.Error("cannot re-adopt sandbox; leaving it untouched", "id", rec.ID, "err", err)
			keep[rec.ID] = true
			live = append(live, rec.ID)
			continue
		}
		b.useMachine(m)
		rec.Kept = false // (a stop that did not get as far as the VM: it runs)
		// Lost: the other hosts marked it while this one was down.
		if rec.State == sandbox.StateLost {
			rec.State, rec.Error = sandbox.StateRunning, ""
		}
		// The host resolver and egress proxy live in this process: give
		// them the sandbox's policy again (the tap and nftables persist).
		policy, err := firewall.Stored(rec.Extra[firewall.RecordKey])
		if err == nil {
			_, err = e.attach(ctx, rec, policy)
		}
		if err != nil {
			e.log.Warn("cannot restore the sandbox's network services; its nftables policy stays in force", "id", rec.ID, "err", err)
		}
		remount := false
		if info, err := m.Info(ctx); err == nil && info.State == hypervisor.StatePaused {
			rec.State = sandbox.StatePaused
			// Paused by an engine that died in a snapshot or hibernate
			// of it running: it runs on.
			if exists(filepath.Join(rec.StateDir, pausedMark)) {
				if err := m.Resume(ctx); err != nil {
					e.log.Warn("cannot resume a sandbox paused for a snapshot an engine died in", "id", rec.ID, "err", err)
				} else {
					rec.State = sandbox.StateRunning
					e.log.Info("resumed a sandbox paused for a snapshot an engine died in", "id", rec.ID)
					remount = len(rec.Volumes) > 0 // (detached for the snapshot)
				}
			}
		}
		unmarkPaused(rec.StateDir)
		if err := e.capacity.Force(rec.Size); err != nil {
			e.log.Warn("adopted sandbox exceeds the admission limits", "id", rec.ID, "err", err)
		}
		if b.keys, err = sandboxkeys.Load(ctx, e.sec, rec.ID); err != nil {
			e.log.Warn("cannot load the sandbox's data key", "id", rec.ID, "err", err)
		}
		if err := e.guests.LoadEnv(ctx, b.guest()); err != nil {
			e.log.Warn("cannot load the sandbox's environment; its execs get none", "id", rec.ID, "err", err)
		}
		if err := e.guests.LoadCredentials(ctx, b.guest()); err != nil {
			e.log.Warn("cannot load the sandbox's credentials; they are not injected", "id", rec.ID, "err", err)
		}
		e.store.PutSandbox(ctx, rec)
		e.boxes.put(b)
		keep[rec.ID] = true
		live = append(live, rec.ID)
		if remount {
			c, err := b.client(ctx, e)
			if err == nil {
				err = e.volumes.Mount(ctx, rec, m, c)
			}
			if err != nil {
				e.log.Warn("a sandbox resumed after a snapshot an engine died in runs without its volumes mounted", "id", rec.ID, "err", err)
			}
		}
		e.log.Info("re-adopted sandbox", "id", rec.ID, "state", rec.State)
	}
	for _, b := range e.boxes.all() {
		e.watch(b)
	}
	// Machine directories without a live sandbox are leftovers.
	ents, _ := os.ReadDir(e.machinesDir())
	for _, ent := range ents {
		if !keep[ent.Name()] {
			dir := filepath.Join(e.machinesDir(), ent.Name())
			e.log.Warn("removing leftover machine directory", "dir", dir)
			procs.KillVMMs(dir)
			if err := mounts.RemoveAll(dir); err != nil {
				e.log.Warn("cannot remove a leftover machine directory", "dir", dir, "err", err)
			}
		}
	}
	return e.net.Prune(ctx, live)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
