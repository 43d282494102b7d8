package tenant

import (
	"context"
	"errors"
	"time"

	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Service creates, lists, gets and deletes accounts, projects and fleets
// for the principal in the context. Objects the principal may not see are
// ErrNotFound, exactly like missing ones.
type Service struct {
	db interface {
		Update(ctx context.Context, fn func(tx Tx) error) error
	}
	// Audit, if set, records every change.
	Audit *audit.Log
	// AccountDeleted, if set, is called after an account is deleted (its
	// keys revoked in the store), so a key cache can drop them.
	AccountDeleted func(accountID string)
	// AccountUpdated, if set, is called after an account's settings
	// change (its retention applies at once).
	AccountUpdated func(accountID string)
	// ProjectUpdated, if set, is called after a project's mesh default
	// changed.
	ProjectUpdated func(projectID string)
}

// Tx is what the tenancy calls need of a store transaction: resolving
// references, and making and deleting accounts, projects and fleets with
// what they hold.
type Tx interface {
	Resolver
	CountLive(ctx context.Context, accountID, projectID, fleetID string) (int, error)
	DeleteAccount(ctx context.Context, id string) error
	DeleteBudget(ctx context.Context, id string) error
	DeleteClientCerts(ctx context.Context, projectID string) error
	DeleteFleet(ctx context.Context, id string) error
	DeleteProject(ctx context.Context, id string) error
	DeleteSecretScope(ctx context.Context, scope string) error
	ListAccounts(ctx context.Context) ([]*store.Account, error)
	ListBudgets(ctx context.Context, accountID string) ([]*store.Budget, error)
	ListEnvironments(ctx context.Context, projectID string) ([]*store.Environment, error)
	ListFleets(ctx context.Context, projectID string) ([]*store.Fleet, error)
	ListKeys(ctx context.Context, accountID string) ([]*store.Key, error)
	ListProjects(ctx context.Context, accountID string) ([]*store.Project, error)
	ListSnapshots(ctx context.Context) ([]*store.Snapshot, error)
	Notify(ctx context.Context, topic, payload string) error
	PutAccount(ctx context.Context, a *store.Account) error
	PutFleet(ctx context.Context, f *store.Fleet) error
	PutKey(ctx context.Context, k *store.Key) error
	DeleteKeySessions(ctx context.Context, keyID string) error
	PutProject(ctx context.Context, p *store.Project) error
	GetURLCA(ctx context.Context, projectID string) (*store.URLCA, error)
}

// New returns a service over db.
func New(db store.Store) *Service {
	return &Service{db: store.Narrow(db, func(tx store.Tx) Tx { return tx })}
}

// EnsureDefault makes the default account and its default project if they
// do not exist yet, and returns the account. The operator's requests that
// name no account land there, so a single-tenant host needs no setup.
func (s *Service) EnsureDefault(ctx context.Context) (*Account, error) {
	var acc *Account
	err := s.db.Update(ctx, func(tx Tx) error {
		a, err := tx.AccountByName(ctx, DefaultName)
		if errors.Is(err, store.ErrNotFound) {
			a, err = createAccount(ctx, tx, DefaultName)
		}
		acc = a
		return err
	})
	return acc, err
}

func createAccount(ctx context.Context, tx Tx, name string) (*Account, error) {
	now := time.Now().UTC()
	a := &Account{ID: NewID(AccountPrefix), Name: name, CreatedAt: now}
	if err := tx.PutAccount(ctx, a); err != nil {
		return nil, conflict(err, "name", "an account named %q exists", name)
	}
	p := &Project{ID: NewID(ProjectPrefix), AccountID: a.ID, Name: DefaultName, CreatedAt: now}
	if err := tx.PutProject(ctx, p); err != nil {
		return nil, err
	}
	return a, nil
}

func conflict(err error, field, format string, args ...any) error {
	if errors.Is(err, store.ErrConflict) {
		return sandbox.Errorf(sandbox.ErrExists, field, format, args...)
	}
	return err
}

func notFound(what, ref string) error {
	return sandbox.Errorf(sandbox.ErrNotFound, "", "no %s %q", what, ref)
}

// Resolver is what resolving a reference to an account, project or fleet
// reads (a store.Tx has it); a domain that resolves references in its own
// transactions includes it in its Tx.
type Resolver interface {
	GetAccount(ctx context.Context, id string) (*store.Account, error)
	AccountByName(ctx context.Context, name string) (*store.Account, error)
	GetProject(ctx context.Context, id string) (*store.Project, error)
	ProjectByName(ctx context.Context, accountID, name string) (*store.Project, error)
	GetFleet(ctx context.Context, id string) (*store.Fleet, error)
	FleetByName(ctx context.Context, projectID, name string) (*store.Fleet, error)
}

// Account resolves an account reference (ID or name) for the principal in
// ctx: "" is the key's own account, or the default one for the operator.
func (s *Service) Account(ctx context.Context, tx Resolver, ref string) (*Account, error) {
	p := authz.From(ctx)
	var a *Account
	var err error
	switch {
	case ref == "" && !p.Operator:
		a, err = tx.GetAccount(ctx, p.AccountID)
	case ref == "":
		a, err = tx.AccountByName(ctx, DefaultName)
	case ValidID(AccountPrefix, ref):
		a, err = tx.GetAccount(ctx, ref)
	default:
		a, err = tx.AccountByName(ctx, ref)
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && !authz.Visible(p, authz.Target{AccountID: a.ID})) {
		return nil, notFound("account", ref)
	}
	return a, err
}

// Project resolves a project reference in an account; "" is the default
// project. The principal's project scope applies.
func (s *Service) Project(ctx context.Context, tx Resolver, acc *Account, ref string) (*Project, error) {
	var p *Project
	var err error
	switch {
	case ref == "":
		p, err = tx.ProjectByName(ctx, acc.ID, DefaultName)
	case ValidID(ProjectPrefix, ref):
		p, err = tx.GetProject(ctx, ref)
	default:
		p, err = tx.ProjectByName(ctx, acc.ID, ref)
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && (p.AccountID != acc.ID ||
		!authz.Visible(authz.From(ctx), authz.Target{AccountID: p.AccountID, ProjectID: p.ID}))) {
		if ref == "" {
			ref = DefaultName
		}
		return nil, notFound("project", ref)
	}
	return p, err
}

// ProjectIn resolves an account and a project reference together. A
// project ID names its account by itself (when accountRef is empty), so
// the operator needs no ?account= for another account's project by ID.
func (s *Service) ProjectIn(ctx context.Context, tx Resolver, accountRef, ref string) (*Account, *Project, error) {
	if accountRef == "" && ValidID(ProjectPrefix, ref) {
		if p, err := tx.GetProject(ctx, ref); err == nil {
			accountRef = p.AccountID
		}
	}
	a, err := s.Account(ctx, tx, accountRef)
	if err != nil {
		return nil, nil, err
	}
	p, err := s.Project(ctx, tx, a, ref)
	return a, p, err
}

// Fleet resolves a fleet reference in a project.
func (s *Service) Fleet(ctx context.Context, tx Resolver, p *Project, ref string) (*Fleet, error) {
	var f *Fleet
	var err error
	if ValidID(FleetPrefix, ref) {
		f, err = tx.GetFleet(ctx, ref)
	} else {
		f, err = tx.FleetByName(ctx, p.ID, ref)
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && f.ProjectID != p.ID) {
		return nil, notFound("fleet", ref)
	}
	return f, err
}

// do runs fn in a transaction after checking the action is allowed, and
// records a change (target names what it is on) in the audit log.
func (s *Service) do(ctx context.Context, action string, n *note, fn func(tx Tx) error) (err error) {
	if changes[action] {
		defer func() { s.Audit.Record(ctx, action, n.account, n.target, err) }()
	}
	if err := authz.Allowed(authz.From(ctx), action); err != nil {
		return err
	}
	return s.db.Update(ctx, fn)
}

// note is what the audit log says a change was on: the reference the
// caller gave, until the change resolves its account and object IDs.
type note struct{ account, target string }

// changes are the actions the audit log records.
var changes = map[string]bool{
	"createAccount": true, "updateAccount": true, "deleteAccount": true, "createProject": true, "updateProject": true,
	"deleteProject": true, "createFleet": true, "deleteFleet": true,
}

// CreateAccount makes an account with its default project (operator only).
func (s *Service) CreateAccount(ctx context.Context, r CreateRequest) (*Account, error) {
	if err := r.Check(); err != nil {
		return nil, err
	}
	var a *Account
	n := &note{target: r.Name}
	err := s.do(ctx, "createAccount", n, func(tx Tx) (err error) {
		if a, err = createAccount(ctx, tx, r.Name); err == nil {
			n.account, n.target = a.ID, a.ID
		}
		return err
	})
	return a, err
}

// ListAccounts lists the accounts the principal sees: all for the
// operator, its own for a key.
func (s *Service) ListAccounts(ctx context.Context) ([]*Account, error) {
	out := []*Account{}
	err := s.do(ctx, "listAccounts", &note{}, func(tx Tx) error {
		all, err := tx.ListAccounts(ctx)
		for _, a := range all {
			if authz.Visible(authz.From(ctx), authz.Target{AccountID: a.ID}) {
				out = append(out, a)
			}
		}
		return err
	})
	return out, err
}

// GetAccount returns an account by ID or name.
func (s *Service) GetAccount(ctx context.Context, ref string) (*Account, error) {
	var a *Account
	err := s.do(ctx, "getAccount", &note{}, func(tx Tx) (err error) {
		a, err = s.Account(ctx, tx, ref)
		return err
	})
	return a, err
}

// AccountUpdate changes an account's settings; absent fields stay.
type AccountUpdate struct {
	Retention *store.Retention `json:"retention,omitempty"`
}

// MaxRetentionDays bounds a retention (a hundred years).
const MaxRetentionDays = 36500

// UpdateAccount changes an account's settings: the operator's, or a key's
// own account's.
func (s *Service) UpdateAccount(ctx context.Context, ref string, u AccountUpdate) (*Account, error) {
	if r := u.Retention; r != nil {
		for field, d := range map[string]*int{"retention.history_days": r.HistoryDays, "retention.output_days": r.OutputDays} {
			if d != nil && (*d < 0 || *d > MaxRetentionDays) {
				return nil, sandbox.Errorf(sandbox.ErrInvalid, field, "days from 0 (keep nothing) to %d; leave it out to keep forever", MaxRetentionDays)
			}
		}
	}
	var a *Account
	n := &note{target: ref}
	err := s.do(ctx, "updateAccount", n, func(tx Tx) (err error) {
		if a, err = s.Account(ctx, tx, ref); err != nil {
			return err
		}
		n.account, n.target = a.ID, a.ID
		if u.Retention != nil {
			a.Retention = *u.Retention
		}
		return tx.PutAccount(ctx, a)
	})
	if err == nil && s.AccountUpdated != nil {
		s.AccountUpdated(a.ID)
	}
	return a, err
}

// DeleteAccount deletes an account with no live sandboxes (operator only):
// its projects and fleets go, and its keys are revoked.
func (s *Service) DeleteAccount(ctx context.Context, ref string) error {
	var deleted string
	n := &note{target: ref}
	err := s.do(ctx, "deleteAccount", n, func(tx Tx) error {
		a, err := s.Account(ctx, tx, ref)
		if err != nil {
			return err
		}
		n.account, n.target = a.ID, a.ID
		deleted = a.ID
		if a.Name == DefaultName {
			return sandbox.Errorf(sandbox.ErrState, "", "the default account cannot be deleted")
		}
		if err := noLive(ctx, tx, "account", a.Name, a.ID, "", ""); err != nil {
			return err
		}
		projects, err := tx.ListProjects(ctx, a.ID)
		if err != nil {
			return err
		}
		for _, p := range projects {
			if err := deleteProject(ctx, tx, p); err != nil {
				return err
			}
		}
		// Its budgets go with it (the usage it metered stays: a record).
		if err := deleteBudgets(ctx, tx, a.ID, func(*store.Budget) bool { return true }); err != nil {
			return err
		}
		keys, err := tx.ListKeys(ctx, a.ID)
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		for _, k := range keys {
			if k.RevokedAt == nil {
				k.RevokedAt = &now
				if err := tx.PutKey(ctx, k); err != nil {
					return err
				}
				if err := tx.DeleteKeySessions(ctx, k.ID); err != nil {
					return err
				}
				// (Every host drops it from its cache: apikey.NoticeTopic.)
				if err := tx.Notify(ctx, "key", k.ID); err != nil {
					return err
				}
			}
		}
		return tx.DeleteAccount(ctx, a.ID)
	})
	if err == nil && s.AccountDeleted != nil {
		s.AccountDeleted(deleted)
	}
	return err
}

// noLive refuses to delete a container that still has live sandboxes.
func noLive(ctx context.Context, tx Tx, what, name, accountID, projectID, fleetID string) error {
	n, err := tx.CountLive(ctx, accountID, projectID, fleetID)
	if err != nil {
		return err
	}
	if n > 0 {
		return sandbox.Errorf(sandbox.ErrState, "", "%s %q has %d sandboxes that are not deleted; delete them first", what, name, n)
	}
	return nil
}

// CreateProject makes a project in an account ("" for the principal's).
func (s *Service) CreateProject(ctx context.Context, accountRef string, r CreateRequest) (*Project, error) {
	if err := r.Check(); err != nil {
		return nil, err
	}
	var p *Project
	n := &note{target: r.Name}
	err := s.do(ctx, "createProject", n, func(tx Tx) error {
		a, err := s.Account(ctx, tx, accountRef)
		if err != nil {
			return err
		}
		n.account = a.ID
		if len(authz.From(ctx).Scope.Projects) > 0 {
			return sandbox.Errorf(sandbox.ErrForbidden, "", "this API key is limited to some projects; it cannot create others")
		}
		p = &Project{ID: NewID(ProjectPrefix), AccountID: a.ID, Name: r.Name, CreatedAt: time.Now().UTC()}
		n.target = p.ID
		return conflict(tx.PutProject(ctx, p), "name", "a project named %q exists", r.Name)
	})
	return p, err
}

// ListProjects lists an account's projects the principal sees.
func (s *Service) ListProjects(ctx context.Context, accountRef string) ([]*Project, error) {
	out := []*Project{}
	err := s.do(ctx, "listProjects", &note{}, func(tx Tx) error {
		a, err := s.Account(ctx, tx, accountRef)
		if err != nil {
			return err
		}
		all, err := tx.ListProjects(ctx, a.ID)
		for _, p := range all {
			if authz.Visible(authz.From(ctx), authz.Target{AccountID: p.AccountID, ProjectID: p.ID}) {
				out = append(out, p)
			}
		}
		return err
	})
	return out, err
}

// GetProject returns a project by ID or name.
func (s *Service) GetProject(ctx context.Context, accountRef, ref string) (*Project, error) {
	var p *Project
	err := s.do(ctx, "getProject", &note{}, func(tx Tx) (err error) {
		_, p, err = s.ProjectIn(ctx, tx, accountRef, ref)
		return err
	})
	return p, err
}

// ProjectUpdate changes a project's settings; absent fields stay.
type ProjectUpdate struct {
	// ThirdPartyDefault makes new sandboxes of the project third-party.
	ThirdPartyDefault *bool `json:"third_party_default,omitempty"`
	// Mesh puts new sandboxes of the project on its private mesh.
	Mesh *bool `json:"mesh,omitempty"`
	// MeshDefault, "allow" or "deny", decides what its mesh sandboxes
	// open to each other when no mesh rule of theirs matches.
	MeshDefault *string `json:"mesh_default,omitempty"`
}

// UpdateProject changes a project's settings.
func (s *Service) UpdateProject(ctx context.Context, accountRef, ref string, u ProjectUpdate) (*Project, error) {
	var p *Project
	n := &note{target: ref}
	err := s.do(ctx, "updateProject", n, func(tx Tx) (err error) {
		if _, p, err = s.ProjectIn(ctx, tx, accountRef, ref); err != nil {
			return err
		}
		n.account, n.target = p.AccountID, p.ID
		if u.ThirdPartyDefault != nil {
			p.ThirdPartyDefault = *u.ThirdPartyDefault
		}
		if u.Mesh != nil {
			p.Mesh = *u.Mesh
		}
		if d := u.MeshDefault; d != nil {
			switch *d {
			case "allow":
				p.MeshDefault = ""
			case "deny":
				p.MeshDefault = "deny"
			default:
				return sandbox.Errorf(sandbox.ErrInvalid, "mesh_default", `must be "allow" or "deny", not %q`, *d)
			}
		}
		return tx.PutProject(ctx, p)
	})
	if err == nil && u.MeshDefault != nil && s.ProjectUpdated != nil {
		s.ProjectUpdated(p.ID)
	}
	return p, err
}

// DeleteProject deletes a project with no live sandboxes, and its fleets.
// The default project stays.
func (s *Service) DeleteProject(ctx context.Context, accountRef, ref string) error {
	n := &note{target: ref}
	return s.do(ctx, "deleteProject", n, func(tx Tx) error {
		a, p, err := s.ProjectIn(ctx, tx, accountRef, ref)
		if err != nil {
			return err
		}
		n.account, n.target = a.ID, p.ID
		if p.Name == DefaultName {
			return sandbox.Errorf(sandbox.ErrState, "", "an account's default project cannot be deleted")
		}
		if err := noLive(ctx, tx, "project", p.Name, a.ID, p.ID, ""); err != nil {
			return err
		}
		return deleteProject(ctx, tx, p)
	})
}

func deleteProject(ctx context.Context, tx Tx, p *Project) error {
	// Environments hold sealed values only their own delete erases.
	envs, err := tx.ListEnvironments(ctx, p.ID)
	if err != nil {
		return err
	}
	if len(envs) > 0 {
		return sandbox.Errorf(sandbox.ErrState, "", "project %q has %d environments; delete them first", p.Name, len(envs))
	}
	// So does a URL CA (its key). Its certificates' records go with the
	// project, and any key a failed change left behind.
	if _, err := tx.GetURLCA(ctx, p.ID); err == nil {
		return sandbox.Errorf(sandbox.ErrState, "", "project %q has a URL CA; delete it first (DELETE /v1/url-ca)", p.Name)
	} else if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if err := tx.DeleteClientCerts(ctx, p.ID); err != nil {
		return err
	}
	if err := tx.DeleteSecretScope(ctx, "urlca/"+p.ID); err != nil { // ingress's scope of CA keys
		return err
	}
	// So do snapshots (a copy of their source's data key).
	snaps, err := tx.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	n := 0
	for _, sn := range snaps {
		if sn.ProjectID == p.ID {
			n++
		}
	}
	if n > 0 {
		return sandbox.Errorf(sandbox.ErrState, "", "project %q has %d snapshots; delete them first", p.Name, n)
	}
	fleets, err := tx.ListFleets(ctx, p.ID)
	if err != nil {
		return err
	}
	for _, f := range fleets {
		if err := tx.DeleteFleet(ctx, f.ID); err != nil {
			return err
		}
	}
	// Budgets on the project or its fleets cover nothing any more.
	if err := deleteBudgets(ctx, tx, p.AccountID, func(b *store.Budget) bool { return b.ProjectID == p.ID }); err != nil {
		return err
	}
	return tx.DeleteProject(ctx, p.ID)
}

// deleteBudgets deletes an account's budgets that match.
func deleteBudgets(ctx context.Context, tx Tx, accountID string, match func(*store.Budget) bool) error {
	bs, err := tx.ListBudgets(ctx, accountID)
	if err != nil {
		return err
	}
	for _, b := range bs {
		if match(b) {
			if err := tx.DeleteBudget(ctx, b.ID); err != nil {
				return err
			}
		}
	}
	return nil
}

// CreateFleet makes a fleet in a project.
func (s *Service) CreateFleet(ctx context.Context, accountRef, projectRef string, r CreateRequest) (*Fleet, error) {
	if err := r.Check(); err != nil {
		return nil, err
	}
	var f *Fleet
	n := &note{target: projectRef + "/" + r.Name}
	err := s.do(ctx, "createFleet", n, func(tx Tx) error {
		a, p, err := s.ProjectIn(ctx, tx, accountRef, projectRef)
		if err != nil {
			return err
		}
		f = &Fleet{ID: NewID(FleetPrefix), AccountID: a.ID, ProjectID: p.ID, Name: r.Name, CreatedAt: time.Now().UTC()}
		n.account, n.target = a.ID, f.ID
		return conflict(tx.PutFleet(ctx, f), "name", "a fleet named %q exists in project %q", r.Name, p.Name)
	})
	return f, err
}

// ListFleets lists a project's fleets.
func (s *Service) ListFleets(ctx context.Context, accountRef, projectRef string) ([]*Fleet, error) {
	out := []*Fleet{}
	err := s.do(ctx, "listFleets", &note{}, func(tx Tx) error {
		_, p, err := s.ProjectIn(ctx, tx, accountRef, projectRef)
		if err != nil {
			return err
		}
		all, err := tx.ListFleets(ctx, p.ID)
		out = append(out, all...)
		return err
	})
	return out, err
}

// GetFleet returns a fleet by ID or name.
func (s *Service) GetFleet(ctx context.Context, accountRef, projectRef, ref string) (*Fleet, error) {
	var f *Fleet
	err := s.do(ctx, "getFleet", &note{}, func(tx Tx) error {
		_, p, err := s.ProjectIn(ctx, tx, accountRef, projectRef)
		if err == nil {
			f, err = s.Fleet(ctx, tx, p, ref)
		}
		return err
	})
	return f, err
}

// DeleteFleet deletes a fleet with no live sandboxes.
func (s *Service) DeleteFleet(ctx context.Context, accountRef, projectRef, ref string) error {
	n := &note{target: projectRef + "/" + ref}
	return s.do(ctx, "deleteFleet", n, func(tx Tx) error {
		a, p, err := s.ProjectIn(ctx, tx, accountRef, projectRef)
		if err != nil {
			return err
		}
		f, err := s.Fleet(ctx, tx, p, ref)
		if err != nil {
			return err
		}
		n.account, n.target = a.ID, f.ID
		if err := noLive(ctx, tx, "fleet", f.Name, a.ID, p.ID, f.ID); err != nil {
			return err
		}
		if err := deleteBudgets(ctx, tx, a.ID, func(b *store.Budget) bool { return b.Scope.Kind == "fleet" && b.Scope.Ref == f.ID }); err != nil {
			return err
		}
		return tx.DeleteFleet(ctx, f.ID)
	})
}
