package cloudhypervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/vhostblk"
)

// handleData is Handle.Data for this backend.
type handleData struct {
	PID         int       `json:"pid"`
	APISocket   string    `json:"api_socket"`
	StateDir    string    `json:"state_dir"`
	VsockSocket string    `json:"vsock_socket"`
	SerialLog   string    `json:"serial_log"`
	VMMLog      string    `json:"vmm_log"`
	Started     time.Time `json:"started"`
	Version     string    `json:"version,omitempty"`
	// BlockDir is where the storage daemon serving the machine's
	// encrypted disks keeps its sockets; empty without one.
	BlockDir string `json:"block_dir,omitempty"`
	// ConsoleRecipient encrypts the console log, read from SerialSocket.
	ConsoleRecipient string `json:"console_recipient,omitempty"`
	SerialSocket     string `json:"serial_socket,omitempty"`
	// Served are the disks the storage daemon serves, in its order: what
	// a snapshot needs to copy them.
	Served []servedDisk `json:"served,omitempty"`
	// Encrypted: launched with a data key, so its snapshots are sealed
	// (with or without disks to serve).
	Encrypted bool `json:"encrypted,omitempty"`
}

// servedDisk is an encrypted overlay the storage daemon serves.
type servedDisk struct {
	// Index is the disk's place in the VM config.
	Index int `json:"index"`
	// Base is the plain image the overlay was made over; SizeBytes the
	// overlay's size asked for (0: the base's).
	Base       string `json:"base"`
	BaseFormat string `json:"base_format"`
	SizeBytes  int64  `json:"size_bytes,omitempty"`
}

// machine is one VMM process and its VM.
type machine struct {
	id   string
	data handleData
	api  API
	proc *pidFD
	// qemuImg measures a snapshot disk's base of an unusual format.
	qemuImg string
	// stopDrain stops draining the console, if this machine's is drained.
	stopDrain func()
}

var _ hypervisor.Machine = (*machine)(nil)

func (m *machine) ID() string { return m.id }

func (m *machine) Handle() hypervisor.Handle {
	data, _ := json.Marshal(m.data)
	return hypervisor.Handle{Backend: Name, ID: m.id, Data: data}
}

func (m *machine) AgentEndpoint() hypervisor.AgentEndpoint {
	return hypervisor.AgentEndpoint{
		Transport: hypervisor.TransportHybridVsock,
		Path:      m.data.VsockSocket,
		Port:      hypervisor.AgentPort,
	}
}

func (m *machine) Info(ctx context.Context) (hypervisor.Info, error) {
	info := hypervisor.Info{ID: m.id, PID: m.data.PID, Started: m.data.Started, State: hypervisor.StateStopped}
	if m.proc.exited() {
		return info, nil
	}
	vi, err := m.api.Info(ctx)
	if err != nil {
		if m.proc.exited() {
			return info, nil
		}
		return info, fmt.Errorf("machine %s: %w", m.id, err)
	}
	switch vi.State {
	case VmStateRunning:
		info.State = hypervisor.StateRunning
	case VmStatePaused:
		info.State = hypervisor.StatePaused
	}
	return info, nil
}

func (m *machine) Pause(ctx context.Context) error {
	if err := m.api.PauseVM(ctx); err != nil {
		return fmt.Errorf("machine %s: pause: %w", m.id, err)
	}
	return nil
}

func (m *machine) Resume(ctx context.Context) error {
	if err := m.api.ResumeVM(ctx); err != nil {
		return fmt.Errorf("machine %s: resume: %w", m.id, err)
	}
	return nil
}

// Shutdown stops the VM (vm.shutdown), then the VMM (vmm.shutdown), and
// waits for the process to exit; past ctx (or 30s without a deadline) it
// kills the VMM. Errors from the API are ignored: the VMM may be half gone,
// and only the process exiting counts.
func (m *machine) Shutdown(ctx context.Context) error {
	if m.proc.exited() {
		return m.stopBlock()
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	step := func(call func(context.Context) error) {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		call(sctx)
	}
	step(m.api.ShutdownVM)
	step(m.api.ShutdownVMM)
	if m.proc.wait(ctx) == nil {
		return m.stopBlock()
	}
	if err := killAndWait(m.proc); err != nil {
		return fmt.Errorf("machine %s: shutdown: %w", m.id, err)
	}
	return m.stopBlock()
}

func (m *machine) Kill(ctx context.Context) error {
	if err := m.proc.kill(); err != nil {
		return fmt.Errorf("machine %s: kill: %w", m.id, err)
	}
	if err := m.proc.wait(ctx); err != nil {
		return fmt.Errorf("machine %s: kill: %w", m.id, err)
	}
	return m.stopBlock()
}

// stopBlock stops the storage daemon of a machine whose VMM has exited
// (it would hold the disks open for no one).
func (m *machine) stopBlock() error {
	if m.data.BlockDir == "" {
		return nil
	}
	if err := stopBlock(m.data.BlockDir); err != nil {
		return fmt.Errorf("machine %s: %w", m.id, err)
	}
	return nil
}

func (m *machine) Wait(ctx context.Context) error {
	if err := m.proc.wait(ctx); err != nil {
		return fmt.Errorf("machine %s: wait: %w", m.id, err)
	}
	return nil
}

// Cleanup removes the state dir. A serial log the caller placed outside
// it is the caller's file and stays.
func (m *machine) Cleanup(ctx context.Context) error {
	if !m.proc.exited() {
		return hypervisor.Errorf(hypervisor.ErrState, "machine %s: cleanup: the VMM is still running", m.id)
	}
	m.endDrain()
	m.proc.close()
	// (A VMM that died on its own left its daemon running.)
	if err := m.stopBlock(); err != nil {
		return err
	}
	if err := removeStages(m.data.StateDir); err != nil {
		return fmt.Errorf("machine %s: cleanup: %w", m.id, err)
	}
	if err := os.RemoveAll(m.data.StateDir); err != nil {
		return fmt.Errorf("machine %s: cleanup: %w", m.id, err)
	}
	return nil
}

// endDrain stops draining the console, if it is drained.
func (m *machine) endDrain() {
	if m.stopDrain != nil {
		m.stopDrain()
	}
}

// logHint is the tail of the VMM log, for errors.
func (m *machine) logHint() string {
	if t := logTail(m.data.VMMLog, 512); t != "" {
		return " (VMM log: " + t + ")"
	}
	return ""
}

func (m *machine) vmState(ctx context.Context) (VmState, error) {
	vi, err := m.api.Info(ctx)
	if err != nil {
		return "", err
	}
	return vi.State, nil
}

// Volumes: the storage daemon that serves the machine's encrypted disks
// serves a volume too (vhostblk.AddVolume: a vhost-user-blk socket over
// the volume's encrypted files), and the VMM hot-plugs it as a disk
// (vm.add-disk) whose device ID names the volume. The disk has no serial
// of its own: the guest finds it by its filesystem's UUID. A machine
// without a storage daemon (launched without a data key) takes none.

func volumeDevice(id string) string { return "vol-" + id }

// block is the machine's storage daemon.
func (m *machine) block() (*vhostblk.Server, error) {
	if m.data.BlockDir == "" {
		return nil, hypervisor.Errorf(hypervisor.ErrUnsupported, "cloud-hypervisor: %s has no storage daemon (it was launched without a data key): it takes no volumes", m.id)
	}
	srv, err := vhostblk.Find(m.data.BlockDir)
	if err != nil {
		return nil, hypervisor.Errorf(hypervisor.ErrState, "cloud-hypervisor: %s: its storage daemon: %v", m.id, err)
	}
	return srv, nil
}

// PlugVolume implements hypervisor.Machine.
func (m *machine) PlugVolume(ctx context.Context, v hypervisor.Volume) error {
	if err := v.Validate(); err != nil {
		return err
	}
	srv, err := m.block()
	if err != nil {
		return err
	}
	sock, err := srv.AddVolume(ctx, v)
	if errors.Is(err, hypervisor.ErrExists) {
		// Served, but not plugged in if a plug died before the VMM took
		// it: that export goes, and the volume is served afresh.
		if plugged, perr := m.hasDisk(ctx, volumeDevice(v.ID)); perr != nil || plugged {
			return err
		}
		if err := srv.RemoveVolume(ctx, v.ID); err != nil {
			return err
		}
		sock, err = srv.AddVolume(ctx, v)
	}
	if err != nil {
		return err
	}
	if _, err := m.api.AddDisk(ctx, DiskConfig{VhostUser: true, VhostSocket: sock, ID: volumeDevice(v.ID), Readonly: v.ReadOnly, NumQueues: 1, QueueSize: 128}); err != nil {
		srv.RemoveVolume(context.WithoutCancel(ctx), v.ID)
		return fmt.Errorf("cloud-hypervisor: volume %s: %w", v.ID, err)
	}
	return nil
}

// hasDisk says whether the VM has a disk of that ID.
func (m *machine) hasDisk(ctx context.Context, id string) (bool, error) {
	vi, err := m.api.Info(ctx)
	if err != nil {
		return false, err
	}
	for _, d := range vi.Config.Disks {
		if d.ID == id {
			return true, nil
		}
	}
	return false, nil
}

// LayerVolume implements hypervisor.Machine (the storage daemon moves it).
func (m *machine) LayerVolume(ctx context.Context, id, path string) error {
	srv, err := m.block()
	if err != nil {
		return err
	}
	return srv.LayerVolume(ctx, id, path)
}

// UnplugVolume implements hypervisor.Machine: the VMM removes the disk
// (the guest, which should have unmounted it, is told), then the daemon
// stops serving it, cutting the VMM off if it still holds it.
func (m *machine) UnplugVolume(ctx context.Context, id string) error {
	if err := m.api.RemoveDevice(ctx, volumeDevice(id)); err != nil {
		if errors.Is(err, hypervisor.ErrNotFound) {
			return hypervisor.Errorf(hypervisor.ErrNotFound, "cloud-hypervisor: volume %s is not plugged into %s", id, m.id)
		}
		return fmt.Errorf("cloud-hypervisor: unplug volume %s: %w", id, err)
	}
	srv, err := m.block()
	if err != nil {
		return err
	}
	return srv.RemoveVolume(ctx, id)
}

// pluggedVolumes lists the volumes the machine's storage daemon serves,
// by their sockets (no call to the daemon: a snapshot needs none before
// its copies).
func (m *machine) pluggedVolumes() []string {
	if m.data.BlockDir == "" {
		return nil
	}
	return vhostblk.VolumeSockets(m.data.BlockDir)
}
