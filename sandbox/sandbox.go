// Package sandbox holds the sandbox model: the create request and its
// validation, sizes, lifecycle states and their transitions, IDs, and the
// error kinds the engine returns.
package sandbox

import (
	"crypto/rand"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
)

// State is a sandbox's lifecycle state.
type State string

const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StatePaused   State = "paused"
	StateStopped  State = "stopped"
	// StateHibernated: its memory is in an encrypted file on the host's
	// disk and no VMM runs; resume restores it.
	StateHibernated State = "hibernated"
	StateDeleted    State = "deleted"
	// StateLost: the host that runs it stopped renewing its lease (it
	// crashed, or lost the database). Nothing can be done with it until
	// the host is back and takes it again.
	StateLost State = "lost"
)

// transitions lists the allowed moves; deleting is allowed from any state
// but deleted.
var transitions = map[State][]State{
	StateCreating:   {StateRunning, StateStopped, StateDeleted},
	StateRunning:    {StatePaused, StateStopped, StateHibernated, StateDeleted},
	StatePaused:     {StateRunning, StateStopped, StateHibernated, StateDeleted},
	StateStopped:    {StateDeleted},
	StateHibernated: {StateRunning, StateDeleted},
	// (Its host takes it back as it was; deleted once back.)
	StateLost: {StateRunning, StatePaused, StateDeleted},
}

// CanTransition reports an ErrState error if from cannot become to.
func CanTransition(from, to State) error {
	for _, s := range transitions[from] {
		if s == to {
			return nil
		}
	}
	return Errorf(ErrState, "", "sandbox is %s; it cannot become %s", from, to)
}

// Resources are a sandbox's resolved size.
type Resources struct {
	VCPUs    int `json:"vcpus"`
	MemoryMB int `json:"memory_mb"`
	DiskGB   int `json:"disk_gb"`
}

// Presets are the named sizes.
var Presets = map[string]Resources{
	"small":  {VCPUs: 1, MemoryMB: 512, DiskGB: 5},
	"medium": {VCPUs: 2, MemoryMB: 2048, DiskGB: 20},
	"large":  {VCPUs: 4, MemoryMB: 8192, DiskGB: 50},
}

// Site is where a sandbox runs.
type Site struct {
	Name    string `json:"name"`    // e.g. fr-par-1
	Country string `json:"country"` // ISO 3166-1 alpha-2, e.g. FR
}

// Sandbox is the API view of a sandbox.
type Sandbox struct {
	ID        string `json:"id"`
	Name      string `json:"name,omitempty"`
	AccountID string `json:"account_id"`
	ProjectID string `json:"project_id"`
	Project   string `json:"project"`
	// FleetID and Fleet name the fleet the sandbox is in, if any.
	FleetID string            `json:"fleet_id,omitempty"`
	Fleet   string            `json:"fleet,omitempty"`
	State   State             `json:"state"`
	Image   string            `json:"image"`
	Size    Resources         `json:"size"`
	Labels  map[string]string `json:"labels,omitempty"`
	NoEnv   bool              `json:"no_env"`
	// Environment is the pinned environment as NAME@VERSION, if any.
	Environment string `json:"environment,omitempty"`
	// ThirdParty sandboxes get only third-party-safe environments.
	ThirdParty bool `json:"third_party"`
	// Monitoring says whether command history is kept; Snapshots whether
	// snapshots are allowed.
	Monitoring bool `json:"monitoring"`
	Snapshots  bool `json:"snapshots"`
	// Served says how its create was served: "boot" (its image booted),
	// "snapshot" (restored from a snapshot: a golden one, a fork's or a
	// named one) or "pool" (claimed from the warm pool).
	Served string `json:"served,omitempty"`
	// CreatePhases is how long each step of its create took, in
	// milliseconds ("total" the whole).
	CreatePhases map[string]float64 `json:"create_phases_ms,omitempty"`
	Site         Site               `json:"site"`
	// Host is the hareboxd that runs it.
	Host string `json:"host,omitempty"`
	// MeshAddress and MeshName are its address and name on its project's
	// private mesh (NAME.PROJECT.internal), if it is on it.
	MeshAddress string    `json:"mesh_address,omitempty"`
	MeshName    string    `json:"mesh_name,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	// Volumes are the volumes attached to it.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// ExpiresAt is when the TTL deletes the sandbox; nil means never.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// Agent is the guest agent's health while the sandbox runs: "ok", or
	// "unresponsive" when it missed the engine's last health checks (it
	// was killed and not restarted, the guest is out of memory, ...).
	Agent string `json:"agent,omitempty"`
	// Error says why a sandbox stopped unexpectedly, if it did.
	Error string `json:"error,omitempty"`
}

// IDPrefix starts every sandbox ID.
const IDPrefix = "sbx_"

// NewID returns a new sortable sandbox ID: the prefix and a lower-case ULID.
func NewID() string {
	return IDPrefix + strings.ToLower(ulid.MustNew(ulid.Now(), rand.Reader).String())
}

// ValidID reports whether id has the shape NewID produces.
func ValidID(id string) bool {
	if !strings.HasPrefix(id, IDPrefix) || len(id) != len(IDPrefix)+26 {
		return false
	}
	_, err := ulid.ParseStrict(strings.ToUpper(id[len(IDPrefix):]))
	return err == nil
}

// ListFilter selects sandboxes; empty fields match everything.
type ListFilter struct {
	State  State             `json:"state,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Account (ID or name) narrows the operator's list to one account; a
	// key lists its own. Project and Fleet are IDs or names, in Account
	// (default: the caller's, or the default account for the operator).
	Account string `json:"account,omitempty"`
	Project string `json:"project,omitempty"`
	Fleet   string `json:"fleet,omitempty"`
}

// Match reports whether s passes the filter's state and labels (the
// engine resolves Project and Fleet).
func (f ListFilter) Match(s *Sandbox) bool {
	if f.State != "" && s.State != f.State {
		return false
	}
	for k, v := range f.Labels {
		if s.Labels[k] != v {
			return false
		}
	}
	return true
}
