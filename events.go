package harebox

import "github.com/harebox/harebox/events"

// Events are the engine's events (budgets' acts, placeholders used where
// they are not swapped, VMs that stopped on their own), for the principal
// in the context.
func (e *Engine) Events() *events.Service { return e.events }
