package guestenv_test

import (
	"context"
	"crypto/rand"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/env"
	"github.com/harebox/harebox/guestenv"
	"github.com/harebox/harebox/internal/testdomains"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
)

// live is the engine's table of live sandboxes, as the credentials lookup
// sees it.
type live map[string]*guestenv.Guest

func (l live) Guest(id string) *guestenv.Guest { return l[id] }

const (
	secret = "sk-live-guestenv-canary-7d1e"
	marker = "# HareBox sandbox CA (the host's credentials proxy)"
)

// TestLifecycle gives a sandbox its environment and credentials as the
// engine does, over the real store, secret store, environments and a
// memhv guest's agent: pinned at create, delivered after the boot (a CA
// installed before, a fork's source's, replaced in the guest's trust
// store), loaded again as after a restart, and erased.
func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	parts := testdomains.New(t)
	dir, db, sec, al, tenants, acc := parts.Dir, parts.Store, parts.Secrets, parts.Audit, parts.Tenants, parts.Account
	envs := env.New(db, tenants, sec)
	if _, err := envs.Create(ctx, "", env.CreateRequest{Name: "api",
		Variables:   map[string]env.Var{"MODE": {Value: "prod"}, "TOKEN": {Value: secret, Secret: true}},
		Files:       []store.EnvFile{{Path: "/etc/app/app.conf", Template: true, Content: "token={{TOKEN}}\n", Mode: 0o600}},
		Credentials: []store.CredentialRule{{Secret: "TOKEN", Hosts: []string{"api.example.test"}, Ports: "443"}},
	}); err != nil {
		t.Fatal(err)
	}
	sandboxes := live{}
	s := guestenv.New(guestenv.Options{Store: db, Secrets: sec, Environments: envs, Audit: al, Sandboxes: sandboxes})

	// Create: pinned in the create's transaction, then prepared.
	rec := &store.Sandbox{Sandbox: sandbox.Sandbox{ID: sandbox.NewID(), AccountID: acc.ID, State: sandbox.StateCreating, CreatedAt: time.Now()}}
	if err := db.Update(ctx, func(tx store.Tx) error {
		_, proj, err := tenants.ProjectIn(ctx, tx, acc.ID, "")
		if err != nil {
			return err
		}
		rec.ProjectID = proj.ID
		if err := s.Pin(ctx, tx, &sandbox.CreateRequest{Environment: "api"}, proj, rec); err != nil {
			return err
		}
		return tx.PutSandbox(ctx, rec)
	}); err != nil {
		t.Fatal(err)
	}
	if rec.Environment != "api@1" {
		t.Fatalf("pinned %q", rec.Environment)
	}
	if v, err := guestenv.Version(rec); err != nil || v != 1 {
		t.Fatalf("pinned version %d, %v", v, err)
	}
	key := make([]byte, secrets.DataKeySize)
	rand.Read(key)
	g := &guestenv.Guest{}
	sb := guestenv.Sandbox{Rec: rec, Key: key, Guest: g}
	sandboxes[rec.ID] = g
	if err := s.PrepareEnv(ctx, sb, map[string]string{"OWN": "mine"}); err != nil {
		t.Fatal(err)
	}
	if err := s.PrepareCredentials(ctx, sb); err != nil {
		t.Fatal(err)
	}
	ph := g.Env()["TOKEN"]
	if !strings.HasPrefix(ph, env.PlaceholderPrefix) || g.Env()["MODE"] != "prod" || g.Env()["OWN"] != "mine" ||
		g.Env()["SSL_CERT_FILE"] != "/etc/harebox/ca-bundle.pem" || g.Env()["NODE_EXTRA_CA_CERTS"] != "/etc/harebox/ca.pem" {
		t.Fatalf("what every exec gets: %v", g.Env())
	}
	creds := s.Credentials(rec.ID)
	if creds == nil || len(creds.Rules) != 1 || creds.Rules[0].Placeholder != ph || creds.Rules[0].Value != secret {
		t.Fatalf("the proxy's view: %+v", creds)
	}
	if s.Credentials(sandbox.NewID()) != nil {
		t.Fatal("credentials for a sandbox that is not live")
	}
	// The own env is sealed under the data key, never in the record.
	if raw, err := sec.Get(ctx, sandboxkeys.Scope(rec.ID), "env"); err != nil || strings.Contains(string(raw), "mine") {
		t.Fatalf("the sealed env: %q, %v", raw, err)
	}
	if own, err := s.OwnEnv(ctx, rec.ID, key); err != nil || string(own) != `{"OWN":"mine"}` {
		t.Fatalf("own env: %s, %v", own, err)
	}

	// Boot: the guest already trusts another CA and a sandbox CA of before.
	c := testdomains.Agent(t, dir)
	const system = "/etc/ssl/certs/ca-certificates.crt"
	before := "OTHER CA\n" + marker + "\n-----BEGIN CERTIFICATE-----\nold\n-----END CERTIFICATE-----\n"
	if _, err := c.WriteFile(ctx, system, strings.NewReader(before), agentclient.WriteOptions{Owner: "root", MakeParents: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.Deliver(ctx, sb, c); err != nil {
		t.Fatal(err)
	}
	caPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: creds.CA.Raw}))
	for path, want := range map[string]string{
		"/etc/app/app.conf":          "token=" + ph + "\n",
		"/etc/harebox/ca.pem":        caPEM,
		system:                       "OTHER CA\n" + marker + "\n" + caPEM,
		"/etc/harebox/ca-bundle.pem": "OTHER CA\n" + marker + "\n" + caPEM,
	} {
		var got strings.Builder
		if _, err := c.ReadFile(ctx, path, &got, 0, 1<<20); err != nil || got.String() != want {
			t.Errorf("%s: %q, %v; want %q", path, got.String(), err, want)
		}
	}

	// After a restart: the same, from the store and the secret store.
	stored, err := db.GetSandbox(ctx, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	g2 := &guestenv.Guest{}
	again := guestenv.Sandbox{Rec: stored, Key: key, Guest: g2}
	if err := s.LoadEnv(ctx, again); err != nil {
		t.Fatal(err)
	}
	if err := s.LoadCredentials(ctx, again); err != nil {
		t.Fatal(err)
	}
	if len(g2.Env()) != len(g.Env()) || g2.Env()["TOKEN"] != ph || g2.Env()["OWN"] != "mine" ||
		g2.Credentials() == nil || !g2.Credentials().CA.Equal(creds.CA) {
		t.Fatalf("loaded again: %v, %+v", g2.Env(), g2.Credentials())
	}

	// Delete: the proxy forgets it, and its sealed env and CA key go.
	g.Close()
	if g.Credentials() != nil {
		t.Fatal("credentials after Close")
	}
	if err := s.Erase(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	if own, err := s.OwnEnv(ctx, rec.ID, key); err != nil || own != nil {
		t.Fatalf("own env after erase: %q, %v", own, err)
	}
	if err := s.LoadCredentials(ctx, guestenv.Sandbox{Rec: stored, Key: key, Guest: &guestenv.Guest{}}); err == nil {
		t.Fatal("credentials loaded after their CA key was erased")
	}
	if err := s.Erase(ctx, rec.ID); err != nil {
		t.Fatal("erase again:", err)
	}
}
