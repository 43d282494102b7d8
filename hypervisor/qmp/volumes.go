package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"time"
)

// Volumes as block nodes, the same in QEMU (under a disk device) and in
// qemu-storage-daemon (under an export): a volume's key is a secret
// object and its files a chain of encrypted qcow2 nodes, all named by the
// volume's ID, so that what is plugged can be found (and removed) from
// the process's own lists, without state kept beside it. A writer moved
// onto a new layer (LayerVolume) has a node more for each.

// VolumeSecret names the secret object that holds volume id's key.
func VolumeSecret(id string) string { return "volkey-" + id }

// VolumeNode names the node of volume id's top file as it was plugged.
func VolumeNode(id string) string { return "volnode-" + id }

// LayerNode names the node of a layer file path that volume id was moved
// onto: the same file always gets the same name, which says whether it
// is open already (at most 31 characters, as QEMU wants).
func LayerNode(id, path string) string {
	return fmt.Sprintf("vl%08x-%s", crc32.ChecksumIEEE([]byte(path)), id)
}

// isLayerNode says whether name is a LayerNode of volume id (of no
// other volume, even one whose ID ends in "-"+id).
func isLayerNode(name, id string) bool {
	hash, ok := strings.CutPrefix(strings.TrimSuffix(name, "-"+id), "vl")
	return ok && len(name) == len("vl")+8+1+len(id) && len(hash) == 8 && strings.Trim(hash, "0123456789abcdef") == ""
}

// volumeFile is the blockdev-add of a volume's file path under the key
// secret as node name (without its backing).
func volumeFile(name, path, secret string, readOnly bool) map[string]any {
	// cache.no-flush is false: a guest's fsync reaches the host's disk, so
	// what it synced survives the process, the host's engine or a crash.
	return map[string]any{"driver": "qcow2", "node-name": name, "read-only": readOnly,
		"cache":   map[string]any{"direct": false, "no-flush": false},
		"file":    map[string]any{"driver": "file", "filename": path},
		"encrypt": map[string]any{"format": "luks", "key-secret": secret}}
}

// AddVolume adds volume id: its key (passphrase) as a secret and its
// files as the node VolumeNode(id), path over backing (nearest first),
// each encrypted under the key; what an earlier, interrupted add left
// goes first. On an error nothing of it stays; a wrong key is one that
// IsWrongKey says so of.
func AddVolume(ctx context.Context, exec Exec, id, path string, backing []string, passphrase string, readOnly bool) error {
	secret := VolumeSecret(id)
	DropVolume(ctx, exec, id, false)
	if _, err := exec(ctx, "object-add", map[string]any{"qom-type": "secret", "id": secret, "format": "raw", "data": passphrase}); err != nil {
		return fmt.Errorf("key: %w", err)
	}
	top := volumeFile(VolumeNode(id), path, secret, readOnly)
	// Its layers, each named in full: an encrypted backing file is opened
	// only with its key.
	layer := top
	for _, b := range backing {
		next := map[string]any{"driver": "qcow2", "read-only": true,
			"file":    map[string]any{"driver": "file", "filename": b},
			"encrypt": map[string]any{"format": "luks", "key-secret": secret}}
		layer["backing"] = next
		layer = next
	}
	layer["backing"] = nil
	if _, err := exec(ctx, "blockdev-add", top); err != nil {
		exec(context.WithoutCancel(ctx), "object-del", map[string]any{"id": secret})
		return err
	}
	return nil
}

// LayerVolume moves the writes of volume id, whose top node is top, onto
// the file path (a new, empty layer over the file top opens, under the
// same key): its node goes over top (blockdev-snapshot), which is then
// open read-only, with its lock on the file for writing given up. A top
// that is path's node already is no change.
func LayerVolume(ctx context.Context, exec Exec, id, top, path string) error {
	next := LayerNode(id, path)
	if top == next {
		return nil
	}
	add := volumeFile(next, path, VolumeSecret(id), false)
	add["backing"] = nil
	if _, err := exec(ctx, "blockdev-add", add); err != nil {
		return err
	}
	if _, err := exec(ctx, "blockdev-snapshot", map[string]any{"node": top, "overlay": next}); err != nil {
		exec(context.WithoutCancel(ctx), "blockdev-del", map[string]any{"node-name": next})
		return err
	}
	return nil
}

// IsWrongKey says whether err is QMP's answer to a key that does not
// open an encrypted file.
func IsWrongKey(err error) bool {
	var qe *Error
	return errors.As(err, &qe) && strings.Contains(qe.Desc, "Invalid password")
}

// Node is a named block node (query-named-block-nodes).
type Node struct {
	Name string `json:"node-name"`
	// RO: open read-only.
	RO bool `json:"ro"`
}

// NamedNodes lists the process's named block nodes.
func NamedNodes(ctx context.Context, exec Exec) ([]Node, error) {
	raw, err := exec(ctx, "query-named-block-nodes", map[string]any{"flat": true})
	if err != nil {
		return nil, err
	}
	var nodes []Node
	if err := json.Unmarshal(raw, &nodes); err != nil {
		return nil, fmt.Errorf("query-named-block-nodes: %w", err)
	}
	return nodes, nil
}

// DropVolume deletes the nodes of volume id (its first file's and its
// layers') and its key. A node is in use until what is over it is gone
// (a device is finalized a moment after the guest let it go; an export
// once its client has) and a layer's until the one over it is: with
// wait, those are tried again for a while.
func DropVolume(ctx context.Context, exec Exec, id string, wait bool) error {
	nodes, err := NamedNodes(ctx, exec)
	if err != nil {
		return err
	}
	var left []string
	for _, n := range nodes {
		if n.Name == VolumeNode(id) || isLayerNode(n.Name, id) {
			left = append(left, n.Name)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for len(left) > 0 {
		var busy []string
		for _, name := range left {
			_, err := exec(ctx, "blockdev-del", map[string]any{"node-name": name})
			var qe *Error
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
			break
		}
		left = busy
		select {
		case <-ctx.Done():
			return fmt.Errorf("it is still in use: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if _, err := exec(ctx, "object-del", map[string]any{"id": VolumeSecret(id)}); err != nil && wait && !IsNotFound(err) {
		return err
	}
	return nil
}
