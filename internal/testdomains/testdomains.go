// Package testdomains sets up, for a domain package's tests, the real
// parts the engine gives a domain: a SQLite store, the sealed secret
// store and the audit log in a temporary directory short enough for
// socket paths, with the default account; and a guest's agent on the
// in-memory hypervisor.
package testdomains

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
)

// Parts are a domain's real parts; New closes them when the test ends.
type Parts struct {
	Dir     string
	Store   *store.DB
	Secrets *secrets.Sealed
	Audit   *audit.Log
	Tenants *tenant.Service
	// Account is the default account.
	Account *store.Account
}

// New opens the parts in a new directory.
func New(t testing.TB) *Parts {
	t.Helper()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "hbt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := &Parts{Dir: dir}
	if p.Store, err = store.OpenSQLite(ctx, filepath.Join(dir, "harebox.db")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Store.Close() })
	if p.Secrets, err = secrets.NewSealed(p.Store, filepath.Join(dir, "master.key")); err != nil {
		t.Fatal(err)
	}
	if p.Audit, err = audit.Open(ctx, p.Store, audit.Options{KeyFile: filepath.Join(dir, "audit.key")}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Audit.Close(ctx) })
	p.Tenants = tenant.New(p.Store)
	if p.Account, err = p.Tenants.EnsureDefault(ctx); err != nil {
		t.Fatal(err)
	}
	return p
}

// Agent boots a machine on the in-memory hypervisor, in dir, and returns
// its agent; both go when the test ends.
func Agent(t testing.TB, dir string) *agentclient.Client {
	t.Helper()
	ctx := context.Background()
	hv := memhv.New(memhv.Options{})
	img := memhv.Image(dir)
	m, err := hv.Launch(ctx, hypervisor.Spec{ID: "g", VCPUs: 1, MemoryMB: 128, Kernel: img.Kernel, Initrd: img.Initrd, StateDir: filepath.Join(dir, "g")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Kill(ctx); m.Cleanup(ctx); hv.Close() })
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, _, err := agentclient.DialReady(dctx, m.AgentEndpoint(), agentclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Sandbox is the engine's authorization of calls on one sandbox, as a
// domain's service sees it (its Check and AccountOf): any other sandbox
// is not found and has no account.
type Sandbox struct{ ID, Account string }

func (s Sandbox) Check(_ context.Context, _, id string) error {
	if id != s.ID {
		return sandbox.Errorf(sandbox.ErrNotFound, "", "no sandbox %q", id)
	}
	return nil
}

func (s Sandbox) AccountOf(_ context.Context, id string) string {
	if id == s.ID {
		return s.Account
	}
	return ""
}
