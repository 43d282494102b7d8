package apiclient

import (
	"net/url"
	"time"

	"github.com/harebox/harebox/model"
)

// EnvVar is an environment's variable. In answers a secret has no value:
// it is sealed in the server, and a sandbox sees a placeholder instead.
type EnvVar struct {
	Value  string `json:"value,omitempty"`
	Secret bool   `json:"secret,omitempty"`
}

// EnvFile is model.EnvFile.
type EnvFile = model.EnvFile

// CredentialRule is model.CredentialRule.
type CredentialRule = model.CredentialRule

// EnvironmentRequest creates an environment and its version 1.
type EnvironmentRequest struct {
	Name string `json:"name"`
	// Project is an ID or name; default the account's default project.
	Project        string            `json:"project,omitempty"`
	Variables      map[string]EnvVar `json:"variables,omitempty"`
	Files          []EnvFile         `json:"files,omitempty"`
	Credentials    []CredentialRule  `json:"credentials,omitempty"`
	ThirdPartySafe bool              `json:"third_party_safe,omitempty"`
}

// EnvironmentUpdate makes a new version from the latest: variables set and
// unset; files, credentials and the third-party flag replaced when given
// (a non-nil empty slice removes them all).
type EnvironmentUpdate struct {
	Set            map[string]EnvVar `json:"set,omitempty"`
	Unset          []string          `json:"unset,omitempty"`
	Files          *[]EnvFile        `json:"files,omitempty"`
	Credentials    *[]CredentialRule `json:"credentials,omitempty"`
	ThirdPartySafe *bool             `json:"third_party_safe,omitempty"`
}

// EnvVersion is one immutable version of an environment.
type EnvVersion struct {
	EnvironmentID  string            `json:"environment_id"`
	Version        int               `json:"version"`
	CreatedAt      time.Time         `json:"created_at"`
	ThirdPartySafe bool              `json:"third_party_safe"`
	Variables      map[string]EnvVar `json:"variables"`
	Files          []EnvFile         `json:"files"`
	Credentials    []CredentialRule  `json:"credentials"`
}

// Environment is an environment with its latest version.
type Environment struct {
	ID        string      `json:"id"`
	AccountID string      `json:"account_id"`
	ProjectID string      `json:"project_id"`
	Project   string      `json:"project"`
	Name      string      `json:"name"`
	Latest    int         `json:"latest"`
	CreatedAt time.Time   `json:"created_at"`
	UpdatedAt time.Time   `json:"updated_at"`
	Version   *EnvVersion `json:"version"`
}

// ProjectQuery is the ?project= and ?account= query of the environment
// routes; nil when both are "".
func ProjectQuery(project, account string) url.Values {
	q := AccountQuery(account)
	if project != "" {
		if q == nil {
			q = url.Values{}
		}
		q.Set("project", project)
	}
	return q
}
