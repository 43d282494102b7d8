package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// MeshAddress is a sandbox's place on its project's mesh: its address,
// unique in the deployment, and the name it answers to there (the first
// label of NAME.PROJECT.internal).
type MeshAddress struct {
	Addr      string `json:"addr"`
	ProjectID string `json:"project_id"`
	SandboxID string `json:"sandbox_id"`
	Name      string `json:"name"`
}

// MeshRanges implements Tx: every project's mesh range, by project ID.
func (s *DB) MeshRanges(ctx context.Context) (map[string]string, error) {
	rows, err := s.q.QueryContext(ctx, `SELECT project_id, prefix FROM mesh_ranges`)
	if err != nil {
		return nil, fmt.Errorf("store: mesh ranges: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var p, r string
		if err := rows.Scan(&p, &r); err != nil {
			return nil, fmt.Errorf("store: mesh ranges: %w", err)
		}
		out[p] = r
	}
	return out, rows.Err()
}

// AddMeshRange implements Tx: ErrConflict when the range or the project
// has one. (A conflict leaves the transaction usable, on PostgreSQL too:
// the caller tries another.)
func (s *DB) AddMeshRange(ctx context.Context, projectID, prefix string) error {
	return s.insertOnce(ctx, "mesh range", `INSERT INTO mesh_ranges (prefix, project_id) VALUES (?, ?) ON CONFLICT DO NOTHING`, prefix, projectID)
}

// insertOnce runs an INSERT ... ON CONFLICT DO NOTHING: ErrConflict when
// it inserted nothing.
func (s *DB) insertOnce(ctx context.Context, what, q string, args ...any) error {
	res, err := s.q.ExecContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("store: add %s: %w", what, err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return ErrConflict
	}
	return nil
}

// MeshAddresses implements Tx: a project's, by address.
func (s *DB) MeshAddresses(ctx context.Context, projectID string) ([]*MeshAddress, error) {
	rows, err := s.q.QueryContext(ctx, `SELECT addr, project_id, sandbox_id, name FROM mesh_addresses WHERE project_id = ? ORDER BY addr`, projectID)
	if err != nil {
		return nil, fmt.Errorf("store: mesh addresses: %w", err)
	}
	defer rows.Close()
	var out []*MeshAddress
	for rows.Next() {
		var a MeshAddress
		if err := rows.Scan(&a.Addr, &a.ProjectID, &a.SandboxID, &a.Name); err != nil {
			return nil, fmt.Errorf("store: mesh addresses: %w", err)
		}
		out = append(out, &a)
	}
	return out, rows.Err()
}

// AddMeshAddress implements Tx: ErrConflict when the address is taken or
// the sandbox has one (the transaction stays usable).
func (s *DB) AddMeshAddress(ctx context.Context, a *MeshAddress) error {
	return s.insertOnce(ctx, "mesh address", `INSERT INTO mesh_addresses (addr, project_id, sandbox_id, name) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		a.Addr, a.ProjectID, a.SandboxID, a.Name)
}

// MeshAddressByName implements Tx: the address of the project's sandbox
// named name, ErrNotFound when none is.
func (s *DB) MeshAddressByName(ctx context.Context, projectID, name string) (*MeshAddress, error) {
	var a MeshAddress
	err := s.q.QueryRowContext(ctx, `SELECT addr, project_id, sandbox_id, name FROM mesh_addresses WHERE project_id = ? AND name = ? ORDER BY addr LIMIT 1`,
		projectID, name).Scan(&a.Addr, &a.ProjectID, &a.SandboxID, &a.Name)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: mesh address: %w", err)
	}
	return &a, nil
}

// DeleteMeshAddress implements Tx: the sandbox's; none is not an error.
func (s *DB) DeleteMeshAddress(ctx context.Context, sandboxID string) error {
	if _, err := s.q.ExecContext(ctx, `DELETE FROM mesh_addresses WHERE sandbox_id = ?`, sandboxID); err != nil {
		return fmt.Errorf("store: delete mesh address: %w", err)
	}
	return nil
}

// MeshAddressesByHost implements Tx: every mesh address of a sandbox that
// has a host, by the host's name.
func (s *DB) MeshAddressesByHost(ctx context.Context) (map[string][]string, error) {
	rows, err := s.q.QueryContext(ctx, `SELECT s.host, m.addr FROM mesh_addresses m JOIN sandboxes s ON s.id = m.sandbox_id WHERE s.host <> '' ORDER BY s.host, m.addr`)
	if err != nil {
		return nil, fmt.Errorf("store: mesh addresses by host: %w", err)
	}
	defer rows.Close()
	out := map[string][]string{}
	for rows.Next() {
		var h, a string
		if err := rows.Scan(&h, &a); err != nil {
			return nil, fmt.Errorf("store: mesh addresses by host: %w", err)
		}
		out[h] = append(out[h], a)
	}
	return out, rows.Err()
}
