package console

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Cookie is the name of the cookie that carries a session's ID.
const Cookie = "harebox_console"

// CSRFHeader carries a session's CSRF token on every request made with
// the session; CSRFParam carries it on a WebSocket's handshake, to which
// a browser cannot add a header. The page keeps the token in its origin's
// storage, which a page on another port or host cannot read or write,
// whereas cookies are shared by every port of a host name.
const (
	CSRFHeader = "X-CSRF-Token"
	CSRFParam  = "csrf_token"
)

// Sessions are the console's signed-in browsers. A session stands for
// the API key it was opened with; the key stays here, in memory, and the
// browser holds only the session's ID, in an HttpOnly cookie. The server
// authenticates each request on a session with its key again, so a
// revoked key's session is refused at its next request. Sessions belong to
// the server that opened them: they end when it restarts.
type Sessions struct {
	opts SessionOptions
	mu   sync.Mutex
	// byID is keyed by the ID's SHA-256, so the map never holds an ID a
	// memory dump could replay.
	byID map[[32]byte]*Session
}

// SessionOptions bound the sessions; zero fields take the defaults.
type SessionOptions struct {
	// Lifetime ends a session this long after sign-in (8 h).
	Lifetime time.Duration
	// Idle ends a session not used for this long (30 min).
	Idle time.Duration
	// Max bounds the sessions open at once (10,000); past it, the one
	// closest to its end is closed to make room.
	Max int
	Now func() time.Time
}

// Session is one signed-in browser.
type Session struct {
	// Key is the API key the session stands for.
	Key string
	// CSRF must come back in CSRFHeader on every change.
	CSRF    string
	Expires time.Time
	used    time.Time
}

// NewSessions returns an empty set of sessions.
func NewSessions(o SessionOptions) *Sessions {
	if o.Lifetime <= 0 {
		o.Lifetime = 8 * time.Hour
	}
	if o.Idle <= 0 {
		o.Idle = 30 * time.Minute
	}
	if o.Max <= 0 {
		o.Max = 10000
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Sessions{opts: o, byID: map[[32]byte]*Session{}}
}

// Open starts a session for key and returns its ID (for the cookie) and
// the session.
func (s *Sessions) Open(key string) (string, Session) {
	id, csrf := random(), random()
	now := s.opts.Now()
	sess := &Session{Key: key, CSRF: csrf, Expires: now.Add(s.opts.Lifetime), used: now}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prune(now)
	for len(s.byID) >= s.opts.Max {
		var first [32]byte
		var end time.Time
		for k, v := range s.byID {
			if e := v.end(s.opts.Idle); end.IsZero() || e.Before(end) {
				first, end = k, e
			}
		}
		delete(s.byID, first)
	}
	s.byID[sha256.Sum256([]byte(id))] = sess
	return id, *sess
}

// Get returns the session with that ID, if it is open, and counts it as
// used now.
func (s *Sessions) Get(id string) (Session, bool) {
	k := sha256.Sum256([]byte(id))
	now := s.opts.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.byID[k]
	if !ok {
		return Session{}, false
	}
	if !now.Before(sess.end(s.opts.Idle)) {
		delete(s.byID, k)
		return Session{}, false
	}
	sess.used = now
	return *sess, true
}

// Close ends the session with that ID (sign-out).
func (s *Sessions) Close(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, sha256.Sum256([]byte(id)))
}

// Len is the number of sessions open.
func (s *Sessions) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prune(s.opts.Now())
	return len(s.byID)
}

// CheckCSRF says whether token is the session's CSRF token, in constant
// time.
func (sess Session) CheckCSRF(token string) bool {
	return token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(sess.CSRF)) == 1
}

// end is when the session ends unless it is used again.
func (sess *Session) end(idle time.Duration) time.Time {
	if e := sess.used.Add(idle); e.Before(sess.Expires) {
		return e
	}
	return sess.Expires
}

func (s *Sessions) prune(now time.Time) {
	for k, v := range s.byID {
		if !now.Before(v.end(s.opts.Idle)) {
			delete(s.byID, k)
		}
	}
}

func random() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// DropCookie takes the session's cookie off a request that goes to a
// sandbox (a proxy on the same host name gets it, as any port does).
func DropCookie(h http.Header) {
	var keep []string
	for _, c := range (&http.Request{Header: h}).Cookies() {
		if c.Name != Cookie {
			keep = append(keep, c.String())
		}
	}
	h.Del("Cookie")
	if len(keep) > 0 {
		h.Set("Cookie", strings.Join(keep, "; "))
	}
}

// DropSetCookie takes a sandbox's Set-Cookie for the session's cookie off
// its answer.
func DropSetCookie(h http.Header) {
	sc := h.Values("Set-Cookie")
	h.Del("Set-Cookie")
	for _, v := range sc {
		if c, err := http.ParseSetCookie(v); err == nil && !strings.EqualFold(c.Name, Cookie) {
			h.Add("Set-Cookie", v)
		}
	}
}
