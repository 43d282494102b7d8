package apiclient

import (
	"net/url"
	"strings"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/model"
)

// Account is model.Account.
type Account = model.Account

// Retention is model.Retention.
type Retention = model.Retention

// AccountUpdate changes an account's settings; absent fields stay.
// Retention replaces the account's retention whole (an empty one keeps
// forever); lowering it purges at once.
type AccountUpdate struct {
	Retention *Retention `json:"retention,omitempty"`
}

// Project is model.Project.
type Project = model.Project

// ProjectUpdate changes a project's settings; absent fields stay.
type ProjectUpdate struct {
	ThirdPartyDefault *bool   `json:"third_party_default,omitempty"`
	Mesh              *bool   `json:"mesh,omitempty"`
	MeshDefault       *string `json:"mesh_default,omitempty"`
}

// Fleet is model.Fleet.
type Fleet = model.Fleet

// NameRequest creates an account, project or fleet.
type NameRequest struct {
	Name string `json:"name"`
}

// KeyRequest creates a scoped API key.
type KeyRequest struct {
	// AccountID (ID or name) is for the operator; a key creates keys in its
	// own account.
	AccountID   string      `json:"account_id,omitempty"`
	Description string      `json:"description,omitempty"`
	Scope       authz.Scope `json:"scope"`
	TTLSeconds  int64       `json:"ttl_seconds,omitempty"`
	// Format is the secret's form: "harebox" (the default) or "e2b".
	Format string `json:"format,omitempty"`
}

// Key is an API key. Secret is set only in the answer to createKey and
// rotateKey: it is shown once.
type Key struct {
	ID          string      `json:"id"`
	AccountID   string      `json:"account_id"`
	Description string      `json:"description,omitempty"`
	ParentID    string      `json:"parent_id,omitempty"`
	Ancestors   []string    `json:"ancestors,omitempty"`
	Scope       authz.Scope `json:"scope"`
	CreatedAt   time.Time   `json:"created_at"`
	ExpiresAt   *time.Time  `json:"expires_at,omitempty"`
	RevokedAt   *time.Time  `json:"revoked_at,omitempty"`
	RotatedAt   *time.Time  `json:"rotated_at,omitempty"`
	Hint        string      `json:"hint"`
	Secret      string      `json:"secret,omitempty"`
}

// Path is the API path /v1/PART/PART..., each part escaped:
// Path("projects", ref, "fleets").
func Path(parts ...string) string {
	var b strings.Builder
	b.WriteString("/v1")
	for _, p := range parts {
		b.WriteString("/" + url.PathEscape(p))
	}
	return b.String()
}

// AccountQuery is the ?account= query with which the operator names an
// account other than the default one; nil for "".
func AccountQuery(ref string) url.Values {
	if ref == "" {
		return nil
	}
	return url.Values{"account": {ref}}
}
