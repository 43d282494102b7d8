package ingress

// Client certificates (auth mtls). A project has at most one URL
// certificate authority: one the service made, whose key is sealed in the
// secret store and which issues client certificates, or one the user
// uploaded. The TLS handshake of an mtls URL's host asks for a client
// certificate; each request is then checked against the project's CA as
// it is at that moment (chain, client-auth usage, expiry, serial not
// revoked), so a revocation or a new CA takes effect on the next request
// of a connection that is already open, and what the certificate opened
// is cut like what a rotated token opened.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// Client certificates' lifetimes.
const (
	DefaultCertTTL = 90 * 24 * time.Hour
	MaxCertTTL     = 365 * 24 * time.Hour
	caLifetime     = 10 * 365 * 24 * time.Hour
)

// caScope is where a project's CA key is sealed.
func caScope(projectID string) string { return "urlca/" + projectID }

// authority is a project's CA as requests check it. It is never changed:
// a change makes a new one, so a request that verified against one can
// tell, under its URL's lock, whether it is still the project's.
type authority struct {
	roots *x509.CertPool // nil: the project has no CA
	// pem is the CA's certificate as stored ("": none): a reload tells
	// a new CA from the same one with new revocations.
	pem string
	// revoked holds "ISSUER_KEY/SERIAL" (see revocationKey).
	revoked map[string]bool
}

// revocationKey names a certificate by its issuer's public key and its
// serial: what a revocation holds for.
func revocationKey(issuerKey, serial string) string { return issuerKey + "/" + serial }

// keyHash is a certificate's public key's SHA-256, hex.
func keyHash(c *x509.Certificate) string {
	h := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(h[:])
}

// authorityOf returns the project's CA, loaded from the store once. The
// load runs outside caMu (a slow store stalls this project only); a
// change made meanwhile wins over what it read.
func (s *Service) authorityOf(ctx context.Context, projectID string) (*authority, error) {
	for {
		s.caMu.Lock()
		a, gen := s.cas[projectID], s.caGen
		s.caMu.Unlock()
		if a != nil {
			return a, nil
		}
		a, err := s.loadAuthority(ctx, projectID)
		if err != nil {
			return nil, err
		}
		s.caMu.Lock()
		if s.caGen == gen {
			// Another request may have loaded it meanwhile: one
			// authority per state, or its requests would not match.
			if cur := s.cas[projectID]; cur != nil {
				a = cur
			} else {
				s.cas[projectID] = a
			}
			s.caMu.Unlock()
			return a, nil
		}
		s.caMu.Unlock()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}

// current is the project's CA now (nil if not loaded); caMu is taken
// briefly, so it may be called under an entry's lock.
func (s *Service) current(projectID string) *authority {
	s.caMu.Lock()
	defer s.caMu.Unlock()
	return s.cas[projectID]
}

func (s *Service) loadAuthority(ctx context.Context, projectID string) (*authority, error) {
	a := &authority{revoked: map[string]bool{}}
	recs, err := s.db.ListClientCerts(ctx, projectID)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if r.RevokedAt != nil {
			for _, k := range r.IssuerKeys {
				a.revoked[revocationKey(k, r.Serial)] = true
			}
		}
	}
	ca, err := s.db.GetURLCA(ctx, projectID)
	if errors.Is(err, store.ErrNotFound) {
		return a, nil
	}
	if err != nil {
		return nil, err
	}
	certs, err := parseCerts(ca.Certificate)
	if err != nil {
		return nil, fmt.Errorf("ingress: project %s's stored CA: %w", projectID, err)
	}
	a.pem = ca.Certificate
	a.roots = x509.NewCertPool()
	for _, c := range certs {
		a.roots.AddCert(c)
	}
	return a, nil
}

// changed reloads the project's CA after a change to its records (made
// here, or through another host: Noticed) and cuts what it no longer
// accepts: what the certificates revoked since the CA was loaded opened,
// or everything its certificates opened when the CA itself is not the
// same (or cannot be read: it fails closed). The caller holds caChange.
func (s *Service) changed(ctx context.Context, projectID string) {
	a, err := s.loadAuthority(ctx, projectID)
	s.caMu.Lock()
	s.caGen++
	old := s.cas[projectID]
	var keys map[string]bool // nil: cut all
	if err == nil && old != nil && old.roots != nil && a.pem == old.pem {
		// The same CA, and so the requests that checked against it
		// stay good, but for the newly revoked.
		a.roots = old.roots
		keys = map[string]bool{}
		for k := range a.revoked {
			if !old.revoked[k] {
				keys[k] = true
			}
		}
	}
	if err != nil {
		s.opts.Log.Error("ingress: cannot load a project's CA; its mtls URLs refuse until it can", "project", projectID, "err", err)
		delete(s.cas, projectID) // loaded again by the next request
	} else {
		s.cas[projectID] = a
	}
	s.caMu.Unlock()
	if keys != nil && len(keys) == 0 {
		return
	}
	s.mu.RLock()
	var es []*entry
	for _, e := range s.byID {
		if e.auth == sandbox.URLAuthMTLS && e.project == projectID {
			es = append(es, e)
		}
	}
	s.mu.RUnlock()
	for _, e := range es {
		e.mu.Lock()
		streams, conns := e.takeCerts(keys)
		e.mu.Unlock()
		cut(streams, conns)
	}
}

// NoticeTopic is the store's notice of a change to a project's CA or its
// certificates' revocations, made through any host: each host's ingress
// reloads what it checks against (Noticed).
const NoticeTopic = "urlca"

// tellHosts has every host's ingress reload the project's CA.
func (s *Service) tellHosts(ctx context.Context, projectID string) {
	if err := s.db.Notify(context.WithoutCancel(ctx), NoticeTopic, projectID); err != nil {
		s.opts.Log.Warn("ingress: cannot tell the other hosts of a change to a project's CA; they see it at their restart", "project", projectID, "err", err)
	}
}

// Noticed reloads a project's CA after a change made through another
// host (a NoticeTopic notice; "": every project loaded here, as after a
// lost connection to the store) and cuts what it no longer accepts, as
// changed does.
func (s *Service) Noticed(ctx context.Context, projectID string) {
	if projectID == "" {
		s.caMu.Lock()
		ids := make([]string, 0, len(s.cas))
		for id := range s.cas {
			ids = append(ids, id)
		}
		s.caMu.Unlock()
		for _, id := range ids {
			s.Noticed(ctx, id)
		}
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s.caChange.Lock()
	defer s.caChange.Unlock()
	if s.current(projectID) == nil {
		// Not loaded here (nothing checked against it): a load in
		// flight must not keep what it read before the change.
		s.caMu.Lock()
		s.caGen++
		s.caMu.Unlock()
		return
	}
	s.changed(ctx, projectID)
}

// takeCerts takes what the certificates of keys opened (nil: every
// certificate); the caller holds e.mu.
func (e *entry) takeCerts(keys map[string]bool) (map[*stream]struct{}, map[*conn]struct{}) {
	if keys == nil {
		return e.takeLocked()
	}
	streams, conns := map[*stream]struct{}{}, map[*conn]struct{}{}
	for st := range e.streams {
		if keys[st.cert] {
			streams[st] = struct{}{}
			delete(e.streams, st)
		}
	}
	for c, k := range e.conns {
		if keys[k] {
			conns[c] = struct{}{}
			delete(e.conns, c)
		}
	}
	return streams, conns
}

func parseCerts(p string) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := []byte(p)
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("a PEM block of type %q, not CERTIFICATE", b.Type)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}

func pemCert(der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// serialText is a serial as the API shows it: lower-case hex.
func serialText(n *big.Int) string { return n.Text(16) }

// normalSerial reads a serial as a user may write it (hex, any case,
// colons, leading zeros).
func normalSerial(s string) (string, error) {
	h := strings.ReplaceAll(s, ":", "")
	n, ok := new(big.Int).SetString(h, 16)
	if !ok || h == "" || len(h) > 64 || n.Sign() < 0 {
		return "", sandbox.Errorf(sandbox.ErrInvalid, "serial", "want a certificate serial number in hex, got %q", s)
	}
	return serialText(n), nil
}

// CA returns the project's URL certificate authority.
func (s *Service) CA(ctx context.Context, projectID string) (*sandbox.URLCA, error) {
	ca, err := s.db.GetURLCA(ctx, projectID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "project %s has no URL CA (set one: PUT /v1/url-ca)", projectID)
	}
	if err != nil {
		return nil, err
	}
	return &ca.URLCA, nil
}

// SetCA gives the project a new CA: the certificates of req (uploaded), or
// one made here whose key is sealed in the secret store. The old one, and
// what it signed, stop working; what they opened is cut. Revocations stay:
// they hold for a CA's key, whichever certificate carries it.
func (s *Service) SetCA(ctx context.Context, projectID, accountID string, req sandbox.URLCARequest) (*sandbox.URLCA, error) {
	if err := sandbox.Validate(&req); err != nil {
		return nil, err
	}
	now := s.opts.Now().UTC()
	ca := &store.URLCA{URLCA: sandbox.URLCA{ProjectID: projectID, CreatedAt: now}, AccountID: accountID}
	var key []byte
	if req.Certificate != "" {
		certs, err := parseCerts(req.Certificate)
		if err != nil {
			return nil, sandbox.Errorf(sandbox.ErrInvalid, "certificate", "%v", err)
		}
		var out strings.Builder
		for _, c := range certs {
			if !c.IsCA || !c.BasicConstraintsValid {
				return nil, sandbox.Errorf(sandbox.ErrInvalid, "certificate", "%q is not a CA certificate (basic constraints CA:TRUE)", printable(c.Subject.CommonName, 64))
			}
			if now.After(c.NotAfter) {
				return nil, sandbox.Errorf(sandbox.ErrInvalid, "certificate", "%q expired at %s", printable(c.Subject.CommonName, 64), c.NotAfter.Format(time.RFC3339))
			}
			out.WriteString(pemCert(c.Raw))
		}
		ca.Certificate, ca.Uploaded = out.String(), true
	} else {
		if s.opts.Secrets == nil {
			return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "this server has no secret store to keep a CA's key in; upload a CA certificate instead")
		}
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		tmpl := &x509.Certificate{
			SerialNumber:          randomSerial(),
			Subject:               pkix.Name{CommonName: "HareBox URL CA " + projectID, Organization: []string{"HareBox"}},
			NotBefore:             now.Add(-time.Minute),
			NotAfter:              now.Add(caLifetime),
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
			BasicConstraintsValid: true,
			IsCA:                  true,
			MaxPathLenZero:        true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
		if err != nil {
			return nil, err
		}
		if key, err = x509.MarshalPKCS8PrivateKey(k); err != nil {
			return nil, err
		}
		ca.Certificate = pemCert(der)
		ca.KeyName = "key-" + serialText(randomSerial())
	}
	s.caChange.Lock()
	defer s.caChange.Unlock()
	old, err := s.db.GetURLCA(ctx, projectID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	if key != nil {
		// Under a name of its own: until the record names it, no CA
		// uses it.
		if err := s.opts.Secrets.Put(ctx, caScope(projectID), ca.KeyName, key); err != nil {
			return nil, err
		}
	}
	// One write replaces the old CA with the new: it fails whole or
	// takes effect whole.
	if err := s.db.PutURLCA(ctx, ca); err != nil {
		if key != nil {
			s.eraseKey(projectID, ca.KeyName)
		}
		return nil, err
	}
	s.changed(ctx, projectID)
	s.tellHosts(ctx, projectID)
	if old != nil && old.KeyName != "" {
		s.eraseKey(projectID, old.KeyName)
	}
	return &ca.URLCA, nil
}

// eraseKey erases a CA's key that no record names any more. A failure is
// logged: the project's delete sweeps what is left.
func (s *Service) eraseKey(projectID, name string) {
	if s.opts.Secrets == nil {
		return
	}
	if err := s.opts.Secrets.Erase(context.WithoutCancel(context.Background()), caScope(projectID), name); err != nil && !isNotFound(err) {
		s.opts.Log.Error("ingress: cannot erase an old URL CA key (the project's delete will)", "project", projectID, "err", err)
	}
}

func isNotFound(err error) bool {
	return errors.Is(err, secrets.ErrNotFound) || errors.Is(err, store.ErrNotFound)
}

// DeleteCA deletes the project's CA and its key: its mtls URLs refuse
// every client until it has another. Revocations stay.
func (s *Service) DeleteCA(ctx context.Context, projectID string) error {
	s.caChange.Lock()
	defer s.caChange.Unlock()
	old, err := s.db.GetURLCA(ctx, projectID)
	if err == nil {
		err = s.db.DeleteURLCA(ctx, projectID)
	}
	if errors.Is(err, store.ErrNotFound) {
		return sandbox.Errorf(sandbox.ErrNotFound, "", "project %s has no URL CA", projectID)
	}
	if err != nil {
		return err
	}
	s.changed(ctx, projectID)
	s.tellHosts(ctx, projectID)
	if old.KeyName != "" {
		s.eraseKey(projectID, old.KeyName)
	}
	return nil
}

func randomSerial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n.Add(n, big.NewInt(1)) // positive, at most 128 bits
}

// IssueCert issues a client certificate from the project's CA, which must
// be one made here. Its key is returned, not kept.
func (s *Service) IssueCert(ctx context.Context, projectID string, req sandbox.ClientCertRequest) (*sandbox.ClientCert, error) {
	if err := sandbox.Validate(&req); err != nil {
		return nil, err
	}
	ttl := DefaultCertTTL
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d < time.Minute || d > MaxCertTTL {
			return nil, sandbox.Errorf(sandbox.ErrInvalid, "ttl", "want a duration from 1m to %v, got %q", MaxCertTTL, req.TTL)
		}
		ttl = d
	}
	s.caChange.Lock()
	defer s.caChange.Unlock()
	ca, err := s.db.GetURLCA(ctx, projectID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "project %s has no URL CA (set one: PUT /v1/url-ca)", projectID)
	}
	if err != nil {
		return nil, err
	}
	if ca.Uploaded || ca.KeyName == "" {
		return nil, sandbox.Errorf(sandbox.ErrState, "", "project %s's URL CA was uploaded: issue its certificates where its key is", projectID)
	}
	if s.opts.Secrets == nil {
		return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "this server has no secret store, where CA keys are")
	}
	certs, err := parseCerts(ca.Certificate)
	if err != nil {
		return nil, err
	}
	der, err := s.opts.Secrets.Get(ctx, caScope(projectID), ca.KeyName)
	if err != nil {
		return nil, fmt.Errorf("ingress: project %s's CA key: %w", projectID, err)
	}
	caKey, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("ingress: project %s's CA key: %w", projectID, err)
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := s.opts.Now().UTC()
	notAfter := now.Add(ttl)
	if notAfter.After(certs[0].NotAfter) {
		notAfter = certs[0].NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: req.Name},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	cert, err := x509.CreateCertificate(rand.Reader, tmpl, certs[0], &k.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	kd, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	rec := &sandbox.ClientCert{ProjectID: projectID, Serial: serialText(tmpl.SerialNumber), Name: req.Name,
		Issued: true, IssuerKeys: []string{keyHash(certs[0])}, NotAfter: &notAfter, CreatedAt: now}
	if err := s.db.PutClientCert(ctx, rec); err != nil {
		return nil, err
	}
	out := *rec
	out.Certificate = pemCert(cert)
	out.PrivateKey = string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd}))
	return &out, nil
}

// ListCerts lists the certificates the project issued and the serials it
// revoked, oldest first.
func (s *Service) ListCerts(ctx context.Context, projectID string) ([]*sandbox.ClientCert, error) {
	l, err := s.db.ListClientCerts(ctx, projectID)
	if l == nil {
		l = []*sandbox.ClientCert{}
	}
	return l, err
}

// RevokeCert revokes a certificate by serial, for the project's CA as it
// is (one made here or uploaded; the revocation holds for its keys). When
// it returns, the project's mtls URLs refuse it and what it opened is cut.
func (s *Service) RevokeCert(ctx context.Context, projectID, serial string) (*sandbox.ClientCert, error) {
	serial, err := normalSerial(serial)
	if err != nil {
		return nil, err
	}
	s.caChange.Lock()
	defer s.caChange.Unlock()
	ca, err := s.CA(ctx, projectID)
	if err != nil {
		return nil, err
	}
	certs, err := parseCerts(ca.Certificate)
	if err != nil {
		return nil, err
	}
	rec, err := s.db.GetClientCert(ctx, projectID, serial)
	if errors.Is(err, store.ErrNotFound) {
		rec, err = &sandbox.ClientCert{ProjectID: projectID, Serial: serial, CreatedAt: s.opts.Now().UTC()}, nil
	}
	if err != nil {
		return nil, err
	}
	for _, c := range certs {
		k := keyHash(c)
		if !slices.Contains(rec.IssuerKeys, k) {
			rec.IssuerKeys = append(rec.IssuerKeys, k)
		}
	}
	if rec.RevokedAt == nil {
		now := s.opts.Now().UTC()
		rec.RevokedAt = &now
	}
	if err := s.db.PutClientCert(ctx, rec); err != nil {
		return nil, err
	}
	s.changed(ctx, projectID)
	s.tellHosts(ctx, projectID)
	return rec, nil
}

// maxClientChain bounds what a client's certificate chain may hold before
// anything is verified: anyone can send one.
const (
	maxClientChain      = 4
	maxClientChainBytes = 32 << 10
)

// clientTLS asks for a client certificate in the handshakes of mtls URLs'
// hosts (checked per request, in checkCert); other hosts do not ask.
func (s *Service) clientTLS(base *tls.Config) func(*tls.ClientHelloInfo) (*tls.Config, error) {
	withCert := base.Clone()
	withCert.ClientAuth = tls.RequireAnyClientCert
	withCert.GetConfigForClient = nil
	withCert.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
		n := 0
		for _, c := range raw {
			n += len(c)
		}
		if len(raw) > maxClientChain || n > maxClientChainBytes {
			return fmt.Errorf("ingress: a client certificate chain of %d certificates, %d bytes (at most %d, %d)", len(raw), n, maxClientChain, maxClientChainBytes)
		}
		return nil // checked per request, against the project's CA then
	}
	return func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		t, ok := s.hostForm(h.ServerName)
		if !ok {
			return nil, nil
		}
		if e := s.published(t); e != nil && e.auth == sandbox.URLAuthMTLS {
			return withCert, nil
		} else if e == nil && s.remoteAuth(t) == sandbox.URLAuthMTLS {
			return withCert, nil // (another host checks it)
		}
		return nil, nil
	}
}

// hostForm is the guest port whose URL's host form is host, if it is one.
func (s *Service) hostForm(host string) (target, bool) {
	label, ok := strings.CutSuffix(strings.ToLower(host), "."+strings.ToLower(s.opts.Base.Hostname()))
	if !ok {
		return target{}, false
	}
	return hostTarget(label)
}

// checked is what checkCert found of a request's client certificate.
type checked struct {
	who string // "mtls", and once verified ":NAME:SERIAL"
	// cert is its revocation key; ca the CA it was verified against;
	// notAfter the chain's earliest expiry.
	cert     string
	ca       *authority
	notAfter time.Time
}

// checkCert checks the client certificate of a request to an mtls URL
// against its project's CA, but for revocation (which the caller checks
// under e.mu with stillGood). It returns the status to refuse with (0:
// allowed) and why.
func (s *Service) checkCert(r *http.Request, e *entry, cookiePath string) (ck checked, status int, msg string) {
	ck.who = "mtls"
	if cookiePath != "/" {
		return ck, http.StatusForbidden, "this URL takes client certificates in its host form only: " + s.view(&e.rec, "").URL
	}
	cs := clientTLS(r)
	if cs == nil {
		return ck, http.StatusForbidden, "this URL needs TLS with a client certificate"
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if !strings.EqualFold(cs.ServerName, host) {
		// A connection made for another host (HTTP/2 reuses them) did
		// not ask for a certificate: the client is to connect anew.
		return ck, http.StatusMisdirectedRequest, "connect to this URL's host anew to present a client certificate"
	}
	if len(cs.PeerCertificates) == 0 {
		return ck, http.StatusUnauthorized, "this URL needs a client certificate"
	}
	a, err := s.authorityOf(r.Context(), e.project)
	if err != nil {
		s.opts.Log.Error("ingress: cannot load a project's CA", "project", e.project, "err", err)
		return ck, http.StatusServiceUnavailable, "this URL's certificate authority cannot be read"
	}
	if a.roots == nil {
		return ck, http.StatusForbidden, "this URL's project has no certificate authority"
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	chains, err := leaf.Verify(x509.VerifyOptions{Roots: a.roots, Intermediates: inter, CurrentTime: s.opts.Now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil || len(chains) == 0 {
		return ck, http.StatusForbidden, "this URL does not accept your client certificate"
	}
	chain := chains[0]
	issuer := chain[0]
	if len(chain) > 1 {
		issuer = chain[1]
	}
	serial := serialText(leaf.SerialNumber)
	ck = checked{who: "mtls:" + printable(leaf.Subject.CommonName, 64) + ":" + serial,
		cert: revocationKey(keyHash(issuer), serial), ca: a, notAfter: leaf.NotAfter}
	for _, c := range chain {
		if c.NotAfter.Before(ck.notAfter) {
			ck.notAfter = c.NotAfter
		}
	}
	return ck, 0, ""
}

// stillGood says whether a certificate checked against its CA is still
// accepted: the project's CA is the same and the certificate not revoked.
// The caller holds e.mu, which every change takes after it puts its new
// CA in force (so a request either sees the change here or is cut by it).
func (s *Service) stillGood(e *entry, ck checked) bool {
	cur := s.current(e.project)
	return cur != nil && cur.roots != nil && cur.roots == ck.ca.roots && !cur.revoked[ck.cert]
}

// printable is s with what is not printable ASCII replaced, cut to max.
func printable(s string, max int) string {
	b := []byte(s)
	if len(b) > max {
		b = b[:max]
	}
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			b[i] = '?'
		}
	}
	return string(b)
}
