package ingress

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// mtlsClient talks to the fixture's ingress with cert (none: nil), by the
// URL's real host name (so its TLS handshake names it), over HTTP/2 or
// HTTP/1.1. asked reports whether a handshake asked for a certificate.
func (f *fixture) mtlsClient(cert *tls.Certificate, h2 bool, asked *bool) *http.Client {
	tc := &tls.Config{RootCAs: f.tls.RootCAs, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		if asked != nil {
			*asked = true
		}
		if cert == nil {
			return &tls.Certificate{}, nil
		}
		return cert, nil
	}}
	addr := strings.TrimPrefix(f.base, "https://")
	tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: h2,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tr}
}

// status sends GET path to u's host form with c: the status, or 0 when
// the request failed (the handshake, say).
func status(t *testing.T, c *http.Client, u *sandbox.URL, path string) int {
	t.Helper()
	resp, err := c.Get(strings.TrimSuffix(u.URL, "/") + path)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func keyPair(t *testing.T, c *sandbox.ClientCert) *tls.Certificate {
	t.Helper()
	kp, err := tls.X509KeyPair([]byte(c.Certificate), []byte(c.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	return &kp
}

// ownCA is a CA a user keeps, and a client certificate it signs.
func ownCA(t *testing.T) (caPEM string, sign func(name string) (*tls.Certificate, string)) {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "user CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	serial := int64(1000)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})), func(name string) (*tls.Certificate, string) {
		serial++
		ck, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		ct := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
		cd, err := x509.CreateCertificate(rand.Reader, ct, ca, &ck.PublicKey, k)
		if err != nil {
			t.Fatal(err)
		}
		return &tls.Certificate{Certificate: [][]byte{cd}, PrivateKey: ck}, big.NewInt(serial).Text(16)
	}
}

// openStream opens an event stream on u with c and reports when it ends.
func openStream(t *testing.T, c *http.Client, u *sandbox.URL) (ended chan struct{}) {
	t.Helper()
	resp, err := c.Get(strings.TrimSuffix(u.URL, "/") + "/sse")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("sse: %v %v", resp, err)
	}
	ended = make(chan struct{})
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(ended)
		for {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { resp.Body.Close() })
	return ended
}

func isEnded(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-time.After(time.Second):
		return false
	}
}

// TestMTLS: an mtls URL's handshake asks for a client certificate (a
// token URL's does not); each request is checked against the project's
// CA as it is then; a revocation cuts what the serial opened and nothing
// else; a new CA (uploaded) cuts what the old one's certificates opened.
func TestMTLS(t *testing.T) {
	f := newFixture(t, true)
	ctx := context.Background()
	u, err := f.svc.Create(ctx, owner, sandbox.URLRequest{Port: 9443, Auth: sandbox.URLAuthMTLS})
	if err != nil {
		t.Fatal(err)
	}
	if u.Token != "" || u.ProjectID != "prj_1" {
		t.Fatalf("created %+v", u)
	}
	if _, err := f.svc.IssueCert(ctx, "prj_1", sandbox.ClientCertRequest{Name: "alice"}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("issue without a CA: %v", err)
	}
	// No client certificate: the handshake fails.
	var asked bool
	if got := status(t, f.mtlsClient(nil, true, &asked), u, "/"); got != 0 || !asked {
		t.Fatalf("no certificate: status %d, asked %v", got, asked)
	}
	// A token URL's handshake does not ask.
	tu := f.publish(t, 8080)
	asked = false
	if got := status(t, f.mtlsClient(nil, true, &asked), tu, "/"); got != http.StatusUnauthorized || asked {
		t.Fatalf("token URL: status %d, asked for a certificate: %v", got, asked)
	}

	ca, err := f.svc.SetCA(ctx, "prj_1", "acc_1", sandbox.URLCARequest{})
	if err != nil || ca.Uploaded || !strings.Contains(ca.Certificate, "BEGIN CERTIFICATE") {
		t.Fatalf("make a CA: %+v %v", ca, err)
	}
	for _, bad := range []sandbox.ClientCertRequest{{}, {Name: "x", TTL: "forever"}, {Name: "x", TTL: "9000h"}, {Name: "x", TTL: "1s"}} {
		if _, err := f.svc.IssueCert(ctx, "prj_1", bad); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("issue %+v: %v", bad, err)
		}
	}
	alice, err := f.svc.IssueCert(ctx, "prj_1", sandbox.ClientCertRequest{Name: "alice", TTL: "1h"})
	if err != nil || alice.PrivateKey == "" || alice.NotAfter.Sub(time.Now()) > time.Hour {
		t.Fatalf("issue: %+v %v", alice, err)
	}
	bob, err := f.svc.IssueCert(ctx, "prj_1", sandbox.ClientCertRequest{Name: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	aliceKP, bobKP := keyPair(t, alice), keyPair(t, bob)
	if got := status(t, f.mtlsClient(aliceKP, true, nil), u, "/"); got != 200 {
		t.Fatalf("alice: %d", got)
	}
	if w := <-f.who; w != "mtls:alice:"+alice.Serial+" true" {
		t.Errorf("recorded %q", w)
	}
	// Another project's CA does not vouch for this one's URLs.
	if _, err := f.svc.SetCA(ctx, "prj_2", "acc_1", sandbox.URLCARequest{}); err != nil {
		t.Fatal(err)
	}
	eve, err := f.svc.IssueCert(ctx, "prj_2", sandbox.ClientCertRequest{Name: "eve"})
	if err != nil {
		t.Fatal(err)
	}
	if got := status(t, f.mtlsClient(keyPair(t, eve), false, nil), u, "/"); got != http.StatusForbidden {
		t.Errorf("another project's certificate: %d", got)
	}
	// The path form and a connection made for another host get no answer
	// from the guest.
	pc := f.mtlsClient(aliceKP, true, nil)
	if resp, err := pc.Get(strings.Replace(u.PathURL, "harebox.test", "localhost", 1)); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("path form: %v %v", resp, err)
	}
	pu, _ := url.Parse(u.URL)
	req, _ := http.NewRequest("GET", f.base+"/", nil)
	req.Host = pu.Host
	if resp, err := f.client.Do(req); err != nil || resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("a connection for another host: %v %v", resp, err)
	}

	// Open streams with both certificates, over HTTP/2, HTTP/1.1 and a
	// WebSocket; revoke alice's.
	aliceH2, aliceH1 := f.mtlsClient(aliceKP, true, nil), f.mtlsClient(aliceKP, false, nil)
	a2, a1 := openStream(t, aliceH2, u), openStream(t, aliceH1, u)
	ws := f.mtlsWS(t, u, aliceKP)
	bobH2 := f.mtlsClient(bobKP, true, nil)
	b2 := openStream(t, bobH2, u)
	rev, err := f.svc.RevokeCert(ctx, "prj_1", strings.ToUpper(alice.Serial))
	if err != nil || rev.RevokedAt == nil || rev.Serial != alice.Serial || !rev.Issued {
		t.Fatalf("revoke: %+v %v", rev, err)
	}
	if !isEnded(a2) || !isEnded(a1) {
		t.Error("alice's streams were not cut")
	}
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	if err := ws.Write(wctx, websocket.MessageText, []byte("hi")); err == nil {
		if _, _, err := ws.Read(wctx); err == nil {
			t.Error("alice's WebSocket still echoes")
		}
	}
	cancel()
	for _, c := range []*http.Client{aliceH2, aliceH1, f.mtlsClient(aliceKP, true, nil)} {
		if got := status(t, c, u, "/"); got != http.StatusForbidden {
			t.Errorf("alice after revocation: %d", got)
		}
	}
	select {
	case <-b2:
		t.Error("bob's stream was cut by alice's revocation")
	case <-time.After(100 * time.Millisecond):
	}
	if got := status(t, bobH2, u, "/"); got != 200 {
		t.Errorf("bob after alice's revocation: %d", got)
	}

	// An uploaded CA replaces the one made here: bob's stream is cut and
	// his certificate refused, the new CA's are let in, and the project
	// can no longer issue.
	caPEM, sign := ownCA(t)
	if _, err := f.svc.SetCA(ctx, "prj_1", "acc_1", sandbox.URLCARequest{Certificate: bob.Certificate}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("a leaf uploaded as a CA: %v", err)
	}
	if got, err := f.svc.SetCA(ctx, "prj_1", "acc_1", sandbox.URLCARequest{Certificate: caPEM}); err != nil || !got.Uploaded {
		t.Fatalf("upload: %+v %v", got, err)
	}
	if !isEnded(b2) {
		t.Error("bob's stream outlived his CA")
	}
	if got := status(t, bobH2, u, "/"); got != http.StatusForbidden {
		t.Errorf("bob after a new CA: %d", got)
	}
	carol, carolSerial := sign("carol")
	if got := status(t, f.mtlsClient(carol, true, nil), u, "/"); got != 200 {
		t.Errorf("carol: %d", got)
	}
	if _, err := f.svc.IssueCert(ctx, "prj_1", sandbox.ClientCertRequest{Name: "x"}); !errors.Is(err, sandbox.ErrState) {
		t.Errorf("issue from an uploaded CA: %v", err)
	}
	if _, err := f.svc.RevokeCert(ctx, "prj_1", "xyz"); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("revoke a bad serial: %v", err)
	}
	if _, err := f.svc.RevokeCert(ctx, "prj_1", "00:"+carolSerial); err != nil {
		t.Fatal(err)
	}
	if got := status(t, f.mtlsClient(carol, true, nil), u, "/"); got != http.StatusForbidden {
		t.Errorf("carol after revocation: %d", got)
	}
	l, err := f.svc.ListCerts(ctx, "prj_1")
	if err != nil || len(l) != 3 || l[2].Serial != carolSerial || l[2].Issued || l[2].RevokedAt == nil || l[0].Serial != alice.Serial || l[0].RevokedAt == nil {
		t.Errorf("list after a new CA: %+v %v", l, err)
	}
	// The same CA uploaded again (or renewed with its key) keeps its
	// revocations.
	if _, err := f.svc.SetCA(ctx, "prj_1", "acc_1", sandbox.URLCARequest{Certificate: caPEM}); err != nil {
		t.Fatal(err)
	}
	if got := status(t, f.mtlsClient(carol, true, nil), u, "/"); got != http.StatusForbidden {
		t.Errorf("carol after her CA was uploaded again: %d", got)
	}
	// A browser presents its certificate by itself: a request another
	// site's page makes with it is refused, a navigation is not.
	erin, _ := sign("erin")
	ec := f.mtlsClient(erin, true, nil)
	for _, c := range []struct {
		method, site, mode string
		want               int
	}{{"POST", "cross-site", "cors", 403}, {"POST", "same-site", "navigate", 403}, {"GET", "same-site", "navigate", 200}, {"POST", "same-origin", "cors", 200}} {
		req, _ := http.NewRequest(c.method, u.URL, nil)
		req.Header.Set("Sec-Fetch-Site", c.site)
		req.Header.Set("Sec-Fetch-Mode", c.mode)
		resp, err := ec.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s from %s (%s): %d, want %d", c.method, c.site, c.mode, resp.StatusCode, c.want)
		}
	}
	// Anyone's self-signed certificate is refused and recorded as
	// unauthenticated, whatever name it carries.
	mallory, _ := ownCAAndLeaf(t, "alice")
	for len(f.who) > 0 {
		<-f.who
	}
	time.Sleep(1100 * time.Millisecond) // refusals are recorded once a second per URL
	if got := status(t, f.mtlsClient(mallory, true, nil), u, "/"); got != http.StatusForbidden {
		t.Errorf("a self-signed alice: %d", got)
	}
	select {
	case w := <-f.who:
		if w != "mtls false" {
			t.Errorf("a self-signed alice recorded as %q", w)
		}
	case <-time.After(5 * time.Second):
		t.Error("a self-signed alice's refusal was not recorded")
	}
	// A chain too long to verify for anyone is refused in the handshake.
	long := *erin
	for i := 0; i < maxClientChain; i++ {
		long.Certificate = append(long.Certificate, erin.Certificate[0])
	}
	if got := status(t, f.mtlsClient(&long, true, nil), u, "/"); got != 0 {
		t.Errorf("a chain of %d certificates: %d", len(long.Certificate), got)
	}

	// A second ingress on the same store (a restart) keeps the CA and its
	// revocations.
	again, err := New(ctx, Options{Store: f.svc.opts.Store, Secrets: f.svc.opts.Secrets, Guests: f.guests, Base: f.svc.opts.Base})
	if err != nil {
		t.Fatal(err)
	}
	dave, _ := sign("dave")
	for _, c := range []struct {
		cert *tls.Certificate
		want int
	}{{dave, 200}, {carol, http.StatusForbidden}} {
		r := httpsRequest(u, c.cert)
		w := httptest.NewRecorder()
		again.ServeHTTP(w, r)
		if got := guestCode(w); got != c.want {
			t.Errorf("after a restart, %s: %d, want %d", c.cert.Leaf.Subject.CommonName, got, c.want)
		}
	}

	if err := f.svc.DeleteCA(ctx, "prj_1"); err != nil {
		t.Fatal(err)
	}
	if got := status(t, f.mtlsClient(dave, true, nil), u, "/"); got != http.StatusForbidden {
		t.Errorf("after the CA's delete: %d", got)
	}
	if _, err := f.svc.CA(ctx, "prj_1"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("CA after delete: %v", err)
	}
}

// guestCode is a recorded response's status, but 0 for a 200 the guest
// did not answer (the recorder says 200 for nothing written too).
func guestCode(w *httptest.ResponseRecorder) int {
	if w.Code == http.StatusOK && !strings.Contains(w.Body.String(), `"from":"guest"`) {
		return 0
	}
	return w.Code
}

// httpsRequest is a request to u's host form as the ingress's server
// hands it over after a handshake with cert.
func httpsRequest(u *sandbox.URL, cert *tls.Certificate) *http.Request {
	pu, _ := url.Parse(u.URL)
	r, _ := http.NewRequest("GET", "/", nil)
	r.Host = pu.Host
	leaf, _ := x509.ParseCertificate(cert.Certificate[0])
	cert.Leaf = leaf
	r.TLS = &tls.ConnectionState{ServerName: pu.Hostname(), PeerCertificates: []*x509.Certificate{leaf}}
	return r
}

func (f *fixture) mtlsWS(t *testing.T, u *sandbox.URL, cert *tls.Certificate) *websocket.Conn {
	t.Helper()
	wsURL := strings.Replace(u.URL, "https", "wss", 1) + "ws"
	return dialWS(t, wsURL, &websocket.DialOptions{HTTPClient: f.mtlsClient(cert, false, nil)})
}

// TestRevokeUnderLoad: a client loops on a certificate, over one HTTP/2
// connection and one HTTP/1.1 keep-alive connection, while it is revoked:
// no request sent after RevokeCert returns succeeds, and another
// certificate's loop never fails.
func TestRevokeUnderLoad(t *testing.T) {
	// (Through another host: the clients reach host b's ingress, the
	// sandbox and its URL are host a's, the revocation is made on a.)
	for _, mode := range []string{"one-host", "through-another-host"} {
		t.Run(mode, func(t *testing.T) {
			f := newFixture(t, true)
			via := f
			if mode == "through-another-host" {
				via = throughAnotherHost(t, f)
			}
			ctx := context.Background()
			u, err := f.svc.Create(ctx, owner, sandbox.URLRequest{Port: 9443, Auth: sandbox.URLAuthMTLS})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.svc.SetCA(ctx, "prj_1", "acc_1", sandbox.URLCARequest{}); err != nil {
				t.Fatal(err)
			}
			other, err := f.svc.IssueCert(ctx, "prj_1", sandbox.ClientCertRequest{Name: "other"})
			if err != nil {
				t.Fatal(err)
			}
			otherKP := keyPair(t, other)
			for round := 0; round < 10; round++ {
				c, err := f.svc.IssueCert(ctx, "prj_1", sandbox.ClientCertRequest{Name: "loop"})
				if err != nil {
					t.Fatal(err)
				}
				kp := keyPair(t, c)
				var revoked atomic.Bool
				var okAfter, sentAfter, otherFailed atomic.Int64
				var stop atomic.Bool
				var wg sync.WaitGroup
				loop := func(cl *http.Client, counts bool) {
					defer wg.Done()
					for !stop.Load() {
						after := revoked.Load()
						got := status(t, cl, u, "/")
						switch {
						case !counts && got != 200:
							otherFailed.Add(1)
						case counts && after:
							sentAfter.Add(1)
							if got == 200 {
								okAfter.Add(1)
							}
						}
					}
				}
				wg.Add(3)
				go loop(via.mtlsClient(kp, true, nil), true)
				go loop(via.mtlsClient(kp, false, nil), true)
				go loop(via.mtlsClient(otherKP, true, nil), false)
				time.Sleep(20 * time.Millisecond)
				if _, err := f.svc.RevokeCert(ctx, "prj_1", c.Serial); err != nil {
					t.Fatal(err)
				}
				revoked.Store(true)
				// (A few requests after it, however slow the machine is.)
				await(func() bool { return sentAfter.Load() >= 4 })
				stop.Store(true)
				wg.Wait()
				if okAfter.Load() != 0 || sentAfter.Load() == 0 || otherFailed.Load() != 0 {
					t.Fatalf("round %d: %d of %d requests after the revocation succeeded; the other certificate failed %d times",
						round, okAfter.Load(), sentAfter.Load(), otherFailed.Load())
				}
			}
		})
	}
}

// ownCAAndLeaf is a certificate for name signed by a CA nobody uploaded.
func ownCAAndLeaf(t *testing.T, name string) (*tls.Certificate, string) {
	_, sign := ownCA(t)
	return sign(name)
}

// TestSetCAUnderLoad: clients loop on a certificate of the project's CA
// while the CA is replaced: no request sent after SetCA returns succeeds.
func TestSetCAUnderLoad(t *testing.T) {
	f := newFixture(t, true)
	ctx := context.Background()
	u, err := f.svc.Create(ctx, owner, sandbox.URLRequest{Port: 9443, Auth: sandbox.URLAuthMTLS})
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 5; round++ {
		if _, err := f.svc.SetCA(ctx, "prj_1", "acc_1", sandbox.URLCARequest{}); err != nil {
			t.Fatal(err)
		}
		c, err := f.svc.IssueCert(ctx, "prj_1", sandbox.ClientCertRequest{Name: "loop"})
		if err != nil {
			t.Fatal(err)
		}
		kp := keyPair(t, c)
		var replaced, stop atomic.Bool
		var okBefore, okAfter, sentAfter atomic.Int64
		var wg sync.WaitGroup
		loop := func(cl *http.Client) {
			defer wg.Done()
			for !stop.Load() {
				after := replaced.Load()
				got := status(t, cl, u, "/")
				switch {
				case after:
					sentAfter.Add(1)
					if got == 200 {
						okAfter.Add(1)
					}
				case got == 200:
					okBefore.Add(1)
				}
			}
		}
		wg.Add(2)
		go loop(f.mtlsClient(kp, true, nil))
		go loop(f.mtlsClient(kp, false, nil))
		await(func() bool { return okBefore.Load() >= 2 })
		if _, err := f.svc.SetCA(ctx, "prj_1", "acc_1", sandbox.URLCARequest{}); err != nil {
			t.Fatal(err)
		}
		replaced.Store(true)
		await(func() bool { return sentAfter.Load() >= 4 })
		stop.Store(true)
		wg.Wait()
		if okBefore.Load() == 0 || okAfter.Load() != 0 || sentAfter.Load() == 0 {
			t.Fatalf("round %d: %d successes before the new CA, %d of %d after", round, okBefore.Load(), okAfter.Load(), sentAfter.Load())
		}
	}
}

// failingStore fails PutURLCA when told to.
type failingStore struct {
	*store.DB
	fail atomic.Bool
}

func (s *failingStore) PutURLCA(ctx context.Context, ca *store.URLCA) error {
	if s.fail.Load() {
		return errors.New("disk on fire")
	}
	return s.DB.PutURLCA(ctx, ca)
}

// failingSecrets fails Erase when told to, and counts what is put and
// erased.
type failingSecrets struct {
	*secrets.Sealed
	fail       atomic.Bool
	mu         sync.Mutex
	put, erase []string
}

func (s *failingSecrets) Put(ctx context.Context, scope, name string, v []byte) error {
	s.mu.Lock()
	s.put = append(s.put, name)
	s.mu.Unlock()
	return s.Sealed.Put(ctx, scope, name, v)
}

func (s *failingSecrets) Erase(ctx context.Context, scope, name string) error {
	if s.fail.Load() {
		return errors.New("secret store on fire")
	}
	s.mu.Lock()
	s.erase = append(s.erase, name)
	s.mu.Unlock()
	return s.Sealed.Erase(ctx, scope, name)
}

// TestSetCAFailures: a CA change that fails leaves the old CA whole (its
// certificates work, it can issue, nothing half-made stays); one whose
// old key cannot be erased still takes effect.
func TestSetCAFailures(t *testing.T) {
	ctx := context.Background()
	db, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	sealed, err := secrets.NewSealed(db, filepath.Join(t.TempDir(), "master.key"))
	if err != nil {
		t.Fatal(err)
	}
	st, sec := &failingStore{DB: db}, &failingSecrets{Sealed: sealed}
	base, _ := url.Parse("https://harebox.test")
	svc, err := New(ctx, Options{Store: st, Secrets: sec, Guests: &loopGuests{addr: upstream(t)}, Base: base})
	if err != nil {
		t.Fatal(err)
	}
	u, err := svc.Create(ctx, owner, sandbox.URLRequest{Port: 9443, Auth: sandbox.URLAuthMTLS})
	if err != nil {
		t.Fatal(err)
	}
	first, err := svc.SetCA(ctx, "prj_1", "acc_1", sandbox.URLCARequest{})
	if err != nil {
		t.Fatal(err)
	}
	alice, err := svc.IssueCert(ctx, "prj_1", sandbox.ClientCertRequest{Name: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	code := func(c *sandbox.ClientCert) int {
		w := httptest.NewRecorder()
		svc.ServeHTTP(w, httpsRequest(u, keyPair(t, c)))
		return guestCode(w)
	}
	if got := code(alice); got != 200 {
		t.Fatalf("alice: %d", got)
	}

	st.fail.Store(true)
	if _, err := svc.SetCA(ctx, "prj_1", "acc_1", sandbox.URLCARequest{}); err == nil {
		t.Fatal("SetCA succeeded on a failing store")
	}
	st.fail.Store(false)
	if ca, err := svc.CA(ctx, "prj_1"); err != nil || ca.Certificate != first.Certificate {
		t.Errorf("after a failed change the CA is %+v %v", ca, err)
	}
	if got := code(alice); got != 200 {
		t.Errorf("alice after a failed change: %d", got)
	}
	if _, err := svc.IssueCert(ctx, "prj_1", sandbox.ClientCertRequest{Name: "bob"}); err != nil {
		t.Errorf("issue after a failed change: %v", err)
	}
	sec.mu.Lock()
	made := sec.put[len(sec.put)-1]
	erased := slices.Contains(sec.erase, made)
	sec.mu.Unlock()
	if !erased {
		t.Error("the failed change's key was left in the secret store")
	}

	sec.fail.Store(true)
	if _, err := svc.SetCA(ctx, "prj_1", "acc_1", sandbox.URLCARequest{}); err != nil {
		t.Fatalf("a change whose old key cannot be erased: %v", err)
	}
	if got := code(alice); got != http.StatusForbidden {
		t.Errorf("alice after her CA was replaced: %d", got)
	}
	if _, err := svc.IssueCert(ctx, "prj_1", sandbox.ClientCertRequest{Name: "carol"}); err != nil {
		t.Errorf("the new CA cannot issue: %v", err)
	}
}

// await waits until cond holds, 10 s at most (the caller then checks what
// it counted): windows of a fixed length see nothing on a busy machine.
func await(cond func() bool) {
	for end := time.Now().Add(10 * time.Second); !cond() && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
}

// TestCAChangedElsewhere: a revocation, or a new CA, made through another
// host (which shares the store) is seen here at its notice: what the
// revoked certificate, or the old CA's certificates, opened here is cut
// and refused from then on; a notice that changes nothing here cuts
// nothing.
func TestCAChangedElsewhere(t *testing.T) {
	t.Parallel()
	a := newFixture(t, true)
	b := newFixtureDB(t, true, "harebox.test", a.db)
	ctx := context.Background()
	u, err := a.svc.Create(ctx, owner, sandbox.URLRequest{Port: 9443, Auth: sandbox.URLAuthMTLS})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.svc.SetCA(ctx, "prj_1", "acc_1", sandbox.URLCARequest{}); err != nil {
		t.Fatal(err)
	}
	issue := func() (*sandbox.ClientCert, *http.Client) {
		c, err := a.svc.IssueCert(ctx, "prj_1", sandbox.ClientCertRequest{Name: "c"})
		if err != nil {
			t.Fatal(err)
		}
		return c, a.mtlsClient(keyPair(t, c), true, nil)
	}
	_, kept := issue()
	gone, revoked := issue()
	keptStream, goneStream := openStream(t, kept, u), openStream(t, revoked, u)
	a.svc.Noticed(ctx, "prj_1") // (nothing changed)
	if isEnded(keptStream) || isEnded(goneStream) || status(t, revoked, u, "/") != 200 {
		t.Fatal("a notice that changed nothing cut something")
	}
	if _, err := b.svc.RevokeCert(ctx, "prj_1", gone.Serial); err != nil {
		t.Fatal(err)
	}
	a.svc.Noticed(ctx, "prj_1")
	if !isEnded(goneStream) {
		t.Error("the stream of a certificate revoked through another host still runs")
	}
	if got := status(t, revoked, u, "/"); got == 200 {
		t.Error("a certificate revoked through another host is still accepted")
	}
	if isEnded(keptStream) || status(t, kept, u, "/") != 200 {
		t.Fatal("another certificate's stream or requests were cut by the revocation")
	}
	if _, err := b.svc.SetCA(ctx, "prj_1", "acc_1", sandbox.URLCARequest{}); err != nil {
		t.Fatal(err)
	}
	a.svc.Noticed(ctx, "")
	if !isEnded(keptStream) {
		t.Error("a stream of the old CA's certificate still runs after a new CA through another host")
	}
	if got := status(t, kept, u, "/"); got == 200 {
		t.Error("the old CA's certificate is still accepted after a new CA through another host")
	}
}
