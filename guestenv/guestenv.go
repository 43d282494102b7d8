// Package guestenv is what a guest is given: its pinned environment's
// variables and files (secrets as placeholders, never values), its own
// create-time env (sealed under its data key in the secret store, never
// in its record), and, when its environment has credential rules, its
// own CA (the key sealed for the host's credentials proxy, the
// certificate installed in the guest) and the rules the proxy swaps
// placeholders by.
//
// The engine calls it at fixed points of a sandbox's life: Pin in the
// create's transaction, PrepareEnv and PrepareCredentials at create,
// LoadEnv and LoadCredentials when a sandbox runs again (re-adopted,
// started), Deliver after every boot, Erase at delete. The credentials
// proxy looks a sandbox's credentials up with Credentials.
package guestenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/env"
	"github.com/harebox/harebox/firewall/credproxy"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
)

// Store is what the service needs of the store: the pinned versions, and
// the sandbox's record, which it writes what it makes into.
type Store interface {
	GetEnvVersion(ctx context.Context, environmentID string, version int) (*store.EnvVersion, error)
	PutSandbox(ctx context.Context, s *store.Sandbox) error
}

// Secrets is what the service needs of the secret store, where a
// sandbox's own env and CA key are sealed (under Scope).
type Secrets interface {
	Put(ctx context.Context, scope, name string, value []byte) error
	Get(ctx context.Context, scope, name string) ([]byte, error)
	Delete(ctx context.Context, scope, name string) error
}

// Environments is what the service needs of the environments (env.Service).
type Environments interface {
	// Pin resolves ref in proj for a new sandbox, in the create's
	// transaction.
	Pin(ctx context.Context, tx env.Tx, proj *store.Project, ref string, thirdParty bool) (*store.Environment, *store.EnvVersion, error)
	// Reveal returns a secret's value, for the credentials proxy only.
	Reveal(ctx context.Context, envID, secretRef string) (string, error)
}

// Audit records what the credentials proxy saw of a sandbox.
type Audit interface {
	RecordPlaceholder(accountID, sandboxID, host string)
	RecordRefusedAnswer(accountID, sandboxID, host string)
}

// Sandboxes is what the credentials lookup needs of the engine.
type Sandboxes interface {
	// Guest returns live sandbox id's Guest, or nil.
	Guest(id string) *Guest
}

// Agent is what delivery needs of a booted guest's agent: its files. The
// engine gives its errors translated into its own (sandbox.Error).
type Agent interface {
	Stat(ctx context.Context, path string) (agentclient.FileInfo, error)
	ReadFile(ctx context.Context, path string, w io.Writer, offset, limit int64) (int64, error)
	WriteFile(ctx context.Context, path string, r io.Reader, o agentclient.WriteOptions) (agentclient.FileInfo, error)
}

// Options are a Service's parts.
type Options struct {
	Store        Store
	Secrets      Secrets
	Environments Environments
	Audit        Audit
	Sandboxes    Sandboxes
}

// Service gives sandboxes their environments and credentials. It is safe
// for concurrent use; calls on one sandbox are the caller's to serialise.
type Service struct{ o Options }

// New returns a Service over o.
func New(o Options) *Service { return &Service{o: o} }

// Guest is what a live sandbox is given, held in host memory (the
// engine's box holds one): the variables every exec gets and what the
// credentials proxy needs. The zero value is a sandbox given nothing yet.
type Guest struct {
	// env: the pinned environment's variables (secrets as placeholders)
	// and the create request's own env.
	env map[string]string
	// creds is an atomic, so the proxy never waits on the engine's locks
	// (the agent's is held during a slow redial).
	creds atomic.Pointer[credproxy.Sandbox]
}

// Env is what every exec of the sandbox gets (the caller must not change
// it).
func (g *Guest) Env() map[string]string { return g.env }

// Credentials is what the credentials proxy needs for the sandbox, or nil.
func (g *Guest) Credentials() *credproxy.Sandbox { return g.creds.Load() }

// Close drops the sandbox's credentials (destroy), and the proxy's idle
// upstream connections for them.
func (g *Guest) Close() {
	if sb := g.creds.Swap(nil); sb != nil {
		sb.Close()
	}
}

// Sandbox is one sandbox as the service's calls take it.
type Sandbox struct {
	// Rec is its record: the service writes what it pins and makes into
	// it, and stores it.
	Rec *store.Sandbox
	// Key is its data key; nil: none (its env is sealed by the secret
	// store's master key alone).
	Key []byte
	// Guest is what it is given, in host memory.
	Guest *Guest
}

const envName = "env"

// envVersionKey keeps the pinned version number in the record's Extra.
const envVersionKey = "environment_version"

// Pin puts the request's environment on a new record, in the create's
// transaction: the version (latest unless named), a placeholder per
// secret, and the third-party check.
func (s *Service) Pin(ctx context.Context, tx env.Tx, req *sandbox.CreateRequest, proj *store.Project, rec *store.Sandbox) error {
	rec.ThirdParty = req.ThirdParty || proj.ThirdPartyDefault
	if req.Environment == "" {
		return nil
	}
	if req.NoEnv {
		return sandbox.Errorf(sandbox.ErrInvalid, "environment", "no_env and environment exclude each other")
	}
	en, v, err := s.o.Environments.Pin(ctx, tx, proj, req.Environment, rec.ThirdParty)
	if err != nil {
		return err
	}
	rec.EnvironmentID, rec.Environment = en.ID, fmt.Sprintf("%s@%d", en.Name, v.Version)
	rec.SetExtra(envVersionKey, v.Version)
	rec.Placeholders = map[string]string{}
	for k, x := range v.Variables {
		if x.Secret {
			rec.Placeholders[k] = env.NewPlaceholder()
		}
	}
	return nil
}

// Version is the number of the version rec pinned (an error if it pinned
// none).
func Version(rec *store.Sandbox) (int, error) {
	var n int
	err := json.Unmarshal(rec.Extra[envVersionKey], &n)
	return n, err
}

// pinned returns the sandbox's pinned environment version, or nil.
func (s *Service) pinned(ctx context.Context, rec *store.Sandbox) (*store.EnvVersion, error) {
	if rec.EnvironmentID == "" {
		return nil, nil
	}
	n, err := Version(rec)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: no pinned version: %w", rec.ID, err)
	}
	v, err := s.o.Store.GetEnvVersion(ctx, rec.EnvironmentID, n)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: environment version: %w", rec.ID, err)
	}
	return v, nil
}

// delivery returns what the sandbox's pinned environment gives it, or
// nothing.
func (s *Service) delivery(ctx context.Context, rec *store.Sandbox) (env.Delivery, error) {
	v, err := s.pinned(ctx, rec)
	if err != nil || v == nil {
		return env.Delivery{}, err
	}
	return env.Deliver(v, rec.Placeholders), nil
}

// PrepareEnv seals a new sandbox's own env (the create request's, or a
// restored one's source's) and loads the variables every exec gets.
func (s *Service) PrepareEnv(ctx context.Context, sb Sandbox, vars map[string]string) error {
	if err := s.sealEnv(ctx, sb, vars); err != nil {
		return err
	}
	return s.LoadEnv(ctx, sb)
}

// sealEnv stores the create request's env for the sandbox, under its data
// key.
func (s *Service) sealEnv(ctx context.Context, sb Sandbox, vars map[string]string) error {
	if len(vars) == 0 {
		return nil
	}
	raw, err := json.Marshal(vars)
	if err != nil {
		return err
	}
	if raw, err = sandboxkeys.Seal(sb.Key, envName, raw); err != nil {
		return err
	}
	return s.o.Secrets.Put(ctx, sandboxkeys.Scope(sb.Rec.ID), envName, raw)
}

// OwnEnv is the sandbox's own env as it was sealed (JSON), opened with
// its data key key; nil if it has none.
func (s *Service) OwnEnv(ctx context.Context, sandboxID string, key []byte) ([]byte, error) {
	raw, err := s.o.Secrets.Get(ctx, sandboxkeys.Scope(sandboxID), envName)
	if errors.Is(err, secrets.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return sandboxkeys.Open(key, envName, raw)
}

// Erase removes the sandbox's sealed env and CA key.
func (s *Service) Erase(ctx context.Context, sandboxID string) error {
	for _, name := range []string{envName, caKeyName} {
		if err := s.o.Secrets.Delete(ctx, sandboxkeys.Scope(sandboxID), name); err != nil && !errors.Is(err, secrets.ErrNotFound) {
			return err
		}
	}
	return nil
}

// LoadEnv computes the variables every exec of the sandbox gets: its
// environment's (secrets as placeholders), then its own create-time env.
// A record from before sealing keeps its env in plain text: it is sealed
// now and dropped from the record.
func (s *Service) LoadEnv(ctx context.Context, sb Sandbox) error {
	d, err := s.delivery(ctx, sb.Rec)
	if err != nil {
		return err
	}
	vars := d.Vars
	if vars == nil {
		vars = map[string]string{}
	}
	own := sb.Rec.Env
	if len(own) > 0 {
		if err := s.sealEnv(ctx, sb, own); err != nil {
			return err
		}
		sb.Rec.Env = nil
		if err := s.o.Store.PutSandbox(ctx, sb.Rec); err != nil {
			return err
		}
	} else if raw, err := s.o.Secrets.Get(ctx, sandboxkeys.Scope(sb.Rec.ID), envName); err == nil {
		if raw, err = sandboxkeys.Open(sb.Key, envName, raw); err != nil {
			return fmt.Errorf("sandbox %s: sealed env: %w", sb.Rec.ID, err)
		}
		if err := json.Unmarshal(raw, &own); err != nil {
			return fmt.Errorf("sandbox %s: sealed env: %w", sb.Rec.ID, err)
		}
	} else if !errors.Is(err, secrets.ErrNotFound) {
		return err
	}
	for k, v := range own {
		vars[k] = v
	}
	sb.Guest.env = vars
	return nil
}

// Deliver gives a booted guest what every boot gives it: its pinned
// environment's files, then its CA.
func (s *Service) Deliver(ctx context.Context, sb Sandbox, a Agent) error {
	if err := s.deliverFiles(ctx, sb, a); err != nil {
		return err
	}
	return installCA(ctx, sb.Guest, a)
}

// deliverFiles writes the pinned environment's files into a booted guest.
func (s *Service) deliverFiles(ctx context.Context, sb Sandbox, a Agent) error {
	d, err := s.delivery(ctx, sb.Rec)
	if err != nil {
		return err
	}
	for _, f := range d.Files {
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		if _, err := a.WriteFile(ctx, f.Path, strings.NewReader(f.Content), agentclient.WriteOptions{Mode: mode, Owner: f.Owner, MakeParents: true}); err != nil {
			return fmt.Errorf("environment file %s: %w", f.Path, err)
		}
	}
	return nil
}
