// Package hypervisor defines the interfaces every HareBox VM backend
// implements (QEMU, Cloud Hypervisor, ...), the machine spec they launch, and
// the portable error kinds callers check with errors.Is.
//
// A backend is usable in-process or served over a process boundary by
// hypervisor/plugin; hypervisor/hypervisortest is the conformance suite every
// backend must pass.
package hypervisor

import (
	"context"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Hypervisor launches machines and re-adopts running ones.
type Hypervisor interface {
	// Capabilities reports what this backend can do on this host.
	Capabilities(ctx context.Context) (Capabilities, error)
	// Launch boots a new machine from spec. The VMM process is detached from
	// the caller so it outlives it; the returned Machine's Handle re-adopts it.
	Launch(ctx context.Context, spec Spec) (Machine, error)
	// Attach re-adopts a running machine from a handle saved earlier.
	// It fails with ErrNotFound if that machine is gone.
	Attach(ctx context.Context, h Handle) (Machine, error)
	// Restore boots a new machine from a snapshot directory written by
	// Machine.Snapshot. spec gives the clone's own identity: its ID, state
	// directory, network and labels; sizes and disks come from the snapshot.
	// Once it returns, the clone needs nothing of the snapshot (neither its
	// files nor SnapshotKey): the snapshot may be deleted while it runs.
	Restore(ctx context.Context, snapshotDir string, spec Spec) (Machine, error)
}

// Machine is one running (or paused) VM.
type Machine interface {
	ID() string
	// Handle is the serialisable data Attach needs to re-adopt this machine.
	Handle() Handle
	// Info reports the machine's current state.
	Info(ctx context.Context) (Info, error)
	// AgentEndpoint is where the host reaches the guest agent.
	AgentEndpoint() AgentEndpoint
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	// Snapshot pauses the machine and writes its memory, device state and a
	// copy of its writable disks into dir, which must not exist yet. The
	// machine stays paused afterwards; Resume continues it.
	//
	// key is the snapshot's own key, any KeySize key (the machine's
	// DataKey, or a new one): memory and disks are written under it, and
	// Restore needs it as SnapshotKey. It is nil exactly for a machine
	// launched without a DataKey.
	Snapshot(ctx context.Context, dir string, key []byte) error
	// Shutdown asks the guest to power off and waits until the VMM exits or
	// ctx is done; on timeout it stops the VMM.
	Shutdown(ctx context.Context) error
	// Kill stops the VMM at once.
	Kill(ctx context.Context) error
	// Wait blocks until the VMM has exited (or ctx is done).
	Wait(ctx context.Context) error
	// Cleanup removes every file the machine owns (sockets, overlays, logs).
	// The machine must have exited.
	Cleanup(ctx context.Context) error
	// PlugVolume gives the running guest a volume as a new disk, which
	// the guest finds by the volume's ID (VolumeSerial). A backend
	// without volumes (Capabilities.Volumes false) fails with
	// ErrUnsupported. Snapshot refuses a machine with a volume plugged.
	PlugVolume(ctx context.Context, v Volume) error
	// UnplugVolume takes a plugged volume away from the guest (which
	// should have unmounted it) and closes its files; ErrNotFound if it is
	// not plugged.
	UnplugVolume(ctx context.Context, id string) error
	// LayerVolume moves the writes of a volume plugged in writable onto
	// path, a new qcow2 layer over the file it writes now (under the same
	// key, made by the caller), while the guest runs: every file under
	// path is then open read-only, and another machine may plug them in
	// read-only (a reader of the volume as it was). The caller freezes
	// the guest's filesystem meanwhile, if the reader is to find it
	// clean. A path that is the top already is no change; ErrNotFound if
	// the volume is not plugged, ErrInvalid if it is read-only.
	LayerVolume(ctx context.Context, id, path string) error
}

// Volume is a disk that outlives machines: a qcow2 file, LUKS-encrypted
// under its own Key, plugged into running machines one writer or many
// readers at a time (the caller's rule; the backend opens the file as
// ReadOnly says).
type Volume struct {
	// ID is 1-20 of [a-z0-9-]: the disk's serial in the guest.
	ID   string `json:"id"`
	Path string `json:"path"`
	// Backing are the files under Path, nearest first: a chain of qcow2
	// layers, each encrypted under Key. None: Path is the whole volume.
	Backing  []string `json:"backing,omitempty"`
	Key      []byte   `json:"-"`
	ReadOnly bool     `json:"read_only,omitempty"`
}

// Validate checks a volume before a backend opens it.
func (v *Volume) Validate() error {
	switch {
	case !volumeIDRE.MatchString(v.ID):
		return Errorf(ErrInvalid, "volume id %q: want 1-20 of [a-z0-9-]", v.ID)
	case len(v.Key) != KeySize:
		return Errorf(ErrInvalid, "volume key: %d bytes, want %d", len(v.Key), KeySize)
	case len(v.Backing) > 32:
		return Errorf(ErrInvalid, "volume backing: %d layers, at most 32", len(v.Backing))
	}
	for _, p := range append([]string{v.Path}, v.Backing...) {
		if err := checkVolumePath(p); err != nil {
			return err
		}
	}
	return nil
}

// ValidateLayer checks the arguments of LayerVolume.
func ValidateLayer(id, path string) error {
	if !ValidVolumeID(id) {
		return Errorf(ErrInvalid, "volume id %q: want 1-20 of [a-z0-9-]", id)
	}
	return checkVolumePath(path)
}

// ValidVolumeID says whether id is a volume's ID as Volume wants it.
func ValidVolumeID(id string) bool { return volumeIDRE.MatchString(id) }

func checkVolumePath(p string) error {
	if !filepath.IsAbs(p) || strings.ContainsAny(p, ",'\n") {
		return Errorf(ErrInvalid, "volume path %q: want an absolute path without commas, quotes or newlines", p)
	}
	return nil
}

// The serial of a SCSI disk is at most 20 bytes in what Linux shows
// (VPD page 0x80 as QEMU fills it).
var volumeIDRE = regexp.MustCompile(`^[a-z0-9-]{1,20}$`)

// Capabilities describes a backend on this host.
type Capabilities struct {
	Name        string `json:"name"`        // "qemu", "cloud-hypervisor"
	Accelerator string `json:"accelerator"` // "kvm", "tcg"
	// Notice explains a fallback (for example a PVM-only /dev/kvm), if any.
	Notice   string `json:"notice,omitempty"`
	Snapshot bool   `json:"snapshot"`
	Pause    bool   `json:"pause"`
	// Encryption says the backend honours Spec.DataKey.
	Encryption bool `json:"encryption"`
	// Reuse says the backend honours Spec.Reuse (a machine can be launched
	// again on the disks it left: stop and start).
	Reuse bool `json:"reuse"`
	// Volumes says machines take volumes while they run (PlugVolume);
	// VolumesNeedDataKey, only those launched with a Spec.DataKey.
	Volumes            bool `json:"volumes"`
	VolumesNeedDataKey bool `json:"volumes_need_data_key,omitempty"`
	// AgentTransports lists the agent channel kinds the backend offers.
	AgentTransports []string `json:"agent_transports"`
	Version         string   `json:"version,omitempty"`
}

// Spec describes a machine to launch.
type Spec struct {
	// ID names the machine; it must be unique on the host and is used in
	// file and device names, so it is restricted to [a-zA-Z0-9_-], 1-64.
	ID       string   `json:"id"`
	VCPUs    int      `json:"vcpus"`
	MemoryMB int      `json:"memory_mb"`
	Kernel   string   `json:"kernel"`
	Initrd   string   `json:"initrd,omitempty"`
	Cmdline  string   `json:"cmdline,omitempty"`
	Disks    []Disk   `json:"disks,omitempty"`
	Network  *Network `json:"network,omitempty"`
	// StateDir is a directory the backend owns for this machine: sockets,
	// overlays, pid files. It is created if missing and removed by Cleanup.
	StateDir string `json:"state_dir"`
	// SerialLog receives the guest console; empty means StateDir/serial.log.
	SerialLog string            `json:"serial_log,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	// DataKey is the machine's own KeySize-byte key. When set, the backend
	// encrypts every writable overlay and memory snapshot of the machine
	// under it (a writable disk it cannot encrypt is refused), and keeps
	// it only in memory: never in a handle, state file or snapshot.
	// Destroying the key (the caller's job) makes all of those unreadable.
	DataKey []byte `json:"data_key,omitempty"`
	// SnapshotKey is, for Restore, the key the snapshot was written under
	// (the key given to Snapshot).
	SnapshotKey []byte `json:"snapshot_key,omitempty"`
	// ConsoleRecipient, an age X25519 public key ("age1..."), has the
	// console stored in SerialLog only encrypted to it, in the format of
	// hypervisor/consolelog. It is public: it may be stored.
	ConsoleRecipient string `json:"console_recipient,omitempty"`
	// Reuse launches the machine again on the disks an earlier launch of
	// it left in StateDir (it was shut down or killed, not cleaned up):
	// its overlays are opened as they are, under the same DataKey, not
	// made anew. Without them the launch fails with ErrNotFound.
	Reuse bool `json:"reuse,omitempty"`
	// SharedMemory, for Restore, says that the snapshot holds no one's
	// data (a golden snapshot: a guest as it booted, before any tenant
	// ran), so a backend may map its memory copy-on-write, shared by
	// every machine restored from it so, instead of copying it into
	// each. A backend that cannot share restores as it would without.
	SharedMemory bool `json:"shared_memory,omitempty"`
}

// KeySize is the length of DataKey and SnapshotKey.
const KeySize = 32

// WithoutKeys returns a copy of s that carries no key, for storing.
func (s Spec) WithoutKeys() Spec {
	s.DataKey, s.SnapshotKey = nil, nil
	return s
}

// Disk is a block device given to the guest.
type Disk struct {
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
	// Format is "raw" or "qcow2".
	Format string `json:"format,omitempty"`
	// Overlay asks the backend to give the machine its own copy-on-write
	// overlay (in StateDir) on top of Path, which then stays untouched.
	Overlay bool `json:"overlay,omitempty"`
	// SizeMB is the overlay's virtual size; 0 or less than the base keeps
	// the base's size. The guest grows its filesystem to match.
	SizeMB int64 `json:"size_mb,omitempty"`
}

// Network attaches the machine to a host tap device.
type Network struct {
	Tap string `json:"tap"`
	MAC string `json:"mac"`
}

// State is a machine's run state.
type State string

const (
	StateRunning State = "running"
	StatePaused  State = "paused"
	StateStopped State = "stopped"
)

// Info is a machine's state as the backend sees it.
type Info struct {
	ID    string `json:"id"`
	State State  `json:"state"`
	PID   int    `json:"pid"`
	// Started is when the VMM was launched.
	Started time.Time `json:"started"`
}

// AgentEndpoint says how to reach the guest agent.
type AgentEndpoint struct {
	// Transport is TransportSerial (a Unix socket carrying the agent's byte
	// stream directly) or TransportHybridVsock (a Unix socket that wants
	// "CONNECT <port>\n" first).
	Transport string `json:"transport"`
	Path      string `json:"path"`
	Port      uint32 `json:"port,omitempty"`
}

// Agent channel kinds.
const (
	TransportSerial      = "virtio-serial"
	TransportHybridVsock = "hybrid-vsock"
)

// AgentPort is the vsock port the guest agent listens on.
const AgentPort = 1024 // keep equal to agent/layout.VsockPort

// AgentSerialName is the virtio-serial port name the guest agent opens.
const AgentSerialName = "org.harebox.agent"

// Handle is what a backend needs to re-adopt a machine. Data is opaque to
// callers and owned by the backend; store the whole Handle as JSON.
type Handle struct {
	Backend string          `json:"backend"`
	ID      string          `json:"id"`
	Data    json.RawMessage `json:"data"`
}
