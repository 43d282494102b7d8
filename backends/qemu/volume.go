package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
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
// lists of devices and nodes are the truth, so a machine re-adopted from
// an older handle still knows its volumes. A writer moved onto a new
// layer (LayerVolume) has a node more for each, named after its file.

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
	m.dropNodes(ctx, v.ID, false)
	m.exec(ctx, "object-del", map[string]any{"id": secret})
	if _, err := m.exec(ctx, "object-add", map[string]any{
		"qom-type": "secret", "id": secret, "format": "raw", "data": overlay.Passphrase(v.Key),
	}); err != nil {
		return fmt.Errorf("qemu: volume %s: key: %w", v.ID, err)
	}
	// cache.no-flush is false: a guest's fsync reaches the host's disk, so
	// what it synced survives QEMU, the host process or a crash.
	top := volumeNode(node, v.Path, secret, v.ReadOnly)
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
	secret, _, device := volumeNames(id)
	if _, err := m.exec(ctx, "device_del", map[string]any{"id": device}); err != nil {
		var qe *qmp.Error
		if errors.As(err, &qe) && qe.Class == "DeviceNotFound" {
			return hypervisor.Errorf(hypervisor.ErrNotFound, "qemu: volume %s is not plugged into %s", id, m.ID())
		}
		return fmt.Errorf("qemu: unplug volume %s: %w", id, err)
	}
	if err := m.dropNodes(ctx, id, true); err != nil {
		return fmt.Errorf("qemu: unplug volume %s: %w", id, err)
	}
	m.exec(ctx, "object-del", map[string]any{"id": secret})
	return nil
}

// volumeNode is the blockdev-add of a volume's file path under the key
// secret, as node name (without its backing).
func volumeNode(name, path, secret string, readOnly bool) map[string]any {
	// cache.no-flush is false: a guest's fsync reaches the host's disk, so
	// what it synced survives QEMU, the host process or a crash.
	return map[string]any{"driver": "qcow2", "node-name": name, "read-only": readOnly,
		"cache":   map[string]any{"direct": false, "no-flush": false},
		"file":    map[string]any{"driver": "file", "filename": path},
		"encrypt": map[string]any{"format": "luks", "key-secret": secret}}
}

// layerNode names the node of a volume's layer file path: the same file
// always gets the same name, which says whether it is open already (at
// most 31 characters, as QEMU wants).
func layerNode(id, path string) string {
	return fmt.Sprintf("vl%08x-%s", crc32.ChecksumIEEE([]byte(path)), id)
}

// LayerVolume implements hypervisor.Machine: the new file's node goes
// over the device's top node (blockdev-snapshot), which QEMU then opens
// read-only, with its lock on the file for writing given up.
func (m *machine) LayerVolume(ctx context.Context, id, path string) error {
	if err := hypervisor.ValidateLayer(id, path); err != nil {
		return err
	}
	secret, _, device := volumeNames(id)
	top, ro, err := m.volumeTop(ctx, device)
	if err != nil {
		return fmt.Errorf("qemu: layer volume %s: %w", id, err)
	}
	switch next := layerNode(id, path); {
	case top == "":
		return hypervisor.Errorf(hypervisor.ErrNotFound, "qemu: volume %s is not plugged into %s", id, m.ID())
	case top == next:
		return nil // (done already)
	case ro:
		return hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: volume %s is plugged into %s read-only: it has no writes to move", id, m.ID())
	default:
		add := volumeNode(next, path, secret, false)
		add["backing"] = nil
		if _, err := m.exec(ctx, "blockdev-add", add); err != nil {
			return volumeErr(id, err)
		}
		if _, err := m.exec(ctx, "blockdev-snapshot", map[string]any{"node": top, "overlay": next}); err != nil {
			m.exec(context.WithoutCancel(ctx), "blockdev-del", map[string]any{"node-name": next})
			return fmt.Errorf("qemu: layer volume %s: %w", id, err)
		}
		return nil
	}
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

// dropNodes deletes the nodes of volume id: its first file's and its
// layers'. A node is in use until the device over it is finalized (a
// moment after the guest let it go) and a layer's until the one over it
// is gone: with wait, those are tried again for a while.
func (m *machine) dropNodes(ctx context.Context, id string, wait bool) error {
	_, node, _ := volumeNames(id)
	raw, err := m.exec(ctx, "query-named-block-nodes", map[string]any{"flat": true})
	if err != nil {
		return err
	}
	var nodes []struct {
		Name string `json:"node-name"`
	}
	if err := json.Unmarshal(raw, &nodes); err != nil {
		return fmt.Errorf("query-named-block-nodes: %w", err)
	}
	var left []string
	for _, n := range nodes {
		if n.Name == node || strings.HasPrefix(n.Name, "vl") && strings.HasSuffix(n.Name, "-"+id) {
			left = append(left, n.Name)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for len(left) > 0 {
		var busy []string
		for _, name := range left {
			_, err := m.exec(ctx, "blockdev-del", map[string]any{"node-name": name})
			var qe *qmp.Error
			switch {
			case err == nil:
			case errors.As(err, &qe) && (strings.Contains(qe.Desc, "in use") || strings.Contains(qe.Desc, "is busy")):
				busy = append(busy, name)
			case !wait:
			default:
				return err
			}
		}
		if !wait || len(busy) == 0 {
			return nil
		}
		left = busy
		select {
		case <-ctx.Done():
			return fmt.Errorf("the guest did not release it: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
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
