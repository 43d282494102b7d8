package vhostblk

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/overlay"
	"github.com/harebox/harebox/hypervisor/qmp"
)

// Volumes: a running daemon serves volumes too, each added and removed
// while it runs, over its monitor (the volume's key is a secret sent
// there, never on a command line): a vhost-user-blk export of the
// volume's encrypted files (qmp's volume nodes) at vol-ID.sock in its
// directory. The daemon's own lists say what it serves.

func volumeExport(id string) string { return "volexp-" + id }

func (s *Server) volumeSocket(id string) string {
	return filepath.Join(s.Dir, "vol-"+id+".sock")
}

// AddVolume serves v and returns its socket: read-only, or writable by
// the one VMM that connects. ErrExists if the daemon serves it already;
// ErrInvalid if its key does not open it.
func (s *Server) AddVolume(ctx context.Context, v hypervisor.Volume) (string, error) {
	if err := v.Validate(); err != nil {
		return "", err
	}
	sock := s.volumeSocket(v.ID)
	if len(sock) > maxSocketPath {
		return "", hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: socket path %s is longer than %d bytes", sock, maxSocketPath)
	}
	if node, err := s.exportNode(ctx, v.ID); err != nil {
		return "", err
	} else if node != "" {
		return "", hypervisor.Errorf(hypervisor.ErrExists, "vhostblk: volume %s is served already", v.ID)
	}
	os.Remove(sock) // (a stale one from a daemon that died)
	if err := qmp.AddVolume(ctx, s.exec, v.ID, v.Path, v.Backing, overlay.Passphrase(v.Key), v.ReadOnly); err != nil {
		return "", volumeErr(v.ID, err)
	}
	if _, err := s.exec(ctx, "block-export-add", map[string]any{
		"type": "vhost-user-blk", "id": volumeExport(v.ID), "node-name": qmp.VolumeNode(v.ID),
		"addr": map[string]any{"type": "unix", "path": sock}, "writable": !v.ReadOnly,
	}); err != nil {
		qmp.DropVolume(context.WithoutCancel(ctx), s.exec, v.ID, false)
		return "", fmt.Errorf("vhostblk: volume %s: export: %w", v.ID, err)
	}
	return sock, nil
}

// LayerVolume moves the writes of volume id onto path, a new layer over
// the file it writes now, while its VMM runs (hypervisor.Machine's
// LayerVolume: the files under path are then open read-only, and can be
// served again read-only beside it). A path that is the top already is
// no change; ErrNotFound if the daemon does not serve it, ErrInvalid if
// it serves it read-only.
func (s *Server) LayerVolume(ctx context.Context, id, path string) error {
	if err := hypervisor.ValidateLayer(id, path); err != nil {
		return err
	}
	top, err := s.exportNode(ctx, id)
	switch {
	case err != nil:
		return err
	case top == "":
		return hypervisor.Errorf(hypervisor.ErrNotFound, "vhostblk: volume %s is not served", id)
	case top == qmp.LayerNode(id, path):
		return nil
	}
	if ro, err := s.readOnly(ctx, top); err != nil {
		return err
	} else if ro {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: volume %s is served read-only: it has no writes to move", id)
	}
	if err := qmp.LayerVolume(ctx, s.exec, id, top, path); err != nil {
		return volumeErr(id, err)
	}
	return nil
}

// RemoveVolume stops serving volume id, cutting off a VMM still
// connected (it should have let the disk go), and closes its files;
// ErrNotFound if the daemon does not serve it.
func (s *Server) RemoveVolume(ctx context.Context, id string) error {
	if !hypervisor.ValidVolumeID(id) {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: volume id %q", id)
	}
	if _, err := s.exec(ctx, "block-export-del", map[string]any{"id": volumeExport(id), "mode": "hard"}); err != nil {
		if qmp.IsNotFound(err) {
			os.Remove(s.volumeSocket(id)) // (what a removal cut short left)
			return hypervisor.Errorf(hypervisor.ErrNotFound, "vhostblk: volume %s is not served", id)
		}
		return fmt.Errorf("vhostblk: remove volume %s: %w", id, err)
	}
	// (An export goes once its last request is done.)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		node, err := s.exportNode(ctx, id)
		if err != nil {
			return err
		}
		if node == "" {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vhostblk: remove volume %s: its export did not end: %w", id, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := qmp.DropVolume(ctx, s.exec, id, true); err != nil {
		return fmt.Errorf("vhostblk: remove volume %s: %w", id, err)
	}
	os.Remove(s.volumeSocket(id))
	return nil
}

// VolumeSockets lists the IDs of the volumes a daemon serving dir has
// sockets for (AddVolume makes one, RemoveVolume removes it).
func VolumeSockets(dir string) []string {
	socks, _ := filepath.Glob(filepath.Join(dir, "vol-*.sock"))
	var out []string
	for _, s := range socks {
		out = append(out, strings.TrimSuffix(strings.TrimPrefix(filepath.Base(s), "vol-"), ".sock"))
	}
	return out
}

// Volumes lists the IDs of the volumes the daemon serves.
func (s *Server) Volumes(ctx context.Context) ([]string, error) {
	exports, err := s.exports(ctx)
	var out []string
	for id := range exports {
		if vol, ok := strings.CutPrefix(id, "volexp-"); ok {
			out = append(out, vol)
		}
	}
	slices.Sort(out)
	return out, err
}

// exportNode is the node volume id's export serves now (its top
// layer), "" if there is none.
func (s *Server) exportNode(ctx context.Context, id string) (string, error) {
	exports, err := s.exports(ctx)
	return exports[volumeExport(id)], err
}

// exports maps the daemon's exports to the nodes they serve.
func (s *Server) exports(ctx context.Context) (map[string]string, error) {
	raw, err := s.exec(ctx, "query-block-exports", nil)
	if err != nil {
		return nil, fmt.Errorf("vhostblk: query-block-exports: %w", err)
	}
	var exports []struct {
		ID   string `json:"id"`
		Node string `json:"node-name"`
	}
	if err := json.Unmarshal(raw, &exports); err != nil {
		return nil, fmt.Errorf("vhostblk: query-block-exports: %w", err)
	}
	out := map[string]string{}
	for _, e := range exports {
		out[e.ID] = e.Node
	}
	return out, nil
}

// readOnly says whether node is open read-only.
func (s *Server) readOnly(ctx context.Context, node string) (bool, error) {
	nodes, err := qmp.NamedNodes(ctx, s.exec)
	if err != nil {
		return false, fmt.Errorf("vhostblk: %w", err)
	}
	for _, n := range nodes {
		if n.Name == node {
			return n.RO, nil
		}
	}
	return false, hypervisor.Errorf(hypervisor.ErrNotFound, "vhostblk: no node %s", node)
}

// volumeErr says which volume the daemon could not open, and why in the
// words that matter (a wrong key is the usual one).
func volumeErr(id string, err error) error {
	if qmp.IsWrongKey(err) {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: volume %s: the key does not open it", id)
	}
	return fmt.Errorf("vhostblk: volume %s: %w", id, err)
}
