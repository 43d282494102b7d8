package store

import (
	"time"

	"github.com/harebox/harebox/authz"
)

// Account owns projects, sandboxes and keys (package tenant has the rules).
type Account struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// Project groups an account's sandboxes.
type Project struct {
	ID        string    `json:"id"`
	AccountID string    `json:"account_id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// Fleet is a named group of sandboxes in a project.
type Fleet struct {
	ID        string    `json:"id"`
	AccountID string    `json:"account_id"`
	ProjectID string    `json:"project_id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

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
