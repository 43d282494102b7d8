package harebox

import (
	"context"
	"strings"

	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Events returns what happened on the engine's side, oldest first: a
// budget's warnings, its being reached and what it did, a guest using a
// placeholder where it is not swapped, a VM that stopped on its own. They
// are audit entries (by principal budget:ID, sandbox:ID or engine); a key
// sees those of the sandboxes and budgets it may see. next is the cursor
// of the next page (the last entry looked at, shown or not).
func (e *Engine) Events(ctx context.Context, q sandbox.EventQuery) (events []*audit.Entry, next int64, err error) {
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
		acc, err := e.tenants.GetAccount(ctx, q.Account)
		if err != nil {
			return nil, 0, sandbox.Errorf(sandbox.ErrInvalid, "account", "%v", err)
		}
		f.AccountID = acc.ID
	}
	// Up to the log's head as it is now: a short page means everything up
	// to it was looked at, so the cursor moves there, and a follower does
	// not scan the same stretch again.
	head := q.After
	if last, err := e.store.LastAudit(ctx); err == nil {
		head = max(head, last.Seq)
	}
	f.Through = head
	l, err := e.audit.Read(ctx, f)
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
		if p.Operator || e.eventVisible(ctx, p, ev) {
			events = append(events, ev)
		}
	}
	return events, next, nil
}

// eventVisible says whether a key may see an event: one about a sandbox
// if it may see the sandbox, one by a budget if it may read the budget.
func (e *Engine) eventVisible(ctx context.Context, p authz.Principal, ev *audit.Entry) bool {
	if id, ok := strings.CutPrefix(ev.Principal, "budget:"); ok {
		if !e.budgets.Sees(ctx, id) {
			return false
		}
		// A budget's act on a sandbox also needs the sandbox.
		if !sandbox.ValidID(ev.Target) {
			return true
		}
	}
	id := ev.Target
	if s, ok := strings.CutPrefix(ev.Principal, "sandbox:"); ok {
		id = s
	}
	rec, err := e.store.GetSandbox(ctx, id)
	return err == nil && authz.Visible(p, targetOf(&rec.Sandbox))
}
