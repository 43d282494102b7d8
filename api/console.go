package api

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/harebox/harebox/apikey"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/console"
	"github.com/harebox/harebox/sandbox"
)

// The console (package console) is served on the API's listener: its page
// at /console/, and its sessions at /console/session. A request that
// carries a session's cookie and no Authorization header is the session's
// key's request if it also carries the session's CSRF token (every
// request, reads too: the cookie alone is worth nothing, so a cookie that
// leaks to a sandbox's page on the same host name, or that such a page
// sets, opens nothing), and if a browser's Origin, when it sends one,
// names this server. Everything else (routes, authorization, audit,
// forwarding to another host) is what the key's own request would get.

func (s *Server) consoleRoutes() {
	assets := console.Handler()
	s.mux.Handle("GET /console", assets)
	s.mux.Handle("GET /console/", assets)
	s.mux.Handle("POST /console/session", s.consoleHandler(s.signIn))
	s.mux.Handle("GET /console/session", s.consoleHandler(s.session))
	s.mux.Handle("DELETE /console/session", s.consoleHandler(s.signOut))
}

func (s *Server) consoleHandler(h func(w http.ResponseWriter, r *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		console.SecurityHeaders(w.Header())
		w.Header().Set("Cache-Control", "no-store")
		if !sameOrigin(r) {
			writeError(w, apiError{status: http.StatusForbidden, code: "forbidden", msg: "the console's session calls must come from its own page"})
			return
		}
		if err := h(w, r); err != nil {
			writeError(w, toAPIError(err))
		}
	})
}

// sessionReply is what sign-in and GET /console/session answer.
type sessionReply struct {
	CSRFToken string          `json:"csrf_token"`
	ExpiresAt time.Time       `json:"expires_at"`
	Principal authz.Principal `json:"principal"`
}

// signIn exchanges an API key for a session: the key is authenticated as
// a bearer key would be (its CIDRs against the caller's address included).
func (s *Server) signIn(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Key string `json:"key"`
	}
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	if req.Key == "" {
		return badRequest("key", "an API key is required")
	}
	r.Header.Set("Authorization", "Bearer "+req.Key)
	ctx, err := s.authenticate(r)
	if err != nil {
		return err
	}
	p := authz.From(ctx)
	id, sess, err := s.sessions.Open(ctx, p.KeyID, req.Key)
	if err != nil {
		return err
	}
	s.eng.Audit().Record(ctx, "signIn", p.AccountID, "console", nil)
	http.SetCookie(w, &http.Cookie{Name: console.Cookie, Value: id, Path: "/", HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	writeJSON(w, http.StatusOK, sessionReply{CSRFToken: sess.CSRF, ExpiresAt: sess.Expires.UTC(), Principal: p})
	return nil
}

// session answers who the session is (the page, reloaded, asks with the
// token it kept).
func (s *Server) session(w http.ResponseWriter, r *http.Request) error {
	sess, _, err := s.cookieSession(r)
	if err != nil {
		return err
	}
	r.Header.Set("Authorization", "Bearer "+sess.Key)
	ctx, err := s.authenticate(r)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sessionReply{CSRFToken: sess.CSRF, ExpiresAt: sess.Expires.UTC(), Principal: authz.From(ctx)})
	return nil
}

func (s *Server) signOut(w http.ResponseWriter, r *http.Request) error {
	_, id, err := s.cookieSession(r)
	if err != nil {
		return err
	}
	if err := s.sessions.Close(r.Context(), id); err != nil {
		return err
	}
	http.SetCookie(w, &http.Cookie{Name: console.Cookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// cookieSession is the request's open session, if the request carries
// its CSRF token: in CSRFHeader, or, for a WebSocket's handshake (a
// browser cannot add a header to it), in the query parameter csrf_token,
// which is then taken off.
func (s *Server) cookieSession(r *http.Request) (apikey.Session, string, error) {
	c, err := r.Cookie(console.Cookie)
	if err != nil {
		return apikey.Session{}, "", sandbox.Errorf(sandbox.ErrUnauthenticated, "", "not signed in to the console")
	}
	token := r.Header.Get(console.CSRFHeader)
	if q := r.URL.Query(); token == "" && q.Has(console.CSRFParam) && strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		token = q.Get(console.CSRFParam)
		q.Del(console.CSRFParam)
		r.URL.RawQuery = q.Encode()
	}
	if token == "" { // (a stray cookie costs no read of the store)
		return apikey.Session{}, "", sandbox.Errorf(sandbox.ErrUnauthenticated, "", "the console session's token is missing (%s): sign in again", console.CSRFHeader)
	}
	sess, err := s.sessions.Get(r.Context(), c.Value)
	if errors.Is(err, apikey.ErrSessionEnded) {
		return apikey.Session{}, "", sandbox.Errorf(sandbox.ErrUnauthenticated, "", "the console session ended: sign in again")
	}
	if err != nil {
		return apikey.Session{}, "", err
	}
	if !sess.CheckCSRF(token) {
		return apikey.Session{}, "", sandbox.Errorf(sandbox.ErrUnauthenticated, "", "the console session's token is missing or wrong (%s): sign in again", console.CSRFHeader)
	}
	return sess, c.Value, nil
}

// fromSession makes a request that carries a session's cookie (and no
// Authorization of its own) the session's key's request. The cookie is
// taken off: what follows sees a bearer key, as from any client.
func (s *Server) fromSession(r *http.Request) error {
	if s.opts.NoConsole || r.Header.Get("Authorization") != "" {
		return nil
	}
	if _, err := r.Cookie(console.Cookie); err != nil {
		return nil
	}
	sess, _, err := s.cookieSession(r)
	if err != nil {
		return err
	}
	if !sameOrigin(r) {
		return sandbox.Errorf(sandbox.ErrForbidden, "", "a console session's requests must come from its own page")
	}
	r.Header.Del("Cookie")
	r.Header.Del(console.CSRFHeader)
	r.Header.Set("Authorization", "Bearer "+sess.Key)
	return nil
}

// sameOrigin: a browser's Origin, if it sent one, names this server (a
// WebSocket or a cross-site form would carry another).
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}
