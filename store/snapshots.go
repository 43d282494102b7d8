package store

import (
	"context"
	"encoding/json"

	"github.com/harebox/harebox/sandbox"
)

// Snapshot is a snapshot's stored record: the API view plus what a create
// from it needs. Its key and its source's own env are in the secret
// store, under the snapshot's scope.
type Snapshot struct {
	sandbox.Snapshot
	// Dir holds the backend's snapshot files.
	Dir string `json:"dir"`
	// ImageDir is the image build under the snapshot's disk.
	ImageDir string `json:"image_dir"`
	// Source is what a clone takes from the source sandbox by default:
	// its project, fleet, environment pin, policy and flags.
	Source SnapshotSource `json:"source"`
	// KeyID and KeyAncestors are the source's creating key and the keys
	// above it: their budgets cover the snapshot's storage too.
	KeyID        string   `json:"key_id,omitempty"`
	KeyAncestors []string `json:"key_ancestors,omitempty"`
}

// SnapshotSource is the source sandbox's settings at snapshot time.
type SnapshotSource struct {
	FleetID string `json:"fleet_id,omitempty"`
	// Environment pins the source's environment version: "ID@VERSION".
	Environment string          `json:"environment,omitempty"`
	ThirdParty  bool            `json:"third_party,omitempty"`
	NoEnv       bool            `json:"no_env,omitempty"`
	Monitoring  bool            `json:"monitoring"`
	Policy      json.RawMessage `json:"policy,omitempty"`
	// Mesh says the source was on its project's mesh: its forks are too.
	Mesh bool `json:"mesh,omitempty"`
	// Volumes were attached to the source: a create from the snapshot
	// or a fork attaches them again unless it names its own.
	Volumes []sandbox.VolumeMount `json:"volumes,omitempty"`
	// Site is the site or country the source's create asked for: a clone
	// asks for it too unless its create names its own.
	Site sandbox.Site `json:"site,omitzero"`
}

// PutSnapshot implements Tx.
func (s *DB) PutSnapshot(ctx context.Context, sn *Snapshot) error {
	return s.put(ctx, "snapshots", []string{"id", "account_id", "sandbox_id", "created_at"},
		[]any{sn.ID, sn.AccountID, sn.SandboxID, nanos(sn.CreatedAt)}, sn)
}

// GetSnapshot implements Tx.
func (s *DB) GetSnapshot(ctx context.Context, id string) (*Snapshot, error) {
	return get[Snapshot](ctx, s, `SELECT record FROM snapshots WHERE id = ?`, id)
}

// ListSnapshots implements Tx.
func (s *DB) ListSnapshots(ctx context.Context) ([]*Snapshot, error) {
	return list[Snapshot](ctx, s, `SELECT record FROM snapshots ORDER BY created_at, id`)
}

// DeleteSnapshot implements Tx.
func (s *DB) DeleteSnapshot(ctx context.Context, id string) error {
	return s.del(ctx, "snapshots", id)
}
