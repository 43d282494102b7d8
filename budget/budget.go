// Package budget meters sandbox usage and holds money amounts. Billing is
// the interface the engine reports to; Local is the embedded default,
// metering into the engine's database.
package budget

import (
	"context"
	"time"
)

// Usage is one metered interval of one sandbox's reservation.
type Usage struct {
	SandboxID string    `json:"sandbox_id"`
	Start     time.Time `json:"start"`
	End       time.Time `json:"end"`
	VCPUs     int       `json:"vcpus"`
	MemoryMB  int       `json:"memory_mb"`
}

// Billing receives usage as sandboxes run.
type Billing interface {
	Record(ctx context.Context, u Usage) error
}

// Local meters into the embedded database.
type Local struct {
	DB interface {
		AddUsage(ctx context.Context, u Usage) error
	}
}

// Record implements Billing.
func (l Local) Record(ctx context.Context, u Usage) error { return l.DB.AddUsage(ctx, u) }
