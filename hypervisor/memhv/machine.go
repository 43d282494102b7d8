package memhv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/guest"
	"github.com/harebox/harebox/hypervisor"
)

// pidBase keeps fake pids above Linux's PID_MAX_LIMIT (1<<22), so that no
// fake pid is ever a real process's.
const pidBase = 1 << 22

// pids is package-wide, so a handle from another Hypervisor never matches.
var pids atomic.Int64

// machine is one fake VM.
type machine struct {
	hv      *Hypervisor
	spec    hypervisor.Spec
	pid     int
	started time.Time
	sock    string
	agent   *agent

	// ctx ends when the machine stops, closing its agent sessions.
	ctx      context.Context
	cancel   context.CancelFunc
	ln       net.Listener
	stopOnce sync.Once
	// encrypted: launched with a DataKey, so snapshots must be sealed.
	encrypted bool
	// diskKey seals the files kept when the machine stops (its "disk",
	// which a launch with Reuse opens again).
	diskKey []byte

	mu      sync.Mutex
	volumes map[string]hypervisor.Volume // plugged in, by ID
	state   hypervisor.State
	resumed chan struct{} // made by Pause, closed by Resume or stop
	stopped chan struct{} // closed once stopped
}

var _ hypervisor.Machine = (*machine)(nil)

func newMachine(h *Hypervisor, spec hypervisor.Spec, sock string, fs *fsys) *machine {
	m := &machine{
		hv: h, spec: spec.WithoutKeys(), encrypted: len(spec.DataKey) > 0, diskKey: bytes.Clone(spec.DataKey), pid: pidBase + int(pids.Add(1)), started: time.Now().UTC(), sock: sock,
		state: hypervisor.StateRunning, stopped: make(chan struct{}),
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.agent = &agent{m: m, fs: fs}
	return m
}

// listen creates the state directory and serves the agent on its socket,
// one session per connection, as a VMM's serial socket would carry it.
func (m *machine) listen() error {
	if err := os.MkdirAll(m.spec.StateDir, 0o700); err != nil {
		return err
	}
	ln, err := net.Listen("unix", m.sock)
	if err != nil {
		return err
	}
	m.ln = ln
	m.logf("memhv: machine %s started", m.spec.ID)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go guest.ServeConn(m.ctx, c, m.agent)
		}
	}()
	return nil
}

// logf appends a line to the machine's console log, where the engine looks
// when a machine fails or exits.
func (m *machine) logf(format string, args ...any) {
	p := m.spec.SerialLog
	if p == "" {
		p = filepath.Join(m.spec.StateDir, "serial.log")
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return
	}
	fmt.Fprintf(f, format+"\n", args...)
	f.Close()
}

func (m *machine) ID() string { return m.spec.ID }

func (m *machine) Handle() hypervisor.Handle {
	b, _ := json.Marshal(handleData{PID: m.pid})
	return hypervisor.Handle{Backend: Name, ID: m.spec.ID, Data: b}
}

func (m *machine) AgentEndpoint() hypervisor.AgentEndpoint {
	return hypervisor.AgentEndpoint{Transport: hypervisor.TransportSerial, Path: m.sock}
}

func (m *machine) Info(context.Context) (hypervisor.Info, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return hypervisor.Info{ID: m.spec.ID, State: m.state, PID: m.pid, Started: m.started}, nil
}

// Pause freezes the agent: calls wait until Resume. Pausing a paused
// machine is a no-op, as in QEMU.
func (m *machine) Pause(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch m.state {
	case hypervisor.StateStopped:
		return hypervisor.Errorf(hypervisor.ErrState, "memhv: %s has stopped", m.spec.ID)
	case hypervisor.StateRunning:
		m.state = hypervisor.StatePaused
		m.resumed = make(chan struct{})
	}
	return nil
}

func (m *machine) Resume(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch m.state {
	case hypervisor.StateStopped:
		return hypervisor.Errorf(hypervisor.ErrState, "memhv: %s has stopped", m.spec.ID)
	case hypervisor.StatePaused:
		m.state = hypervisor.StateRunning
		close(m.resumed)
		m.resumed = nil
	}
	return nil
}

// awake returns once the machine runs, as a frozen guest's agent answers
// only after Resume; it fails when ctx ends or the machine stops.
func (m *machine) awake(ctx context.Context) error {
	for {
		m.mu.Lock()
		state, resumed := m.state, m.resumed
		m.mu.Unlock()
		switch state {
		case hypervisor.StateRunning:
			return nil
		case hypervisor.StateStopped:
			return status.Error(codes.Unavailable, "the machine has stopped")
		}
		select {
		case <-resumed:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// Snapshot pauses the machine and writes its spec and files into dir,
// sealed under key (the rules on keys are the real backends').
func (m *machine) Snapshot(_ context.Context, dir string, key []byte) error {
	if !filepath.IsAbs(dir) {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "memhv: snapshot dir %q: want an absolute path", dir)
	}
	switch {
	case len(key) != 0 && len(key) != hypervisor.KeySize:
		return hypervisor.Errorf(hypervisor.ErrInvalid, "memhv: snapshot key of %d bytes", len(key))
	case m.encrypted != (len(key) > 0):
		return hypervisor.Errorf(hypervisor.ErrInvalid, "memhv: %s: a snapshot key is needed exactly for a machine launched with a data key", m.spec.ID)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		if os.IsExist(err) {
			return hypervisor.Errorf(hypervisor.ErrExists, "memhv: snapshot dir %s exists", dir)
		}
		return fmt.Errorf("memhv: snapshot: %w", err)
	}
	m.mu.Lock()
	plugged := len(m.volumes)
	m.mu.Unlock()
	if plugged > 0 {
		os.RemoveAll(dir)
		return hypervisor.Errorf(hypervisor.ErrState, "memhv: %s has volumes plugged in: unplug them before a snapshot", m.spec.ID)
	}
	err := m.Pause(context.Background())
	if err == nil {
		err = writeSnapshot(dir, snapshot{Version: snapshotVersion, Spec: m.spec, Files: m.agent.fs.clone().nodes}, key)
	}
	if err != nil {
		os.RemoveAll(dir)
	}
	return err
}

// PlugVolume records the volume as plugged in: the fake guest mounts it
// (an empty directory; what is written there stays in this machine).
func (m *machine) PlugVolume(_ context.Context, v hypervisor.Volume) error {
	if err := v.Validate(); err != nil {
		return err
	}
	if _, err := os.Stat(v.Path); err != nil {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "memhv: volume %s: %v", v.ID, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.state == hypervisor.StateStopped {
		return hypervisor.Errorf(hypervisor.ErrState, "memhv: %s has stopped", m.spec.ID)
	}
	if _, ok := m.volumes[v.ID]; ok {
		return hypervisor.Errorf(hypervisor.ErrExists, "memhv: volume %s is plugged into %s already", v.ID, m.spec.ID)
	}
	if m.volumes == nil {
		m.volumes = map[string]hypervisor.Volume{}
	}
	v.Key = nil
	m.volumes[v.ID] = v
	return nil
}

// UnplugVolume forgets a plugged volume.
func (m *machine) UnplugVolume(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.volumes[id]; !ok {
		return hypervisor.Errorf(hypervisor.ErrNotFound, "memhv: volume %s is not plugged into %s", id, m.spec.ID)
	}
	delete(m.volumes, id)
	return nil
}

// LayerVolume moves the plugged volume's top to path.
func (m *machine) LayerVolume(_ context.Context, id, path string) error {
	if err := hypervisor.ValidateLayer(id, path); err != nil {
		return err
	}
	if _, err := os.Stat(path); err != nil {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "memhv: volume %s: %v", id, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.volumes[id]
	switch {
	case !ok:
		return hypervisor.Errorf(hypervisor.ErrNotFound, "memhv: volume %s is not plugged into %s", id, m.spec.ID)
	case v.Path == path:
		return nil
	case v.ReadOnly:
		return hypervisor.Errorf(hypervisor.ErrInvalid, "memhv: volume %s is plugged into %s read-only", id, m.spec.ID)
	}
	v.Backing = append([]string{v.Path}, v.Backing...)
	v.Path = path
	m.volumes[id] = v
	return nil
}

func (m *machine) plugged(id string) (hypervisor.Volume, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.volumes[id]
	return v, ok
}

// Shutdown powers the machine off at once: there is no guest to wait for.
func (m *machine) Shutdown(context.Context) error {
	m.stop("powered off")
	return nil
}

func (m *machine) Kill(context.Context) error {
	m.stop("killed")
	return nil
}

func (m *machine) Wait(ctx context.Context) error {
	select {
	case <-m.stopped:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Cleanup removes the state directory; a console log the caller placed
// outside it stays.
func (m *machine) Cleanup(context.Context) error {
	select {
	case <-m.stopped:
	default:
		return hypervisor.Errorf(hypervisor.ErrState, "memhv: %s is still running", m.spec.ID)
	}
	if err := os.RemoveAll(m.spec.StateDir); err != nil {
		return fmt.Errorf("memhv: cleanup: %w", err)
	}
	return nil
}

// stop ends the machine once: sessions close, the socket goes, Attach no
// longer finds it, and calls waiting in a pause fail. The state turns
// stopped last, so whoever sees it (Wait, Info, Cleanup) sees all of that
// done.
func (m *machine) stop(why string) {
	m.stopOnce.Do(func() {
		m.cancel()
		m.ln.Close()
		m.hv.forget(m)
		m.logf("memhv: machine %s %s", m.spec.ID, why)
		// The files stay on the machine's "disk", as a real disk would.
		// (Not when the state directory is gone: nothing is made again.)
		disk := filepath.Join(m.spec.StateDir, diskDir)
		if err := os.Mkdir(disk, 0o700); err == nil || os.IsExist(err) {
			writeSnapshot(disk, snapshot{Version: snapshotVersion, Spec: m.spec, Files: m.agent.fs.clone().nodes}, m.diskKey)
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		m.state = hypervisor.StateStopped
		if m.resumed != nil {
			close(m.resumed)
			m.resumed = nil
		}
		close(m.stopped)
	})
}
