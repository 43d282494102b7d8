package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// CountLive implements Tx.
func (s *DB) CountLive(ctx context.Context, accountID, projectID, fleetID string) (int, error) {
	q := `SELECT COUNT(*) FROM sandboxes WHERE account_id = ? AND state != 'deleted'`
	args := []any{accountID}
	if projectID != "" {
		q += ` AND project_id = ?`
		args = append(args, projectID)
	}
	if fleetID != "" {
		q += ` AND fleet_id = ?`
		args = append(args, fleetID)
	}
	var n int
	if err := s.q.QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count sandboxes: %w", err)
	}
	return n, nil
}

// put inserts or replaces one JSON record with its columns.
func (s *DB) put(ctx context.Context, table string, cols []string, vals []any, rec any) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	cols = append(cols, "record")
	vals = append(vals, string(b))
	var set []string
	for _, c := range cols[1:] {
		set = append(set, c+" = excluded."+c)
	}
	q := fmt.Sprintf(`INSERT INTO %s (%s) VALUES (?%s) ON CONFLICT(%s) DO UPDATE SET %s`,
		table, strings.Join(cols, ", "), strings.Repeat(", ?", len(cols)-1), cols[0], strings.Join(set, ", "))
	if _, err := s.q.ExecContext(ctx, q, vals...); err != nil {
		if isUnique(err) {
			return ErrConflict
		}
		return fmt.Errorf("store: put %s: %w", table, err)
	}
	return nil
}

// get decodes the one record a query selects.
func get[T any](ctx context.Context, s *DB, q string, args ...any) (*T, error) {
	var rec string
	err := s.q.QueryRowContext(ctx, q, args...).Scan(&rec)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: get: %w", err)
	}
	var v T
	if err := json.Unmarshal([]byte(rec), &v); err != nil {
		return nil, fmt.Errorf("store: corrupt record: %w", err)
	}
	return &v, nil
}

// list decodes every record a query selects.
func list[T any](ctx context.Context, s *DB, q string, args ...any) ([]*T, error) {
	rows, err := s.q.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list: %w", err)
	}
	defer rows.Close()
	var out []*T
	for rows.Next() {
		var rec string
		if err := rows.Scan(&rec); err != nil {
			return nil, fmt.Errorf("store: list: %w", err)
		}
		var v T
		if err := json.Unmarshal([]byte(rec), &v); err != nil {
			return nil, fmt.Errorf("store: corrupt record: %w", err)
		}
		out = append(out, &v)
	}
	return out, rows.Err()
}

// del deletes a table's row by its id: ErrNotFound if there is none.
func (s *DB) del(ctx context.Context, table, id string) error { return s.delBy(ctx, table, "id", id) }

// delBy deletes a table's row whose key column col is key.
func (s *DB) delBy(ctx context.Context, table, col, key string) error {
	res, err := s.q.ExecContext(ctx, `DELETE FROM `+table+` WHERE `+col+` = ?`, key)
	if err != nil {
		return fmt.Errorf("store: delete from %s: %w", table, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// PutAccount implements Tx.
func (s *DB) PutAccount(ctx context.Context, a *Account) error {
	return s.put(ctx, "accounts", []string{"id", "name", "created_at"}, []any{a.ID, a.Name, a.CreatedAt.UnixNano()}, a)
}

// GetAccount implements Tx.
func (s *DB) GetAccount(ctx context.Context, id string) (*Account, error) {
	return get[Account](ctx, s, `SELECT record FROM accounts WHERE id = ?`, id)
}

// AccountByName implements Tx.
func (s *DB) AccountByName(ctx context.Context, name string) (*Account, error) {
	return get[Account](ctx, s, `SELECT record FROM accounts WHERE name = ?`, name)
}

// ListAccounts implements Tx.
func (s *DB) ListAccounts(ctx context.Context) ([]*Account, error) {
	return list[Account](ctx, s, `SELECT record FROM accounts ORDER BY created_at, id`)
}

// DeleteAccount implements Tx.
func (s *DB) DeleteAccount(ctx context.Context, id string) error {
	return s.del(ctx, "accounts", id)
}

// PutProject implements Tx.
func (s *DB) PutProject(ctx context.Context, p *Project) error {
	return s.put(ctx, "projects", []string{"id", "account_id", "name", "created_at"}, []any{p.ID, p.AccountID, p.Name, p.CreatedAt.UnixNano()}, p)
}

// GetProject implements Tx.
func (s *DB) GetProject(ctx context.Context, id string) (*Project, error) {
	return get[Project](ctx, s, `SELECT record FROM projects WHERE id = ?`, id)
}

// ProjectByName implements Tx.
func (s *DB) ProjectByName(ctx context.Context, accountID, name string) (*Project, error) {
	return get[Project](ctx, s, `SELECT record FROM projects WHERE account_id = ? AND name = ?`, accountID, name)
}

// ListProjects implements Tx.
func (s *DB) ListProjects(ctx context.Context, accountID string) ([]*Project, error) {
	return list[Project](ctx, s, `SELECT record FROM projects WHERE account_id = ? ORDER BY created_at, id`, accountID)
}

// DeleteProject implements Tx.
func (s *DB) DeleteProject(ctx context.Context, id string) error {
	return s.del(ctx, "projects", id)
}

// PutFleet implements Tx.
func (s *DB) PutFleet(ctx context.Context, f *Fleet) error {
	return s.put(ctx, "fleets", []string{"id", "project_id", "name", "created_at"}, []any{f.ID, f.ProjectID, f.Name, f.CreatedAt.UnixNano()}, f)
}

// GetFleet implements Tx.
func (s *DB) GetFleet(ctx context.Context, id string) (*Fleet, error) {
	return get[Fleet](ctx, s, `SELECT record FROM fleets WHERE id = ?`, id)
}

// FleetByName implements Tx.
func (s *DB) FleetByName(ctx context.Context, projectID, name string) (*Fleet, error) {
	return get[Fleet](ctx, s, `SELECT record FROM fleets WHERE project_id = ? AND name = ?`, projectID, name)
}

// ListFleets implements Tx.
func (s *DB) ListFleets(ctx context.Context, projectID string) ([]*Fleet, error) {
	return list[Fleet](ctx, s, `SELECT record FROM fleets WHERE project_id = ? ORDER BY created_at, id`, projectID)
}

// DeleteFleet implements Tx.
func (s *DB) DeleteFleet(ctx context.Context, id string) error {
	return s.del(ctx, "fleets", id)
}

// keyRecord stores a key with its hash (which the key's JSON omits).
type keyRecord struct {
	Key
	Hash []byte `json:"hash"`
}

// PutKey implements Tx.
func (s *DB) PutKey(ctx context.Context, k *Key) error {
	return s.put(ctx, "api_keys", []string{"id", "account_id", "hash", "created_at"}, []any{k.ID, k.AccountID, k.Hash, k.CreatedAt.UnixNano()}, keyRecord{*k, k.Hash})
}

// GetKey implements Tx.
func (s *DB) GetKey(ctx context.Context, id string) (*Key, error) {
	r, err := get[keyRecord](ctx, s, `SELECT record FROM api_keys WHERE id = ?`, id)
	if err != nil {
		return nil, err
	}
	r.Key.Hash = r.Hash
	return &r.Key, nil
}

// ListKeys implements Tx.
func (s *DB) ListKeys(ctx context.Context, accountID string) ([]*Key, error) {
	q, args := `SELECT record FROM api_keys ORDER BY created_at, id`, []any{}
	if accountID != "" {
		q, args = `SELECT record FROM api_keys WHERE account_id = ? ORDER BY created_at, id`, []any{accountID}
	}
	rs, err := list[keyRecord](ctx, s, q, args...)
	if err != nil {
		return nil, err
	}
	out := make([]*Key, len(rs))
	for i, r := range rs {
		r.Key.Hash = r.Hash
		out[i] = &r.Key
	}
	return out, nil
}

// PutEnvironment implements Tx.
func (s *DB) PutEnvironment(ctx context.Context, e *Environment) error {
	return s.put(ctx, "environments", []string{"id", "project_id", "name", "created_at"}, []any{e.ID, e.ProjectID, e.Name, e.CreatedAt.UnixNano()}, e)
}

// GetEnvironment implements Tx.
func (s *DB) GetEnvironment(ctx context.Context, id string) (*Environment, error) {
	return get[Environment](ctx, s, `SELECT record FROM environments WHERE id = ?`, id)
}

// EnvironmentByName implements Tx.
func (s *DB) EnvironmentByName(ctx context.Context, projectID, name string) (*Environment, error) {
	return get[Environment](ctx, s, `SELECT record FROM environments WHERE project_id = ? AND name = ?`, projectID, name)
}

// ListEnvironments implements Tx.
func (s *DB) ListEnvironments(ctx context.Context, projectID string) ([]*Environment, error) {
	return list[Environment](ctx, s, `SELECT record FROM environments WHERE project_id = ? ORDER BY created_at, id`, projectID)
}

// DeleteEnvironment implements Tx: the environment and its versions.
func (s *DB) DeleteEnvironment(ctx context.Context, id string) error {
	if _, err := s.q.ExecContext(ctx, `DELETE FROM env_versions WHERE environment_id = ?`, id); err != nil {
		return fmt.Errorf("store: delete versions: %w", err)
	}
	return s.del(ctx, "environments", id)
}

// PutEnvVersion implements Tx. Versions are immutable: inserting one that
// exists is ErrConflict.
func (s *DB) PutEnvVersion(ctx context.Context, v *EnvVersion) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	_, err = s.q.ExecContext(ctx, `INSERT INTO env_versions (environment_id, version, created_at, record) VALUES (?, ?, ?, ?)`,
		v.EnvironmentID, v.Version, v.CreatedAt.UnixNano(), string(b))
	if err != nil {
		if isUnique(err) {
			return ErrConflict
		}
		return fmt.Errorf("store: put version: %w", err)
	}
	return nil
}

// GetEnvVersion implements Tx.
func (s *DB) GetEnvVersion(ctx context.Context, environmentID string, version int) (*EnvVersion, error) {
	return get[EnvVersion](ctx, s, `SELECT record FROM env_versions WHERE environment_id = ? AND version = ?`, environmentID, version)
}

// ListEnvVersions implements Tx, oldest first.
func (s *DB) ListEnvVersions(ctx context.Context, environmentID string) ([]*EnvVersion, error) {
	return list[EnvVersion](ctx, s, `SELECT record FROM env_versions WHERE environment_id = ? ORDER BY version`, environmentID)
}

// CountLiveWithEnvironment implements Tx.
func (s *DB) CountLiveWithEnvironment(ctx context.Context, environmentID string) (int, error) {
	var n int
	err := s.q.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes WHERE environment_id = ? AND state != 'deleted'`, environmentID).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("store: count sandboxes: %w", err)
	}
	return n, nil
}
