package ingress

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"

	"github.com/harebox/harebox/sandbox"
)

// OpenID Connect: a URL with auth oidc takes an ID token as a bearer
// token, checked by the maintained go-oidc library against its issuer's
// discovery document and its keys (a keySet: cached, and fetched again
// as the issuer rotates them).

// checkRule checks an oidc URL's rule beyond its field tags.
func checkRule(r *sandbox.OIDCRule) error {
	if r == nil {
		return sandbox.Errorf(sandbox.ErrInvalid, "oidc", "is required with auth oidc")
	}
	u, err := url.Parse(r.Issuer)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return sandbox.Errorf(sandbox.ErrInvalid, "oidc.issuer", "want an https URL without query or fragment")
	}
	if len(r.Subjects)+len(r.Emails)+len(r.Groups) == 0 {
		return sandbox.Errorf(sandbox.ErrInvalid, "oidc", "allows nobody: give subjects, emails or groups")
	}
	return nil
}

// issuer is one OpenID Connect issuer's provider, made on first use.
type issuer struct {
	mu   sync.Mutex
	p    *oidc.Provider
	keys *keySet
	algs []string // the signing algorithms it names
	err  error
	at   time.Time // of the last failed discovery
}

// issuers caches providers by issuer URL.
type issuers struct {
	mu sync.Mutex
	m  map[string]*issuer
}

// retryDiscovery is how long a failed discovery is not tried again.
const retryDiscovery = 10 * time.Second

func (s *Service) verifier(rule *sandbox.OIDCRule) (*oidc.IDTokenVerifier, *keySet, error) {
	is, err := s.issuer(rule)
	if err != nil {
		return nil, nil, err
	}
	return oidc.NewVerifier(rule.Issuer, is.keys, &oidc.Config{
		ClientID: rule.Audience, Now: s.opts.Now, SupportedSigningAlgs: is.algs}), is.keys, nil
}

// provider returns the rule's issuer's provider, discovering it on first
// use.
func (s *Service) provider(rule *sandbox.OIDCRule) (*oidc.Provider, error) {
	is, err := s.issuer(rule)
	if err != nil {
		return nil, err
	}
	return is.p, nil
}

// issuer returns the rule's issuer, discovered on first use.
func (s *Service) issuer(rule *sandbox.OIDCRule) (*issuer, error) {
	s.issuers.mu.Lock()
	if s.issuers.m == nil {
		s.issuers.m = map[string]*issuer{}
	}
	is := s.issuers.m[rule.Issuer]
	if is == nil {
		is = &issuer{}
		s.issuers.m[rule.Issuer] = is
	}
	s.issuers.mu.Unlock()
	is.mu.Lock()
	defer is.mu.Unlock()
	if is.p == nil {
		if is.err != nil && s.opts.Now().Sub(is.at) < retryDiscovery {
			return nil, is.err
		}
		p, err := oidc.NewProvider(oidc.ClientContext(s.bg, s.client), rule.Issuer)
		var keys *keySet
		var algs []string
		if err == nil {
			keys, algs, err = s.keysOf(p)
		}
		if err != nil {
			is.err, is.at = err, s.opts.Now()
			return nil, err
		}
		is.p, is.keys, is.algs, is.err = p, keys, algs, nil
	}
	return is, nil
}

// claims are what a rule looks at besides the subject.
type claims struct {
	Email         string   `json:"email"`
	EmailVerified *bool    `json:"email_verified"`
	Groups        []string `json:"groups"`
}

// checkOIDC checks a request's bearer ID token against e's rule: who it
// is ("oidc:SUBJECT"), and 0, or the status to refuse it with.
func (s *Service) checkOIDC(r *http.Request, e *entry) (string, int) {
	raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || raw == "" || len(raw) > 16<<10 {
		return "oidc", http.StatusUnauthorized
	}
	who, _, status := s.checkIDToken(r.Context(), e, raw, "")
	return who, status
}

// checkIDToken checks a raw ID token (and its nonce, when one is
// expected) against e's rule.
func (s *Service) checkIDToken(ctx context.Context, e *entry, raw, nonce string) (string, time.Time, int) {
	v, keys, err := s.verifier(e.rule)
	if err != nil {
		s.opts.Log.Warn("ingress: OpenID Connect discovery failed", "issuer", e.rule.Issuer, "err", err)
		return "oidc", time.Time{}, http.StatusServiceUnavailable
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tok, err := v.Verify(ctx, raw)
	if err == nil && nonce != "" && tok.Nonce != nonce {
		err = errors.New("wrong nonce")
	}
	if err != nil && keys.down.Load() {
		// (go-oidc keeps only the text of the key set's error.)
		s.opts.Log.Warn("ingress: an ID token could not be checked: the issuer's keys cannot be fetched", "issuer", e.rule.Issuer, "err", err)
		return "oidc", time.Time{}, http.StatusServiceUnavailable
	}
	if err != nil {
		s.opts.Log.Debug("ingress: ID token refused", "url", e.id, "err", err)
		return "oidc", time.Time{}, http.StatusUnauthorized
	}
	var c claims
	if err := tok.Claims(&c); err != nil {
		return "oidc", time.Time{}, http.StatusUnauthorized
	}
	sub := tok.Subject
	if len(sub) > 255 {
		sub = sub[:255]
	}
	who := "oidc:" + sub
	if allows(e.rule, tok.Subject, c) {
		return who, tok.Expiry, 0
	}
	return who, tok.Expiry, http.StatusForbidden
}

// allows says whether a rule lets a verified token's holder in.
func allows(r *sandbox.OIDCRule, subject string, c claims) bool {
	if slices.Contains(r.Subjects, subject) {
		return true
	}
	if c.Email != "" && (c.EmailVerified == nil || *c.EmailVerified) &&
		slices.ContainsFunc(r.Emails, func(e string) bool { return strings.EqualFold(e, c.Email) }) {
		return true
	}
	for _, g := range c.Groups {
		if slices.Contains(r.Groups, g) {
			return true
		}
	}
	return false
}
