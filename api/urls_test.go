package api_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/harebox/harebox/api"
)

// TestURLCA: a project's URL CA over REST: made, shown, issued from (the
// key only in that response), listed, revoked, checked on bad input, and
// in the way of the project's delete until it is deleted itself; a
// restart keeps it and its key.
func TestURLCA(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	f.must(t, 201, "POST", "/v1/projects", f.root, map[string]any{"name": "web"})
	f.must(t, 404, "GET", "/v1/url-ca?project=web", f.root, nil)
	f.must(t, 404, "POST", "/v1/url-ca/certs?project=web", f.root, map[string]any{"name": "alice"})
	ca := f.must(t, 200, "PUT", "/v1/url-ca?project=web", f.root, map[string]any{})
	if ca.body["uploaded"] != false || !strings.Contains(str(ca, "certificate"), "BEGIN CERTIFICATE") || !strings.HasPrefix(str(ca, "project_id"), "prj_") {
		t.Fatalf("made: %s", ca.raw)
	}
	if got := f.must(t, 200, "GET", "/v1/url-ca?project=web", f.root, nil); str(got, "certificate") != str(ca, "certificate") {
		t.Errorf("get: %s", got.raw)
	}
	for _, bad := range []struct {
		method, path string
		body         any
	}{
		{"PUT", "/v1/url-ca?project=web", map[string]any{"certificate": "junk"}},
		{"PUT", "/v1/url-ca?project=web", map[string]any{"certificate": 1}},
		{"POST", "/v1/url-ca/certs?project=web", map[string]any{}},
		{"POST", "/v1/url-ca/certs?project=web", map[string]any{"name": "a", "ttl": "forever"}},
		{"POST", "/v1/url-ca/certs?project=web", map[string]any{"name": "a", "extra": 1}},
		{"POST", "/v1/url-ca/certs/zz/revoke?project=web", nil},
	} {
		if r := f.do(t, bad.method, bad.path, f.root, bad.body); r.status != 400 {
			t.Errorf("%s %s %v: %d %s", bad.method, bad.path, bad.body, r.status, r.raw)
		}
	}

	c := f.must(t, 201, "POST", "/v1/url-ca/certs?project=web", f.root, map[string]any{"name": "alice", "ttl": "24h"})
	if c.header.Get("Cache-Control") != "no-store" {
		t.Errorf("issued without Cache-Control: no-store")
	}
	kp, err := tls.X509KeyPair([]byte(str(c, "certificate")), []byte(str(c, "private_key")))
	if err != nil {
		t.Fatalf("issued: %v (%s)", err, c.raw)
	}
	leaf, _ := x509.ParseCertificate(kp.Certificate[0])
	blk, _ := pem.Decode([]byte(str(ca, "certificate")))
	root, _ := x509.ParseCertificate(blk.Bytes)
	roots := x509.NewCertPool()
	roots.AddCert(root)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil || leaf.Subject.CommonName != "alice" {
		t.Errorf("the certificate does not chain to the CA for client auth: %v", err)
	}
	serial := str(c, "serial")
	list := f.must(t, 200, "GET", "/v1/url-ca/certs?project=web", f.root, nil)
	if strings.Contains(string(list.raw), "PRIVATE KEY") || strings.Contains(string(list.raw), "BEGIN CERTIFICATE") || !strings.Contains(string(list.raw), serial) {
		t.Errorf("list: %s", list.raw)
	}
	rev := f.must(t, 200, "POST", "/v1/url-ca/certs/"+strings.ToUpper(serial)+"/revoke?project=web", f.root, nil)
	if str(rev, "revoked_at") == "" || str(rev, "serial") != serial {
		t.Errorf("revoke: %s", rev.raw)
	}

	// The CA is kept across a restart, and can still issue (its key is
	// in the secret store).
	f.eng.Close()
	f.open(t, api.Options{})
	if got := f.must(t, 200, "GET", "/v1/url-ca?project=web", f.root, nil); str(got, "certificate") != str(ca, "certificate") {
		t.Errorf("after a restart: %s", got.raw)
	}
	f.must(t, 201, "POST", "/v1/url-ca/certs?project=web", f.root, map[string]any{"name": "bob"})
	if l := f.must(t, 200, "GET", "/v1/url-ca/certs?project=web", f.root, nil); len(l.body["certs"].([]any)) != 2 {
		t.Errorf("certs after a restart: %s", l.raw)
	}

	if r := f.do(t, "DELETE", "/v1/projects/web", f.root, nil); r.status != 409 || !strings.Contains(string(r.raw), "URL CA") {
		t.Errorf("delete a project with a URL CA: %d %s", r.status, r.raw)
	}
	f.must(t, 204, "DELETE", "/v1/url-ca?project=web", f.root, nil)
	f.must(t, 404, "GET", "/v1/url-ca?project=web", f.root, nil)
	f.must(t, 204, "DELETE", "/v1/projects/web", f.root, nil)

	// Every change is in the audit log.
	a := f.must(t, 200, "GET", "/v1/audit?limit=1000", f.root, nil)
	for _, op := range []string{"setURLCA", "issueClientCert", "revokeClientCert", "deleteURLCA"} {
		if !strings.Contains(string(a.raw), `"action":"`+op+`"`) {
			t.Errorf("no %s in the audit log", op)
		}
	}
}
