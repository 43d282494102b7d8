// Package budget meters sandbox usage. Billing is the interface the engine
// reports to; Local is the embedded default, metering into the engine's
// database.
package budget

import (
	"context"

	"github.com/harebox/harebox/store"
)

// Usage is one metered interval of one sandbox's reservation.
type Usage = store.Usage

// Billing receives usage as sandboxes run.
type Billing interface {
	Record(ctx context.Context, u Usage) error
}

// Local meters into the embedded database.
type Local struct{ DB store.Store }

// Record implements Billing.
func (l Local) Record(ctx context.Context, u Usage) error { return l.DB.AddUsage(ctx, u) }
