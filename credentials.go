package harebox

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
	// systemBundle is the guest's own trust store, kept in the bundle.
	systemBundle = "/etc/ssl/certs/ca-certificates.crt"
	// maxBundle bounds what is read of the guest's trust store.
	maxBundle = 4 << 20
)

// credentialsOf is the network's view of a sandbox's credentials.
func (e *Engine) credentialsOf(id string) *credproxy.Sandbox {
	if b := e.live(id); b != nil {
		return b.creds.Load()
	}
	return nil
}

// makeCA gives a new sandbox its CA when its environment has credential
// rules.
func (e *Engine) makeCA(ctx context.Context, b *box) error {
	v, err := e.pinned(ctx, b.rec)
	if err != nil || v == nil || len(v.Credentials) == 0 {
		return err
	}
	cert, key, err := credproxy.NewCA("HareBox sandbox " + b.rec.ID)
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := e.sec.Put(ctx, sandboxScope(b.rec.ID), caKeyName, der); err != nil {
		return err
	}
	b.rec.Extra = withExtra(b.rec.Extra, caCertKey, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})))
	return e.store.PutSandbox(ctx, b.rec)
}

// loadCredentials builds what the credential proxy needs for the sandbox
// (its CA, and each rule with its placeholder and value, in host memory
// only) and the variables that point the guest's TLS clients at the CA.
func (e *Engine) loadCredentials(ctx context.Context, b *box) error {
	raw, ok := b.rec.Extra[caCertKey]
	if !ok {
		return nil
	}
	var certPEM string
	if err := json.Unmarshal(raw, &certPEM); err != nil {
		return err
	}
	blk, _ := pem.Decode([]byte(certPEM))
	if blk == nil {
		return fmt.Errorf("sandbox %s: bad CA certificate", b.rec.ID)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return err
	}
	der, err := e.sec.Get(ctx, sandboxScope(b.rec.ID), caKeyName)
	if err != nil {
		return fmt.Errorf("sandbox %s: CA key: %w", b.rec.ID, err)
	}
	key, err := x509.ParseECPrivateKey(der)
	if err != nil {
		return err
	}
	v, err := e.pinned(ctx, b.rec)
	if err != nil || v == nil {
		return err
	}
	sb := &credproxy.Sandbox{CA: cert, CAKey: key}
	account, id := b.rec.AccountID, b.rec.ID
	sb.OnMisuse = func(host string) { e.audit.RecordPlaceholder(account, id, host) }
	for _, c := range v.Credentials {
		value, err := e.envs.Reveal(ctx, b.rec.EnvironmentID, v.Variables[c.Secret].SecretRef)
		if err != nil {
			return fmt.Errorf("sandbox %s: secret %s: %w", b.rec.ID, c.Secret, err)
		}
		r := credproxy.Rule{Hosts: c.Hosts, Header: c.Header, Format: c.Format, AllowHTTP: c.AllowHTTP,
			Placeholder: b.rec.Placeholders[c.Secret], Value: value}
		if c.Ports != "" {
			r.Ports, _ = firewall.ParsePorts(c.Ports)
		}
		sb.Rules = append(sb.Rules, r)
	}
	b.creds.Store(sb)
	if b.env == nil {
		b.env = map[string]string{}
	}
	for _, k := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"} {
		b.env[k] = bundlePath
	}
	b.env["NODE_EXTRA_CA_CERTS"] = caPath
	return nil
}

// installCA puts the sandbox's CA certificate in the guest: on its own,
// and appended to a copy of the guest's trust store that the variables
// loadCredentials set point at.
func (e *Engine) installCA(ctx context.Context, b *box, c *agentclient.Client) error {
	sb := b.creds.Load()
	if sb == nil {
		return nil
	}
	caPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: sb.CA.Raw}))
	var system strings.Builder
	if fi, err := c.Stat(ctx, systemBundle); err == nil && fi.Type == "file" && fi.Size <= maxBundle {
		if _, err := c.ReadFile(ctx, systemBundle, &system, 0, maxBundle); err != nil {
			system.Reset()
		}
	}
	for path, content := range map[string]string{caPath: caPEM, bundlePath: system.String() + "\n" + caPEM} {
		if _, err := c.WriteFile(ctx, path, io.Reader(strings.NewReader(content)), agentclient.WriteOptions{Mode: 0o644, Owner: "root", MakeParents: true}); err != nil {
			return fmt.Errorf("CA %s: %w", path, agentErr(err))
		}
	}
	return nil
}
