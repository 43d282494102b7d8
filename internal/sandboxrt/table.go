package sandboxrt

import (
	"sync"

	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// table is the engine's sandboxes by ID, under its own lock (taken under
// a box's lock, never the other way round): the live boxes, the records of those being created (from
// their placement until they are registered or fail) and of those kept
// (stopped or hibernated: their disks are metered), and the names claimed
// by creates in flight.
type table struct {
	mu       sync.Mutex
	boxes    map[string]*box
	creating map[string]*store.Sandbox
	kept     map[string]*store.Sandbox
	claimed  map[string]bool
}

func newTable() *table {
	return &table{boxes: map[string]*box{}, creating: map[string]*store.Sandbox{},
		kept: map[string]*store.Sandbox{}, claimed: map[string]bool{}}
}

// get is the live box of id, or nil.
func (t *table) get(id string) *box {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.boxes[id]
}

// all are the live boxes.
func (t *table) all() []*box {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*box, 0, len(t.boxes))
	for _, b := range t.boxes {
		out = append(out, b)
	}
	return out
}

// put registers b as live. (A create's own ID is new: it replaces none.)
func (t *table) put(b *box) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.boxes[b.rec.ID] = b
}

// putIfAbsent registers b unless id has a live box already, and returns
// the one registered.
func (t *table) putIfAbsent(b *box) *box {
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur := t.boxes[b.rec.ID]; cur != nil {
		return cur
	}
	t.boxes[b.rec.ID] = b
	return b
}

// take registers b, which comes back from being kept, unless id has a
// live box already (a start or delete in flight); it returns the kept
// record it replaces.
func (t *table) take(b *box) (prev *store.Sandbox, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	id := b.rec.ID
	if t.boxes[id] != nil {
		return nil, false
	}
	t.boxes[id] = b
	prev = t.kept[id]
	delete(t.kept, id)
	return prev, true
}

// drop forgets id's live box; a non-nil keep is kept instead.
func (t *table) drop(id string, keep *store.Sandbox) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.boxes, id)
	if keep != nil {
		t.kept[id] = keep
	}
}

// forget removes every trace of id (it is deleted).
func (t *table) forget(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.boxes, id)
	delete(t.kept, id)
}

// isKept says whether id is stopped or hibernated here.
func (t *table) isKept(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.kept[id]
	return ok
}

// creatingStarts records a create's record until creatingEnds.
func (t *table) creatingStarts(rec *store.Sandbox) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.creating[rec.ID] = rec
}

func (t *table) creatingEnds(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.creating, id)
}

// unboxed are the records without a live box: those being created and
// those kept.
func (t *table) unboxed() (creating, kept []*store.Sandbox) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, rec := range t.creating {
		creating = append(creating, rec)
	}
	for _, rec := range t.kept {
		kept = append(kept, rec)
	}
	return creating, kept
}

// claimName refuses a name that a live sandbox of the account, a kept
// one, or a create in flight there already has; release ends the claim.
// Names are per account, so a taken name says nothing about other
// accounts.
func (t *table) claimName(accountID, name string) (release func(), err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, b := range t.boxes {
		if b.rec.AccountID == accountID && b.rec.Name == name {
			return nil, sandbox.Errorf(sandbox.ErrExists, "name", "sandbox %s is already named %q", b.rec.ID, name)
		}
	}
	// A stopped sandbox keeps its name: it starts again under it.
	for _, r := range t.kept {
		if r.AccountID == accountID && r.Name == name {
			return nil, sandbox.Errorf(sandbox.ErrExists, "name", "sandbox %s (stopped) is already named %q", r.ID, name)
		}
	}
	claim := accountID + "/" + name
	if t.claimed[claim] {
		return nil, sandbox.Errorf(sandbox.ErrExists, "name", "a sandbox named %q is being created", name)
	}
	t.claimed[claim] = true
	return func() {
		t.mu.Lock()
		delete(t.claimed, claim)
		t.mu.Unlock()
	}, nil
}
