package store

import (
	"context"
	"encoding/json"
	"fmt"
)

// Settings are the deployment's own settings, each a JSON value under a
// name, shared by every host of the store (the warm pool's, for one). The
// domain that owns a name gives its value a type.

// PutSetting implements Tx: sets name's value, replacing any other.
func (s *DB) PutSetting(ctx context.Context, name string, value json.RawMessage) error {
	if name == "" || !json.Valid(value) {
		return fmt.Errorf("store: put setting %q: want a name and a JSON value", name)
	}
	return s.put(ctx, "settings", []string{"name"}, []any{name}, value)
}

// GetSetting implements Tx: ErrNotFound if name has no value.
func (s *DB) GetSetting(ctx context.Context, name string) (json.RawMessage, error) {
	v, err := get[json.RawMessage](ctx, s, `SELECT record FROM settings WHERE name = ?`, name)
	if err != nil {
		return nil, err
	}
	return *v, nil
}

// DeleteSetting implements Tx: ErrNotFound if name has no value.
func (s *DB) DeleteSetting(ctx context.Context, name string) error {
	return s.delBy(ctx, "settings", "name", name)
}
