// Package events is what happened on the engine's side, as a principal
// may see it: a budget's warnings, its being reached and what it did, a
// guest using a placeholder where it is not swapped, a VM that stopped on
// its own. They are the audit log's entries by principal budget:ID,
// sandbox:ID or engine (store.AuditFilter.Events); the REST API lists
// them (GET /v1/events, and harebox events --follow) through List.
package events

import (
	"context"
	"strings"

	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Query pages through events.
type Query struct {
	// Account (ID or name) narrows the operator's events to one account;
	// a key reads its own account's.
	Account string
	// After is the cursor: events after this sequence number.
	After int64
	// Limit bounds one page (default 100, at most 1000).
	Limit int
}

// Store is what listing events reads of the store: the log's head, and
// the sandbox an event is about.
type Store interface {
	LastAudit(ctx context.Context) (*store.AuditEntry, error)
	GetSandbox(ctx context.Context, id string) (*store.Sandbox, error)
}

// Budgets says whether the principal in ctx may see a budget (the budget
// service).
type Budgets interface {
	Sees(ctx context.Context, id string) bool
}

// Accounts resolves the account a query names (the tenant service).
type Accounts interface {
	GetAccount(ctx context.Context, ref string) (*store.Account, error)
}

// Options are what a Service reads.
type Options struct {
	Log      *audit.Log
	Store    Store
	Budgets  Budgets
	Accounts Accounts
}

// Service lists events.
type Service struct{ o Options }

// New returns a Service over o.
func New(o Options) *Service { return &Service{o: o} }

// List returns events oldest first, for the principal in ctx: a key sees
// those of the sandboxes and budgets it may see. next is the cursor of
// the next page (the last entry looked at, shown or not).
func (s *Service) List(ctx context.Context, q Query) (events []*audit.Entry, next int64, err error) {
	p := authz.From(ctx)
	if err := authz.Allowed(p, "listEvents"); err != nil {
		return nil, 0, err
	}
	if q.Limit <= 0 {
		q.Limit = 100
	}
	if q.Limit > 1000 || q.After < 0 {
		return nil, 0, sandbox.Errorf(sandbox.ErrInvalid, "limit", "limit must be 1 to 1000 and after at least 0")
	}
	f := store.AuditFilter{After: q.After, Limit: q.Limit, Events: true}
	switch {
	case !p.Operator:
		f.AccountID = p.AccountID
	case q.Account != "":
		acc, err := s.o.Accounts.GetAccount(ctx, q.Account)
		if err != nil {
			return nil, 0, sandbox.Errorf(sandbox.ErrInvalid, "account", "%v", err)
		}
		f.AccountID = acc.ID
	}
	// Up to the log's head as it is now: a short page means everything up
	// to it was looked at, so the cursor moves there, and a follower does
	// not scan the same stretch again.
	head := q.After
	if last, err := s.o.Store.LastAudit(ctx); err == nil {
		head = max(head, last.Seq)
	}
	f.Through = head
	l, err := s.o.Log.Read(ctx, f)
	if err != nil {
		return nil, 0, err
	}
	next = q.After
	if len(l) < q.Limit {
		next = head
	}
	events = []*audit.Entry{}
	for _, ev := range l {
		next = max(next, ev.Seq)
		if p.Operator || s.visible(ctx, p, ev) {
			events = append(events, ev)
		}
	}
	return events, next, nil
}

// visible says whether a key may see an event: one about a sandbox if it
// may see the sandbox, one by a budget if it may read the budget.
func (s *Service) visible(ctx context.Context, p authz.Principal, ev *audit.Entry) bool {
	if id, ok := strings.CutPrefix(ev.Principal, "budget:"); ok {
		if !s.o.Budgets.Sees(ctx, id) {
			return false
		}
		// A budget's act on a sandbox also needs the sandbox.
		if !sandbox.ValidID(ev.Target) {
			return true
		}
	}
	id := ev.Target
	if sb, ok := strings.CutPrefix(ev.Principal, "sandbox:"); ok {
		id = sb
	}
	rec, err := s.o.Store.GetSandbox(ctx, id)
	return err == nil && authz.Visible(p, authz.TargetOf(&rec.Sandbox))
}
