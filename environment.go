package harebox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/env"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// Environments manages environments, for the principal in the context.
func (e *Engine) Environments() *env.Service { return e.envs }

// The create request's own env is sealed in the secret store under the
// sandbox's scope, never in its record, and erased with the sandbox.
func sandboxScope(id string) string { return "sandbox/" + id }

const sandboxEnvName = "env"

// pinEnvironment puts the request's environment on a new record, in the
// create's transaction: the version (latest unless named), a placeholder
// per secret, and the third-party check.
func (e *Engine) pinEnvironment(ctx context.Context, tx store.Tx, req *sandbox.CreateRequest, proj *store.Project, rec *store.Sandbox) error {
	rec.ThirdParty = req.ThirdParty || proj.ThirdPartyDefault
	if req.Environment == "" {
		return nil
	}
	if req.NoEnv {
		return sandbox.Errorf(sandbox.ErrInvalid, "environment", "no_env and environment exclude each other")
	}
	en, v, err := e.envs.Pin(ctx, tx, proj, req.Environment, rec.ThirdParty)
	if err != nil {
		return err
	}
	rec.EnvironmentID, rec.Environment = en.ID, fmt.Sprintf("%s@%d", en.Name, v.Version)
	rec.Extra = withExtra(rec.Extra, envVersionKey, v.Version)
	rec.Placeholders = map[string]string{}
	for k, x := range v.Variables {
		if x.Secret {
			rec.Placeholders[k] = env.NewPlaceholder()
		}
	}
	return nil
}

// envVersionKey keeps the pinned version number in the record.
const envVersionKey = "environment_version"

func withExtra(m map[string]json.RawMessage, k string, v any) map[string]json.RawMessage {
	if m == nil {
		m = map[string]json.RawMessage{}
	}
	b, _ := json.Marshal(v)
	m[k] = b
	return m
}

// pinned returns the sandbox's pinned environment version, or nil.
func (e *Engine) pinned(ctx context.Context, rec *store.Sandbox) (*store.EnvVersion, error) {
	if rec.EnvironmentID == "" {
		return nil, nil
	}
	var n int
	if err := json.Unmarshal(rec.Extra[envVersionKey], &n); err != nil {
		return nil, fmt.Errorf("sandbox %s: no pinned version: %w", rec.ID, err)
	}
	v, err := e.store.GetEnvVersion(ctx, rec.EnvironmentID, n)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: environment version: %w", rec.ID, err)
	}
	return v, nil
}

// delivery returns what the sandbox's pinned environment gives it, or
// nothing.
func (e *Engine) delivery(ctx context.Context, rec *store.Sandbox) (env.Delivery, error) {
	v, err := e.pinned(ctx, rec)
	if err != nil || v == nil {
		return env.Delivery{}, err
	}
	return env.Deliver(v, rec.Placeholders), nil
}

// sealEnv stores the create request's env for the sandbox, under its data
// key.
func (e *Engine) sealEnv(ctx context.Context, b *box, vars map[string]string) error {
	if len(vars) == 0 {
		return nil
	}
	raw, err := json.Marshal(vars)
	if err != nil {
		return err
	}
	if raw, err = seal(b.key, sandboxEnvName, raw); err != nil {
		return err
	}
	return e.sec.Put(ctx, sandboxScope(b.rec.ID), sandboxEnvName, raw)
}

// eraseEnv removes the sandbox's sealed env and CA key.
func (e *Engine) eraseEnv(ctx context.Context, id string) error {
	for _, name := range []string{sandboxEnvName, caKeyName, consoleKeyName} {
		if err := e.sec.Delete(ctx, sandboxScope(id), name); err != nil && !errors.Is(err, secrets.ErrNotFound) {
			return err
		}
	}
	return nil
}

// loadEnv computes the variables every exec of the sandbox gets: its
// environment's (secrets as placeholders), then its own create-time env.
// A record from before sealing keeps its env in plain text: it is sealed
// now and dropped from the record.
func (e *Engine) loadEnv(ctx context.Context, b *box) error {
	d, err := e.delivery(ctx, b.rec)
	if err != nil {
		return err
	}
	vars := d.Vars
	if vars == nil {
		vars = map[string]string{}
	}
	own := b.rec.Env
	if len(own) > 0 {
		if err := e.sealEnv(ctx, b, own); err != nil {
			return err
		}
		b.rec.Env = nil
		if err := e.store.PutSandbox(ctx, b.rec); err != nil {
			return err
		}
	} else if raw, err := e.sec.Get(ctx, sandboxScope(b.rec.ID), sandboxEnvName); err == nil {
		if raw, err = open(b.key, sandboxEnvName, raw); err != nil {
			return fmt.Errorf("sandbox %s: sealed env: %w", b.rec.ID, err)
		}
		if err := json.Unmarshal(raw, &own); err != nil {
			return fmt.Errorf("sandbox %s: sealed env: %w", b.rec.ID, err)
		}
	} else if !errors.Is(err, secrets.ErrNotFound) {
		return err
	}
	for k, v := range own {
		vars[k] = v
	}
	b.env = vars
	return nil
}

// deliverFiles writes the pinned environment's files into a booted guest.
func (e *Engine) deliverFiles(ctx context.Context, b *box, c *agentclient.Client) error {
	d, err := e.delivery(ctx, b.rec)
	if err != nil {
		return err
	}
	for _, f := range d.Files {
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		if _, err := c.WriteFile(ctx, f.Path, strings.NewReader(f.Content), agentclient.WriteOptions{Mode: mode, Owner: f.Owner, MakeParents: true}); err != nil {
			return fmt.Errorf("environment file %s: %w", f.Path, agentErr(err))
		}
	}
	return nil
}
