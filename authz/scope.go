package authz

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/harebox/harebox/budget/money"
	"github.com/harebox/harebox/sandbox"
)

// Actions are the API's operations (its operationIds) that need a key;
// the api package checks that its routes and this list agree.
var Actions = []string{
	"getInfo",
	"createSandbox", "listSandboxes", "getSandbox", "deleteSandbox", "pauseSandbox", "resumeSandbox", "stopSandbox", "startSandbox",
	"forkSandbox", "hibernateSandbox", "setSandboxTimeout", "createSnapshot", "listSnapshots", "getSnapshot", "deleteSnapshot",
	"exec", "execStream", "startProcess", "listProcesses", "getProcess", "getProcessOutput", "killProcess", "sendProcessInput", "openPty",
	"writeFile", "readFile", "removeFile", "statFile", "listFiles", "mkdir", "moveFile",
	"getFirewall", "setFirewall",
	"createAccount", "listAccounts", "getAccount", "deleteAccount",
	"createProject", "listProjects", "getProject", "updateProject", "deleteProject",
	"createFleet", "listFleets", "getFleet", "deleteFleet",
	"createKey", "listKeys", "getKey", "revokeKey", "rotateKey",
	"createEnvironment", "listEnvironments", "getEnvironment", "updateEnvironment", "deleteEnvironment",
	"listEnvironmentVersions", "getEnvironmentVersion",
	"listAudit", "verifyAudit", "getAuditKey",
	"updateAccount", "listCommands",
	"createBudget", "listBudgets", "getBudget", "deleteBudget", "getUsage",
	"listEvents", "getSandboxMetrics", "getServerMetrics",
	"createURL", "listURLs", "getURL", "rotateURL", "deleteURL",
	"getURLCA", "setURLCA", "deleteURLCA", "issueClientCert", "listClientCerts", "revokeClientCert",
	"listImages", "buildImage", "deleteImage",
	"listHosts", "deleteHost", "rotateMeshKey", "moveSandbox", "drainHost", "undrainHost",
	"getPool", "setPool", "resetPool",
	"createVolume", "listVolumes", "getVolume", "resizeVolume", "deleteVolume",
	"runCode", "listCodeContexts", "createCodeContext", "restartCodeContext", "deleteCodeContext",
}

// Groups name sets of actions; a scope may list groups and actions. A name
// that is both (exec) means the group.
var Groups = map[string][]string{
	"*":               Actions,
	"info":            {"getInfo"},
	"sandboxes:read":  {"listSandboxes", "getSandbox", "getSandboxMetrics"},
	"sandboxes:write": {"createSandbox", "deleteSandbox", "pauseSandbox", "resumeSandbox", "stopSandbox", "startSandbox", "forkSandbox", "hibernateSandbox", "setSandboxTimeout"},
	"snapshots:read":  {"listSnapshots", "getSnapshot"},
	"snapshots:write": {"createSnapshot", "deleteSnapshot"},
	"exec": {"exec", "execStream", "startProcess", "listProcesses", "getProcess", "getProcessOutput", "killProcess", "sendProcessInput", "openPty", "listCommands",
		"runCode", "listCodeContexts", "createCodeContext", "restartCodeContext", "deleteCodeContext"},
	"accounts:write":     {"updateAccount"},
	"files:read":         {"readFile", "statFile", "listFiles"},
	"files:write":        {"writeFile", "removeFile", "mkdir", "moveFile"},
	"firewall:read":      {"getFirewall"},
	"firewall:write":     {"setFirewall"},
	"accounts:read":      {"listAccounts", "getAccount"},
	"projects:read":      {"listProjects", "getProject", "listFleets", "getFleet"},
	"projects:write":     {"createProject", "updateProject", "deleteProject", "createFleet", "deleteFleet"},
	"keys:read":          {"listKeys", "getKey"},
	"keys:write":         {"createKey", "revokeKey", "rotateKey"},
	"environments:read":  {"listEnvironments", "getEnvironment", "listEnvironmentVersions", "getEnvironmentVersion"},
	"environments:write": {"createEnvironment", "updateEnvironment", "deleteEnvironment"},
	"audit:read":         {"listAudit", "getAuditKey"},
	"budgets:read":       {"listBudgets", "getBudget", "getUsage"},
	"budgets:write":      {"createBudget", "deleteBudget"},
	"events:read":        {"listEvents"},
	"metrics:read":       {"getServerMetrics"},
	"urls:read":          {"listURLs", "getURL", "getURLCA", "listClientCerts"},
	"urls:write":         {"createURL", "rotateURL", "deleteURL", "setURLCA", "deleteURLCA", "issueClientCert", "revokeClientCert"},
	"images:read":        {"listImages"},
	"images:write":       {"buildImage", "deleteImage"},
	"volumes:read":       {"listVolumes", "getVolume"},
	"volumes:write":      {"createVolume", "resizeVolume", "deleteVolume"},
}

// operatorOnly actions need the operator whatever a key's scope says:
// a key belongs to one account and cannot make or end accounts.
var operatorOnly = map[string]bool{"createAccount": true, "deleteAccount": true, "verifyAudit": true,
	"buildImage": true, "deleteImage": true, "listHosts": true, "deleteHost": true, "rotateMeshKey": true,
	"moveSandbox": true, "drainHost": true, "undrainHost": true, "getPool": true, "setPool": true, "resetPool": true}

// Scope limits a key. Every field is optional (empty means no limit on that
// dimension) and they combine with AND.
type Scope struct {
	// Actions are operationIds or group names; empty means all.
	Actions []string `json:"actions,omitempty"`
	// Sandboxes are the only sandbox IDs the key sees; it cannot create.
	Sandboxes []string `json:"sandboxes,omitempty"`
	// Projects are the only project IDs the key sees and creates in.
	Projects []string `json:"projects,omitempty"`
	// Labels select the sandboxes the key sees; the sandboxes it creates
	// get them.
	Labels map[string]string `json:"labels,omitempty"`
	// CIDRs are where the caller's address must be.
	CIDRs []string `json:"cidrs,omitempty"`
	// Rate bounds the key's requests (a token bucket).
	Rate *Rate `json:"rate,omitempty"`
	// Budget is a dollar limit on what the key's actions may spend.
	Budget *money.USD `json:"budget_usd,omitempty"`
}

// Rate is a token bucket: PerSecond requests on average, Burst at once.
type Rate struct {
	PerSecond float64 `json:"per_second"`
	Burst     int     `json:"burst"`
}

// Limits on a scope's size, so a key stays cheap to check.
const (
	MaxScopeItems  = 256
	MaxScopeLabels = 32
)

// Validate checks the scope's fields; errors name the field.
func (s *Scope) Validate() error {
	for i, a := range s.Actions {
		if _, ok := Groups[a]; !ok && !slices.Contains(Actions, a) {
			return sandbox.Errorf(sandbox.ErrInvalid, fmt.Sprintf("scope.actions[%d]", i), "unknown action or group %q (groups: %s)", a, strings.Join(groupNames(), ", "))
		}
	}
	for _, l := range []struct {
		name string
		n    int
	}{{"scope.actions", len(s.Actions)}, {"scope.sandboxes", len(s.Sandboxes)}, {"scope.projects", len(s.Projects)}, {"scope.cidrs", len(s.CIDRs)}} {
		if l.n > MaxScopeItems {
			return sandbox.Errorf(sandbox.ErrInvalid, l.name, "at most %d entries", MaxScopeItems)
		}
	}
	for i, id := range s.Sandboxes {
		if !sandbox.ValidID(id) {
			return sandbox.Errorf(sandbox.ErrInvalid, fmt.Sprintf("scope.sandboxes[%d]", i), "%q is not a sandbox ID", id)
		}
	}
	if len(s.Labels) > MaxScopeLabels {
		return sandbox.Errorf(sandbox.ErrInvalid, "scope.labels", "at most %d labels", MaxScopeLabels)
	}
	if err := sandbox.Validate(struct {
		Labels map[string]string `json:"scope.labels" validate:"dive,keys,labelkey,endkeys,max=256"`
	}{s.Labels}); err != nil {
		return err
	}
	for i, c := range s.CIDRs {
		if _, err := netip.ParsePrefix(c); err != nil {
			return sandbox.Errorf(sandbox.ErrInvalid, fmt.Sprintf("scope.cidrs[%d]", i), "%q is not a CIDR (e.g. 192.0.2.0/24)", c)
		}
	}
	if r := s.Rate; r != nil && (!(r.PerSecond > 0) || r.PerSecond > 1e6 || r.Burst < 1 || r.Burst > 1e6) {
		return sandbox.Errorf(sandbox.ErrInvalid, "scope.rate", "per_second must be above 0 (at most 1e6) and burst 1 to 1e6")
	}
	if b := s.Budget; b != nil && (*b < 0 || *b > money.MaxUSD) {
		return sandbox.Errorf(sandbox.ErrInvalid, "scope.budget_usd", "must be 0 to %s", money.MaxUSD)
	}
	return nil
}

func groupNames() []string {
	var out []string
	for g := range Groups {
		out = append(out, g)
	}
	sort.Strings(out)
	return out
}

// actionSet expands the scope's actions; nil means all.
func (s *Scope) actionSet() map[string]bool {
	if len(s.Actions) == 0 {
		return nil
	}
	set := map[string]bool{}
	for _, a := range s.Actions {
		if g, ok := Groups[a]; ok {
			for _, x := range g {
				set[x] = true
			}
		} else {
			set[a] = true
		}
	}
	return set
}

func (s *Scope) allows(action string) bool {
	if len(s.Actions) == 0 {
		return true
	}
	for _, a := range s.Actions {
		if a == action || slices.Contains(Groups[a], action) {
			return true
		}
	}
	return false
}

// AllowsAddr reports whether the caller's address is within the scope's
// CIDRs; a scope with CIDRs refuses a caller whose address is unknown.
func (s *Scope) AllowsAddr(addr netip.Addr, known bool) bool {
	if len(s.CIDRs) == 0 {
		return true
	}
	if !known {
		return false
	}
	addr = addr.Unmap()
	for _, c := range s.CIDRs {
		if p, err := netip.ParsePrefix(c); err == nil && p.Contains(addr) {
			return true
		}
	}
	return false
}

// Within reports whether s is narrower than or equal to parent on every
// dimension; the error names the first dimension where it is wider.
// Expiries are compared too (zero means never).
func (s *Scope) Within(parent *Scope, exp, parentExp time.Time) error {
	wider := func(field, format string, args ...any) error {
		return sandbox.Errorf(sandbox.ErrForbidden, field, "a key can only create keys narrower than itself: "+format, args...)
	}
	if ps := parent.actionSet(); ps != nil {
		cs := s.actionSet()
		if cs == nil {
			return wider("scope.actions", "this key is limited to some actions; name them")
		}
		for a := range cs {
			if !ps[a] {
				return wider("scope.actions", "this key may not %s", a)
			}
		}
	}
	if err := subset(s.Sandboxes, parent.Sandboxes); err != "" {
		return wider("scope.sandboxes", "%s", err)
	}
	if err := subset(s.Projects, parent.Projects); err != "" {
		return wider("scope.projects", "%s", err)
	}
	for k, v := range parent.Labels {
		if got, ok := s.Labels[k]; !ok || got != v {
			return wider("scope.labels", "the new key must select %s=%s too", k, v)
		}
	}
	if len(parent.CIDRs) > 0 {
		if len(s.CIDRs) == 0 {
			return wider("scope.cidrs", "this key is limited to some addresses; name them")
		}
		for _, c := range s.CIDRs {
			cp, _ := netip.ParsePrefix(c)
			if !slices.ContainsFunc(parent.CIDRs, func(p string) bool {
				pp, err := netip.ParsePrefix(p)
				return err == nil && pp.Bits() <= cp.Bits() && pp.Contains(cp.Addr())
			}) {
				return wider("scope.cidrs", "%s is outside this key's addresses", c)
			}
		}
	}
	if pr := parent.Rate; pr != nil {
		if r := s.Rate; r == nil || r.PerSecond > pr.PerSecond || r.Burst > pr.Burst {
			return wider("scope.rate", "at most %g per second with a burst of %d", pr.PerSecond, pr.Burst)
		}
	}
	if pb := parent.Budget; pb != nil {
		if b := s.Budget; b == nil || *b > *pb {
			return wider("scope.budget_usd", "at most %s", pb)
		}
	}
	if !parentExp.IsZero() && (exp.IsZero() || exp.After(parentExp)) {
		return wider("expires_at", "this key expires at %s; the new key must expire no later", parentExp.Format(time.RFC3339))
	}
	return nil
}

// subset explains why child is not within parent ("" when it is); an
// empty parent allows anything, an empty child is everything.
func subset(child, parent []string) string {
	if len(parent) == 0 {
		return ""
	}
	if len(child) == 0 {
		return "this key is limited to some; name them"
	}
	for _, c := range child {
		if !slices.Contains(parent, c) {
			return fmt.Sprintf("%s is outside this key's scope", c)
		}
	}
	return ""
}
