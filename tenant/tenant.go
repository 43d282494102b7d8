// Package tenant holds accounts, projects and fleets: who owns sandboxes.
// An account owns projects; every sandbox belongs to exactly one project
// (each account has a project named "default"); a fleet is a named group
// of sandboxes inside a project. Service is their create/list/get/delete,
// checked against the caller's principal (authz); storage is behind the
// narrow Store interface.
package tenant

import (
	"crypto/rand"
	"strings"

	"github.com/oklog/ulid/v2"

	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// ID prefixes. Names are DNS labels (no '_'), so a reference that starts
// with a prefix is an ID and anything else is a name.
const (
	AccountPrefix = "acc_"
	ProjectPrefix = "prj_"
	FleetPrefix   = "flt_"
)

// DefaultName names the default account and every account's default
// project.
const DefaultName = "default"

// The records live in the store; this package holds their rules.
type (
	Account = store.Account
	Project = store.Project
	Fleet   = store.Fleet
)

// NewID returns prefix and a lower-case ULID.
func NewID(prefix string) string {
	return prefix + strings.ToLower(ulid.MustNew(ulid.Now(), rand.Reader).String())
}

// ValidID reports whether id has the shape NewID(prefix) produces.
func ValidID(prefix, id string) bool {
	if !strings.HasPrefix(id, prefix) || len(id) != len(prefix)+26 {
		return false
	}
	_, err := ulid.ParseStrict(strings.ToUpper(id[len(prefix):]))
	return err == nil
}

// CreateRequest names a new account, project or fleet.
type CreateRequest struct {
	Name string `json:"name" validate:"required,max=63,dnslabel"`
}

// Check validates the request.
func (r *CreateRequest) Check() error { return sandbox.Validate(r) }
