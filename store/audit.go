package store

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"
)

// AppendAudit implements Tx.
func (s *SQLite) AppendAudit(ctx context.Context, e *AuditEntry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	_, err = s.q.ExecContext(ctx, `INSERT INTO audit_log (seq, time, account_id, principal, action, target, outcome, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		e.Seq, e.Time.UnixNano(), e.AccountID, e.Principal, e.Action, e.Target, e.Outcome, string(b))
	if err != nil {
		if strings.Contains(err.Error(), "UNIQUE constraint failed") {
			return ErrConflict
		}
		return fmt.Errorf("store: append audit: %w", err)
	}
	return nil
}

// LastAudit implements Tx.
func (s *SQLite) LastAudit(ctx context.Context) (*AuditEntry, error) {
	return get[AuditEntry](ctx, s, `SELECT record FROM audit_log ORDER BY seq DESC LIMIT 1`)
}

// ListAudit implements Tx.
func (s *SQLite) ListAudit(ctx context.Context, f AuditFilter) ([]*AuditEntry, error) {
	q := `SELECT record FROM audit_log WHERE seq > ?`
	args := []any{f.After}
	for _, c := range []struct{ col, v string }{
		{"account_id", f.AccountID}, {"principal", f.Principal}, {"target", f.Target}, {"action", f.Action}, {"outcome", f.Outcome},
	} {
		if c.v != "" {
			q += ` AND ` + c.col + ` = ?`
			args = append(args, c.v)
		}
	}
	if !f.From.IsZero() {
		q += ` AND time >= ?`
		args = append(args, nanos(f.From))
	}
	if !f.To.IsZero() {
		q += ` AND time < ?`
		args = append(args, nanos(f.To))
	}
	limit := f.Limit
	if limit <= 0 || limit > 10000 {
		limit = 10000
	}
	q += fmt.Sprintf(` ORDER BY seq LIMIT %d`, limit)
	return list[AuditEntry](ctx, s, q, args...)
}

// PutAuditCheckpoint implements Tx.
func (s *SQLite) PutAuditCheckpoint(ctx context.Context, c *AuditCheckpoint) error {
	return s.put(ctx, "audit_checkpoints", []string{"seq"}, []any{c.Seq}, c)
}

// ListAuditCheckpoints implements Tx, oldest first.
func (s *SQLite) ListAuditCheckpoints(ctx context.Context) ([]*AuditCheckpoint, error) {
	return list[AuditCheckpoint](ctx, s, `SELECT record FROM audit_checkpoints ORDER BY seq`)
}

// nanos is t in Unix nanoseconds, clamped to what an int64 holds (years
// 1678 to 2262), so a far-off bound still compares the right way.
func nanos(t time.Time) int64 {
	switch {
	case t.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	case t.Before(time.Unix(0, math.MinInt64)):
		return math.MinInt64
	}
	return t.UnixNano()
}
