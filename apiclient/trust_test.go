package apiclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestTrust(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"status":"ok"}`)
	}))
	srv.EnableHTTP2 = true
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // (the refused handshakes)
	srv.StartTLS()
	defer srv.Close()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644)
	// Another self-signed certificate for the same names.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	otherDER, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	otherFile := filepath.Join(dir, "other.pem")
	os.WriteFile(otherFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: otherDER}), 0o644)
	sum := sha256.Sum256(srv.Certificate().Raw)
	pin := fmt.Sprintf("sha256:%x", sum)
	var colons []string
	for _, b := range sum {
		colons = append(colons, fmt.Sprintf("%02X", b))
	}
	wrong := sha256.Sum256([]byte("another certificate"))

	get := func(o Options) error {
		o.URL = srv.URL
		c, err := Open(o)
		if err != nil {
			return err
		}
		return c.Do(context.Background(), "GET", "/health", nil, nil, nil)
	}
	t.Setenv("HAREBOX_CA", "")
	for name, ca := range map[string]string{"CA file": caFile, "pin": pin, "pin with colons, upper case": "sha256:" + strings.Join(colons, ":")} {
		if err := get(Options{CA: ca}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, c := range map[string]struct{ ca, want string }{
		"system roots": {"", "certificate"},
		"another CA":   {otherFile, "certificate"},
		"another pin":  {fmt.Sprintf("sha256:%x", wrong), "not the one HAREBOX_CA pins"},
	} {
		if err := get(Options{CA: c.ca}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
	// Bad values are refused before any request.
	for _, ca := range []string{filepath.Join(dir, "missing.pem"), filepath.Join(dir, "ca.pem") + "x", "sha256:abcd", "sha256:" + strings.Repeat("zz", 32)} {
		if _, err := Open(Options{URL: srv.URL, CA: ca}); err == nil || !strings.Contains(err.Error(), "HAREBOX_CA") {
			t.Errorf("%s: %v", ca, err)
		}
	}
	os.WriteFile(filepath.Join(dir, "empty.pem"), []byte("no certificate here"), 0o644)
	if _, err := Open(Options{URL: srv.URL, CA: filepath.Join(dir, "empty.pem")}); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("a file without a certificate: %v", err)
	}
	// The environment, and the option over it.
	t.Setenv("HAREBOX_CA", pin)
	if err := get(Options{}); err != nil {
		t.Errorf("HAREBOX_CA from the environment: %v", err)
	}
	if err := get(Options{CA: otherFile}); err == nil {
		t.Error("the option did not override the environment")
	}
	// Whatever the case of the scheme, https is verified as asked.
	if _, err := Open(Options{URL: "HTTPS://127.0.0.1:1", CA: "sha256:bad"}); err == nil {
		t.Error("HTTPS:// in capitals skipped HAREBOX_CA")
	}
	// Plain HTTP ignores it.
	t.Setenv("HAREBOX_CA", "sha256:bad")
	if _, err := Open(Options{URL: "http://127.0.0.1:1"}); err != nil {
		t.Errorf("http URL: %v", err)
	}
}
