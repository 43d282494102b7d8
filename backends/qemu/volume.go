package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/overlay"
	"github.com/harebox/harebox/hypervisor/qmp"
)

// Volumes are SCSI disks on a virtio-scsi controller that every machine
// launched since volumes exist has (state.SCSI): microvm's virtio-mmio
// devices cannot be hot-plugged, but disks on a SCSI bus can, and the
// guest's kernel sees them come and go. Each volume is three QEMU
// objects named by its ID: its key (a secret), its node (the LUKS qcow2
// file) and its device. Nothing of them is kept in the state: QEMU's own
// list of devices is the truth, so a machine re-adopted from an older
// handle still knows its volumes.

func volumeNames(id string) (secret, node, device string) {
	return "volkey-" + id, "volnode-" + id, "vol-" + id
}

// PlugVolume implements hypervisor.Machine.
func (m *machine) PlugVolume(ctx context.Context, v hypervisor.Volume) error {
	if err := v.Validate(); err != nil {
		return err
	}
	if !m.st.SCSI {
		return hypervisor.Errorf(hypervisor.ErrUnsupported, "qemu: %s was made before volumes existed (from an older snapshot): it has no bus for them", m.ID())
	}
	secret, node, device := volumeNames(v.ID)
	if plugged, err := m.volumes(ctx); err != nil {
		return err
	} else if plugged[v.ID] {
		return hypervisor.Errorf(hypervisor.ErrExists, "qemu: volume %s is plugged into %s already", v.ID, m.ID())
	}
	// Whatever an earlier, interrupted plug left goes first.
	m.exec(ctx, "blockdev-del", map[string]any{"node-name": node})
	m.exec(ctx, "object-del", map[string]any{"id": secret})
	if _, err := m.exec(ctx, "object-add", map[string]any{
		"qom-type": "secret", "id": secret, "format": "raw", "data": overlay.Passphrase(v.Key),
	}); err != nil {
		return fmt.Errorf("qemu: volume %s: key: %w", v.ID, err)
	}
	// cache.no-flush is false: a guest's fsync reaches the host's disk, so
	// what it synced survives QEMU, the host process or a crash.
	top := map[string]any{"driver": "qcow2", "node-name": node, "read-only": v.ReadOnly,
		"cache":   map[string]any{"direct": false, "no-flush": false},
		"file":    map[string]any{"driver": "file", "filename": v.Path},
		"encrypt": map[string]any{"format": "luks", "key-secret": secret}}
	// Its layers, each named in full: an encrypted backing file is opened
	// only with its key.
	layer := top
	for _, b := range v.Backing {
		next := map[string]any{"driver": "qcow2", "read-only": true,
			"file":    map[string]any{"driver": "file", "filename": b},
			"encrypt": map[string]any{"format": "luks", "key-secret": secret}}
		layer["backing"] = next
		layer = next
	}
	layer["backing"] = nil
	if _, err := m.exec(ctx, "blockdev-add", top); err != nil {
		m.exec(context.WithoutCancel(ctx), "object-del", map[string]any{"id": secret})
		return volumeErr(v.ID, err)
	}
	if _, err := m.exec(ctx, "device_add", map[string]any{
		"driver": "scsi-hd", "id": device, "drive": node, "bus": "scsi0.0", "serial": v.ID,
	}); err != nil {
		m.exec(context.WithoutCancel(ctx), "blockdev-del", map[string]any{"node-name": node})
		m.exec(context.WithoutCancel(ctx), "object-del", map[string]any{"id": secret})
		return fmt.Errorf("qemu: volume %s: device: %w", v.ID, err)
	}
	return nil
}

// UnplugVolume implements hypervisor.Machine. The guest acknowledges the
// removal (its SCSI layer drops the disk); until it has, the file stays
// open, so this waits for the device to be gone.
func (m *machine) UnplugVolume(ctx context.Context, id string) error {
	secret, node, device := volumeNames(id)
	if _, err := m.exec(ctx, "device_del", map[string]any{"id": device}); err != nil {
		var qe *qmp.Error
		if errors.As(err, &qe) && qe.Class == "DeviceNotFound" {
			return hypervisor.Errorf(hypervisor.ErrNotFound, "qemu: volume %s is not plugged into %s", id, m.ID())
		}
		return fmt.Errorf("qemu: unplug volume %s: %w", id, err)
	}
	// The node is in use until the device is finalized, a moment after
	// the guest let it go.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		_, err := m.exec(ctx, "blockdev-del", map[string]any{"node-name": node})
		var qe *qmp.Error
		if err == nil {
			break
		}
		if !errors.As(err, &qe) || !strings.Contains(qe.Desc, "in use") {
			return fmt.Errorf("qemu: unplug volume %s: %w", id, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("qemu: unplug volume %s: the guest did not release it: %w", id, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	m.exec(ctx, "object-del", map[string]any{"id": secret})
	return nil
}

// volumes lists the IDs of the volumes plugged in, by their devices.
func (m *machine) volumes(ctx context.Context) (map[string]bool, error) {
	raw, err := m.exec(ctx, "qom-list", map[string]any{"path": "/machine/peripheral"})
	if err != nil {
		return nil, fmt.Errorf("qemu: list devices: %w", err)
	}
	var props []struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(raw, &props); err != nil {
		return nil, fmt.Errorf("qemu: list devices: %w", err)
	}
	out := map[string]bool{}
	for _, p := range props {
		if id, ok := strings.CutPrefix(p.Name, "vol-"); ok {
			out[id] = true
		}
	}
	return out, nil
}

// volumeErr says which volume QEMU could not open, and why in the words
// that matter (a wrong key is the usual one).
func volumeErr(id string, err error) error {
	var qe *qmp.Error
	if errors.As(err, &qe) && strings.Contains(qe.Desc, "Invalid password") {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: volume %s: the key does not open it", id)
	}
	return fmt.Errorf("qemu: volume %s: %w", id, err)
}
