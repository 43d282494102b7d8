package store

import (
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/model"
)

// Account is model.Account.
type Account = model.Account

// Retention is model.Retention.
type Retention = model.Retention

// Project is model.Project.
type Project = model.Project

// Fleet is model.Fleet.
type Fleet = model.Fleet

// Key is a stored API key, never its secret (package apikey has the
// rules).
type Key struct {
	ID          string `json:"id"`
	AccountID   string `json:"account_id"`
	Description string `json:"description,omitempty"`
	// ParentID is the key that created this one; empty when the operator
	// did. Ancestors lists every key above it, parent first.
	ParentID  string      `json:"parent_id,omitempty"`
	Ancestors []string    `json:"ancestors,omitempty"`
	Scope     authz.Scope `json:"scope"`
	CreatedAt time.Time   `json:"created_at"`
	ExpiresAt *time.Time  `json:"expires_at,omitempty"`
	RevokedAt *time.Time  `json:"revoked_at,omitempty"`
	// RotatedAt is when the secret was last replaced.
	RotatedAt *time.Time `json:"rotated_at,omitempty"`
	// Hint is the secret's first characters, to tell keys apart.
	Hint string `json:"hint"`
	// Hash is the SHA-256 of the secret; never shown.
	Hash []byte `json:"-"`
}

// Active reports whether the key authenticates at t.
func (k *Key) Active(t time.Time) bool {
	return k.RevokedAt == nil && (k.ExpiresAt == nil || t.Before(*k.ExpiresAt))
}

// Environment is a named, versioned set of variables and files in a
// project (package env has the rules). Latest is its newest version.
type Environment struct {
	ID        string    `json:"id"`
	AccountID string    `json:"account_id"`
	ProjectID string    `json:"project_id"`
	Name      string    `json:"name"`
	Latest    int       `json:"latest"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// EnvVersion is one immutable version of an environment. Secret values
// are not in it: they are sealed in the secret store.
type EnvVersion struct {
	EnvironmentID  string            `json:"environment_id"`
	Version        int               `json:"version"`
	CreatedAt      time.Time         `json:"created_at"`
	ThirdPartySafe bool              `json:"third_party_safe"`
	Variables      map[string]EnvVar `json:"variables"`
	Files          []EnvFile         `json:"files"`
	Credentials    []CredentialRule  `json:"credentials"`
}

// EnvVar is a variable: a plain value, or a secret whose value is never
// shown (nor delivered to a guest, which sees a placeholder).
type EnvVar struct {
	Value  string `json:"value,omitempty"`
	Secret bool   `json:"secret,omitempty"`
	// SecretRef names the sealed value in the secret store (scope
	// SecretScope(environment)); versions share it while it is unchanged.
	SecretRef string `json:"secret_ref,omitempty"`
}

// EnvFile is model.EnvFile.
type EnvFile = model.EnvFile

// CredentialRule is model.CredentialRule.
type CredentialRule = model.CredentialRule

// AuditEntry is model.AuditEntry.
type AuditEntry = model.AuditEntry

// AuditCheckpoint is a signature over the log's hash at Seq.
type AuditCheckpoint struct {
	Seq  int64     `json:"seq"`
	Hash string    `json:"hash"`
	Sig  []byte    `json:"sig"`
	Time time.Time `json:"time"`
}

// AuditFilter selects audit entries; empty fields match everything.
// Entries come in Seq order from After (exclusive), at most Limit.
type AuditFilter struct {
	AccountID string
	Principal string
	Target    string
	Action    string
	Outcome   string
	From, To  time.Time
	After     int64
	Limit     int
	// Newest takes the last Limit matching entries rather than the first
	// (still returned oldest first): a tail of the log.
	Newest bool
	// Events selects only the entries of the engine's own acts (by a
	// budget, a sandbox's guest, or the engine): /v1/events.
	Events bool
	// Through, if set, is the last sequence number looked at.
	Through int64
}

// CommandRow indexes one command of a sandbox's history; the entry itself
// (command, output) is sealed in the secret store.
type CommandRow struct {
	ID           string
	SandboxID    string
	AccountID    string
	StartedAt    time.Time
	OutputPurged bool
}
