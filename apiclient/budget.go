package apiclient

import "time"

// BudgetScope says what a budget covers: kind account, project, fleet,
// label or key; Ref names the project (ID or name), fleet (ID) or key
// (ID); Labels is a label scope's selector.
type BudgetScope struct {
	Kind   string            `json:"kind"`
	Ref    string            `json:"ref,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
}

// BudgetRequest makes a budget. Money is a decimal dollar string.
type BudgetRequest struct {
	Name   string      `json:"name,omitempty"`
	Scope  BudgetScope `json:"scope"`
	Period string      `json:"period"`
	Limit  string      `json:"limit_usd"`
	Action string      `json:"action"`
	WarnAt []int       `json:"warn_at_percent,omitempty"`
}

// Budget is a dollar limit with its running account.
type Budget struct {
	ID          string      `json:"id"`
	AccountID   string      `json:"account_id"`
	Name        string      `json:"name,omitempty"`
	Scope       BudgetScope `json:"scope"`
	FromKey     bool        `json:"from_key,omitempty"`
	ProjectID   string      `json:"project_id,omitempty"`
	Period      string      `json:"period"`
	Limit       string      `json:"limit_usd"`
	Action      string      `json:"action"`
	WarnAt      []int       `json:"warn_at_percent,omitempty"`
	CreatedAt   time.Time   `json:"created_at"`
	PeriodStart time.Time   `json:"period_start"`
	Spent       string      `json:"spent_usd"`
	Reserved    string      `json:"reserved_usd"`
	ReachedAt   *time.Time  `json:"reached_at,omitempty"`
	Pending     bool        `json:"action_pending,omitempty"`
	Warned      []int       `json:"warned_percent,omitempty"`
}

// UsageGroup is the metered usage of one group and its cost.
type UsageGroup struct {
	Group string `json:"group"`
	// Name is what Group stands for: the account's, project's, fleet's or
	// sandbox's name, the key's description; empty for a label's value.
	Name             string `json:"name,omitempty"`
	VCPUSeconds      int64  `json:"vcpu_seconds"`
	MemoryGiBSeconds int64  `json:"memory_gib_seconds"`
	PausedSeconds    int64  `json:"paused_seconds"`
	EgressBytes      uint64 `json:"egress_bytes"`
	// SnapshotGBSeconds is snapshot storage (10^9 bytes) held, in seconds.
	SnapshotGBSeconds int64  `json:"snapshot_gb_seconds"`
	Cost              string `json:"cost_usd"`
}
