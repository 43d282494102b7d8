package budget

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/budget/money"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
)

// Service keeps budgets and the ledger for the principal in the context.
type Service struct {
	// Audit, if set, records every change and every budget event.
	Audit *audit.Log
	// Billing, if set, gets a copy of every metered interval.
	Billing Billing
	prices  Prices
	db      Store
	tenants *tenant.Service
	now     func() time.Time
}

// Tx is what budgets, their reservations and the ledger need of a store
// transaction.
type Tx interface {
	tenant.Resolver
	AddUsage(ctx context.Context, u store.Usage) error
	CandidateBudgets(ctx context.Context, accountID, projectID, fleetID string, keyIDs []string, labels map[string]string) ([]*store.Budget, error)
	DeleteBudget(ctx context.Context, id string) error
	DeleteReservation(ctx context.Context, sandboxID string) error
	GetBudget(ctx context.Context, id string) (*store.Budget, error)
	GetKey(ctx context.Context, id string) (*store.Key, error)
	GetReservation(ctx context.Context, sandboxID string) (*store.Reservation, error)
	GetSandbox(ctx context.Context, id string) (*store.Sandbox, error)
	ListBudgets(ctx context.Context, accountID string) ([]*store.Budget, error)
	Notify(ctx context.Context, topic, payload string) error
	PutBudget(ctx context.Context, b *store.Budget) error
	PutReservation(ctx context.Context, r *store.Reservation) error
	QueryUsage(ctx context.Context, f store.UsageFilter) ([]store.Usage, error)
}

// keys is what checking a key's budget reads, in a transaction or not.
type keys interface {
	GetKey(ctx context.Context, id string) (*store.Key, error)
}

// Store is what the budget service needs of the store.
type Store interface {
	keys
	Update(ctx context.Context, fn func(tx Tx) error) error
	GetBudget(ctx context.Context, id string) (*store.Budget, error)
	ListBudgets(ctx context.Context, accountID string) ([]*store.Budget, error)
	QueryUsage(ctx context.Context, f store.UsageFilter) ([]store.Usage, error)
}

// New returns a service pricing usage with prices; now is its clock.
func New(db store.Store, tenants *tenant.Service, prices Prices, now func() time.Time) *Service {
	if now == nil {
		now = time.Now
	}
	return &Service{db: store.Narrow(db, func(tx store.Tx) Tx { return tx }), tenants: tenants, prices: prices, now: now}
}

// Prices is the service's price table.
func (s *Service) Prices() Prices { return s.prices }

// Create makes a budget in an account (the caller's, for a key).
func (s *Service) Create(ctx context.Context, accountRef string, r CreateRequest) (out *store.Budget, err error) {
	defer func() {
		target, account := r.Name, ""
		if out != nil {
			target, account = out.ID, out.AccountID
		}
		s.Audit.Record(ctx, "createBudget", account, target, err)
	}()
	p := authz.From(ctx)
	if err := authz.Allowed(p, "createBudget"); err != nil {
		return nil, err
	}
	if err := r.Check(); err != nil {
		return nil, err
	}
	now := s.now().UTC()
	b := &store.Budget{ID: tenant.NewID(IDPrefix), Name: r.Name, Scope: r.Scope, Period: r.Period, Limit: r.Limit,
		Action: r.Action, WarnAt: slices.Compact(slices.Sorted(slices.Values(r.WarnAt))), CreatedAt: now}
	b.Scope.Labels = maps.Clone(r.Scope.Labels)
	err = s.db.Update(ctx, func(tx Tx) error {
		acc, err := s.tenants.Account(ctx, tx, accountRef)
		if err != nil {
			return sandbox.Errorf(sandbox.ErrInvalid, "account", "%v", err)
		}
		b.AccountID = acc.ID
		if err := s.resolve(ctx, tx, acc, b); err != nil {
			return err
		}
		if err := within(p, b); err != nil {
			return err
		}
		b.PeriodStart = periodStart(b, now)
		// A monthly budget starts with what its scope already spent this
		// month.
		if b.Period == Monthly {
			used, err := tx.QueryUsage(ctx, store.UsageFilter{AccountID: acc.ID, From: b.PeriodStart})
			if err != nil {
				return err
			}
			// A usage row names the key that created its sandbox; the keys
			// above that one are looked up (a key budget covers the keys
			// its key made).
			ancestors := map[string][]string{}
			for _, u := range used {
				sub := subjectOf(u)
				if b.Scope.Kind == ScopeKey && u.KeyID != "" {
					a, ok := ancestors[u.KeyID]
					if !ok {
						if k, err := tx.GetKey(ctx, u.KeyID); err == nil {
							a = k.Ancestors
						}
						ancestors[u.KeyID] = a
					}
					sub.Keys = append(sub.Keys, a...)
				}
				// (An interval across the month's start counts whole, as in
				// usage reports.)
				if Covers(b, sub) {
					b.Spent = min(money.MaxUSD, b.Spent+u.Cost)
				}
			}
			if b.Spent >= b.Limit {
				b.ReachedAt, b.Pending = &now, true
			}
		}
		return tx.PutBudget(ctx, b)
	})
	if err != nil {
		return nil, err
	}
	if b.ReachedAt != nil {
		// Reached at birth (its scope spent the limit this month already).
		s.Audit.RecordBudget(b.AccountID, b.ID, "budgetReached", b.ID)
	}
	return b, nil
}

// resolve turns the scope's reference into an ID of the account.
func (s *Service) resolve(ctx context.Context, tx Tx, acc *store.Account, b *store.Budget) error {
	switch b.Scope.Kind {
	case ScopeProject:
		proj, err := s.tenants.Project(ctx, tx, acc, b.Scope.Ref)
		if err != nil {
			return sandbox.Errorf(sandbox.ErrInvalid, "scope.ref", "%v", err)
		}
		b.Scope.Ref, b.ProjectID = proj.ID, proj.ID
	case ScopeFleet:
		f, err := tx.GetFleet(ctx, b.Scope.Ref)
		var proj *store.Project
		if err == nil {
			proj, err = tx.GetProject(ctx, f.ProjectID)
		}
		if errors.Is(err, store.ErrNotFound) || (err == nil && proj.AccountID != acc.ID) {
			return sandbox.Errorf(sandbox.ErrInvalid, "scope.ref", "no fleet %q in account %s (a fleet scope takes the fleet's ID)", b.Scope.Ref, acc.Name)
		}
		if err != nil {
			return err
		}
		b.ProjectID = proj.ID
	case ScopeKey:
		k, err := tx.GetKey(ctx, b.Scope.Ref)
		if errors.Is(err, store.ErrNotFound) || (err == nil && (k.AccountID != acc.ID ||
			!authz.Visible(authz.From(ctx), authz.Target{AccountID: k.AccountID, KeyID: k.ID, KeyAncestors: k.Ancestors}))) {
			return sandbox.Errorf(sandbox.ErrInvalid, "scope.ref", "no API key %q in account %s", b.Scope.Ref, acc.Name)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// within refuses a budget that reaches past what a scoped key may touch:
// its action (a deny, a pause, a delete) would fall on sandboxes the key
// cannot see. The operator and unrestricted keys pass.
func within(p authz.Principal, b *store.Budget) error {
	if p.Operator {
		return nil
	}
	sc := p.Scope
	deny := func(why string) error {
		return sandbox.Errorf(sandbox.ErrForbidden, "scope", "this API key %s", why)
	}
	if len(sc.Sandboxes) > 0 {
		return deny("is limited to some sandboxes and cannot set budgets")
	}
	if len(sc.Projects) > 0 {
		if b.ProjectID == "" || !slices.Contains(sc.Projects, b.ProjectID) {
			return deny("is limited to some projects: a budget it sets covers a project or fleet of those")
		}
	}
	if len(sc.Labels) > 0 {
		if b.Scope.Kind != ScopeLabel && b.Scope.Kind != ScopeKey {
			return deny("is limited to labelled sandboxes: a budget it sets has a label scope that includes its labels")
		}
		for k, v := range sc.Labels {
			if b.Scope.Kind == ScopeLabel && b.Scope.Labels[k] != v {
				return deny(fmt.Sprintf("is limited to sandboxes labelled %s=%s: the budget's selector must include it", k, v))
			}
		}
	}
	return nil
}

// mayTouch refuses a budget whose action would fall on sandboxes p cannot
// see (within), or on a key that is not p or a key p made.
func mayTouch(ctx context.Context, tx keys, p authz.Principal, b *store.Budget) error {
	if err := within(p, b); err != nil || p.Operator || b.Scope.Kind != ScopeKey {
		return err
	}
	k, err := tx.GetKey(ctx, b.Scope.Ref)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if err != nil || !authz.Visible(p, authz.Target{AccountID: k.AccountID, KeyID: k.ID, KeyAncestors: k.Ancestors}) {
		return sandbox.Errorf(sandbox.ErrForbidden, "scope", "this API key may set budgets only on itself and the keys it made")
	}
	return nil
}

// visible says whether p may read b: its account's budgets that cover
// the whole account (they limit p too), and those it may touch; a budget
// elsewhere would tell p what sandboxes it cannot see spent.
func (s *Service) visible(ctx context.Context, tx keys, p authz.Principal, b *store.Budget) bool {
	if !authz.Visible(p, authz.Target{AccountID: b.AccountID}) {
		return false
	}
	return p.Operator || b.Scope.Kind == ScopeAccount || mayTouch(ctx, tx, p, b) == nil
}

// List returns an account's budgets that the caller may see.
func (s *Service) List(ctx context.Context, accountRef string) ([]*store.Budget, error) {
	p := authz.From(ctx)
	if err := authz.Allowed(p, "listBudgets"); err != nil {
		return nil, err
	}
	var out []*store.Budget
	err := s.db.Update(ctx, func(tx Tx) error {
		acc, err := s.tenants.Account(ctx, tx, accountRef)
		if err != nil {
			return sandbox.Errorf(sandbox.ErrInvalid, "account", "%v", err)
		}
		l, err := tx.ListBudgets(ctx, acc.ID)
		out = []*store.Budget{}
		for _, b := range l {
			if s.visible(ctx, tx, p, b) {
				out = append(out, b)
			}
		}
		return err
	})
	return out, err
}

// Get returns a budget with its running account.
func (s *Service) Get(ctx context.Context, id string) (*store.Budget, error) {
	p := authz.From(ctx)
	if err := authz.Allowed(p, "getBudget"); err != nil {
		return nil, err
	}
	b, err := s.db.GetBudget(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !s.visible(ctx, s.db, p, b)) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no budget %q", id)
	}
	return b, err
}

// Sees reports whether the principal in ctx may see budget id (its scope
// only, whatever the key's actions): for events about it.
func (s *Service) Sees(ctx context.Context, id string) bool {
	b, err := s.db.GetBudget(ctx, id)
	return err == nil && s.visible(ctx, s.db, authz.From(ctx), b)
}

// Delete removes a budget; what it reserved goes with it.
func (s *Service) Delete(ctx context.Context, id string) (err error) {
	account := ""
	defer func() { s.Audit.Record(ctx, "deleteBudget", account, id, err) }()
	p := authz.From(ctx)
	if err := authz.Allowed(p, "deleteBudget"); err != nil {
		return err
	}
	return s.db.Update(ctx, func(tx Tx) error {
		b, err := tx.GetBudget(ctx, id)
		if errors.Is(err, store.ErrNotFound) || (err == nil && !s.visible(ctx, tx, p, b)) {
			return sandbox.Errorf(sandbox.ErrNotFound, "", "no budget %q", id)
		}
		if err != nil {
			return err
		}
		account = b.AccountID
		if b.FromKey {
			return sandbox.Errorf(sandbox.ErrInvalid, "", "budget %s is API key %s's budget_usd, part of the key's scope: it cannot be deleted on its own", id, b.Scope.Ref)
		}
		if err := mayTouch(ctx, tx, p, b); err != nil {
			return err
		}
		return tx.DeleteBudget(ctx, id)
	})
}

// Admit reserves amount, the expected cost of a new sandbox's first
// interval, in every budget that covers it, inside tx (the transaction
// that admits the sandbox): a budget it would pass refuses with an error
// of kind sandbox.ErrBudget, and then nothing is reserved anywhere.
func (s *Service) Admit(ctx context.Context, tx Tx, sandboxID string, subj Subject, amount money.USD) error {
	now := s.now().UTC()
	for _, k := range subj.Keys {
		if err := keyBudget(ctx, tx, k); err != nil {
			return err
		}
	}
	covering, err := coveringBudgets(ctx, tx, subj)
	if err != nil {
		return err
	}
	var ids []string
	for _, b := range covering {
		roll(b, now)
		if full(b) || (refuses(b) && b.Spent+b.Reserved+amount > b.Limit) {
			return refusal(b, amount)
		}
		b.Reserved = min(money.MaxUSD, b.Reserved+amount)
		if err := tx.PutBudget(ctx, b); err != nil {
			return err
		}
		ids = append(ids, b.ID)
	}
	return tx.PutReservation(ctx, &store.Reservation{SandboxID: sandboxID, Amount: amount, Budgets: ids, From: now})
}

// coveringBudgets reads the budgets that cover subj, oldest first (so a
// refusal names the same budget every time).
func coveringBudgets(ctx context.Context, tx Tx, subj Subject) ([]*store.Budget, error) {
	cands, err := tx.CandidateBudgets(ctx, subj.AccountID, subj.ProjectID, subj.FleetID, subj.Keys, subj.Labels)
	if err != nil {
		return nil, err
	}
	out := cands[:0]
	for _, b := range cands {
		if Covers(b, subj) {
			out = append(out, b)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// Meter is one settlement of one sandbox.
type Meter struct {
	SandboxID string
	Subject   Subject
	// Held is what the sandbox held since it was last settled.
	Held Resources
	// Next is what it holds from now on, for NextFor (its next interval,
	// or less when its TTL ends first); nothing with Final.
	Next    Resources
	NextFor time.Duration
	// Final ends the reservation (the sandbox is gone).
	Final bool
	// Reserved settles only a sandbox that holds a reservation (one
	// being created: if it has none, its create already ended). Without
	// it, a sandbox without one (from before budgets) gets one.
	Reserved bool
	// Admit refuses the renewal if a covering budget has no room for it
	// (a resume): nothing is settled then.
	Admit bool
	// Egress is the sandbox's egress counter now, if its network counts
	// (network.Meter); what it grew by since the last settlement is
	// charged.
	Egress *uint64
}

// Event is something a settlement made happen to a budget.
type Event struct {
	Budget *store.Budget
	// Reached: the budget was reached just now; its action is pending.
	Reached bool
	// Warn is a warning threshold crossed, in percent.
	Warn int
}

// NoticeTopic is the store notice of a budget reached (store.Notify):
// every host that shares the store acts on its sandboxes in its scope.
const NoticeTopic = "budget"

// Settle charges a sandbox's usage since its last settlement to every
// budget that covers it and renews its reservation, in one transaction,
// then records the events in the audit log and returns them (a reached
// budget's action is left to the caller: see Pending).
func (s *Service) Settle(ctx context.Context, m Meter) ([]Event, error) {
	var events []Event
	var usage *store.Usage
	err := s.db.Update(ctx, func(tx Tx) error {
		// The time is read in the transaction: settlements of a sandbox
		// are serialized, so each starts where the one before ended.
		now := s.now().UTC()
		events, usage = nil, nil
		r, err := tx.GetReservation(ctx, m.SandboxID)
		if errors.Is(err, store.ErrNotFound) {
			if m.Final || m.Reserved {
				return nil
			}
			// A sandbox from before budgets: metered from now on.
			r, err = &store.Reservation{SandboxID: m.SandboxID, From: now}, nil
		}
		if err != nil {
			return err
		}
		from := r.From
		if now.Before(from) {
			// The clock went back: nothing is charged now, and the next
			// settlement charges from here (not from the later time).
			from = now
		}
		cost := s.prices.Cost(m.Held, now.Sub(from))
		egress, counter := uint64(0), r.Egress
		if m.Egress != nil {
			counter = *m.Egress
			egress = counter - r.Egress
			if counter < r.Egress {
				egress = counter // the counter started again (a new link)
			}
			cost = min(money.MaxUSD, cost+s.prices.EgressCost(egress))
		}
		next := money.USD(0)
		if !m.Final {
			next = s.prices.Cost(m.Next, m.NextFor)
		}
		covering, err := coveringBudgets(ctx, tx, m.Subject)
		if err != nil {
			return err
		}
		var ids []string
		for _, b := range covering {
			old := money.USD(0)
			if slices.Contains(r.Budgets, b.ID) {
				old = r.Amount
			}
			reached, warn := settle(b, now, old, cost, next)
			if m.Admit && full(b) {
				return refusal(b, next)
			}
			if err := tx.PutBudget(ctx, b); err != nil {
				return err
			}
			ids = append(ids, b.ID)
			for _, w := range warn {
				events = append(events, Event{Budget: b, Warn: w})
			}
			if reached {
				events = append(events, Event{Budget: b, Reached: true})
				// Every host acts on its own sandboxes in its scope.
				if err := tx.Notify(ctx, NoticeTopic, b.ID); err != nil {
					return err
				}
			}
		}
		if now.After(from) || egress > 0 {
			u := store.Usage{SandboxID: m.SandboxID, AccountID: m.Subject.AccountID, ProjectID: m.Subject.ProjectID,
				FleetID: m.Subject.FleetID, KeyID: first(m.Subject.Keys), Labels: m.Subject.Labels, Start: from, End: now,
				VCPUs: m.Held.VCPUs, MemoryMB: m.Held.MemoryMB, DiskGB: m.Held.DiskGB, Paused: m.Held.Paused, EgressBytes: egress,
				SnapshotBytes: m.Held.SnapshotBytes, Cost: cost}
			if err := tx.AddUsage(ctx, u); err != nil {
				return err
			}
			usage = &u
		}
		if m.Final {
			return tx.DeleteReservation(ctx, m.SandboxID)
		}
		return tx.PutReservation(ctx, &store.Reservation{SandboxID: m.SandboxID, Amount: next, Budgets: ids, From: now, Egress: counter})
	})
	if err != nil {
		return nil, err
	}
	for _, ev := range events {
		if ev.Reached {
			s.Audit.RecordBudget(ev.Budget.AccountID, ev.Budget.ID, "budgetReached", ev.Budget.ID)
		} else {
			s.Audit.RecordBudget(ev.Budget.AccountID, ev.Budget.ID, "budgetWarning", fmt.Sprintf("%s@%d%%", ev.Budget.ID, ev.Warn))
		}
	}
	if usage != nil && s.Billing != nil {
		if err := s.Billing.Record(ctx, *usage); err != nil {
			return events, fmt.Errorf("budget: billing sink: %w", err)
		}
	}
	return events, nil
}

// Enforced returns the budgets whose action is due: those whose action is
// pending, and those reached this period that pause or delete (their
// action holds for the rest of the period: a sandbox in scope found
// running, one that was still booting when the budget was reached or one
// an earlier attempt failed on, is acted on too).
func (s *Service) Enforced(ctx context.Context) ([]*store.Budget, error) {
	all, err := s.db.ListBudgets(ctx, "")
	if err != nil {
		return nil, err
	}
	now := s.now().UTC()
	var out []*store.Budget
	for _, b := range all {
		roll(b, now)
		if b.Pending || (b.ReachedAt != nil && (b.Action == Pause || b.Action == Stop || b.Action == Delete)) {
			out = append(out, b)
		}
	}
	return out, nil
}

// Acted records what a budget's action was done to, and that its pending
// action is done (in the period it was decided in).
func (s *Service) Acted(ctx context.Context, b *store.Budget, targets []string) error {
	for _, t := range targets {
		s.Audit.RecordBudget(b.AccountID, b.ID, "budget"+strings.ToUpper(b.Action[:1])+b.Action[1:], t)
	}
	if !b.Pending {
		return nil
	}
	return s.db.Update(ctx, func(tx Tx) error {
		cur, err := tx.GetBudget(ctx, b.ID)
		if errors.Is(err, store.ErrNotFound) {
			return nil // deleted meanwhile
		}
		if err != nil {
			return err
		}
		if !cur.PeriodStart.Equal(b.PeriodStart) {
			return nil // a new period began: its own state stands
		}
		cur.Pending = false
		return tx.PutBudget(ctx, cur)
	})
}

// SubjectOf is what a budget matches of a sandbox's record.
func SubjectOf(rec *store.Sandbox) Subject {
	s := Subject{AccountID: rec.AccountID, ProjectID: rec.ProjectID, FleetID: rec.FleetID, Labels: rec.Labels}
	if rec.KeyID != "" {
		s.Keys = append([]string{rec.KeyID}, rec.KeyAncestors...)
	}
	return s
}

// subjectOf is what a usage row says of its sandbox (its creating key,
// not the keys above it).
func subjectOf(u store.Usage) Subject {
	s := Subject{AccountID: u.AccountID, ProjectID: u.ProjectID, FleetID: u.FleetID, Labels: u.Labels}
	if u.KeyID != "" {
		s.Keys = []string{u.KeyID}
	}
	return s
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

// keyBudget makes the budget of an API key's budget_usd, the first time
// the key (or a key it made) spends: a total for the key's life that
// refuses what would pass it (deny_new). It has the key's ULID.
func keyBudget(ctx context.Context, tx Tx, keyID string) error {
	id := IDPrefix + strings.TrimPrefix(keyID, "key_")
	if _, err := tx.GetBudget(ctx, id); !errors.Is(err, store.ErrNotFound) {
		return err
	}
	k, err := tx.GetKey(ctx, keyID)
	if err != nil || k.Scope.Budget == nil {
		return err
	}
	b := &store.Budget{ID: id, AccountID: k.AccountID, Name: "key-budget", FromKey: true, Scope: store.BudgetScope{Kind: ScopeKey, Ref: k.ID},
		Period: Total, Limit: *k.Scope.Budget, Action: DenyNew, CreatedAt: k.CreatedAt, PeriodStart: k.CreatedAt}
	return tx.PutBudget(ctx, b)
}

// UsageQuery selects and groups usage.
type UsageQuery struct {
	// Account (ID or name) is the operator's choice; a key reads its own.
	Account string
	// From and To bound the intervals (those that overlap count whole).
	From, To time.Time
	// GroupBy is account, project, fleet, key, sandbox or label:KEY.
	GroupBy string
}

// UsageGroup is the usage of one group.
type UsageGroup struct {
	Group string `json:"group"`
	// Name is what the group's ID stands for, for people: the account's,
	// project's, fleet's or sandbox's name, the key's description (for a
	// caller that may read keys). Empty for a label's value, and for a
	// thing without one or no longer there.
	Name             string `json:"name,omitempty"`
	VCPUSeconds      int64  `json:"vcpu_seconds"`
	MemoryGiBSeconds int64  `json:"memory_gib_seconds"`
	PausedSeconds    int64  `json:"paused_seconds"`
	EgressBytes      uint64 `json:"egress_bytes"`
	// SnapshotGBSeconds is snapshot storage (10^9 bytes) held, in seconds.
	SnapshotGBSeconds int64     `json:"snapshot_gb_seconds"`
	Cost              money.USD `json:"cost_usd"`
	// Sums in milliseconds (MiB-milliseconds for memory), made seconds last.
	vcpuMs, memMiBMs, pausedMs int64
	snapMBMs                   int64 // 10^6-byte milliseconds
}

// Usage reports metered usage grouped as q says, sorted by group.
func (s *Service) Usage(ctx context.Context, q UsageQuery) ([]UsageGroup, error) {
	p := authz.From(ctx)
	if err := authz.Allowed(p, "getUsage"); err != nil {
		return nil, err
	}
	if q.GroupBy == "" {
		q.GroupBy = "sandbox"
	}
	key, ok := groupKey(q.GroupBy)
	if !ok {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "group_by", "must be account, project, fleet, key, sandbox or label:KEY")
	}
	if !q.To.IsZero() && !q.From.IsZero() && !q.To.After(q.From) {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "to", "must be after from")
	}
	var accountID string
	if q.Account != "" || !p.Operator {
		err := s.db.Update(ctx, func(tx Tx) error {
			acc, err := s.tenants.Account(ctx, tx, q.Account)
			if err != nil {
				return sandbox.Errorf(sandbox.ErrInvalid, "account", "%v", err)
			}
			accountID = acc.ID
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	rows, err := s.db.QueryUsage(ctx, store.UsageFilter{AccountID: accountID, From: q.From, To: q.To})
	if err != nil {
		return nil, err
	}
	groups := map[string]*UsageGroup{}
	for _, u := range rows {
		if !authz.Visible(p, authz.Target{AccountID: u.AccountID, ProjectID: u.ProjectID, SandboxID: u.SandboxID, Labels: u.Labels}) {
			continue
		}
		k := key(u)
		g := groups[k]
		if g == nil {
			g = &UsageGroup{Group: k}
			groups[k] = g
		}
		d := u.End.Sub(u.Start).Milliseconds()
		if u.Paused {
			g.pausedMs += d
		} else {
			g.vcpuMs += d * int64(u.VCPUs)
			g.memMiBMs += d * int64(u.MemoryMB)
		}
		g.EgressBytes += u.EgressBytes
		g.snapMBMs += d * (u.SnapshotBytes / 1_000_000)
		g.Cost = min(money.MaxUSD, g.Cost+u.Cost)
	}
	out := make([]UsageGroup, 0, len(groups))
	for _, g := range groups {
		g.VCPUSeconds, g.PausedSeconds = g.vcpuMs/1000, g.pausedMs/1000
		g.MemoryGiBSeconds = g.memMiBMs / 1024 / 1000
		g.SnapshotGBSeconds = g.snapMBMs / 1000 / 1000
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	if err := s.nameGroups(ctx, q.GroupBy, out); err != nil {
		return nil, err
	}
	return out, nil
}

// nameGroups fills in each group's Name, where its kind has names, in
// one transaction. Every group is of rows the caller may see; a key's
// description also needs the right to read keys.
func (s *Service) nameGroups(ctx context.Context, by string, gs []UsageGroup) error {
	var name func(tx Tx, id string) (string, error)
	switch by {
	case "account":
		name = func(tx Tx, id string) (string, error) {
			a, err := tx.GetAccount(ctx, id)
			return field(a, err, func(a *store.Account) string { return a.Name })
		}
	case "project":
		name = func(tx Tx, id string) (string, error) {
			p, err := tx.GetProject(ctx, id)
			return field(p, err, func(p *store.Project) string { return p.Name })
		}
	case "fleet":
		name = func(tx Tx, id string) (string, error) {
			f, err := tx.GetFleet(ctx, id)
			return field(f, err, func(f *store.Fleet) string { return f.Name })
		}
	case "sandbox":
		name = func(tx Tx, id string) (string, error) {
			b, err := tx.GetSandbox(ctx, id)
			return field(b, err, func(b *store.Sandbox) string { return b.Name })
		}
	case "key":
		if authz.Allowed(authz.From(ctx), "getKey") != nil {
			return nil
		}
		name = func(tx Tx, id string) (string, error) {
			k, err := tx.GetKey(ctx, id)
			return field(k, err, func(k *store.Key) string { return k.Description })
		}
	default:
		return nil
	}
	return s.db.Update(ctx, func(tx Tx) error {
		for i := range gs {
			if gs[i].Group == "" {
				continue
			}
			n, err := name(tx, gs[i].Group)
			if err != nil {
				return err
			}
			gs[i].Name = n
		}
		return nil
	})
}

// field is get(v), or "" for a thing not found (deleted since).
func field[T any](v T, err error, get func(T) string) (string, error) {
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return get(v), nil
}

func groupKey(by string) (func(store.Usage) string, bool) {
	switch by {
	case "account":
		return func(u store.Usage) string { return u.AccountID }, true
	case "project":
		return func(u store.Usage) string { return u.ProjectID }, true
	case "fleet":
		return func(u store.Usage) string { return u.FleetID }, true
	case "key":
		return func(u store.Usage) string { return u.KeyID }, true
	case "sandbox":
		return func(u store.Usage) string { return u.SandboxID }, true
	}
	if l, ok := strings.CutPrefix(by, "label:"); ok && l != "" {
		return func(u store.Usage) string { return u.Labels[l] }, true
	}
	return nil, false
}
