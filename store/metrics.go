package store

import (
	"context"
	"fmt"
	"time"
)

// MetricSample is one sample of a sandbox's use of the host, measured on
// the host side (the VMM process, the tap, the disk files), never asked
// of the guest. CPU and network are counters since the VMM (or the link)
// started; memory and disk are levels.
type MetricSample struct {
	SandboxID string    `json:"sandbox_id"`
	AccountID string    `json:"-"`
	Time      time.Time `json:"time"`
	// CPUSeconds is the VMM's CPU time (user and system).
	CPUSeconds float64 `json:"cpu_seconds"`
	// MemoryBytes is the VMM's resident memory.
	MemoryBytes int64 `json:"memory_bytes"`
	// DiskBytes is what the sandbox's own disk files take on the host.
	DiskBytes int64 `json:"disk_bytes"`
	// NetSentBytes and NetReceivedBytes are the guest's traffic on its
	// link (absent without a network that counts).
	NetSentBytes     uint64 `json:"net_sent_bytes"`
	NetReceivedBytes uint64 `json:"net_received_bytes"`
}

// PutMetrics implements Tx.
func (s *DB) PutMetrics(ctx context.Context, m *MetricSample) error {
	return s.put(ctx, "metrics", []string{"id", "sandbox_id", "account_id", "time_ns"},
		[]any{fmt.Sprintf("%s/%d", m.SandboxID, m.Time.UnixNano()), m.SandboxID, m.AccountID, m.Time.UnixNano()}, m)
}

// ListMetrics implements Tx.
func (s *DB) ListMetrics(ctx context.Context, sandboxID string, from, to time.Time, limit int) ([]*MetricSample, error) {
	q, args := `SELECT record FROM metrics WHERE sandbox_id = ?`, []any{sandboxID}
	if !from.IsZero() {
		q += ` AND time_ns >= ?`
		args = append(args, nanos(from))
	}
	if !to.IsZero() {
		q += ` AND time_ns < ?`
		args = append(args, nanos(to))
	}
	if limit <= 0 || limit > 10000 {
		limit = 10000
	}
	return list[MetricSample](ctx, s, q+fmt.Sprintf(` ORDER BY time_ns LIMIT %d`, limit), args...)
}

// PurgeMetrics implements Tx.
func (s *DB) PurgeMetrics(ctx context.Context, accountID string, before time.Time) error {
	if _, err := s.q.ExecContext(ctx, `DELETE FROM metrics WHERE account_id = ? AND time_ns < ?`, accountID, nanos(before)); err != nil {
		return fmt.Errorf("store: purge metrics: %w", err)
	}
	return nil
}
