package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/overlay"
	"github.com/harebox/harebox/hypervisor/qmp"
)

// Volumes are SCSI disks on a virtio-scsi controller that every machine
// launched since volumes exist has (state.SCSI): microvm's virtio-mmio
// devices cannot be hot-plugged, but disks on a SCSI bus can, and the
// guest's kernel sees them come and go. Each volume is its key, its
// nodes (qmp's volume nodes) and its device, all named by its ID.
// Nothing of them is kept in the state: QEMU's own lists of devices and
// nodes are the truth, so a machine re-adopted from an older handle
// still knows its volumes.

func volumeDevice(id string) string { return "vol-" + id }

// PlugVolume implements hypervisor.Machine.
func (m *machine) PlugVolume(ctx context.Context, v hypervisor.Volume) error {
	if err := v.Validate(); err != nil {
		return err
	}
	if !m.st.SCSI {
		return hypervisor.Errorf(hypervisor.ErrUnsupported, "qemu: %s was made before volumes existed (from an older snapshot): it has no bus for them", m.ID())
	}
	if plugged, err := m.volumes(ctx); err != nil {
		return err
	} else if plugged[v.ID] {
		return hypervisor.Errorf(hypervisor.ErrExists, "qemu: volume %s is plugged into %s already", v.ID, m.ID())
	}
	if err := qmp.AddVolume(ctx, m.exec, v.ID, v.Path, v.Backing, overlay.Passphrase(v.Key), v.ReadOnly); err != nil {
		return volumeErr(v.ID, err)
	}
	if _, err := m.exec(ctx, "device_add", map[string]any{
		"driver": "scsi-hd", "id": volumeDevice(v.ID), "drive": qmp.VolumeNode(v.ID), "bus": "scsi0.0", "serial": v.ID,
	}); err != nil {
		qmp.DropVolume(context.WithoutCancel(ctx), m.exec, v.ID, false)
		return fmt.Errorf("qemu: volume %s: device: %w", v.ID, err)
	}
	return nil
}

// UnplugVolume implements hypervisor.Machine. The guest acknowledges the
// removal (its SCSI layer drops the disk); until it has, the files stay
// open, so this waits for the device to be gone.
func (m *machine) UnplugVolume(ctx context.Context, id string) error {
	if _, err := m.exec(ctx, "device_del", map[string]any{"id": volumeDevice(id)}); err != nil {
		var qe *qmp.Error
		if errors.As(err, &qe) && qe.Class == "DeviceNotFound" {
			return hypervisor.Errorf(hypervisor.ErrNotFound, "qemu: volume %s is not plugged into %s", id, m.ID())
		}
		return fmt.Errorf("qemu: unplug volume %s: %w", id, err)
	}
	if err := qmp.DropVolume(ctx, m.exec, id, true); err != nil {
		return fmt.Errorf("qemu: unplug volume %s: the guest did not release it: %w", id, err)
	}
	return nil
}

// LayerVolume implements hypervisor.Machine (qmp.LayerVolume under the
// device's top node).
func (m *machine) LayerVolume(ctx context.Context, id, path string) error {
	if err := hypervisor.ValidateLayer(id, path); err != nil {
		return err
	}
	top, ro, err := m.volumeTop(ctx, volumeDevice(id))
	switch {
	case err != nil:
		return fmt.Errorf("qemu: layer volume %s: %w", id, err)
	case top == "":
		return hypervisor.Errorf(hypervisor.ErrNotFound, "qemu: volume %s is not plugged into %s", id, m.ID())
	case top == qmp.LayerNode(id, path):
		return nil // (done already)
	case ro:
		return hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: volume %s is plugged into %s read-only: it has no writes to move", id, m.ID())
	}
	if err := qmp.LayerVolume(ctx, m.exec, id, top, path); err != nil {
		return volumeErr(id, err)
	}
	return nil
}

// volumeTop is the node a volume's device reads and writes (its top
// layer), and whether it is read-only; "" if the device is not there.
func (m *machine) volumeTop(ctx context.Context, device string) (string, bool, error) {
	raw, err := m.exec(ctx, "query-block", nil)
	if err != nil {
		return "", false, err
	}
	var blocks []struct {
		QDev     string `json:"qdev"`
		Inserted *struct {
			NodeName string `json:"node-name"`
			RO       bool   `json:"ro"`
		} `json:"inserted"`
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", false, fmt.Errorf("query-block: %w", err)
	}
	for _, b := range blocks {
		if (b.QDev == device || strings.HasSuffix(b.QDev, "/"+device)) && b.Inserted != nil {
			return b.Inserted.NodeName, b.Inserted.RO, nil
		}
	}
	return "", false, nil
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
	if qmp.IsWrongKey(err) {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: volume %s: the key does not open it", id)
	}
	return fmt.Errorf("qemu: volume %s: %w", id, err)
}
