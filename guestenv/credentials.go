package guestenv

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"strings"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/firewall/credproxy"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"google.golang.org/grpc/codes"
)

// A sandbox whose environment has credential rules gets its own CA: the
// key is sealed under the sandbox's scope (erased with it) and used only by
// the host's credential proxy; the certificate is installed in the guest,
// which trusts it for the hosts the rules name.
const (
	caKeyName  = "ca-key"
	caCertKey  = "ca_cert" // in the record's Extra, PEM
	caPath     = "/etc/harebox/ca.pem"
	bundlePath = "/etc/harebox/ca-bundle.pem"
	// systemBundle is the guest's own trust store (Debian's and Ubuntu's
	// OpenSSL, Go and pip read it): the CA is added to it, after caMarker,
	// and to localCA, so the guest's own update-ca-certificates keeps it.
	systemBundle = "/etc/ssl/certs/ca-certificates.crt"
	localCA      = "/usr/local/share/ca-certificates/harebox-sandbox.crt"
	caMarker     = "# HareBox sandbox CA (the host's credentials proxy)"
	// maxBundle bounds what is read of the guest's trust store.
	maxBundle = 4 << 20
)

// Credentials is the network's view of a sandbox's credentials: what the
// credentials proxy needs for live sandbox id, or nil.
func (s *Service) Credentials(id string) *credproxy.Sandbox {
	if g := s.o.Sandboxes.Guest(id); g != nil {
		return g.Credentials()
	}
	return nil
}

// PrepareCredentials makes a new sandbox's CA and loads its credential
// rules for the proxy.
func (s *Service) PrepareCredentials(ctx context.Context, sb Sandbox) error {
	if err := s.makeCA(ctx, sb); err != nil {
		return err
	}
	return s.LoadCredentials(ctx, sb)
}

// makeCA gives a new sandbox its CA when its environment has credential
// rules.
func (s *Service) makeCA(ctx context.Context, sb Sandbox) error {
	v, err := s.pinned(ctx, sb.Rec)
	if err != nil || v == nil || len(v.Credentials) == 0 {
		return err
	}
	cert, key, err := credproxy.NewCA("HareBox sandbox " + sb.Rec.ID)
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := s.o.Secrets.Put(ctx, sandboxkeys.Scope(sb.Rec.ID), caKeyName, der); err != nil {
		return err
	}
	sb.Rec.SetExtra(caCertKey, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})))
	return s.o.Store.PutSandbox(ctx, sb.Rec)
}

// LoadCredentials builds what the credential proxy needs for the sandbox
// (its CA, and each rule with its placeholder and value, in host memory
// only) and the variables that point the guest's TLS clients at the CA.
// It runs after LoadEnv, whose variables it adds to.
func (s *Service) LoadCredentials(ctx context.Context, sb Sandbox) error {
	rec, g := sb.Rec, sb.Guest
	raw, ok := rec.Extra[caCertKey]
	if !ok {
		return nil
	}
	var certPEM string
	if err := json.Unmarshal(raw, &certPEM); err != nil {
		return err
	}
	blk, _ := pem.Decode([]byte(certPEM))
	if blk == nil {
		return fmt.Errorf("sandbox %s: bad CA certificate", rec.ID)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return err
	}
	der, err := s.o.Secrets.Get(ctx, sandboxkeys.Scope(rec.ID), caKeyName)
	if err != nil {
		return fmt.Errorf("sandbox %s: CA key: %w", rec.ID, err)
	}
	key, err := x509.ParseECPrivateKey(der)
	if err != nil {
		return err
	}
	v, err := s.pinned(ctx, rec)
	if err != nil || v == nil {
		return err
	}
	cs := &credproxy.Sandbox{CA: cert, CAKey: key}
	account, id := rec.AccountID, rec.ID
	cs.OnMisuse = func(host string) { s.o.Audit.RecordPlaceholder(account, id, host) }
	cs.OnRefused = func(host, _ string) { s.o.Audit.RecordRefusedAnswer(account, id, host) } // (the proxy logs why)
	for _, c := range v.Credentials {
		value, err := s.o.Environments.Reveal(ctx, rec.EnvironmentID, v.Variables[c.Secret].SecretRef)
		if err != nil {
			return fmt.Errorf("sandbox %s: secret %s: %w", rec.ID, c.Secret, err)
		}
		r := credproxy.Rule{Hosts: c.Hosts, Header: c.Header, Format: c.Format, AllowHTTP: c.AllowHTTP,
			Placeholder: rec.Placeholders[c.Secret], Value: value}
		if c.Ports != "" {
			r.Ports, _ = firewall.ParsePorts(c.Ports)
		}
		cs.Rules = append(cs.Rules, r)
	}
	g.creds.Store(cs)
	if g.env == nil {
		g.env = map[string]string{}
	}
	for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"} {
		g.env[k] = bundlePath
	}
	g.env["NODE_EXTRA_CA_CERTS"] = caPath
	return nil
}

// installCA puts the sandbox's CA certificate in the guest: on its own,
// in the guest's trust store (replacing a CA installed before, a fork's
// source's), and in a copy of that store the variables LoadCredentials
// sets point at. A trust store that exists but cannot be read whole is
// left alone.
func installCA(ctx context.Context, g *Guest, a Agent) error {
	sb := g.creds.Load()
	if sb == nil {
		return nil
	}
	caPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: sb.CA.Raw}))
	files := map[string]string{caPath: caPEM, localCA: caPEM}
	var system strings.Builder
	fi, err := a.Stat(ctx, systemBundle)
	readable := agentclient.Code(err) == codes.NotFound // none: the CA is the whole store
	if err == nil && fi.Type == "file" && fi.Size <= maxBundle {
		_, err = a.ReadFile(ctx, systemBundle, &system, 0, maxBundle)
		readable = err == nil
	}
	if !readable {
		system.Reset()
	}
	bundle := withoutSandboxCA(system.String()) + caMarker + "\n" + caPEM
	files[bundlePath] = bundle
	if readable {
		files[systemBundle] = bundle
	}
	for path, content := range files {
		if _, err := a.WriteFile(ctx, path, io.Reader(strings.NewReader(content)), agentclient.WriteOptions{Mode: 0o644, Owner: "root", MakeParents: true}); err != nil {
			return fmt.Errorf("CA %s: %w", path, err)
		}
	}
	return nil
}

// withoutSandboxCA returns a trust store without the certificate after
// each caMarker line, ending in a newline unless empty.
func withoutSandboxCA(store string) string {
	var out strings.Builder
	skipping := false
	for _, line := range strings.SplitAfter(store, "\n") {
		switch {
		case strings.TrimSpace(line) == caMarker:
			skipping = true
		case skipping:
			if strings.TrimSpace(line) == "-----END CERTIFICATE-----" {
				skipping = false
			}
		default:
			out.WriteString(line)
		}
	}
	s := out.String()
	if s != "" && !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	return s
}
