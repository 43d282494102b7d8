package apiclient

import (
	"net/url"
	"strings"
	"time"

	"github.com/harebox/harebox/authz"
)

// Account owns projects, sandboxes and keys.
type Account struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	// Retention bounds how long the account's command history is kept.
	Retention Retention `json:"retention"`
}

// Retention is an account's command-history retention, in days: nil keeps
// forever, 0 keeps nothing. The audit log is kept whatever it says.
type Retention struct {
	// HistoryDays keeps history entries this long.
	HistoryDays *int `json:"history_days,omitempty"`
	// OutputDays keeps their output this long.
	OutputDays *int `json:"output_days,omitempty"`
}

// AccountUpdate changes an account's settings; absent fields stay.
// Retention replaces the account's retention whole (an empty one keeps
// forever); lowering it purges at once.
type AccountUpdate struct {
	Retention *Retention `json:"retention,omitempty"`
}

// Project groups an account's sandboxes; every account has one named
// "default".
type Project struct {
	ID        string    `json:"id"`
	AccountID string    `json:"account_id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	// ThirdPartyDefault makes the project's new sandboxes third-party:
	// they get only environments marked third_party_safe.
	ThirdPartyDefault bool `json:"third_party_default"`
}

// ProjectUpdate changes a project's settings; absent fields stay.
type ProjectUpdate struct {
	ThirdPartyDefault *bool `json:"third_party_default,omitempty"`
}

// Fleet is a named group of sandboxes in a project.
type Fleet struct {
	ID        string    `json:"id"`
	AccountID string    `json:"account_id"`
	ProjectID string    `json:"project_id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

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
