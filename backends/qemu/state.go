package qemu

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/harebox/harebox/hypervisor"
)

// state is everything needed to re-adopt a machine; it is the handle's data
// and is also kept in the state directory for inspection.
type state struct {
	Spec    hypervisor.Spec   `json:"spec"`
	Disks   []hypervisor.Disk `json:"disks"` // what QEMU actually opened
	QMP     string            `json:"qmp"`
	Agent   string            `json:"agent"`
	PIDFile string            `json:"pid_file"`
	Serial  string            `json:"serial"`
	Accel   string            `json:"accel"`
	// TSCKHz is the TSC rate the guest kernel was told at boot under TCG
	// (tsc_early_khz): it keeps time by it for good (tsc=reliable), and a
	// restore carries it (a host whose TSC runs otherwise is refused).
	TSCKHz    int64     `json:"tsc_khz,omitempty"`
	Proc      proc      `json:"proc"`
	StartedAt time.Time `json:"started_at"`
	// Encrypted: the writable overlays are LUKS under the spec's DataKey.
	// BackingEncrypted: their backing files (a snapshot's disks) are LUKS
	// under the SnapshotKey. The keys themselves are never stored; Spec is
	// kept WithoutKeys.
	Encrypted        bool `json:"encrypted,omitempty"`
	BackingEncrypted bool `json:"backing_encrypted,omitempty"`
	// Backing names, by disk, the file QEMU opens as the overlay's backing
	// in place of the one in its header (a restore's snapshot disk, until
	// detach has streamed it in).
	Backing map[int]string `json:"backing,omitempty"`
	// SCSI: the machine has the virtio-scsi controller volumes are
	// plugged into (volume.go). Those restored from snapshots older than
	// volumes lack it: their device set must match the snapshot's.
	SCSI bool `json:"scsi,omitempty"`
	// SharedBase: the guest's RAM is a golden snapshot's base, mapped
	// copy-on-write (base.go).
	SharedBase bool `json:"shared_base,omitempty"`

	// mem is the file QEMU maps the guest's RAM from (inherited), while
	// it starts; memShared maps it shared: a base's maker only.
	mem       *os.File
	memShared bool
}

func (st *state) handle() hypervisor.Handle {
	b, _ := json.Marshal(st)
	return hypervisor.Handle{Backend: Name, ID: st.Spec.ID, Data: b}
}

func (st *state) save() error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(st.Spec.StateDir, "state.json"), b)
}

// Snapshot directory layout.
const (
	snapshotMeta = "snapshot.json"
	memoryFile   = "memory"
	// snapshotVersion changes when the layout does. 2: the memory file is
	// written through a socket, sealed when Encrypted.
	snapshotVersion = 2
)

// snapshot describes a snapshot directory. Writable disks are copied into
// the directory (Path relative to it); read-only disks are referenced.
type snapshot struct {
	Version   int               `json:"version"`
	Spec      hypervisor.Spec   `json:"spec"`
	Disks     []hypervisor.Disk `json:"disks"`
	Accel     string            `json:"accel"`
	TSCKHz    int64             `json:"tsc_khz,omitempty"` // (state.TSCKHz)
	CreatedAt time.Time         `json:"created_at"`
	// Encrypted: memory and disks are under the key given to Snapshot.
	Encrypted bool `json:"encrypted,omitempty"`
	// SCSI: the machine had the volumes' controller (state.SCSI).
	SCSI bool `json:"scsi,omitempty"`
}

func loadSnapshot(dir string) (*snapshot, error) {
	b, err := os.ReadFile(filepath.Join(dir, snapshotMeta))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, hypervisor.Errorf(hypervisor.ErrNotFound, "qemu: no snapshot in %s", dir)
		}
		return nil, fmt.Errorf("qemu: %w", err)
	}
	var s snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: bad snapshot %s: %v", dir, err)
	}
	if s.Version != snapshotVersion {
		return nil, hypervisor.Errorf(hypervisor.ErrUnsupported, "qemu: snapshot version %d, want %d", s.Version, snapshotVersion)
	}
	for i, d := range s.Disks {
		if !d.ReadOnly && (filepath.IsAbs(d.Path) || filepath.Base(d.Path) != d.Path) {
			return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: snapshot disk %d path %q must be a file name", i, d.Path)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, memoryFile)); err != nil {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: snapshot %s: %v", dir, err)
	}
	return &s, nil
}

func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
