package store

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// AppendAudit implements Tx.
func (s *DB) AppendAudit(ctx context.Context, e *AuditEntry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	_, err = s.q.ExecContext(ctx, `INSERT INTO audit_log (seq, time, account_id, principal, action, target, outcome, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		e.Seq, e.Time.UnixNano(), e.AccountID, e.Principal, e.Action, e.Target, e.Outcome, string(b))
	if err != nil {
		if isUnique(err) {
			// Another host appended at this place meanwhile: the
			// transaction goes again (it reads the chain's new end).
			return fmt.Errorf("store: append audit at %d: %w (%w)", e.Seq, ErrConflict, errRetry)
		}
		return fmt.Errorf("store: append audit: %w", err)
	}
	return nil
}

// LastAudit implements Tx.
func (s *DB) LastAudit(ctx context.Context) (*AuditEntry, error) {
	l, err := s.auditRows(ctx, `SELECT `+auditCols+` FROM audit_log ORDER BY seq DESC LIMIT 1`)
	if err != nil {
		return nil, err
	}
	if len(l) == 0 {
		return nil, ErrNotFound
	}
	return l[0], nil
}

// auditCols are what an audit row is read as: the columns that queries
// match, and the record (which the chain hashes) that they index. Each
// entry read names the columns that disagree with its record (Mismatch),
// for the audit package to refuse and report.
const auditCols = `seq, time, account_id, principal, action, target, outcome, record`

func (s *DB) auditRows(ctx context.Context, q string, args ...any) ([]*AuditEntry, error) {
	rows, err := s.q.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list audit: %w", err)
	}
	defer rows.Close()
	var out []*AuditEntry
	for rows.Next() {
		var (
			seq, at                                             int64
			account, principal, action, target, outcome, record string
		)
		if err := rows.Scan(&seq, &at, &account, &principal, &action, &target, &outcome, &record); err != nil {
			return nil, fmt.Errorf("store: list audit: %w", err)
		}
		e := &AuditEntry{}
		if err := json.Unmarshal([]byte(record), e); err != nil {
			// Named by its place, so that verify can say which.
			out = append(out, &AuditEntry{Seq: seq, Mismatch: []string{"record"}})
			continue
		}
		for _, c := range []struct {
			name string
			same bool
		}{
			{"seq", seq == e.Seq}, {"time", at == e.Time.UnixNano()}, {"account_id", sameText(account, e.AccountID)},
			{"principal", sameText(principal, e.Principal)}, {"action", sameText(action, e.Action)},
			{"target", sameText(target, e.Target)}, {"outcome", sameText(outcome, e.Outcome)},
		} {
			if !c.same {
				e.Mismatch = append(e.Mismatch, c.name)
			}
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// sameText says whether a column holds a record's text: as the record's
// JSON has it (invalid UTF-8 made U+FFFD) and as PostgreSQL keeps it (NUL
// made U+FFFD too, see text), which SQLite's column does not.
func sameText(col, field string) bool {
	return col == field || storedText(col) == storedText(field)
}

func storedText(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	b, _ := json.Marshal(s)
	json.Unmarshal(b, &s)
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// ListAudit implements Tx.
func (s *DB) ListAudit(ctx context.Context, f AuditFilter) ([]*AuditEntry, error) {
	q := `SELECT ` + auditCols + ` FROM audit_log WHERE seq > ?`
	args := []any{f.After}
	for _, c := range []struct{ col, v string }{
		{"account_id", f.AccountID}, {"principal", f.Principal}, {"target", f.Target}, {"action", f.Action}, {"outcome", f.Outcome},
	} {
		if c.v != "" {
			q += ` AND ` + c.col + ` = ?`
			args = append(args, c.v)
		}
	}
	if f.Through > 0 {
		q += ` AND seq <= ?`
		args = append(args, f.Through)
	}
	if f.Events {
		q += ` AND (principal LIKE 'budget:%' OR principal LIKE 'sandbox:%' OR principal = 'engine')`
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
	if !f.Newest {
		q += fmt.Sprintf(` ORDER BY seq LIMIT %d`, limit)
		return s.auditRows(ctx, q, args...)
	}
	q += fmt.Sprintf(` ORDER BY seq DESC LIMIT %d`, limit)
	l, err := s.auditRows(ctx, q, args...)
	slices.Reverse(l)
	return l, err
}

// PutAuditCheckpoint implements Tx.
func (s *DB) PutAuditCheckpoint(ctx context.Context, c *AuditCheckpoint) error {
	return s.put(ctx, "audit_checkpoints", []string{"seq"}, []any{c.Seq}, c)
}

// ListAuditCheckpoints implements Tx, oldest first.
func (s *DB) ListAuditCheckpoints(ctx context.Context) ([]*AuditCheckpoint, error) {
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

// PutCommand implements Tx.
func (s *DB) PutCommand(ctx context.Context, c *CommandRow) error {
	_, err := s.q.ExecContext(ctx, `INSERT INTO commands (id, sandbox_id, account_id, started_at, output_purged) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT(id) DO UPDATE SET output_purged = excluded.output_purged`,
		c.ID, c.SandboxID, c.AccountID, c.StartedAt.UnixNano(), boolInt(c.OutputPurged))
	if err != nil {
		return fmt.Errorf("store: put command: %w", err)
	}
	return nil
}

func (s *DB) commandRows(ctx context.Context, q string, args ...any) ([]*CommandRow, error) {
	rows, err := s.q.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list commands: %w", err)
	}
	defer rows.Close()
	var out []*CommandRow
	for rows.Next() {
		c := &CommandRow{}
		var started, purged int64
		if err := rows.Scan(&c.ID, &c.SandboxID, &c.AccountID, &started, &purged); err != nil {
			return nil, fmt.Errorf("store: list commands: %w", err)
		}
		c.OutputPurged = purged != 0
		c.StartedAt = time.Unix(0, started).UTC()
		out = append(out, c)
	}
	return out, rows.Err()
}

// ListCommands implements Tx: the newest limit entries, oldest first.
func (s *DB) ListCommands(ctx context.Context, sandboxID string, limit int) ([]*CommandRow, error) {
	if limit <= 0 || limit > 10000 {
		limit = 10000
	}
	return s.commandRows(ctx, `SELECT * FROM (SELECT id, sandbox_id, account_id, started_at, output_purged FROM commands
		WHERE sandbox_id = ? ORDER BY started_at DESC, id DESC LIMIT ?) AS newest ORDER BY started_at, id`, sandboxID, limit)
}

// OldCommands implements Tx.
func (s *DB) OldCommands(ctx context.Context, accountID string, before time.Time, withOutput bool) ([]*CommandRow, error) {
	q := `SELECT id, sandbox_id, account_id, started_at, output_purged FROM commands WHERE account_id = ? AND started_at < ?`
	if withOutput {
		q += ` AND output_purged = 0`
	}
	return s.commandRows(ctx, q+` ORDER BY started_at`, accountID, nanos(before))
}

// DeleteCommand implements Tx.
func (s *DB) DeleteCommand(ctx context.Context, id string) error {
	_, err := s.q.ExecContext(ctx, `DELETE FROM commands WHERE id = ?`, id)
	return err
}

// DeleteCommands implements Tx.
func (s *DB) DeleteCommands(ctx context.Context, sandboxID string) error {
	_, err := s.q.ExecContext(ctx, `DELETE FROM commands WHERE sandbox_id = ?`, sandboxID)
	return err
}

// boolInt is b as the integer column (0 or 1) both databases take.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
