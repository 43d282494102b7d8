// Package budget holds prices, budgets and the ledger: what a sandbox's
// usage costs, and the rules that keep an account, project, fleet, label
// or API key under a dollar limit. Admitting a sandbox reserves the cost
// of its next metering interval in every budget that covers it, in the
// store transaction that admits it; metering settles the reservation into
// spend and renews it. Package budget/meter meters the engine's sandboxes
// and acts on reached budgets; the records live in the store.
package budget

import (
	"context"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"

	"github.com/harebox/harebox/budget/money"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Billing receives a copy of every metered interval, e.g. for an
// external billing system: an output only. The engine meters into its
// own store, where budgets read it, whether or not one is set.
type Billing interface {
	Record(ctx context.Context, u store.Usage) error
}

// Scope kinds.
const (
	ScopeAccount = "account"
	ScopeProject = "project"
	ScopeFleet   = "fleet"
	ScopeLabel   = "label"
	ScopeKey     = "key"
)

// Periods.
const (
	Monthly = "monthly" // calendar months, UTC
	Total   = "total"   // from the budget's creation on
)

// Actions when a budget is reached.
const (
	// Notify records the event in the audit log; nothing is refused.
	Notify = "notify"
	// DenyNew refuses creates and resumes in scope; running sandboxes
	// go on.
	DenyNew = "deny_new"
	// Pause pauses the running sandboxes in scope, and refuses creates
	// and resumes.
	Pause = "pause"
	// Stop stops the sandboxes in scope (they keep their disks, which
	// cost disk_gb_hour stopped), and refuses creates, resumes and starts.
	// On a backend that cannot start them again they are paused instead.
	Stop = "stop"
	// Delete deletes the sandboxes in scope, and refuses creates and
	// resumes.
	Delete = "delete"
)

// IDPrefix starts every budget ID.
const IDPrefix = "bgt_"

// CreateRequest makes a budget.
type CreateRequest struct {
	Name string `json:"name,omitempty" validate:"omitempty,max=63,dnslabel"`
	// Scope.Ref names a project (ID or name), a fleet (ID) or an API key
	// (ID) of the budget's account.
	Scope  store.BudgetScope `json:"scope"`
	Period string            `json:"period" validate:"oneof=monthly total"`
	Limit  money.USD         `json:"limit_usd"`
	Action string            `json:"action" validate:"oneof=notify deny_new pause stop delete"`
	// WarnAt are percentages of the limit announced once a period each.
	WarnAt []int `json:"warn_at_percent,omitempty" validate:"max=4,dive,min=1,max=99"`
}

// Check validates the request.
func (r *CreateRequest) Check() error {
	if err := sandbox.Validate(r); err != nil {
		return err
	}
	if r.Limit <= 0 || r.Limit > money.MaxUSD {
		return sandbox.Errorf(sandbox.ErrInvalid, "limit_usd", "must be more than 0 and at most %s", money.MaxUSD)
	}
	switch r.Scope.Kind {
	case ScopeAccount:
		if r.Scope.Ref != "" || len(r.Scope.Labels) > 0 {
			return sandbox.Errorf(sandbox.ErrInvalid, "scope", "an account scope takes no ref and no labels")
		}
	case ScopeLabel:
		if r.Scope.Ref != "" || len(r.Scope.Labels) == 0 {
			return sandbox.Errorf(sandbox.ErrInvalid, "scope.labels", "a label scope takes labels (a selector) and no ref")
		}
	default:
		if r.Scope.Ref == "" || len(r.Scope.Labels) > 0 {
			return sandbox.Errorf(sandbox.ErrInvalid, "scope.ref", "a %s scope takes a ref and no labels", r.Scope.Kind)
		}
	}
	return nil
}

// Subject is what a budget's scope is matched against: a sandbox's place,
// its labels and the key that created it.
type Subject struct {
	AccountID, ProjectID, FleetID string
	// Keys are the key that created the sandbox and the keys above it.
	Keys   []string
	Labels map[string]string
}

// Covers reports whether b's scope includes s.
func Covers(b *store.Budget, s Subject) bool {
	if b.AccountID != s.AccountID {
		return false
	}
	switch b.Scope.Kind {
	case ScopeAccount:
		return true
	case ScopeProject:
		return s.ProjectID == b.Scope.Ref
	case ScopeFleet:
		return s.FleetID != "" && s.FleetID == b.Scope.Ref
	case ScopeKey:
		return slices.Contains(s.Keys, b.Scope.Ref)
	case ScopeLabel:
		for k, v := range b.Scope.Labels {
			if got, ok := s.Labels[k]; !ok || got != v {
				return false
			}
		}
		return len(b.Scope.Labels) > 0
	}
	return false
}

// periodStart is the start of b's period that holds t.
func periodStart(b *store.Budget, t time.Time) time.Time {
	if b.Period == Total {
		return b.CreatedAt
	}
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// roll starts a new period if now is past the current one: the spend,
// the reached state and the warnings reset; reservations carry over.
func roll(b *store.Budget, now time.Time) {
	if start := periodStart(b, now); start.After(b.PeriodStart) {
		b.PeriodStart = start
		b.Spent = 0
		b.ReachedAt = nil
		b.Pending = false
		b.Warned = nil
	}
}

// refuses reports whether b refuses what would pass it (every action but
// notify).
func refuses(b *store.Budget) bool { return b.Action != Notify }

// full reports whether b has no room left: reached this period, or its
// spend and reservations past the limit.
func full(b *store.Budget) bool {
	return refuses(b) && (b.ReachedAt != nil || b.Spent+b.Reserved > b.Limit)
}

func refusal(b *store.Budget, amount money.USD) error {
	left := max(0, b.Limit-b.Spent-b.Reserved)
	if b.ReachedAt != nil {
		left = 0
	}
	return &sandbox.Error{Kind: sandbox.ErrBudget, Msg: fmt.Sprintf("budget %s (%s %s, %s) has %s left of %s this period and this needs %s",
		ref(b), b.Scope.Kind, scopeText(b), b.Action, left, b.Limit, amount)}
}

// settle moves a sandbox's old reservation into spend as cost, reserves
// next, and reports whether b was reached just now (its action is due:
// Pending is set) and the warning thresholds crossed.
func settle(b *store.Budget, now time.Time, oldReserved, cost, next money.USD) (reached bool, warn []int) {
	roll(b, now)
	b.Reserved = min(money.MaxUSD, max(0, b.Reserved-oldReserved)+next)
	b.Spent = min(money.MaxUSD, b.Spent+cost)
	for _, pct := range b.WarnAt {
		if !slices.Contains(b.Warned, pct) && atLeastPercent(b.Spent, b.Limit, pct) {
			b.Warned = append(b.Warned, pct)
			warn = append(warn, pct)
		}
	}
	// Reached: the spend is at the limit, or (for a budget that acts) the
	// sandboxes it covers cannot all have their next interval under it.
	if b.ReachedAt == nil && (b.Spent >= b.Limit || (refuses(b) && b.Spent+b.Reserved > b.Limit)) {
		t := now.UTC()
		b.ReachedAt = &t
		b.Pending = true
		return true, warn
	}
	return false, warn
}

// atLeastPercent reports whether spent is at least pct percent of limit,
// exactly (the products can pass int64).
func atLeastPercent(spent, limit money.USD, pct int) bool {
	l := new(big.Int).Mul(big.NewInt(int64(limit)), big.NewInt(int64(pct)))
	return new(big.Int).Mul(big.NewInt(int64(spent)), big.NewInt(100)).Cmp(l) >= 0
}

func ref(b *store.Budget) string {
	if b.Name != "" {
		return b.Name
	}
	return b.ID
}

func scopeText(b *store.Budget) string {
	if b.Scope.Kind == ScopeLabel {
		var kv []string
		for k, v := range b.Scope.Labels {
			kv = append(kv, k+"="+v)
		}
		slices.Sort(kv)
		return strings.Join(kv, ",")
	}
	if b.Scope.Kind == ScopeAccount {
		return b.AccountID
	}
	return b.Scope.Ref
}
