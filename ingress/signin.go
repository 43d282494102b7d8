package ingress

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
)

// Browser sign-in for oidc URLs: the authorization code flow with PKCE,
// as a public client (the rule's audience is the client ID; no secret).
//
// One redirect URI serves every URL: https://HOST/.harebox/oidc/callback
// on the ingress's base host. A browser that opens an oidc URL without a
// session is sent to the issuer with a state, a nonce and a PKCE
// challenge kept here; the callback exchanges the code (with the
// verifier), checks the ID token (and its nonce) against the URL's rule,
// makes a session and sends the browser back to the URL's own host with a
// one-time ticket, which that host swaps for the session cookie (host
// form: each URL is an origin of its own, which a cookie set on the base
// host would not reach). Sessions and tickets live in memory: a restart
// signs everyone out.

// Paths the ingress keeps for itself.
const (
	CallbackPath = "/.harebox/oidc/callback" // on the base host
	SessionPath  = "/.harebox/oidc/session"  // under every URL
	// SessionCookie holds a signed-in browser's session on a URL.
	SessionCookie = "harebox_session"
)

const (
	signInTTL  = 10 * time.Minute // to come back from the issuer
	ticketTTL  = time.Minute      // to take the ticket to the URL
	sessionMax = 12 * time.Hour   // a session, at most (else the token's expiry)
	maxPending = 10000            // sign-ins in flight, and tickets, each
)

// signIns holds the sign-ins in flight, tickets and sessions.
type signIns struct {
	mu       sync.Mutex
	pending  map[string]*pending
	tickets  map[string]*ticket
	sessions map[[sha256.Size]byte]*session
}

type pending struct {
	e          *entry
	verifier   string
	nonce      string
	returnTo   string // the URL the browser asked for
	sessionURL string // the URL's session endpoint
	exp        time.Time
}

type ticket struct {
	e        *entry
	session  string
	returnTo string
	exp      time.Time
}

type session struct {
	e   *entry
	who string
	exp time.Time
}

func random() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// purgeLocked drops what has expired. The caller holds mu.
func (si *signIns) purgeLocked(now time.Time) {
	for k, p := range si.pending {
		if now.After(p.exp) {
			delete(si.pending, k)
		}
	}
	for k, t := range si.tickets {
		if now.After(t.exp) {
			delete(si.tickets, k)
		}
	}
	for k, ss := range si.sessions {
		if now.After(ss.exp) {
			delete(si.sessions, k)
		}
	}
}

// wantsPage says whether a request is a browser opening a page (which is
// sent to sign in), not a script or a machine (which gets 401).
func wantsPage(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	if m := r.Header.Get("Sec-Fetch-Mode"); m != "" {
		return m == "navigate"
	}
	return strings.Contains(r.Header.Get("Accept"), "text/html")
}

func (s *Service) oauthConfig(e *entry, p *oidc.Provider) *oauth2.Config {
	b := *s.opts.Base
	b.Path = CallbackPath
	ep := p.Endpoint()
	ep.AuthStyle = oauth2.AuthStyleInParams // a public client: its ID in the form, no secret
	return &oauth2.Config{ClientID: e.rule.Audience, Endpoint: ep, RedirectURL: b.String(),
		Scopes: []string{oidc.ScopeOpenID, "email", "profile"}}
}

// signIn sends a browser to the URL's issuer. sessionURL is the URL's
// session endpoint (in the form the browser used).
func (s *Service) signIn(w http.ResponseWriter, r *http.Request, e *entry, sessionURL string) {
	p, err := s.provider(e.rule)
	if err != nil {
		s.refuse(w, e, "oidc", http.StatusServiceUnavailable)
		return
	}
	now := s.opts.Now()
	pd := &pending{e: e, verifier: oauth2.GenerateVerifier(), nonce: random(),
		returnTo: "https://" + r.Host + r.URL.RequestURI(), sessionURL: sessionURL, exp: now.Add(signInTTL)}
	// (It names this host: another host that gets the callback sends it
	// here, where the sign-in waits.)
	state := random()
	if h := s.hosts.Load(); h != nil {
		state += "." + (*h).Self()
	}
	s.signIns.mu.Lock()
	if s.signIns.pending == nil {
		s.signIns.pending = map[string]*pending{}
	}
	if len(s.signIns.pending) >= maxPending {
		s.signIns.purgeLocked(now)
	}
	full := len(s.signIns.pending) >= maxPending
	if !full {
		s.signIns.pending[state] = pd
	}
	s.signIns.mu.Unlock()
	if full {
		http.Error(w, "too many sign-ins in progress; try again", http.StatusServiceUnavailable)
		return
	}
	to := s.oauthConfig(e, p).AuthCodeURL(state, oauth2.S256ChallengeOption(pd.verifier), oidc.Nonce(pd.nonce))
	w.Header().Set("Cache-Control", "no-store")
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// callback finishes a sign-in: on the base host, back from the issuer.
func (s *Service) callback(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	now := s.opts.Now()
	s.signIns.mu.Lock()
	pd := s.signIns.pending[q.Get("state")]
	delete(s.signIns.pending, q.Get("state")) // one use
	s.signIns.mu.Unlock()
	w.Header().Set("Cache-Control", "no-store")
	if pd == nil || now.After(pd.exp) {
		http.Error(w, "this sign-in is unknown or expired; open the URL again", http.StatusBadRequest)
		return
	}
	e := pd.e
	if q.Get("error") != "" || q.Get("code") == "" {
		s.refuse(w, e, "oidc", http.StatusUnauthorized)
		return
	}
	p, err := s.provider(e.rule)
	if err != nil {
		s.refuse(w, e, "oidc", http.StatusServiceUnavailable)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithValue(r.Context(), oauth2.HTTPClient, s.client), 10*time.Second)
	defer cancel()
	tok, err := s.oauthConfig(e, p).Exchange(ctx, q.Get("code"), oauth2.VerifierOption(pd.verifier))
	if err != nil {
		s.opts.Log.Debug("ingress: code exchange failed", "url", e.id, "err", err)
		s.refuse(w, e, "oidc", http.StatusUnauthorized)
		return
	}
	raw, _ := tok.Extra("id_token").(string)
	who, exp, status := s.checkIDToken(ctx, e, raw, pd.nonce)
	if status != 0 {
		s.refuse(w, e, who, status)
		return
	}
	sess, tk := random(), random()
	s.signIns.mu.Lock()
	if s.signIns.tickets == nil {
		s.signIns.tickets = map[string]*ticket{}
		s.signIns.sessions = map[[sha256.Size]byte]*session{}
	}
	if len(s.signIns.tickets) >= maxPending || len(s.signIns.sessions) >= 100*maxPending {
		s.signIns.purgeLocked(now)
	}
	s.signIns.tickets[tk] = &ticket{e: e, session: sess, returnTo: pd.returnTo, exp: now.Add(ticketTTL)}
	if limit := now.Add(sessionMax); exp.After(limit) {
		exp = limit
	}
	s.signIns.sessions[sha256.Sum256([]byte(sess))] = &session{e: e, who: who, exp: exp}
	s.signIns.mu.Unlock()
	w.Header().Set("Referrer-Policy", "no-referrer")
	http.Redirect(w, r, pd.sessionURL+"?ticket="+tk, http.StatusSeeOther)
}

// takeTicket swaps a ticket, on the URL's own host, for the session
// cookie, and sends the browser on to where it was going.
func (s *Service) takeTicket(w http.ResponseWriter, r *http.Request, e *entry, cookiePath string) {
	now := s.opts.Now()
	tk := r.URL.Query().Get("ticket")
	s.signIns.mu.Lock()
	t := s.signIns.tickets[tk]
	delete(s.signIns.tickets, tk)
	var exp time.Time
	if t != nil {
		if ss := s.signIns.sessions[sha256.Sum256([]byte(t.session))]; ss != nil {
			exp = ss.exp
		}
	}
	s.signIns.mu.Unlock()
	w.Header().Set("Cache-Control", "no-store")
	if t == nil || t.e != e || now.After(t.exp) || exp.IsZero() {
		http.Error(w, "this sign-in ticket is unknown or expired; open the URL again", http.StatusBadRequest)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: t.session, Path: cookiePath, Expires: exp,
		HttpOnly: true, Secure: true, SameSite: http.SameSiteLaxMode})
	w.Header().Set("Referrer-Policy", "no-referrer")
	http.Redirect(w, r, t.returnTo, http.StatusSeeOther)
}

// sessionOf returns who a request's session cookie signs in on e, if it
// does.
func (s *Service) sessionOf(r *http.Request, e *entry) (string, bool) {
	c, err := r.Cookie(SessionCookie)
	if err != nil || len(c.Value) > 128 {
		return "", false
	}
	s.signIns.mu.Lock()
	defer s.signIns.mu.Unlock()
	ss := s.signIns.sessions[sha256.Sum256([]byte(c.Value))]
	if ss == nil || ss.e != e || s.opts.Now().After(ss.exp) {
		return "", false
	}
	return ss.who, true
}
