package store

import (
	"context"
	"fmt"

	"github.com/harebox/harebox/sandbox"
)

// URL is a published port's stored record: the API view without the
// token, and the token's hash.
type URL struct {
	sandbox.URL
	// TokenHash is the SHA-256 of the token, hex.
	TokenHash string `json:"token_hash"`
}

// PutURL implements Tx; a second URL for the same sandbox and port is
// ErrConflict.
func (s *SQLite) PutURL(ctx context.Context, u *URL) error {
	return s.put(ctx, "urls", []string{"id", "sandbox_id", "port", "created_at"},
		[]any{u.ID, u.SandboxID, u.Port, nanos(u.CreatedAt)}, u)
}

// GetURL implements Tx.
func (s *SQLite) GetURL(ctx context.Context, id string) (*URL, error) {
	return get[URL](ctx, s, `SELECT record FROM urls WHERE id = ?`, id)
}

// ListURLs implements Tx: a sandbox's ("" for every sandbox's).
func (s *SQLite) ListURLs(ctx context.Context, sandboxID string) ([]*URL, error) {
	if sandboxID == "" {
		return list[URL](ctx, s, `SELECT record FROM urls ORDER BY created_at, id`)
	}
	return list[URL](ctx, s, `SELECT record FROM urls WHERE sandbox_id = ? ORDER BY created_at, id`, sandboxID)
}

// DeleteURL implements Tx.
func (s *SQLite) DeleteURL(ctx context.Context, id string) error {
	res, err := s.q.ExecContext(ctx, `DELETE FROM urls WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("store: delete url: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}
