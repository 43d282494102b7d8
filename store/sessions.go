package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Session is a signed-in browser's stand-in for an API key (the web
// console's), kept in the store so that every host of a deployment
// honours it and a restart keeps it. Its owner (package apikey) seals
// what it needs under a key only the browser's session ID gives: the
// store holds nothing that opens a session or yields its key.
type Session struct {
	// IDHash names the session: a hash of its ID, which only the browser
	// holds.
	IDHash string
	// KeyID is the API key the session stands for.
	KeyID string
	// Expires is the session's hard end; Used its last use (as its
	// owner counts them); Ends when it ends unless used again.
	Expires, Used, Ends time.Time
	// Sealed is the owner's sealed payload.
	Sealed []byte
}

// PutSession implements Tx: inserts or replaces the session.
func (s *DB) PutSession(ctx context.Context, ss *Session) error {
	if ss.IDHash == "" || ss.KeyID == "" || len(ss.Sealed) == 0 {
		return fmt.Errorf("store: put session: want an ID hash, a key and a sealed payload")
	}
	_, err := s.q.ExecContext(ctx, `INSERT INTO sessions (id_hash, key_id, expires_at, used_at, ends_at, sealed) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT(id_hash) DO UPDATE SET key_id = excluded.key_id, expires_at = excluded.expires_at,
		used_at = excluded.used_at, ends_at = excluded.ends_at, sealed = excluded.sealed`,
		ss.IDHash, ss.KeyID, nanos(ss.Expires), nanos(ss.Used), nanos(ss.Ends), ss.Sealed)
	if err != nil {
		return fmt.Errorf("store: put session: %w", err)
	}
	return nil
}

// GetSession implements Tx.
func (s *DB) GetSession(ctx context.Context, idHash string) (*Session, error) {
	ss := Session{IDHash: idHash}
	var expires, used, ends int64
	err := s.q.QueryRowContext(ctx, `SELECT key_id, expires_at, used_at, ends_at, sealed FROM sessions WHERE id_hash = ?`, idHash).
		Scan(&ss.KeyID, &expires, &used, &ends, &ss.Sealed)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: get session: %w", err)
	}
	ss.Expires, ss.Used, ss.Ends = time.Unix(0, expires), time.Unix(0, used), time.Unix(0, ends)
	return &ss, nil
}

// TouchSession implements Tx: a session's last use and end move; one
// deleted meanwhile (signed out on another host) stays deleted.
func (s *DB) TouchSession(ctx context.Context, idHash string, used, ends time.Time) error {
	res, err := s.q.ExecContext(ctx, `UPDATE sessions SET used_at = ?, ends_at = ? WHERE id_hash = ?`, nanos(used), nanos(ends), idHash)
	if err != nil {
		return fmt.Errorf("store: touch session: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// DeleteSession implements Tx.
func (s *DB) DeleteSession(ctx context.Context, idHash string) error {
	return s.delBy(ctx, "sessions", "id_hash", idHash)
}

// DeleteKeySessions implements Tx: a key's sessions (it was revoked or
// rotated); none is no error.
func (s *DB) DeleteKeySessions(ctx context.Context, keyID string) error {
	if _, err := s.q.ExecContext(ctx, `DELETE FROM sessions WHERE key_id = ?`, keyID); err != nil {
		return fmt.Errorf("store: delete a key's sessions: %w", err)
	}
	return nil
}

// PruneSessions implements Tx: the sessions ended by now go, and of
// keyID's (if given) all but the keep that end last.
func (s *DB) PruneSessions(ctx context.Context, now time.Time, keyID string, keep int) error {
	if _, err := s.q.ExecContext(ctx, `DELETE FROM sessions WHERE ends_at <= ?`, nanos(now)); err != nil {
		return fmt.Errorf("store: prune sessions: %w", err)
	}
	if keyID == "" {
		return nil
	}
	_, err := s.q.ExecContext(ctx, `DELETE FROM sessions WHERE key_id = ? AND id_hash NOT IN
		(SELECT id_hash FROM sessions WHERE key_id = ? ORDER BY ends_at DESC, id_hash LIMIT ?)`, keyID, keyID, max(keep, 0))
	if err != nil {
		return fmt.Errorf("store: prune sessions: %w", err)
	}
	return nil
}
