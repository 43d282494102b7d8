package sandbox

// EventQuery pages through events.
type EventQuery struct {
	// Account (ID or name) narrows the operator's events to one account;
	// a key reads its own account's.
	Account string
	// After is the cursor: events after this sequence number.
	After int64
	// Limit bounds one page (default 100, at most 1000).
	Limit int
}
