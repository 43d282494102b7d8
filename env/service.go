package env

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
)

// Tx is what the environment calls need of a store transaction.
type Tx interface {
	tenant.Resolver
	CountLiveWithEnvironment(ctx context.Context, environmentID string) (int, error)
	DeleteEnvironment(ctx context.Context, id string) error
	EnvironmentByName(ctx context.Context, projectID, name string) (*store.Environment, error)
	GetEnvVersion(ctx context.Context, environmentID string, version int) (*store.EnvVersion, error)
	GetEnvironment(ctx context.Context, id string) (*store.Environment, error)
	ListEnvVersions(ctx context.Context, environmentID string) ([]*store.EnvVersion, error)
	ListEnvironments(ctx context.Context, projectID string) ([]*store.Environment, error)
	PutEnvVersion(ctx context.Context, v *store.EnvVersion) error
	PutEnvironment(ctx context.Context, e *store.Environment) error
}

// Service manages environments for the principal in the context.
type Service struct {
	// Audit, if set, records every change.
	Audit *audit.Log
	db    interface {
		Update(ctx context.Context, fn func(tx Tx) error) error
	}
	tenants *tenant.Service
	secrets secrets.Store
}

// New returns a service; secret values go to sec.
func New(db store.Store, tenants *tenant.Service, sec secrets.Store) *Service {
	return &Service{db: store.Narrow(db, func(tx store.Tx) Tx { return tx }), tenants: tenants, secrets: sec}
}

// View is an environment with its latest version; secret values never
// appear in it.
type View struct {
	*store.Environment
	Project string            `json:"project"`
	Version *store.EnvVersion `json:"version"`
}

// scope is where an environment's secret values are sealed.
func scope(envID string) string { return "env/" + envID }

// public strips what only the host needs (the secret references).
func public(v *store.EnvVersion) *store.EnvVersion {
	c := *v
	c.Variables = map[string]store.EnvVar{}
	for k, x := range v.Variables {
		x.SecretRef = ""
		c.Variables[k] = x
	}
	return &c
}

func newRef() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// seal stores the secret values of vars under new references and returns
// the variables as stored, with the references it made (to remove if the
// version is not committed).
func (s *Service) seal(ctx context.Context, envID string, in map[string]Var, into map[string]store.EnvVar) (made []string, err error) {
	for k, v := range in {
		if !v.Secret {
			into[k] = store.EnvVar{Value: v.Value}
			continue
		}
		ref := newRef()
		if err := s.secrets.Put(ctx, scope(envID), ref, []byte(v.Value)); err != nil {
			return made, err
		}
		made = append(made, ref)
		into[k] = store.EnvVar{Secret: true, SecretRef: ref}
	}
	return made, nil
}

func (s *Service) unseal(envID string, refs []string) {
	for _, r := range refs {
		s.secrets.Delete(context.WithoutCancel(context.Background()), scope(envID), r)
	}
}

// checkVars validates the request's variables before anything is sealed.
func checkVars(in map[string]Var) error {
	vars := map[string]store.EnvVar{}
	for k, v := range in {
		vars[k] = store.EnvVar{Value: v.Value, Secret: v.Secret}
	}
	return check(vars, nil, nil)
}

// Create makes an environment with its version 1.
func (s *Service) Create(ctx context.Context, accountRef string, r CreateRequest) (out *View, err error) {
	defer func() {
		target, account := r.Name, ""
		if out != nil {
			target, account = out.ID, out.AccountID
		}
		s.Audit.Record(ctx, "createEnvironment", account, target, err)
	}()
	if err := authz.Allowed(authz.From(ctx), "createEnvironment"); err != nil {
		return nil, err
	}
	if err := sandbox.Validate(&r); err != nil {
		return nil, err
	}
	if err := checkVars(r.Variables); err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	e := &store.Environment{ID: tenant.NewID(IDPrefix), Name: r.Name, Latest: 1, CreatedAt: now, UpdatedAt: now}
	v := &store.EnvVersion{EnvironmentID: e.ID, Version: 1, CreatedAt: now, ThirdPartySafe: r.ThirdPartySafe,
		Variables: map[string]store.EnvVar{}, Files: orEmpty(r.Files), Credentials: orEmpty(r.Credentials)}
	made, err := s.seal(ctx, e.ID, r.Variables, v.Variables)
	if err == nil {
		err = check(v.Variables, v.Files, v.Credentials)
	}
	var proj *store.Project
	if err == nil {
		err = s.db.Update(ctx, func(tx Tx) error {
			var err error
			_, proj, err = s.tenants.ProjectIn(ctx, tx, accountRef, r.Project)
			if err != nil {
				return sandbox.Errorf(sandbox.ErrInvalid, "project", "%v", err)
			}
			e.AccountID, e.ProjectID = proj.AccountID, proj.ID
			if err := tx.PutEnvironment(ctx, e); err != nil {
				if errors.Is(err, store.ErrConflict) {
					return sandbox.Errorf(sandbox.ErrExists, "name", "an environment named %q exists in project %q", r.Name, proj.Name)
				}
				return err
			}
			return tx.PutEnvVersion(ctx, v)
		})
	}
	if err != nil {
		s.unseal(e.ID, made)
		return nil, err
	}
	return &View{Environment: e, Project: proj.Name, Version: public(v)}, nil
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// find resolves an environment reference (ID, or name in the project) for
// action, with its project.
func (s *Service) find(ctx context.Context, tx Tx, action, accountRef, projectRef, ref string) (*store.Environment, *store.Project, error) {
	if err := authz.Allowed(authz.From(ctx), action); err != nil {
		return nil, nil, err
	}
	var e *store.Environment
	var err error
	if tenant.ValidID(IDPrefix, ref) {
		if e, err = tx.GetEnvironment(ctx, ref); err == nil && projectRef == "" {
			projectRef = e.ProjectID
		}
	}
	_, proj, perr := s.tenants.ProjectIn(ctx, tx, accountRef, projectRef)
	if perr != nil {
		return nil, nil, perr
	}
	if e == nil {
		e, err = tx.EnvironmentByName(ctx, proj.ID, ref)
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && e.ProjectID != proj.ID) {
		return nil, nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no environment %q in project %q", ref, proj.Name)
	}
	return e, proj, err
}

// List lists a project's environments with their latest versions.
func (s *Service) List(ctx context.Context, accountRef, projectRef string) ([]*View, error) {
	if err := authz.Allowed(authz.From(ctx), "listEnvironments"); err != nil {
		return nil, err
	}
	out := []*View{}
	err := s.db.Update(ctx, func(tx Tx) error {
		_, proj, err := s.tenants.ProjectIn(ctx, tx, accountRef, projectRef)
		if err != nil {
			return err
		}
		all, err := tx.ListEnvironments(ctx, proj.ID)
		if err != nil {
			return err
		}
		for _, e := range all {
			v, err := tx.GetEnvVersion(ctx, e.ID, e.Latest)
			if err != nil {
				return err
			}
			out = append(out, &View{Environment: e, Project: proj.Name, Version: public(v)})
		}
		return nil
	})
	return out, err
}

// Get returns an environment with its latest version.
func (s *Service) Get(ctx context.Context, accountRef, projectRef, ref string) (*View, error) {
	var out *View
	err := s.db.Update(ctx, func(tx Tx) error {
		e, proj, err := s.find(ctx, tx, "getEnvironment", accountRef, projectRef, ref)
		if err != nil {
			return err
		}
		v, err := tx.GetEnvVersion(ctx, e.ID, e.Latest)
		out = &View{Environment: e, Project: proj.Name}
		if v != nil {
			out.Version = public(v)
		}
		return err
	})
	return out, err
}

// Update makes a new version from the latest one and the request. Running
// sandboxes keep the version they pinned.
func (s *Service) Update(ctx context.Context, accountRef, projectRef, ref string, r UpdateRequest) (out *View, err error) {
	defer func() {
		target, account := ref, ""
		if out != nil {
			target, account = out.ID, out.AccountID
		}
		s.Audit.Record(ctx, "updateEnvironment", account, target, err)
	}()
	if err := authz.Allowed(authz.From(ctx), "updateEnvironment"); err != nil {
		return nil, err
	}
	if err := checkVars(r.Set); err != nil {
		return nil, err
	}
	if len(r.Set) == 0 && len(r.Unset) == 0 && r.Files == nil && r.Credentials == nil && r.ThirdPartySafe == nil {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "", "nothing to change: give set, unset, files, credentials or third_party_safe")
	}
	// The new values are sealed before the transaction: the secret store
	// writes through the store itself, which a transaction holds (SQLite
	// has one connection), and a PostgreSQL transaction may run again.
	var envID string
	err = s.db.Update(ctx, func(tx Tx) error {
		e, _, err := s.find(ctx, tx, "updateEnvironment", accountRef, projectRef, ref)
		if err == nil {
			envID = e.ID
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	set := map[string]store.EnvVar{}
	made, err := s.seal(ctx, envID, r.Set, set)
	if err != nil {
		s.unseal(envID, made)
		return nil, err
	}
	err = s.db.Update(ctx, func(tx Tx) error {
		e, proj, err := s.find(ctx, tx, "updateEnvironment", accountRef, projectRef, ref)
		if err != nil {
			return err
		}
		if e.ID != envID {
			return sandbox.Errorf(sandbox.ErrState, "", "environment %q was replaced meanwhile; try again", ref)
		}
		last, err := tx.GetEnvVersion(ctx, e.ID, e.Latest)
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		v := &store.EnvVersion{EnvironmentID: e.ID, Version: e.Latest + 1, CreatedAt: now, ThirdPartySafe: last.ThirdPartySafe,
			Variables: maps.Clone(last.Variables), Files: last.Files, Credentials: last.Credentials}
		for _, k := range r.Unset {
			if _, ok := v.Variables[k]; !ok {
				return sandbox.Errorf(sandbox.ErrInvalid, "unset", "no variable %q", k)
			}
			delete(v.Variables, k)
		}
		// Unchanged secrets keep their sealed values (versions share them).
		maps.Copy(v.Variables, set)
		if r.Files != nil {
			v.Files = orEmpty(*r.Files)
		}
		if r.Credentials != nil {
			v.Credentials = orEmpty(*r.Credentials)
		}
		if r.ThirdPartySafe != nil {
			v.ThirdPartySafe = *r.ThirdPartySafe
		}
		if err := check(v.Variables, v.Files, v.Credentials); err != nil {
			return err
		}
		if err := tx.PutEnvVersion(ctx, v); err != nil {
			return err
		}
		e.Latest, e.UpdatedAt = v.Version, now
		if err := tx.PutEnvironment(ctx, e); err != nil {
			return err
		}
		out = &View{Environment: e, Project: proj.Name, Version: public(v)}
		return nil
	})
	if err != nil {
		s.unseal(envID, made)
		return nil, err
	}
	return out, nil
}

// Delete deletes an environment that no live sandbox pinned, with every
// version and every sealed value.
func (s *Service) Delete(ctx context.Context, accountRef, projectRef, ref string) (err error) {
	var envID, account string
	defer func() {
		target := ref
		if envID != "" {
			target = envID
		}
		s.Audit.Record(ctx, "deleteEnvironment", account, target, err)
	}()
	var refs []string
	err = s.db.Update(ctx, func(tx Tx) error {
		e, _, err := s.find(ctx, tx, "deleteEnvironment", accountRef, projectRef, ref)
		if err != nil {
			return err
		}
		n, err := tx.CountLiveWithEnvironment(ctx, e.ID)
		if err != nil {
			return err
		}
		if n > 0 {
			return sandbox.Errorf(sandbox.ErrState, "", "environment %q is pinned by %d sandboxes that are not deleted", e.Name, n)
		}
		vs, err := tx.ListEnvVersions(ctx, e.ID)
		if err != nil {
			return err
		}
		refs = refs[:0]
		for _, v := range vs {
			for _, x := range v.Variables {
				if x.SecretRef != "" && !slices.Contains(refs, x.SecretRef) {
					refs = append(refs, x.SecretRef)
				}
			}
		}
		envID, account = e.ID, e.AccountID
		return tx.DeleteEnvironment(ctx, e.ID)
	})
	if err == nil {
		s.unseal(envID, refs)
	}
	return err
}

// Versions lists an environment's versions, oldest first.
func (s *Service) Versions(ctx context.Context, accountRef, projectRef, ref string) ([]*store.EnvVersion, error) {
	out := []*store.EnvVersion{}
	err := s.db.Update(ctx, func(tx Tx) error {
		e, _, err := s.find(ctx, tx, "listEnvironmentVersions", accountRef, projectRef, ref)
		if err != nil {
			return err
		}
		vs, err := tx.ListEnvVersions(ctx, e.ID)
		for _, v := range vs {
			out = append(out, public(v))
		}
		return err
	})
	return out, err
}

// Version returns one version.
func (s *Service) Version(ctx context.Context, accountRef, projectRef, ref string, n int) (*store.EnvVersion, error) {
	var out *store.EnvVersion
	err := s.db.Update(ctx, func(tx Tx) error {
		e, _, err := s.find(ctx, tx, "getEnvironmentVersion", accountRef, projectRef, ref)
		if err != nil {
			return err
		}
		v, err := tx.GetEnvVersion(ctx, e.ID, n)
		if errors.Is(err, store.ErrNotFound) {
			return sandbox.Errorf(sandbox.ErrNotFound, "", "environment %q has no version %d", e.Name, n)
		}
		if err == nil {
			out = public(v)
		}
		return err
	})
	return out, err
}

// Pin resolves NAME[@VERSION] (or ID[@VERSION]) in proj for a new sandbox:
// the latest version unless one is named. A third-party sandbox gets only
// a version marked third_party_safe.
func (s *Service) Pin(ctx context.Context, tx Tx, proj *store.Project, ref string, thirdParty bool) (*store.Environment, *store.EnvVersion, error) {
	name, ver, hasVer := strings.Cut(ref, "@")
	var e *store.Environment
	var err error
	if tenant.ValidID(IDPrefix, name) {
		e, err = tx.GetEnvironment(ctx, name)
	} else {
		e, err = tx.EnvironmentByName(ctx, proj.ID, name)
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && e.ProjectID != proj.ID) {
		return nil, nil, sandbox.Errorf(sandbox.ErrInvalid, "environment", "no environment %q in project %q", name, proj.Name)
	}
	if err != nil {
		return nil, nil, err
	}
	n := e.Latest
	if hasVer {
		if n, err = strconv.Atoi(ver); err != nil || n < 1 {
			return nil, nil, sandbox.Errorf(sandbox.ErrInvalid, "environment", "%q: the version is a number from 1", ref)
		}
	}
	v, err := tx.GetEnvVersion(ctx, e.ID, n)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil, sandbox.Errorf(sandbox.ErrInvalid, "environment", "environment %q has no version %d", e.Name, n)
	}
	if err != nil {
		return nil, nil, err
	}
	if thirdParty && !v.ThirdPartySafe {
		return nil, nil, sandbox.Errorf(sandbox.ErrForbidden, "environment", "a third-party sandbox may only get environments marked third_party_safe; %s@%d is not", e.Name, n)
	}
	return e, v, nil
}

// Reveal returns a secret's value, for the host's credential proxy only:
// it checks no principal, and no API route calls it.
func (s *Service) Reveal(ctx context.Context, envID, secretRef string) (string, error) {
	b, err := s.secrets.Get(ctx, scope(envID), secretRef)
	return string(b), err
}
