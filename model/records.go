package model

import "time"

// The domain records that the store keeps and the REST API returns as
// they are, so the engine, the domains, the API and its Go client share
// one definition. (Records whose stored and wire forms differ, such as a
// key's hash and its secret shown once, keep one type on each side.)

// Account owns projects, sandboxes and keys (package tenant has the
// rules).
type Account struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	// Retention bounds how long command history is kept.
	Retention Retention `json:"retention"`
}

// Retention is an account's history retention, in days; nil keeps
// forever, 0 keeps nothing. The audit log is kept whatever it says.
type Retention struct {
	// HistoryDays keeps command history entries this long.
	HistoryDays *int `json:"history_days,omitempty"`
	// OutputDays keeps their output this long (never longer than the
	// entries themselves).
	OutputDays *int `json:"output_days,omitempty"`
}

// Project groups an account's sandboxes; every account has one named
// "default".
type Project struct {
	ID        string    `json:"id"`
	AccountID string    `json:"account_id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	// ThirdPartyDefault makes every sandbox created in the project a
	// third-party one (only third-party-safe environments).
	ThirdPartyDefault bool `json:"third_party_default"`
	// Mesh puts every sandbox created in the project on its private mesh
	// (unless the create says otherwise).
	Mesh bool `json:"mesh"`
	// MeshDefault decides what its mesh sandboxes open to each other when
	// no mesh rule of theirs matches: "deny", or "" (allow).
	MeshDefault string `json:"mesh_default,omitempty"`
}

// Fleet is a named group of sandboxes in a project.
type Fleet struct {
	ID        string    `json:"id"`
	AccountID string    `json:"account_id"`
	ProjectID string    `json:"project_id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// EnvFile is a file the environment puts in the guest. A template's
// {{NAME}} references are replaced by the variables' values (a secret's by
// the sandbox's placeholder).
type EnvFile struct {
	Path     string `json:"path"`
	Mode     uint32 `json:"mode,omitempty"`
	Owner    string `json:"owner,omitempty"`
	Content  string `json:"content"`
	Template bool   `json:"template,omitempty"`
}

// CredentialRule binds a secret variable to where it may be used: the
// destination hosts and ports, and how the host puts it in requests.
type CredentialRule struct {
	Secret string   `json:"secret"`
	Hosts  []string `json:"hosts"`
	Ports  string   `json:"ports,omitempty"`
	// Header, if set, is set on matching requests to Format with {value}
	// replaced; otherwise the placeholder is replaced wherever it appears
	// in the request's headers or URL.
	Header    string `json:"header,omitempty"`
	Format    string `json:"format,omitempty"`
	AllowHTTP bool   `json:"allow_http,omitempty"`
}

// AuditEntry is one record of the audit log (package audit has the rules):
// who did what to what, from where, and how it ended. Hash commits to the
// entry and to Prev, the hash of the entry before it.
type AuditEntry struct {
	Seq       int64     `json:"seq"`
	Time      time.Time `json:"time"`
	AccountID string    `json:"account_id,omitempty"`
	Principal string    `json:"principal"`
	Source    string    `json:"source,omitempty"`
	Action    string    `json:"action"`
	Target    string    `json:"target,omitempty"`
	// Outcome is "ok", "denied" or "error"; Error is the error's kind.
	Outcome   string `json:"outcome"`
	Error     string `json:"error,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	Prev      string `json:"prev"`
	Hash      string `json:"hash"`
	// Mismatch, on an entry read back, names the row's columns that
	// disagree with its record, which the chain hashes ("record" if the
	// record does not decode): the columns are what filters match, so a
	// changed one moves the entry out of (or into) a view. Not part of
	// the record.
	Mismatch []string `json:"-"`
}

// Volume is a project's named disk that outlives sandboxes (package
// volume has the rules). It lives on the host that made it.
type Volume struct {
	ID        string    `json:"id"`
	AccountID string    `json:"account_id"`
	ProjectID string    `json:"project_id"`
	Name      string    `json:"name"`
	SizeGB    int       `json:"size_gb"`
	Host      string    `json:"host,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// UsedBytes is what its file takes on the host's disk, measured
	// when it was last detached, grown or listed.
	UsedBytes int64 `json:"used_bytes"`
	// Attachments are the sandboxes it is attached to now: one writer,
	// and any number of readers, each seeing the volume as it was when
	// it attached.
	Attachments []VolumeAttachment `json:"attachments"`
	// Layers counts the files over its first: a writer that attaches
	// while readers hold the volume writes to a new layer over theirs, so
	// that they see what they saw, and a reader that attaches beside a
	// writer takes the writer's layer, the writer a new one; the layers
	// are folded into the first when nothing holds it.
	Layers int `json:"layers,omitempty"`
	// Busy says what is being done to its files ("resizing", "folding
	// its layers", "giving its writer a new layer"): meanwhile it is not
	// attached (but by readers beside the writer that moves).
	Busy string `json:"busy,omitempty"`
}

// VolumeAttachment is a volume attached to a sandbox.
type VolumeAttachment struct {
	SandboxID string `json:"sandbox_id"`
	Path      string `json:"path"`
	ReadOnly  bool   `json:"read_only,omitempty"`
	// Layer is the layer it opens (Volume.Layers): its top.
	Layer int `json:"layer,omitempty"`
}

// Pool is the warm pool as one host keeps it (GET /v1/pool).
type Pool struct {
	// Pool is how many idle sandboxes the host keeps for each
	// "IMAGE:PRESET".
	Pool map[string]int `json:"pool"`
	// Source says where that comes from: "deployment" (harebox pool set,
	// for every host that shares the store) or "host" (the host's own
	// hareboxd --pool, while the deployment has none).
	Source string `json:"source"`
	// SetAt is when the deployment's pool was set (source "deployment").
	SetAt *time.Time `json:"set_at,omitempty"`
	// Host is the host that answered.
	Host string `json:"host"`
	// Kept is false on a host that keeps no pool at all (golden snapshots
	// off, or a backend that cannot snapshot).
	Kept bool `json:"kept"`
	// Idle is how many idle sandboxes the host holds now.
	Idle int `json:"idle"`
}

// Pool sources.
const (
	PoolFromDeployment = "deployment"
	PoolFromHost       = "host"
)
