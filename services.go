package harebox

import (
	"github.com/harebox/harebox/apikey"
	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/budget/meter"
	"github.com/harebox/harebox/clone"
	"github.com/harebox/harebox/codeinterp"
	"github.com/harebox/harebox/env"
	"github.com/harebox/harebox/events"
	"github.com/harebox/harebox/history"
	"github.com/harebox/harebox/ingress"
	"github.com/harebox/harebox/monitor"
	"github.com/harebox/harebox/processes"
	"github.com/harebox/harebox/tenant"
	"github.com/harebox/harebox/volume"
)

// The domain services harebox.New composed: the REST layer calls each
// directly for its own calls, and a library user may too.

// Tenants manages accounts, projects and fleets, for the principal in the
// context (authz.WithPrincipal; none is the operator).
func (e *Engine) Tenants() *tenant.Service { return e.tenants }

// Keys manages scoped API keys and authenticates them.
func (e *Engine) Keys() *apikey.Service { return e.keys }

// History is the sandboxes' command history; a list on it goes through
// OnSandbox with action listCommands.
func (e *Engine) History() *history.Service { return e.history }

// Audit is the engine's audit log.
func (e *Engine) Audit() *audit.Log { return e.audit }

// Budgets are the engine's budgets and metered usage.
func (e *Engine) Budgets() *budget.Service { return e.budgets }

// Meter is the engine's metering of its sandboxes against their budgets.
func (e *Engine) Meter() *meter.Service { return e.meter }

// Monitor is the engine's monitoring: samples and their queries, for the
// principal in the context.
func (e *Engine) Monitor() *monitor.Service { return e.monitor }

// URLs is the engine's ingress: the caller serves it on its own listener
// (Serve) at Options.Ingress.
func (e *Engine) URLs() *ingress.Service { return e.urls }

// URLCalls are the URL and URL CA calls for the principal in the context
// (authz.WithPrincipal; none is the operator), as the REST API makes them.
func (e *Engine) URLCalls() *ingress.Calls { return e.urlCalls }

// Environments manages environments, for the principal in the context.
func (e *Engine) Environments() *env.Service { return e.envs }

// Volumes is the volumes' service (the REST layer calls it directly).
func (e *Engine) Volumes() *volume.Service { return e.volumes }

// Code runs cells in the sandboxes' code interpreters, for the principal
// in the context.
func (e *Engine) Code() *codeinterp.Service { return e.code }

// Processes runs the sandboxes' background processes, for the principal
// in the context.
func (e *Engine) Processes() *processes.Service { return e.processes }

// Snapshots takes, keeps and restores snapshots, and forks sandboxes.
func (e *Engine) Snapshots() *clone.Snapshots { return e.snaps }

// Events are the engine's events (budgets' acts, placeholders used where
// they are not swapped, VMs that stopped on their own), for the principal
// in the context.
func (e *Engine) Events() *events.Service { return e.events }

// Pool is the warm pool's setting, for every host of the deployment (the
// REST layer calls it directly).
func (e *Engine) Pool() *clone.PoolSettings { return e.pool.Load() }
