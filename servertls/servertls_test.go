package servertls

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestSelfSigned(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	certFile, keyFile, created, err := SelfSigned(dir, []string{"0.0.0.0", "10.9.8.7", "api.example.test"})
	if err != nil || !created {
		t.Fatalf("first start: %v created=%v", err, created)
	}
	src, err := Load(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf := src.Leaf()
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	for _, name := range []string{"localhost", "127.0.0.1", "::1", "10.9.8.7", "api.example.test"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "other.example.test"}); err == nil {
		t.Error("valid for a name it was not made for")
	}
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v %v", fi.Mode(), err)
	}
	fp, _ := os.ReadFile(filepath.Join(dir, FingerprintFile))
	if strings.TrimSpace(string(fp)) != Fingerprint(leaf.Raw) || len(fp) != len("sha256:")+64+1 {
		t.Errorf("fingerprint file %q, want %s", fp, Fingerprint(leaf.Raw))
	}
	// The next start keeps it: pinned clients go on working.
	if _, _, created, err := SelfSigned(dir, nil); err != nil || created {
		t.Fatalf("second start: %v created=%v", err, created)
	}
	again, err := Load(certFile, keyFile, nil)
	if err != nil || !again.Leaf().Equal(leaf) {
		t.Fatalf("second start: a new certificate (%v)", err)
	}
}

// TestReloadUnderLoad: the files are replaced (the certificate first, the
// key a moment later, as a renewal tool may write them) while clients
// send requests over kept-alive and new connections. No request fails;
// new connections get the new certificate; a bad pair keeps the old one.
func TestReloadUnderLoad(t *testing.T) {
	dir := t.TempDir()
	caA, caB := newCA(t, "A"), newCA(t, "B")
	certFile, keyFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	caA.issue(t, certFile, keyFile)
	src, err := Load(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go src.Watch(ctx, 20*time.Millisecond)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }), TLSConfig: Config(src)}
	go hs.ServeTLS(l, "", "")
	defer hs.Close()
	url := "https://" + l.Addr().String() + "/"

	roots := x509.NewCertPool()
	roots.AddCert(caA.cert)
	roots.AddCert(caB.cert)
	client := func(keepAlive bool) *http.Client {
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: !keepAlive, ForceAttemptHTTP2: true}}
	}
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, keepAlive := range []bool{true, false} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := client(keepAlive)
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := c.Get(url)
				if err == nil {
					resp.Body.Close()
					if resp.ProtoMajor != 2 {
						err = &net.AddrError{Err: "not HTTP/2: " + resp.Proto}
					}
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				} else {
					ok.Add(1)
				}
			}
		}()
	}
	served := func() *x509.Certificate {
		conn, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0]
	}
	time.Sleep(200 * time.Millisecond)
	if served().Issuer.CommonName != "CA A" {
		t.Fatal("not serving the first certificate")
	}
	caB.issue(t, certFile, "")
	time.Sleep(100 * time.Millisecond) // (the certificate alone: no match yet)
	caB.issue(t, "", keyFile)
	deadline := time.Now().Add(5 * time.Second)
	for served().Issuer.CommonName != "CA B" {
		if time.Now().After(deadline) {
			t.Fatal("the new certificate was not served within 5 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	// A broken pair: the served certificate stays.
	os.WriteFile(keyFile, []byte("not a key"), 0o600)
	if err := src.Reload(); err == nil {
		t.Error("a broken key was loaded")
	}
	if served().Issuer.CommonName != "CA B" {
		t.Error("a broken pair replaced the certificate in use")
	}
	close(stop)
	wg.Wait()
	if failed.Load() != 0 || ok.Load() < 20 {
		t.Fatalf("%d requests failed (first: %v), %d succeeded", failed.Load(), firstErr.Load(), ok.Load())
	}
	t.Logf("%d requests during the reload, none failed", ok.Load())
}

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// next is the leaf issue writes, made on first use.
	next struct{ cert, key []byte }
}

func newCA(t *testing.T, name string) *testCA {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "CA " + name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key}
}

// issue writes a leaf for 127.0.0.1 signed by the CA: its certificate to
// certFile and its key to keyFile (either may be "", to write one now and
// the other later).
func (ca *testCA) issue(t *testing.T, certFile, keyFile string) {
	if ca.next.cert == nil {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "leaf"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
		if err != nil {
			t.Fatal(err)
		}
		kd, _ := x509.MarshalPKCS8PrivateKey(key)
		ca.next.cert = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		ca.next.key = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd})
	}
	if certFile != "" {
		if err := os.WriteFile(certFile, ca.next.cert, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if keyFile != "" {
		if err := os.WriteFile(keyFile, ca.next.key, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
