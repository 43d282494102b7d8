package store

import (
	"context"

	"github.com/harebox/harebox/model"
)

// Volume is model.Volume.
type Volume = model.Volume

// PutVolume implements Tx.
func (s *DB) PutVolume(ctx context.Context, v *Volume) error {
	return s.put(ctx, "volumes", []string{"id", "project_id", "name", "created_at"}, []any{v.ID, v.ProjectID, v.Name, nanos(v.CreatedAt)}, v)
}

// GetVolume implements Tx.
func (s *DB) GetVolume(ctx context.Context, id string) (*Volume, error) {
	return get[Volume](ctx, s, `SELECT record FROM volumes WHERE id = ?`, id)
}

// VolumeByName implements Tx.
func (s *DB) VolumeByName(ctx context.Context, projectID, name string) (*Volume, error) {
	return get[Volume](ctx, s, `SELECT record FROM volumes WHERE project_id = ? AND name = ?`, projectID, name)
}

// ListVolumes implements Tx.
func (s *DB) ListVolumes(ctx context.Context, projectID string) ([]*Volume, error) {
	if projectID == "" {
		return list[Volume](ctx, s, `SELECT record FROM volumes ORDER BY created_at, id`)
	}
	return list[Volume](ctx, s, `SELECT record FROM volumes WHERE project_id = ? ORDER BY created_at, id`, projectID)
}

// DeleteVolume implements Tx.
func (s *DB) DeleteVolume(ctx context.Context, id string) error { return s.del(ctx, "volumes", id) }
