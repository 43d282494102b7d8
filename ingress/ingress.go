// Package ingress publishes sandboxes' TCP ports as URLs behind an auth
// mode, served by the host's reverse proxy: the only way in to a guest.
//
// A URL has two forms on the ingress's listener: the host form
// https://PORT-ULID.DOMAIN/ (ULID: the sandbox ID without "sbx_"), and
// the path form https://DOMAIN/s/SANDBOX/PORT/ for hosts without wildcard
// DNS. Every request is authorized before it is proxied, and the
// credential used is taken off it: the guest never sees it.
//
// Token rotation is atomic. The token's hash is checked and the request
// registered under one lock; Rotate swaps the hash under that lock and,
// before it returns, cuts what the old token opened: requests and streams
// in flight (their writes fail from then on), WebSockets, and HTTP/1
// connections it was used on (closed with a reset, so nothing buffered
// goes out). A request sent after Rotate returns is checked against the
// new token only.
package ingress

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/console"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// TokenPrefix starts every URL token.
const TokenPrefix = "hburl_"

// Credential names: a header, the cookie a link's token is swapped for,
// and the link's query parameter.
const (
	TokenHeader = "X-HareBox-Token"
	CookieName  = "harebox_token"
	QueryParam  = "harebox_token"
)

// Store is what the service needs of the store: its URLs, URL CAs and
// client certificates.
type Store interface {
	ListURLs(ctx context.Context, sandboxID string) ([]*store.URL, error)
	PutURL(ctx context.Context, u *store.URL) error
	DeleteURL(ctx context.Context, id string) error
	GetURLCA(ctx context.Context, projectID string) (*store.URLCA, error)
	PutURLCA(ctx context.Context, ca *store.URLCA) error
	DeleteURLCA(ctx context.Context, projectID string) error
	ListClientCerts(ctx context.Context, projectID string) ([]*sandbox.ClientCert, error)
	GetClientCert(ctx context.Context, projectID, serial string) (*sandbox.ClientCert, error)
	PutClientCert(ctx context.Context, c *sandbox.ClientCert) error
	// Notify tells every host sharing the store (NoticeTopic).
	Notify(ctx context.Context, topic, payload string) error
}

// Options configure the service.
type Options struct {
	Store store.Store
	// Secrets keeps the keys of the URL CAs made here; nil: CAs can
	// only be uploaded.
	Secrets secrets.Store
	// Guests dials guest ports; nil: no port can be published.
	Guests network.Ingress
	// Base is the ingress's public address (https://HOST[:PORT]): path
	// forms are under it, host forms are PORT-ULID.HOST[:PORT]. Nil: no
	// ingress listens, and no port can be published.
	Base *url.URL
	// Record records an access decision for the audit log: the URL, who
	// ("token", or "oidc:" and the token's subject) and whether it was
	// allowed. Grants are recorded once per connection and URL, refusals
	// at most once a second per URL. Nil: nothing is recorded.
	Record func(u *sandbox.URL, who string, allowed bool)
	// HTTPClient asks OpenID Connect issuers for their configuration and
	// keys; nil: one with the system's roots and a 10 s timeout.
	HTTPClient *http.Client
	Log        *slog.Logger
	Now        func() time.Time
}

// Service keeps the published URLs, in the store and in memory (where the
// proxy checks them), and serves the ingress.
type Service struct {
	opts      Options
	db        Store
	transport *http.Transport
	proxy     *httputil.ReverseProxy

	mu     sync.RWMutex
	byID   map[string]*entry
	byPort map[target]*entry
	conns  sync.Map // net.Conn -> *conn, while open

	bg      context.Context // outlives calls: issuers' discovery
	client  *http.Client    // to OpenID Connect issuers
	issuers issuers
	signIns signIns

	// caChange serializes the changes of URL CAs and certificates with
	// their store writes; caMu guards cas, the projects' CAs as requests
	// check them (loaded on first use).
	caChange sync.Mutex
	caMu     sync.Mutex
	cas      map[string]*authority
	caGen    uint64 // counts changes, so a load never undoes one

	hosts  atomic.Pointer[Hosts] // nil: one host
	remote remoteAuths
	// nonce and connSeq name this host's client connections to the
	// hosts it forwards their requests to (connHeader).
	nonce   string
	connSeq atomic.Uint64
}

// target is a guest port.
type target struct {
	sandboxID string
	port      int
}

// entry is one URL in memory, with what was opened with its token.
type entry struct {
	id      string
	t       target // never changes, nor do auth, rule and project
	auth    string
	rule    *sandbox.OIDCRule
	project string

	// rot serializes the changes of a URL (rotate, delete) with their
	// store writes; mu guards what requests check, held only briefly.
	rot     sync.Mutex
	mu      sync.Mutex
	rec     store.URL
	hash    [sha256.Size]byte
	gone    bool
	streams map[*stream]struct{}
	conns   map[*conn]string // to the certificate they have (mtls: its revocation key)
	denied  time.Time        // the last refusal recorded
	// remote are the client connections of other hosts whose grant on
	// this URL is recorded (connHeader), at most maxRemoteGrants.
	remote map[string]bool
}

// New loads the published URLs.
func New(ctx context.Context, opts Options) (*Service, error) {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Service{opts: opts, db: opts.Store, byID: map[string]*entry{}, byPort: map[target]*entry{},
		bg: context.WithoutCancel(ctx), client: opts.HTTPClient, cas: map[string]*authority{}, nonce: random()[:12]}
	if s.client == nil {
		s.client = &http.Client{Timeout: 10 * time.Second}
	}
	recs, err := opts.Store.ListURLs(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("ingress: %w", err)
	}
	for _, r := range recs {
		if _, err := s.add(r); err != nil {
			opts.Log.Error("ingress: stored URL is unusable", "id", r.ID, "err", err)
		}
	}
	s.transport = &http.Transport{
		DialContext:         s.dial,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     60 * time.Second,
		// The guest is hostile: its headers are bounded (its body is
		// the client's to read, at the client's pace).
		MaxResponseHeaderBytes: 256 << 10,
	}
	s.proxy = &httputil.ReverseProxy{
		Rewrite:   s.rewrite,
		Transport: s.transport,
		// Bodies of unknown length (chunked: long polls, streams) and
		// event streams are flushed as the guest writes them (the
		// proxy's rule); sized ones are copied in large writes.
		FlushInterval:  0,
		BufferPool:     bufferPool{},
		ErrorHandler:   s.proxyError,
		ModifyResponse: guestResponse,
		ErrorLog:       slog.NewLogLogger(opts.Log.Handler(), slog.LevelDebug),
	}
	return s, nil
}

func (s *Service) add(r *store.URL) (*entry, error) {
	e := &entry{id: r.ID, t: target{r.SandboxID, r.Port}, auth: r.Auth, rule: r.OIDC, project: r.ProjectID, rec: *r,
		streams: map[*stream]struct{}{}, conns: map[*conn]string{}}
	switch r.Auth {
	case sandbox.URLAuthToken:
		h, err := hex.DecodeString(r.TokenHash)
		if err != nil || len(h) != sha256.Size {
			return nil, errors.New("bad token hash")
		}
		copy(e.hash[:], h)
	case sandbox.URLAuthOIDC:
		if r.OIDC == nil {
			return nil, errors.New("no OIDC rule")
		}
	case sandbox.URLAuthMTLS:
		if r.ProjectID == "" {
			return nil, errors.New("no project")
		}
	default:
		return nil, fmt.Errorf("unknown auth %q", r.Auth)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byID[r.ID] = e
	s.byPort[target{r.SandboxID, r.Port}] = e
	return e, nil
}

func newToken() (string, string) {
	b := make([]byte, 32)
	rand.Read(b)
	tok := TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
	h := sha256.Sum256([]byte(tok))
	return tok, hex.EncodeToString(h[:])
}

// Owner is the sandbox whose port is published, and where it belongs.
type Owner struct{ SandboxID, AccountID, ProjectID string }

// Create publishes a sandbox's port. The result carries the token, which
// is not kept.
func (s *Service) Create(ctx context.Context, owner Owner, req sandbox.URLRequest) (*sandbox.URL, error) {
	if err := sandbox.Validate(&req); err != nil {
		return nil, err
	}
	switch {
	case s.opts.Base == nil:
		return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "this server has no ingress (start hareboxd with --ingress-listen)")
	case s.opts.Guests == nil:
		return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "this server's sandbox network cannot let its ingress in (hareboxd --network none)")
	}
	if req.Auth == "" {
		req.Auth = sandbox.URLAuthToken
	}
	var tok, hash string
	switch req.Auth {
	case sandbox.URLAuthToken:
		if req.OIDC != nil {
			return nil, sandbox.Errorf(sandbox.ErrInvalid, "oidc", "is for auth oidc only")
		}
		tok, hash = newToken()
	case sandbox.URLAuthOIDC:
		if err := checkRule(req.OIDC); err != nil {
			return nil, err
		}
	case sandbox.URLAuthMTLS:
		switch {
		case req.OIDC != nil:
			return nil, sandbox.Errorf(sandbox.ErrInvalid, "oidc", "is for auth oidc only")
		case s.opts.Base.Scheme != "https":
			return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "this server's ingress has no TLS, which client certificates need")
		case net.ParseIP(s.opts.Base.Hostname()) != nil:
			return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "client certificates need a URL's host form, and this server's ingress is at an address (start hareboxd with an --ingress-url whose host is a name with wildcard DNS)")
		case owner.ProjectID == "":
			return nil, sandbox.Errorf(sandbox.ErrInvalid, "auth", "the sandbox has no project, whose CA client certificates are checked against")
		}
	}
	sandboxID := owner.SandboxID
	rec := &store.URL{URL: sandbox.URL{ID: sandbox.NewURLID(), SandboxID: sandboxID, AccountID: owner.AccountID, ProjectID: owner.ProjectID,
		Port: req.Port, Auth: req.Auth, OIDC: req.OIDC, CreatedAt: s.opts.Now().UTC()}, TokenHash: hash}
	if err := s.db.PutURL(ctx, rec); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, sandbox.Errorf(sandbox.ErrExists, "port", "port %d of %s is published already", req.Port, sandboxID)
		}
		return nil, err
	}
	if _, err := s.add(rec); err != nil {
		return nil, err
	}
	return s.view(rec, tok), nil
}

// view is a record as the API shows it; tok, when set, is shown once.
func (s *Service) view(r *store.URL, tok string) *sandbox.URL {
	u := r.URL
	if s.opts.Base != nil {
		b := *s.opts.Base
		u.PathURL = b.JoinPath("s", r.SandboxID, strconv.Itoa(r.Port)).String() + "/"
		u.URL = u.PathURL
		if net.ParseIP(b.Hostname()) == nil { // no host form under an address
			b.Host = strconv.Itoa(r.Port) + "-" + strings.TrimPrefix(r.SandboxID, sandbox.IDPrefix) + "." + b.Host
			b.Path = "/"
			u.URL = b.String()
		}
	}
	if tok != "" {
		u.Token = tok
		u.Link = u.URL + "?" + QueryParam + "=" + url.QueryEscape(tok)
	}
	return &u
}

// List returns a sandbox's URLs, oldest first: those the ingress serves,
// as Get, Rotate and Delete see them.
func (s *Service) List(ctx context.Context, sandboxID string) ([]*sandbox.URL, error) {
	s.mu.RLock()
	var es []*entry
	for _, e := range s.byID {
		if e.t.sandboxID == sandboxID {
			es = append(es, e)
		}
	}
	s.mu.RUnlock()
	out := []*sandbox.URL{}
	for _, e := range es {
		e.mu.Lock()
		out = append(out, s.view(&e.rec, ""))
		e.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b *sandbox.URL) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

func (s *Service) entry(sandboxID, id string) (*entry, error) {
	s.mu.RLock()
	e := s.byID[id]
	s.mu.RUnlock()
	if e == nil || e.t.sandboxID != sandboxID {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no URL %q on sandbox %s", id, sandboxID)
	}
	return e, nil
}

// Get returns one URL of a sandbox.
func (s *Service) Get(ctx context.Context, sandboxID, id string) (*sandbox.URL, error) {
	e, err := s.entry(sandboxID, id)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return s.view(&e.rec, ""), nil
}

// Rotate replaces a URL's token. When it returns, the new token works and
// the old one is refused, and everything the old one opened is cut.
func (s *Service) Rotate(ctx context.Context, sandboxID, id string) (*sandbox.URL, error) {
	e, err := s.entry(sandboxID, id)
	if err != nil {
		return nil, err
	}
	if e.auth != sandbox.URLAuthToken {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "", "URL %s has no token to rotate (auth %s)", id, e.auth)
	}
	tok, hash := newToken()
	e.rot.Lock()
	defer e.rot.Unlock()
	e.mu.Lock()
	rec, gone := e.rec, e.gone
	e.mu.Unlock()
	if gone {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no URL %q on sandbox %s", id, sandboxID)
	}
	now := s.opts.Now().UTC()
	rec.TokenHash, rec.RotatedAt = hash, &now
	// Stored first: once the new token is in force here, it is the one a
	// restart loads. (Delete, which also holds rot, cannot run between.)
	if err := s.db.PutURL(ctx, &rec); err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.rec = rec
	h, _ := hex.DecodeString(hash)
	copy(e.hash[:], h)
	streams, conns := e.takeLocked()
	e.mu.Unlock()
	// From here no request can register with the old token; what it
	// registered is cut before Rotate returns.
	cut(streams, conns)
	return s.view(&rec, tok), nil
}

// Delete unpublishes a URL: its port is closed to the ingress and what
// its token opened is cut.
func (s *Service) Delete(ctx context.Context, sandboxID, id string) error {
	e, err := s.entry(sandboxID, id)
	if err != nil {
		return err
	}
	if err := s.drop(ctx, e); err != nil {
		return err
	}
	if s.opts.Guests != nil {
		if err := s.opts.Guests.ClosePorts(ctx, sandboxID, uint16(e.t.port)); err != nil {
			s.opts.Log.Warn("ingress: cannot close port", "sandbox", sandboxID, "port", e.t.port, "err", err)
		}
	}
	return nil
}

// drop deletes a URL's record and takes it out of service: refused from
// now on, and what it opened cut.
func (s *Service) drop(ctx context.Context, e *entry) error {
	e.rot.Lock()
	defer e.rot.Unlock()
	if err := s.db.DeleteURL(ctx, e.id); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	s.mu.Lock()
	if s.byID[e.id] == e {
		delete(s.byID, e.id)
		delete(s.byPort, e.t)
	}
	s.mu.Unlock()
	e.mu.Lock()
	e.gone = true
	streams, conns := e.takeLocked()
	e.mu.Unlock()
	cut(streams, conns)
	return nil
}

// Took loads a sandbox's URLs as the store has them now, for a sandbox
// that moved to this host or resumes here (what this host loaded of them
// before may be stale: made, rotated or deleted where it ran), cutting
// what the entries it replaces carried.
func (s *Service) Took(ctx context.Context, sandboxID string) error {
	recs, err := s.db.ListURLs(ctx, sandboxID)
	if err != nil {
		return err
	}
	s.Left(sandboxID)
	for _, r := range recs {
		if _, err := s.add(r); err != nil {
			s.opts.Log.Error("ingress: stored URL is unusable", "id", r.ID, "err", err)
		}
	}
	return nil
}

// Left lets go of the URLs of a sandbox that moved to another host (its
// records stay: that host serves them now), cutting what they carried
// through this host to the sandbox here.
func (s *Service) Left(sandboxID string) {
	s.mu.Lock()
	var left []*entry
	for id, e := range s.byID {
		if e.t.sandboxID == sandboxID {
			left = append(left, e)
			delete(s.byID, id)
			delete(s.byPort, e.t)
		}
	}
	s.mu.Unlock()
	for _, e := range left {
		e.mu.Lock()
		e.gone = true
		streams, conns := e.takeLocked()
		e.mu.Unlock()
		cut(streams, conns)
	}
}

// Forget unpublishes every URL of a sandbox that is being deleted (its
// network goes with it).
func (s *Service) Forget(ctx context.Context, sandboxID string) error {
	recs, err := s.db.ListURLs(ctx, sandboxID)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		s.mu.RLock()
		e := s.byID[r.ID]
		s.mu.RUnlock()
		var err error
		if e != nil {
			err = s.drop(ctx, e)
		} else if err = s.db.DeleteURL(ctx, r.ID); errors.Is(err, store.ErrNotFound) {
			err = nil
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// takeLocked takes what the current credential opened, to cut. The
// caller holds e.mu.
func (e *entry) takeLocked() (map[*stream]struct{}, map[*conn]struct{}) {
	streams, conns := e.streams, map[*conn]struct{}{}
	for c := range e.conns {
		conns[c] = struct{}{}
	}
	e.streams, e.conns = map[*stream]struct{}{}, map[*conn]string{}
	return streams, conns
}

// cut ends streams and connections: HTTP/1 connections are reset first
// (a write in progress fails at once, nothing buffered goes out), then
// every stream is marked dead (its writes fail from now on), its HTTP/2
// stream reset and its request cancelled (which ends the guest's side).
// None of it waits for a client.
func cut(streams map[*stream]struct{}, conns map[*conn]struct{}) {
	for c := range conns {
		c.kill()
	}
	for st := range streams {
		st.cut()
	}
}

// Serve serves the ingress on ln, with TLS when tc is set (HTTP/2 then
// too), until ln is closed or ctx ends.
func (s *Service) Serve(ctx context.Context, ln net.Listener, tc *tls.Config) error {
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.opts.Log.Handler(), slog.LevelDebug),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			cn := &conn{c: c, id: s.nonce + "-" + strconv.FormatUint(s.connSeq.Add(1), 10)}
			s.conns.Store(c, cn)
			return context.WithValue(ctx, connKey{}, cn)
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				if cn, ok := s.conns.LoadAndDelete(c); ok && st == http.StateClosed {
					cn.(*conn).forget()
				}
			}
		},
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		srv.Close()
	}()
	var err error
	if tc != nil {
		srv.TLSConfig = tc.Clone()
		srv.TLSConfig.NextProtos = []string{"h2", "http/1.1"}
		srv.TLSConfig.GetConfigForClient = s.clientTLS(srv.TLSConfig)
		err = srv.ServeTLS(ln, "", "")
	} else {
		err = srv.Serve(ln)
	}
	s.transport.CloseIdleConnections()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// conn is a client connection of the ingress.
type conn struct {
	c  net.Conn
	id string // names it to another host this host forwards its requests to
	mu sync.Mutex
	// entries are the URLs whose token was used on the connection (and
	// whose grant on it is recorded).
	entries map[*entry]bool
}

type connKey struct{}

// kill closes the connection with a reset: what is still buffered for
// the client is dropped, not sent.
func (c *conn) kill() { reset(c.c) }

// reset closes a client connection with a reset.
func reset(raw net.Conn) {
	if tc, ok := raw.(*tls.Conn); ok {
		raw = tc.NetConn()
	}
	if tcp, ok := raw.(*net.TCPConn); ok {
		tcp.SetLinger(0)
	}
	raw.Close()
}

// firstGrant notes that e's token was used on c and says whether that is
// new (its grant not recorded yet).
func (c *conn) firstGrant(e *entry) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries[e] {
		return false
	}
	if c.entries == nil {
		c.entries = map[*entry]bool{}
	}
	c.entries[e] = true
	return true
}

// forget takes a closed connection off the URLs it was used for.
func (c *conn) forget() {
	c.mu.Lock()
	es := c.entries
	c.entries = nil
	c.mu.Unlock()
	for e := range es {
		e.mu.Lock()
		delete(e.conns, c)
		e.mu.Unlock()
	}
}

var hostLabel = regexp.MustCompile(`^([0-9]{1,5})-([0-9a-z]{26})$`)

// hostTarget is the guest port a host form's first label names.
func hostTarget(label string) (target, bool) {
	m := hostLabel.FindStringSubmatch(label)
	if m == nil {
		return target{}, false
	}
	port, _ := strconv.Atoi(m[1])
	return target{sandbox.IDPrefix + m[2], port}, true
}

// isBase says whether host (with or without a port) is the ingress's
// own host, not a URL's.
func (s *Service) isBase(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.EqualFold(host, s.opts.Base.Hostname())
}

// published is the URL of guest port t, or nil.
func (s *Service) published(t target) *entry {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byPort[t]
}

// parse reads the guest port a request names, the path to send to the
// guest (escaped) and the path the credential cookie is scoped to.
func (s *Service) parse(r *http.Request) (t target, path, cookiePath string, ok bool) {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	base := strings.ToLower(s.opts.Base.Hostname())
	path = r.URL.EscapedPath()
	cookiePath = "/"
	if label, ok := strings.CutSuffix(strings.ToLower(host), "."+base); ok {
		if t, ok = hostTarget(label); !ok {
			return target{}, "", "", false
		}
	} else {
		rest, ok := strings.CutPrefix(path, "/s/")
		if !ok {
			return target{}, "", "", false
		}
		parts := strings.SplitN(rest, "/", 3)
		if len(parts) < 2 || !sandbox.ValidID(parts[0]) {
			return target{}, "", "", false
		}
		port, err := strconv.Atoi(parts[1])
		if err != nil || port < 1 || port > 65535 || parts[1] != strconv.Itoa(port) {
			return target{}, "", "", false
		}
		t = target{parts[0], port}
		cookiePath = "/s/" + parts[0] + "/" + parts[1] + "/"
		path = "/"
		if len(parts) == 3 {
			path += parts[2]
		} else {
			path = "" // redirect to the trailing slash
		}
	}
	return t, path, cookiePath, true
}

// credential is the token a request presents, if any, and whether it
// came in the cookie (which a browser sends by itself).
func credential(r *http.Request) (string, bool) {
	if v := r.Header.Get(TokenHeader); v != "" {
		return v, false
	}
	if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && strings.HasPrefix(v, TokenPrefix) {
		return v, false
	}
	if c, err := r.Cookie(CookieName); err == nil {
		return c.Value, true
	}
	return "", false
}

// crossSite says whether a browser sent the request for a page of another
// origin, other than by navigating to it: the host forms of all URLs are
// one site, so a page of one sandbox could otherwise act on another's app
// with the cookie the browser holds for it.
func crossSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "cross-site", "same-site":
		return !(r.Header.Get("Sec-Fetch-Mode") == "navigate" && (r.Method == http.MethodGet || r.Method == http.MethodHead))
	}
	return false
}

// valid checks tok against e's hash; the caller holds e.mu.
func (e *entry) valid(tok string) bool {
	h := sha256.Sum256([]byte(tok))
	return !e.gone && e.auth == sandbox.URLAuthToken && subtle.ConstantTimeCompare(h[:], e.hash[:]) == 1
}

// stream is one authorized request in flight.
type stream struct {
	dead   atomic.Bool
	cancel context.CancelFunc
	cert   string // the client certificate it was let in with (mtls: its revocation key)
	// h2 is the HTTP/2 stream's writer (or, for a request from another
	// host, the HTTP/1 one), whose write deadline cut puts in the past
	// (which resets the stream, or fails the connection's writes); nil
	// for this host's own HTTP/1 clients, whose connection cut kills. It
	// may be used only until the handler returns (done), under mu.
	mu   sync.Mutex
	h2   http.ResponseWriter
	done bool
	// hijacked is the connection a WebSocket took over (cutWriter.Hijack),
	// which cut resets: for one that came from another host, this host
	// holds no client connection of its own to kill.
	hijacked net.Conn
}

func (st *stream) cut() {
	st.dead.Store(true)
	st.mu.Lock()
	if st.h2 != nil && !st.done {
		http.NewResponseController(st.h2).SetWriteDeadline(time.Unix(1, 0))
	}
	if st.hijacked != nil {
		reset(st.hijacked)
	}
	st.mu.Unlock()
	st.cancel()
}

// finish marks the handler done: its writer is not to be used again.
func (st *stream) finish() {
	st.mu.Lock()
	st.done = true
	st.mu.Unlock()
}

type routeKey struct{}

// routed is what rewrite needs of a request.
type routed struct {
	sandboxID string
	port      int
	path      string
	// cookiePath is where the URL's cookies live ("/" in the host form).
	cookiePath string
	// bearer: the Authorization header was the credential (oidc).
	bearer bool
}

// ServeHTTP is the ingress.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == CallbackPath && s.isBase(r.Host) {
		_, host, _ := strings.Cut(r.URL.Query().Get("state"), ".")
		if hosts := s.elsewhere(r); host != "" && hosts != nil && hosts.ForwardHost(w, r, host) {
			return
		}
		s.callback(w, r)
		return
	}
	t, path, cookiePath, ok := s.parse(r)
	if !ok {
		http.Error(w, "no such URL", http.StatusNotFound)
		return
	}
	if hosts := s.elsewhere(r); hosts != nil && s.forwardSandbox(w, r, hosts, t.sandboxID) {
		return
	}
	e := s.published(t)
	if e == nil {
		http.Error(w, "no such URL", http.StatusNotFound)
		return
	}
	if path == "" {
		to := r.URL.EscapedPath() + "/"
		if r.URL.RawQuery != "" {
			to += "?" + r.URL.RawQuery
		}
		http.Redirect(w, r, to, http.StatusPermanentRedirect)
		return
	}
	if cookiePath != "/" && r.Header.Get("Service-Worker") != "" {
		// Path-form URLs share one origin: a service worker of one
		// could see the others' requests, links and tokens included.
		http.Error(w, "service workers are refused on path-form URLs; use the host form", http.StatusForbidden)
		return
	}
	who := e.auth
	tok, fromCookie := credential(r)
	var ck checked // mtls: the client certificate
	if e.auth == sandbox.URLAuthOIDC {
		var status int
		if path == SessionPath {
			s.takeTicket(w, r, e, cookiePath)
			return
		}
		if strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
			who, status = s.checkOIDC(r, e)
			fromCookie = false
		} else if who, fromCookie = s.sessionOf(r, e); !fromCookie {
			if wantsPage(r) {
				s.signIn(w, r, e, "https://"+r.Host+cookiePath+strings.TrimPrefix(SessionPath, "/"))
				return
			}
			who, status = "oidc", http.StatusUnauthorized
		}
		if status != 0 {
			s.refuse(w, e, who, status)
			return
		}
	} else if e.auth == sandbox.URLAuthMTLS {
		var status int
		var msg string
		if ck, status, msg = s.checkCert(r, e, cookiePath); status != 0 {
			s.refuseWith(w, e, ck.who, status, msg)
			return
		}
		// A browser presents its certificate by itself, as it sends a
		// cookie: the same cross-site rule holds.
		who, fromCookie = ck.who, true
	} else if q := r.URL.Query(); q.Has(QueryParam) {
		s.exchange(w, r, e, q, cookiePath)
		return
	}
	c, _ := r.Context().Value(connKey{}).(*conn)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	st := &stream{cancel: cancel}
	if r.ProtoMajor == 2 || c == nil {
		// (A request from another host: no client connection of this
		// host's to kill, so a cut fails its writes at once this way.)
		st.h2 = w
	}
	if fromCookie && crossSite(r) {
		s.refuse(w, e, who, http.StatusForbidden)
		return
	}
	e.mu.Lock()
	if e.gone || (e.auth == sandbox.URLAuthToken && !e.valid(tok)) {
		e.mu.Unlock()
		s.refuse(w, e, who, http.StatusUnauthorized)
		return
	}
	if e.auth == sandbox.URLAuthMTLS && !s.stillGood(e, ck) {
		e.mu.Unlock()
		s.refuseWith(w, e, who, http.StatusForbidden, "this URL does not accept your client certificate")
		return
	}
	st.cert = ck.cert
	e.streams[st] = struct{}{}
	if c != nil && r.ProtoMajor == 1 {
		e.conns[c] = ck.cert
	}
	view := e.rec.URL
	e.mu.Unlock()
	upgrade := r.Header.Get("Upgrade") != ""
	if e.auth == sandbox.URLAuthMTLS {
		// A stream (a WebSocket, events) ends when its certificate does.
		expire := time.AfterFunc(ck.notAfter.Sub(s.opts.Now()), st.cut)
		defer expire.Stop()
	}
	defer func() {
		st.finish()
		e.mu.Lock()
		delete(e.streams, st)
		e.mu.Unlock()
		if upgrade && c != nil {
			c.forget() // the proxy hijacked it, and has closed it
		}
	}()
	if s.firstGrant(r, c, e) && s.opts.Record != nil {
		s.opts.Record(&view, who, true)
	}
	ctx = context.WithValue(ctx, routeKey{}, &routed{view.SandboxID, view.Port, path, cookiePath, e.auth == sandbox.URLAuthOIDC})
	// The guest's app may answer before it has read the request's body
	// (an early refusal, a stream): HTTP/1 would then consume and close
	// the body under the proxy's transport, which drops the connection
	// and the answer with it (golang/go#40747). Full duplex leaves the
	// body to the transport; closing it when done waits out a read still
	// in flight (golang/go#68560).
	http.NewResponseController(w).EnableFullDuplex()
	if r.Body != nil { // (a request made for ServeHTTP by hand may have none)
		defer r.Body.Close()
	}
	s.proxy.ServeHTTP(&cutWriter{ResponseWriter: w, st: st}, r.WithContext(ctx))
	if st.dead.Load() {
		// Cut: end the response as broken, never as a complete (empty)
		// one, which HTTP/2 would otherwise send.
		panic(http.ErrAbortHandler)
	}
}

// exchange swaps a link's token for a cookie and sends the browser on
// to the same URL without it.
func (s *Service) exchange(w http.ResponseWriter, r *http.Request, e *entry, q url.Values, cookiePath string) {
	tok := q.Get(QueryParam)
	e.mu.Lock()
	ok := e.valid(tok)
	view := e.rec.URL
	e.mu.Unlock()
	if !ok {
		s.refuse(w, e, e.auth, http.StatusUnauthorized)
		return
	}
	if s.opts.Record != nil {
		s.opts.Record(&view, e.auth, true)
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: tok, Path: cookiePath, HttpOnly: true,
		Secure: true, SameSite: http.SameSiteLaxMode})
	q.Del(QueryParam)
	u := url.URL{Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: q.Encode()}
	if p := u.EscapedPath(); len(p) > 1 && (p[1] == '/' || p[1] == '\\') {
		// "//host/..." would send the browser to another host.
		u = url.URL{Path: "/." + u.Path, RawQuery: u.RawQuery}
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer") // the next request must not name the link
	http.Redirect(w, r, u.String(), http.StatusSeeOther)
}

// refuse answers a request the URL's auth does not let through: 401
// without a valid credential, 403 with one that the rule does not allow,
// 503 when the issuer cannot be asked.
func (s *Service) refuse(w http.ResponseWriter, e *entry, who string, status int) {
	msg := "this URL needs its token"
	switch {
	case status == http.StatusServiceUnavailable:
		msg = "this URL's OpenID Connect issuer cannot be reached"
	case status == http.StatusForbidden:
		msg = "this URL does not allow you"
	case e.auth == sandbox.URLAuthOIDC:
		msg = "this URL needs an OpenID Connect ID token from its issuer (Authorization: Bearer)"
	}
	s.refuseWith(w, e, who, status, msg)
}

// refuseWith answers with status and msg, and records the refusal (a
// 503 or 421 is the server's or the connection's, not the client's).
func (s *Service) refuseWith(w http.ResponseWriter, e *entry, who string, status int, msg string) {
	e.mu.Lock()
	now := s.opts.Now()
	record := now.Sub(e.denied) >= time.Second
	if record {
		e.denied = now
	}
	view := e.rec.URL
	e.mu.Unlock()
	if record && s.opts.Record != nil && status != http.StatusServiceUnavailable && status != http.StatusMisdirectedRequest {
		s.opts.Record(&view, who, false)
	}
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="harebox"`)
	}
	http.Error(w, msg, status)
}

// rewrite makes the request the guest gets: its path, the original Host,
// X-Forwarded-*, and no HareBox credential.
func (s *Service) rewrite(pr *httputil.ProxyRequest) {
	rt := pr.In.Context().Value(routeKey{}).(*routed)
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = rt.sandboxID + ":" + strconv.Itoa(rt.port) // the dial key
	out.URL.RawPath = rt.path
	out.URL.Path, _ = url.PathUnescape(rt.path)
	if out.URL.Path == rt.path {
		out.URL.RawPath = ""
	}
	out.Host = pr.In.Host
	pr.SetXForwarded()
	if a := pr.In.Header.Get(cluster.HeaderClient); a != "" && cluster.FromHost(pr.In) {
		out.Header.Set("X-Forwarded-For", a) // (the client, not the host that forwarded it)
	}
	cluster.DropHostHeaders(out.Header)
	out.Header.Del(TokenHeader)
	if v := out.Header.Get("Authorization"); strings.HasPrefix(v, "Bearer "+TokenPrefix) || (rt.bearer && strings.HasPrefix(v, "Bearer ")) {
		out.Header.Del("Authorization")
	}
	// A browser following a link's redirect may name the link, token and
	// all, as the Referer.
	if ref, err := url.Parse(out.Header.Get("Referer")); err == nil && strings.Contains(ref.Path, "/.harebox/") {
		out.Header.Del("Referer") // the ingress's own pages (a sign-in's ticket)
	} else if err == nil && ref.Query().Has(QueryParam) {
		q := ref.Query()
		q.Del(QueryParam)
		ref.RawQuery = q.Encode()
		out.Header.Set("Referer", ref.String())
	}
	var keep []string
	for _, c := range out.Cookies() {
		if c.Name != CookieName && c.Name != SessionCookie && c.Name != console.Cookie {
			keep = append(keep, c.String())
		}
	}
	out.Header.Del("Cookie")
	if len(keep) > 0 {
		out.Header.Set("Cookie", strings.Join(keep, "; "))
	}
}

func (s *Service) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	id, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return nil, fmt.Errorf("ingress: bad port %q", p)
	}
	return s.opts.Guests.DialGuest(ctx, id, uint16(port))
}

func (s *Service) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // cut (rotated, deleted) or the client went away
	}
	rt := r.Context().Value(routeKey{}).(*routed)
	s.opts.Log.Debug("ingress: guest does not answer", "sandbox", rt.sandboxID, "port", rt.port, "err", err)
	http.Error(w, fmt.Sprintf("sandbox %s does not answer on port %d", rt.sandboxID, rt.port), http.StatusBadGateway)
}

// guestResponse keeps a guest's response to its own URL. Its cookies are
// the URL's only: one named like the ingress's is dropped (a guest must
// not replace the credential a browser holds), a Domain is taken off (it
// would reach every sandbox's host-form URL), and in the path form the
// Path is put under the URL's. In the path form, Service-Worker-Allowed is
// dropped (a worker's scope must not cover other URLs).
func guestResponse(resp *http.Response) error {
	rt, _ := resp.Request.Context().Value(routeKey{}).(*routed)
	if rt == nil {
		return nil
	}
	if rt.cookiePath != "/" {
		resp.Header.Del("Service-Worker-Allowed")
	}
	sc := resp.Header.Values("Set-Cookie")
	if len(sc) == 0 {
		return nil
	}
	resp.Header.Del("Set-Cookie")
	for _, v := range sc {
		c, err := http.ParseSetCookie(v)
		if err != nil || strings.EqualFold(c.Name, CookieName) || strings.EqualFold(c.Name, SessionCookie) || strings.EqualFold(c.Name, console.Cookie) {
			continue
		}
		if c.Domain == "" && (rt.cookiePath == "/" || strings.HasPrefix(c.Path, rt.cookiePath)) {
			resp.Header.Add("Set-Cookie", v) // as the guest wrote it
			continue
		}
		c.Domain = ""
		if rt.cookiePath != "/" && !strings.HasPrefix(c.Path, rt.cookiePath) {
			c.Path = rt.cookiePath + strings.TrimPrefix(c.Path, "/")
		}
		if s := c.String(); s != "" {
			resp.Header.Add("Set-Cookie", s)
		}
	}
	return nil
}

// bufferPool reuses the proxy's copy buffers.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

func (bufferPool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }

// cutWriter fails every write that starts once its stream is cut: nothing
// the guest writes after Rotate returns reaches a client of the old token.
type cutWriter struct {
	http.ResponseWriter
	st *stream
}

var errCut = errors.New("ingress: the URL's token was rotated")

func (w *cutWriter) Write(p []byte) (int, error) {
	if w.st.dead.Load() {
		return 0, errCut
	}
	return w.ResponseWriter.Write(p)
}

func (w *cutWriter) WriteHeader(code int) {
	if !w.st.dead.Load() {
		w.ResponseWriter.WriteHeader(code)
	}
}

func (w *cutWriter) Flush() {
	if !w.st.dead.Load() {
		http.NewResponseController(w.ResponseWriter).Flush()
	}
}

// Unwrap gives the proxy what else the writer can do.
func (w *cutWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack hands the proxy the connection for a WebSocket, kept on the
// stream: a cut resets it at once.
func (w *cutWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	w.st.mu.Lock()
	defer w.st.mu.Unlock()
	if w.st.dead.Load() {
		reset(c)
		return nil, nil, errCut
	}
	w.st.hijacked = c
	return c, brw, nil
}
