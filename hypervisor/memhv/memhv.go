// Package memhv is an in-memory hypervisor.Hypervisor for fast tests of
// the engine and the API, in the manner of gocloud.dev's memblob.
//
// A memhv machine is not a VM: it runs no kernel and no code, on the guest
// or on the host. Each machine serves a fake guest agent on a Unix socket
// in its state directory, over the real agent's transport (yamux and gRPC,
// guest.ServeConn), so the engine dials it as it dials a VM. The fake agent
// keeps an in-memory filesystem, with the real agent's checks and gRPC
// codes, and answers Exec with a few built-in commands:
//
//	echo ARGS     prints ARGS joined by spaces, and a newline
//	cat PATH...   prints files (relative paths from cwd, default the home)
//	cat           with stdin, copies it until its end
//	true, false   exit 0, exit 1
//	exit [N]      ends the exec with N (default: the last command's code)
//	printenv NAME prints the exec's variable NAME (exit 1 without it)
//	sleep SECS    waits; the request's timeout (timed_out, signal 9), a
//	              signal or the caller going away end it
//	stubborn SECS sleep, but the timeout does not end it (an agent that
//	              does not enforce timeouts, for the host's backstop)
//
// Anything else writes "fake agent: command not found: NAME" to stderr and
// exits 127. Argv is one command. A shell string is split into commands on
// ';' and newlines, and each on whitespace: no quoting, variables, pipes or
// globs; a trailing ">&2" sends a command's output to stderr. Stdin is
// read only by "cat" without paths; terminal sizes are dropped; the
// environment is only read by "printenv NAME"; the users are root, user
// (the default) and numeric ids. Of the agent's file calls, Watch is not
// served (Unimplemented).
//
// As in the real backends: specs are validated and errors carry the
// portable kinds; a paused machine's agent answers no call until Resume
// (calls wait, or fail at their deadline); Attach re-adopts running
// machines of the same *Hypervisor (give a restarted engine the same
// value) and reports ErrNotFound for any other; Snapshot writes the
// machine's files into the snapshot directory, and Restore boots a clone
// with its own ID, socket and copy of them. Not modelled: disks (checked
// to exist, never read or written), network, entropy, processes.
package memhv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/sealstream"
)

// Name is the backend's name in capabilities and handles.
const Name = "memhv"

const (
	agentSocket = "agent.sock"
	// maxSocketPath leaves room below sun_path's 107 bytes, as the real
	// backends do.
	maxSocketPath = 100
	snapshotFile  = "snapshot.json"
	// sealedFile replaces snapshotFile for a machine with a data key.
	sealedFile = "snapshot.sealed"
	// snapshotVersion changes when the snapshot file's layout does.
	snapshotVersion = 1
)

// Options tune a Hypervisor for a test.
type Options struct {
	// LaunchDelay is added to every Launch and Restore, standing for boot
	// time (for timeout and concurrency tests).
	LaunchDelay time.Duration
}

// Hypervisor is an in-memory backend. It is safe for concurrent use.
type Hypervisor struct {
	opts Options

	mu       sync.Mutex
	machines map[string]*machine // running or paused, by ID
	launched int
	failNext error
}

var _ hypervisor.Hypervisor = (*Hypervisor)(nil)

// New returns an empty in-memory hypervisor.
func New(opts Options) *Hypervisor {
	return &Hypervisor{opts: opts, machines: map[string]*machine{}}
}

// Launched reports how many times Launch and Restore were called, whether
// or not they succeeded: a test sees that a refused request never reached
// the hypervisor.
func (h *Hypervisor) Launched() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.launched
}

// FailNextLaunch makes the next Launch or Restore return err (after
// LaunchDelay) without starting a machine.
func (h *Hypervisor) FailNextLaunch(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failNext = err
}

// Machine returns the running or paused machine with this ID, so a test
// can act as the VM would on its own (Kill stands for a crash).
func (h *Hypervisor) Machine(id string) (hypervisor.Machine, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, ok := h.machines[id]
	return m, ok
}

// Plugged counts the volumes plugged into the machine with this ID (0
// when it does not run).
func (h *Hypervisor) Plugged(id string) int {
	h.mu.Lock()
	m, ok := h.machines[id]
	h.mu.Unlock()
	if !ok {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.volumes)
}

// Volume returns the volume plugged into the machine with this ID as
// volID, with its files as they are now (LayerVolume moves its top).
func (h *Hypervisor) Volume(id, volID string) (hypervisor.Volume, bool) {
	h.mu.Lock()
	m, ok := h.machines[id]
	h.mu.Unlock()
	if !ok {
		return hypervisor.Volume{}, false
	}
	return m.plugged(volID)
}

// Spec returns the spec the machine with this ID runs with, keys
// included, so a test can check what the engine gave it.
func (h *Hypervisor) Spec(id string) (hypervisor.Spec, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, ok := h.machines[id]
	if !ok {
		return hypervisor.Spec{}, false
	}
	spec := m.spec
	spec.DataKey = bytes.Clone(m.diskKey)
	return spec, true
}

// Close kills every machine still running or paused. Their files stay until
// Cleanup.
func (h *Hypervisor) Close() error {
	h.mu.Lock()
	ms := make([]*machine, 0, len(h.machines))
	for _, m := range h.machines {
		ms = append(ms, m)
	}
	h.mu.Unlock()
	for _, m := range ms {
		m.stop("killed: hypervisor closed")
	}
	return nil
}

// Capabilities implements hypervisor.Hypervisor.
func (h *Hypervisor) Capabilities(context.Context) (hypervisor.Capabilities, error) {
	return hypervisor.Capabilities{
		Name:            Name,
		Accelerator:     "none",
		Notice:          "in-memory fake for tests: runs no code",
		Snapshot:        true,
		Encryption:      true,
		Reuse:           true,
		Pause:           true,
		Volumes:         true,
		AgentTransports: []string{hypervisor.TransportSerial},
		Version:         "1",
	}, nil
}

// begin counts a Launch or Restore, waits LaunchDelay and fires an injected
// failure.
func (h *Hypervisor) begin(ctx context.Context) error {
	h.mu.Lock()
	h.launched++
	fail := h.failNext
	h.failNext = nil
	h.mu.Unlock()
	if d := h.opts.LaunchDelay; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("memhv: launch: %w", ctx.Err())
		}
	}
	return fail
}

// Launch implements hypervisor.Hypervisor.
func (h *Hypervisor) Launch(ctx context.Context, spec hypervisor.Spec) (hypervisor.Machine, error) {
	if err := h.begin(ctx); err != nil {
		return nil, err
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	// As the real backends: the files a VMM would open must exist.
	paths := []string{spec.Kernel, spec.Initrd}
	for _, d := range spec.Disks {
		paths = append(paths, d.Path)
	}
	for _, p := range paths {
		if _, err := os.Stat(p); p != "" && err != nil {
			return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "memhv: %v", err)
		}
	}
	if !spec.Reuse {
		// Block devices are files, /dev/vda on, in the order of the disks.
		fs := newFS()
		now := time.Now()
		fs.nodes["/dev"] = &node{Dir: true, Mode: 0o755, MTime: now}
		for i := range spec.Disks {
			fs.nodes["/dev/vd"+string(rune('a'+i))] = &node{Mode: 0o660, MTime: now}
		}
		return h.start(spec, fs)
	}
	// The disk an earlier launch left, under the same key.
	open := spec
	open.SnapshotKey = spec.DataKey
	snap, err := readSnapshot(filepath.Join(spec.StateDir, diskDir), open)
	if err != nil {
		return nil, hypervisor.Errorf(hypervisor.ErrNotFound, "memhv: reuse: the disk of an earlier launch: %v", err)
	}
	os.Remove(filepath.Join(spec.StateDir, agentSocket))
	return h.start(spec, &fsys{nodes: snap.Files})
}

// diskDir is where a stopped machine's files stay (its "disk").
const diskDir = "disk"

// handleData is a Handle's Data: the fake pid tells a machine from an
// earlier one with the same ID.
type handleData struct {
	PID int `json:"pid"`
}

// Attach implements hypervisor.Hypervisor.
func (h *Hypervisor) Attach(_ context.Context, hd hypervisor.Handle) (hypervisor.Machine, error) {
	if hd.Backend != Name {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "memhv: handle is for backend %q", hd.Backend)
	}
	var d handleData
	if err := json.Unmarshal(hd.Data, &d); err != nil || d.PID <= 0 {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "memhv: bad handle for %q", hd.ID)
	}
	h.mu.Lock()
	m := h.machines[hd.ID]
	h.mu.Unlock()
	if m == nil || m.pid != d.PID {
		return nil, hypervisor.Errorf(hypervisor.ErrNotFound, "memhv: machine %s is not running", hd.ID)
	}
	return m, nil
}

// snapshot is the file a snapshot directory holds: the machine's spec and
// its whole filesystem (memory and disks are one in memhv).
type snapshot struct {
	Version int              `json:"version"`
	Spec    hypervisor.Spec  `json:"spec"`
	Files   map[string]*node `json:"files"`
}

// Restore implements hypervisor.Hypervisor.
func (h *Hypervisor) Restore(ctx context.Context, dir string, spec hypervisor.Spec) (hypervisor.Machine, error) {
	if err := h.begin(ctx); err != nil {
		return nil, err
	}
	if err := spec.ValidKeys(); err != nil {
		return nil, err
	}
	snap, err := readSnapshot(dir, spec)
	if err != nil {
		return nil, err
	}
	if snap.Version != snapshotVersion {
		return nil, hypervisor.Errorf(hypervisor.ErrUnsupported, "memhv: snapshot version %d, want %d", snap.Version, snapshotVersion)
	}
	// The clone keeps the snapshot's hardware and takes its identity from
	// spec, with the real backends' rule on networks.
	clone := snap.Spec
	clone.ID, clone.StateDir, clone.SerialLog, clone.Labels = spec.ID, spec.StateDir, spec.SerialLog, spec.Labels
	clone.Network, clone.DataKey = spec.Network, spec.DataKey
	clone.SharedMemory = spec.SharedMemory // (asked, kept for Spec: nothing here is shared)
	if (clone.Network == nil) != (snap.Spec.Network == nil) {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "memhv: restore: the clone must have a network exactly when the snapshot has one")
	}
	if err := clone.Validate(); err != nil {
		return nil, err
	}
	return h.start(clone, &fsys{nodes: snap.Files})
}

// start makes the state directory and serves the machine's agent.
func (h *Hypervisor) start(spec hypervisor.Spec, fs *fsys) (*machine, error) {
	sock := filepath.Join(spec.StateDir, agentSocket)
	if len(sock) > maxSocketPath {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "memhv: state dir %s is too long for Unix socket paths", spec.StateDir)
	}
	if ents, _ := os.ReadDir(spec.StateDir); len(ents) > 0 && !spec.Reuse {
		return nil, hypervisor.Errorf(hypervisor.ErrExists, "memhv: state dir %s is not empty", spec.StateDir)
	}
	m := newMachine(h, spec, sock, fs)
	// Under the lock, so that two launches of one ID cannot both pass.
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, dup := h.machines[spec.ID]; dup {
		return nil, hypervisor.Errorf(hypervisor.ErrExists, "memhv: machine %s is already running", spec.ID)
	}
	if err := m.listen(); err != nil {
		m.cancel()
		os.RemoveAll(spec.StateDir)
		return nil, fmt.Errorf("memhv: launch %s: %w", spec.ID, err)
	}
	h.machines[spec.ID] = m
	return m, nil
}

func (h *Hypervisor) forget(m *machine) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.machines[m.spec.ID] == m {
		delete(h.machines, m.spec.ID)
	}
}

// Image returns an image memhv accepts: placeholder kernel and initrd files
// in dir/memhv-image (created if missing), so that the engine's image
// lookup and spec validation pass. Nothing boots them. If they cannot be
// written, Launch reports the missing files.
func Image(dir string) images.Image {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	dir = filepath.Join(dir, "memhv-image")
	img := images.Image{
		Name:          Name,
		Kernel:        filepath.Join(dir, images.KernelFile),
		Initrd:        filepath.Join(dir, images.InitrdFile),
		Cmdline:       images.BaseCmdline,
		KernelVersion: Name,
		BuiltAt:       time.Now().UTC(),
		Dir:           dir,
	}
	os.MkdirAll(dir, 0o755)
	for _, p := range []string{img.Kernel, img.Initrd} {
		if _, err := os.Stat(p); err != nil {
			os.WriteFile(p, []byte("memhv placeholder: never booted\n"), 0o644)
		}
	}
	return img
}

// writeSnapshot writes snap into dir, sealed under key when there is one.
func writeSnapshot(dir string, snap snapshot, key []byte) error {
	b, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	if len(key) == 0 {
		return os.WriteFile(filepath.Join(dir, snapshotFile), b, 0o600)
	}
	var buf bytes.Buffer
	w, err := sealstream.NewWriter(&buf, key)
	if err == nil {
		_, err = w.Write(b)
	}
	if err == nil {
		err = w.Close()
	}
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, sealedFile), buf.Bytes(), 0o600)
}

// readSnapshot reads dir's snapshot, with the real backends' rules on
// keys: a sealed one needs the key it was written under, and the clone a
// data key of its own.
func readSnapshot(dir string, spec hypervisor.Spec) (*snapshot, error) {
	b, err := os.ReadFile(filepath.Join(dir, snapshotFile))
	sealed := false
	if os.IsNotExist(err) {
		b, err = os.ReadFile(filepath.Join(dir, sealedFile))
		sealed = true
	}
	if os.IsNotExist(err) {
		return nil, hypervisor.Errorf(hypervisor.ErrNotFound, "memhv: no snapshot in %s", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("memhv: restore: %w", err)
	}
	switch {
	case sealed && (len(spec.SnapshotKey) == 0 || len(spec.DataKey) == 0):
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "memhv: restore: the snapshot is encrypted: it needs its key, and the clone a data key")
	case !sealed && len(spec.SnapshotKey) > 0:
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "memhv: restore: the snapshot is not encrypted but a snapshot key was given")
	}
	if sealed {
		r, err := sealstream.NewReader(bytes.NewReader(b), spec.SnapshotKey)
		if err == nil {
			b, err = io.ReadAll(r)
		}
		if err != nil {
			return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "memhv: restore: snapshot does not open under the snapshot key: %v", err)
		}
	}
	var snap snapshot
	if err := json.Unmarshal(b, &snap); err != nil || snap.Files["/"] == nil {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "memhv: bad snapshot in %s", dir)
	}
	return &snap, nil
}
