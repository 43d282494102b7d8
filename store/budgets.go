package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/harebox/harebox/budget/money"
)

// Budget is a dollar limit on what the sandboxes in its scope spend in a
// period, the action taken when it is reached, and its running account
// (the budget package holds the rules).
type Budget struct {
	ID        string      `json:"id"`
	AccountID string      `json:"account_id"`
	Name      string      `json:"name,omitempty"`
	Scope     BudgetScope `json:"scope"`
	// FromKey marks the budget an API key's budget_usd makes: it goes
	// with the key, not on its own.
	FromKey bool `json:"from_key,omitempty"`
	// ProjectID is the project of a project or fleet scope.
	ProjectID string    `json:"project_id,omitempty"`
	Period    string    `json:"period"`
	Limit     money.USD `json:"limit_usd"`
	Action    string    `json:"action"`
	WarnAt    []int     `json:"warn_at_percent,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// PeriodStart is the start of the current period.
	PeriodStart time.Time `json:"period_start"`
	// Spent is what was settled in the period; Reserved what the live
	// sandboxes in scope hold for their next interval.
	Spent    money.USD `json:"spent_usd"`
	Reserved money.USD `json:"reserved_usd"`
	// ReachedAt is when the period's spend reached the limit; Pending
	// means its action is decided but not yet done.
	ReachedAt *time.Time `json:"reached_at,omitempty"`
	Pending   bool       `json:"action_pending,omitempty"`
	// Warned lists the thresholds already announced this period.
	Warned []int `json:"warned_percent,omitempty"`
}

// BudgetScope says what a budget covers: the account, a project, fleet or
// key (Ref, an ID), or the sandboxes whose labels match Labels.
type BudgetScope struct {
	Kind   string            `json:"kind" validate:"oneof=account project fleet label key"`
	Ref    string            `json:"ref,omitempty" validate:"max=64"`
	Labels map[string]string `json:"labels,omitempty" validate:"max=16,dive,keys,max=63,endkeys,max=255"`
}

// Usage is one metered interval of one sandbox: where it was, what it
// held, and what that cost.
type Usage struct {
	SandboxID string            `json:"sandbox_id"`
	AccountID string            `json:"account_id,omitempty"`
	ProjectID string            `json:"project_id,omitempty"`
	FleetID   string            `json:"fleet_id,omitempty"`
	KeyID     string            `json:"key_id,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	Start     time.Time         `json:"start"`
	End       time.Time         `json:"end"`
	VCPUs     int               `json:"vcpus"`
	MemoryMB  int               `json:"memory_mb"`
	DiskGB    int               `json:"disk_gb"`
	Paused    bool              `json:"paused,omitempty"`
	// EgressBytes is what the guest sent out of its link in the interval.
	EgressBytes uint64 `json:"egress_bytes,omitempty"`
	// SnapshotBytes is the snapshot storage held (a snapshot's files, or a
	// hibernated sandbox's).
	SnapshotBytes int64     `json:"snapshot_bytes,omitempty"`
	Cost          money.USD `json:"cost_usd"`
}

// Reservation is what a live sandbox holds against its budgets: Amount,
// the expected cost of its next interval, reserved in each of Budgets;
// From is how far its usage is settled.
type Reservation struct {
	SandboxID string    `json:"sandbox_id"`
	Amount    money.USD `json:"amount_usd"`
	Budgets   []string  `json:"budgets,omitempty"`
	From      time.Time `json:"from"`
	// Egress is the link's egress counter at From.
	Egress uint64 `json:"egress,omitempty"`
}

// UsageFilter selects usage rows: an account's ("" for every account),
// ending after From and starting before To (zero: unbounded).
type UsageFilter struct {
	AccountID string
	From, To  time.Time
}

// PutBudget implements Tx.
func (s *DB) PutBudget(ctx context.Context, b *Budget) error {
	ref := b.Scope.Ref
	if b.Scope.Kind == "label" {
		ref = labelRef(b.Scope.Labels)
	}
	return s.put(ctx, "budgets", []string{"id", "account_id", "scope_kind", "scope_ref", "created_at"},
		[]any{b.ID, b.AccountID, b.Scope.Kind, ref, b.CreatedAt.UnixNano()}, b)
}

// labelRef indexes a label budget by one of its labels (the least, as
// KEY=VALUE): a sandbox without that label cannot match it, so an
// admission reads only the label budgets that one of its labels names.
func labelRef(labels map[string]string) string {
	ref := ""
	for k, v := range labels {
		if kv := k + "=" + v; ref == "" || kv < ref {
			ref = kv
		}
	}
	return ref
}

// GetBudget implements Tx.
func (s *DB) GetBudget(ctx context.Context, id string) (*Budget, error) {
	return get[Budget](ctx, s, `SELECT record FROM budgets WHERE id = ?`, id)
}

// ListBudgets implements Tx.
func (s *DB) ListBudgets(ctx context.Context, accountID string) ([]*Budget, error) {
	if accountID == "" {
		return list[Budget](ctx, s, `SELECT record FROM budgets ORDER BY created_at, id`)
	}
	return list[Budget](ctx, s, `SELECT record FROM budgets WHERE account_id = ? ORDER BY created_at, id`, accountID)
}

// CandidateBudgets implements Tx: a query on the indexed scope columns,
// so an admission reads the few budgets that can cover it, not all.
func (s *DB) CandidateBudgets(ctx context.Context, accountID, projectID, fleetID string, keyIDs []string, labels map[string]string) ([]*Budget, error) {
	q, args := `SELECT record FROM budgets WHERE account_id = ? AND scope_kind = 'account'
		UNION ALL SELECT record FROM budgets WHERE account_id = ? AND scope_kind = 'project' AND scope_ref = ?
		UNION ALL SELECT record FROM budgets WHERE account_id = ? AND scope_kind = 'fleet' AND scope_ref = ?`,
		[]any{accountID, accountID, projectID, accountID, fleetID}
	in := func(kind string, refs []string) {
		if len(refs) == 0 {
			return
		}
		q += ` UNION ALL SELECT record FROM budgets WHERE account_id = ? AND scope_kind = '` + kind + `' AND scope_ref IN (?` + strings.Repeat(", ?", len(refs)-1) + `)`
		args = append(args, accountID)
		for _, r := range refs {
			args = append(args, r)
		}
	}
	in("key", keyIDs)
	var kv []string
	for k, v := range labels {
		kv = append(kv, k+"="+v)
	}
	in("label", kv)
	return list[Budget](ctx, s, q, args...)
}

// DeleteBudget implements Tx.
func (s *DB) DeleteBudget(ctx context.Context, id string) error {
	return s.del(ctx, "budgets", id)
}

// PutReservation implements Tx.
func (s *DB) PutReservation(ctx context.Context, r *Reservation) error {
	return s.put(ctx, "reservations", []string{"sandbox_id"}, []any{r.SandboxID}, r)
}

// GetReservation implements Tx.
func (s *DB) GetReservation(ctx context.Context, sandboxID string) (*Reservation, error) {
	return get[Reservation](ctx, s, `SELECT record FROM reservations WHERE sandbox_id = ?`, sandboxID)
}

// ListReservations implements Tx.
func (s *DB) ListReservations(ctx context.Context) ([]*Reservation, error) {
	return list[Reservation](ctx, s, `SELECT record FROM reservations ORDER BY sandbox_id`)
}

// DeleteReservation implements Tx.
func (s *DB) DeleteReservation(ctx context.Context, sandboxID string) error {
	if _, err := s.q.ExecContext(ctx, `DELETE FROM reservations WHERE sandbox_id = ?`, sandboxID); err != nil {
		return fmt.Errorf("store: delete reservation: %w", err)
	}
	return nil
}

// AddUsage implements Tx.
func (s *DB) AddUsage(ctx context.Context, u Usage) error {
	labels, err := json.Marshal(u.Labels)
	if err != nil {
		return fmt.Errorf("store: add usage: %w", err)
	}
	_, err = s.q.ExecContext(ctx, `INSERT INTO usage (sandbox_id, start_ns, end_ns, vcpus, memory_mb, account_id, project_id, fleet_id, key_id, labels, disk_gb, paused, cost, egress_bytes, snapshot_bytes)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		u.SandboxID, u.Start.UnixNano(), u.End.UnixNano(), u.VCPUs, u.MemoryMB,
		u.AccountID, u.ProjectID, u.FleetID, u.KeyID, string(labels), u.DiskGB, u.Paused, int64(u.Cost), int64(min(u.EgressBytes, 1<<62)), u.SnapshotBytes)
	if err != nil {
		return fmt.Errorf("store: add usage: %w", err)
	}
	return nil
}

const usageCols = `sandbox_id, start_ns, end_ns, vcpus, memory_mb, account_id, project_id, fleet_id, key_id, labels, disk_gb, paused, cost, egress_bytes, snapshot_bytes`

// ListUsage implements Tx.
func (s *DB) ListUsage(ctx context.Context, sandboxID string) ([]Usage, error) {
	return s.usage(ctx, `SELECT `+usageCols+` FROM usage WHERE sandbox_id = ? ORDER BY start_ns`, sandboxID)
}

// QueryUsage implements Tx.
func (s *DB) QueryUsage(ctx context.Context, f UsageFilter) ([]Usage, error) {
	q, args := `SELECT `+usageCols+` FROM usage WHERE 1 = 1`, []any{}
	if f.AccountID != "" {
		q += ` AND account_id = ?`
		args = append(args, f.AccountID)
	}
	if !f.From.IsZero() {
		q += ` AND end_ns > ?`
		args = append(args, f.From.UnixNano())
	}
	if !f.To.IsZero() {
		q += ` AND start_ns < ?`
		args = append(args, f.To.UnixNano())
	}
	return s.usage(ctx, q+` ORDER BY start_ns`, args...)
}

func (s *DB) usage(ctx context.Context, q string, args ...any) ([]Usage, error) {
	rows, err := s.q.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list usage: %w", err)
	}
	defer rows.Close()
	var out []Usage
	for rows.Next() {
		var start, end, cost, egress int64
		var labels string
		var u Usage
		if err := rows.Scan(&u.SandboxID, &start, &end, &u.VCPUs, &u.MemoryMB, &u.AccountID, &u.ProjectID, &u.FleetID, &u.KeyID, &labels, &u.DiskGB, &u.Paused, &cost, &egress, &u.SnapshotBytes); err != nil {
			return nil, fmt.Errorf("store: list usage: %w", err)
		}
		u.Start, u.End, u.Cost, u.EgressBytes = time.Unix(0, start).UTC(), time.Unix(0, end).UTC(), money.USD(cost), uint64(egress)
		if err := json.Unmarshal([]byte(labels), &u.Labels); err != nil {
			return nil, fmt.Errorf("store: corrupt usage labels: %w", err)
		}
		out = append(out, u)
	}
	return out, rows.Err()
}
