// Package env holds environments: named, versioned sets of variables and
// files in a project, that sandboxes pin at create (NAME@VERSION). Every
// update makes a new immutable version. A secret variable's value is sealed
// in the secret store and never delivered to a guest: each sandbox gets its
// own placeholder for it (hbph_...), which only the host can swap for the
// value, for the destinations a credential rule names. Environments marked
// third_party_safe are the only ones a third-party sandbox may get.
package env

import (
	"crypto/rand"
	"fmt"
	"path"
	"regexp"
	"strings"

	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Limits on one version, so an environment stays cheap to deliver.
const (
	MaxVariables   = 256
	MaxValueBytes  = 32 << 10
	MaxFiles       = 64
	MaxFileBytes   = 1 << 20
	MaxTotalBytes  = 4 << 20
	MaxCredentials = 64
)

// IDPrefix starts every environment ID.
const IDPrefix = "env_"

// PlaceholderPrefix starts every placeholder a guest sees for a secret.
const PlaceholderPrefix = "hbph_"

// Var is a variable as a request gives it.
type Var struct {
	Value  string `json:"value"`
	Secret bool   `json:"secret,omitempty"`
}

// CreateRequest makes an environment and its version 1.
type CreateRequest struct {
	Name string `json:"name" validate:"required,max=63,dnslabel"`
	// Project is an ID or name; default the account's default project.
	Project        string                 `json:"project,omitempty" validate:"max=64"`
	Variables      map[string]Var         `json:"variables,omitempty"`
	Files          []store.EnvFile        `json:"files,omitempty"`
	Credentials    []store.CredentialRule `json:"credentials,omitempty"`
	ThirdPartySafe bool                   `json:"third_party_safe,omitempty"`
}

// UpdateRequest makes a new version from the latest: variables set and
// unset; files, credentials and the third-party flag replaced when given.
type UpdateRequest struct {
	Set            map[string]Var          `json:"set,omitempty"`
	Unset          []string                `json:"unset,omitempty"`
	Files          *[]store.EnvFile        `json:"files,omitempty"`
	Credentials    *[]store.CredentialRule `json:"credentials,omitempty"`
	ThirdPartySafe *bool                   `json:"third_party_safe,omitempty"`
}

var (
	envNameRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	templateRE = regexp.MustCompile(`\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}`)
	headerRE   = regexp.MustCompile(`^[A-Za-z0-9-]{1,64}$`)
)

// check validates a version's content; errors name the field.
func check(vars map[string]store.EnvVar, files []store.EnvFile, creds []store.CredentialRule) error {
	if len(vars) > MaxVariables {
		return sandbox.Errorf(sandbox.ErrInvalid, "variables", "at most %d variables", MaxVariables)
	}
	for k, v := range vars {
		if !envNameRE.MatchString(k) {
			return sandbox.Errorf(sandbox.ErrInvalid, "variables["+k+"]", "names must match [A-Za-z_][A-Za-z0-9_]*")
		}
		if len(v.Value) > MaxValueBytes {
			return sandbox.Errorf(sandbox.ErrInvalid, "variables["+k+"]", "at most %d bytes", MaxValueBytes)
		}
	}
	if len(files) > MaxFiles {
		return sandbox.Errorf(sandbox.ErrInvalid, "files", "at most %d files", MaxFiles)
	}
	total := 0
	for i, f := range files {
		field := fmt.Sprintf("files[%d]", i)
		switch {
		case f.Path == "" || f.Path[0] != '/' || path.Clean(f.Path) != f.Path || len(f.Path) > 4096:
			return sandbox.Errorf(sandbox.ErrInvalid, field+".path", "%q must be an absolute, clean path", f.Path)
		case f.Mode > 0o7777:
			return sandbox.Errorf(sandbox.ErrInvalid, field+".mode", "must be at most 07777")
		case len(f.Content) > MaxFileBytes:
			return sandbox.Errorf(sandbox.ErrInvalid, field+".content", "at most %d bytes", MaxFileBytes)
		case len(f.Owner) > 64:
			return sandbox.Errorf(sandbox.ErrInvalid, field+".owner", "at most 64 bytes")
		}
		total += len(f.Content)
		if f.Template {
			for _, m := range templateRE.FindAllStringSubmatch(f.Content, -1) {
				if _, ok := vars[m[1]]; !ok {
					return sandbox.Errorf(sandbox.ErrInvalid, field+".content", "the template names %s, which is not a variable", m[1])
				}
			}
		}
	}
	if total > MaxTotalBytes {
		return sandbox.Errorf(sandbox.ErrInvalid, "files", "at most %d bytes in all", MaxTotalBytes)
	}
	if len(creds) > MaxCredentials {
		return sandbox.Errorf(sandbox.ErrInvalid, "credentials", "at most %d rules", MaxCredentials)
	}
	for i, c := range creds {
		field := fmt.Sprintf("credentials[%d]", i)
		if v, ok := vars[c.Secret]; !ok || !v.Secret {
			return sandbox.Errorf(sandbox.ErrInvalid, field+".secret", "%q is not a secret variable of this environment", c.Secret)
		}
		if len(c.Hosts) == 0 || len(c.Hosts) > 32 {
			return sandbox.Errorf(sandbox.ErrInvalid, field+".hosts", "name 1 to 32 hosts")
		}
		for j, h := range c.Hosts {
			if _, err := firewall.NormalizeHost(h); err != nil {
				return sandbox.Errorf(sandbox.ErrInvalid, fmt.Sprintf("%s.hosts[%d]", field, j), "%v", err)
			}
		}
		if c.Ports != "" {
			if _, err := firewall.ParsePorts(c.Ports); err != nil {
				return sandbox.Errorf(sandbox.ErrInvalid, field+".ports", "%v", err)
			}
		}
		if c.Header != "" && (!headerRE.MatchString(c.Header) || !strings.Contains(c.Format, "{value}")) {
			return sandbox.Errorf(sandbox.ErrInvalid, field+".header", "a header name, with a format that contains {value} (e.g. \"Bearer {value}\")")
		}
	}
	return nil
}

// NewPlaceholder returns a fresh placeholder: the prefix and 32 random
// lower-case base32 characters (160 bits), unique per sandbox and secret.
func NewPlaceholder() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz234567"
	b := make([]byte, 32)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[b[i]&31]
	}
	return PlaceholderPrefix + string(b)
}

// Delivery is what a sandbox gets from its pinned version: variables
// (secrets as its placeholders) and files (templates rendered the same
// way). It never holds a secret's value.
type Delivery struct {
	Vars  map[string]string
	Files []store.EnvFile
}

// Deliver renders v for a sandbox with placeholders (secret name ->
// placeholder).
func Deliver(v *store.EnvVersion, placeholders map[string]string) Delivery {
	d := Delivery{Vars: map[string]string{}}
	for k, x := range v.Variables {
		if x.Secret {
			d.Vars[k] = placeholders[k]
		} else {
			d.Vars[k] = x.Value
		}
	}
	for _, f := range v.Files {
		if f.Template {
			f.Content = templateRE.ReplaceAllStringFunc(f.Content, func(m string) string {
				return d.Vars[templateRE.FindStringSubmatch(m)[1]]
			})
		}
		f.Template = false
		d.Files = append(d.Files, f)
	}
	return d
}
