package apikey

import (
	"context"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// Sessions stand for keys in browsers: the web console signs in with a
// key and gets a session. The browser holds the session's ID only. The
// store holds the ID's hash, and the key's secret with the session's CSRF
// token sealed under a key derived from the ID: every host of a
// deployment honours a session and a restart keeps it, while the store
// alone (a dump, a backup) opens no session and yields no key. The caller
// authenticates the key again on each request made with a session, so a
// revoked key's sessions are refused at once.
type Sessions struct {
	db   Store
	opts SessionOptions
}

// SessionOptions bound sessions; zero fields take the defaults.
type SessionOptions struct {
	// Lifetime ends a session this long after sign-in (8 h).
	Lifetime time.Duration
	// Idle ends a session not used for this long (30 min), counted to
	// the minute: a session's last use is written at most once a minute.
	Idle time.Duration
	// PerKey bounds a key's open sessions (32); past it, the key's
	// session nearest its end is closed to make room. The bound is per
	// key, so no tenant's sign-ins close another's sessions.
	PerKey int
	Now    func() time.Time
}

// Session is what a session stands for.
type Session struct {
	// Key is the secret of the API key the session stands for.
	Key string `json:"key"`
	// CSRF must come back on every request made with the session.
	CSRF    string    `json:"csrf"`
	Expires time.Time `json:"-"`
}

// ErrSessionEnded: the session is unknown, ended, or signed out.
var ErrSessionEnded error = sandbox.Errorf(sandbox.ErrUnauthenticated, "", "the session ended: sign in again")

// touchEvery is how stale a session's last use may be in the store.
const touchEvery = time.Minute

// Sessions returns the key service's sessions.
func (s *Service) Sessions(o SessionOptions) *Sessions {
	if o.Lifetime <= 0 {
		o.Lifetime = 8 * time.Hour
	}
	if o.Idle <= 0 {
		o.Idle = 30 * time.Minute
	}
	if o.PerKey <= 0 {
		o.PerKey = 32
	}
	if o.Now == nil {
		o.Now = s.now
	}
	return &Sessions{db: s.db, opts: o}
}

// Open starts a session for the key keyID ("" for the root key) whose
// secret is key, which the caller authenticated, and returns its ID, for
// the browser.
func (ss *Sessions) Open(ctx context.Context, keyID, key string) (string, Session, error) {
	if keyID == "" {
		keyID = "(root)" // (no key's ID: those start with IDPrefix)
	}
	id, csrf := random(), random()
	now := ss.opts.Now()
	sess := Session{Key: key, CSRF: csrf, Expires: now.Add(ss.opts.Lifetime)}
	plain, err := json.Marshal(sess)
	if err != nil {
		return "", Session{}, err
	}
	hash, seal := derive(id)
	sealed, err := secrets.Seal(seal, hash, plain)
	if err != nil {
		return "", Session{}, err
	}
	row := &store.Session{IDHash: hash, KeyID: keyID, Expires: sess.Expires, Used: now, Ends: ss.ends(sess.Expires, now), Sealed: sealed}
	err = ss.db.Update(ctx, func(tx Tx) error {
		if err := tx.PruneSessions(ctx, now, keyID, ss.opts.PerKey-1); err != nil {
			return err
		}
		return tx.PutSession(ctx, row)
	})
	if err != nil {
		return "", Session{}, fmt.Errorf("open a session: %w", err)
	}
	return id, sess, nil
}

// Get returns the session whose ID is id, if it is open, and counts it
// as used now. It is ErrSessionEnded if not.
func (ss *Sessions) Get(ctx context.Context, id string) (Session, error) {
	if !wellFormed(id) {
		return Session{}, ErrSessionEnded
	}
	hash, seal := derive(id)
	row, err := ss.db.GetSession(ctx, hash)
	if errors.Is(err, store.ErrNotFound) {
		return Session{}, ErrSessionEnded
	}
	if err != nil {
		return Session{}, fmt.Errorf("read a session: %w", err)
	}
	now := ss.opts.Now()
	if !now.Before(row.Ends) {
		ss.db.DeleteSession(ctx, hash) // (a prune would too)
		return Session{}, ErrSessionEnded
	}
	var sess Session
	plain, err := secrets.Open(seal, hash, row.Sealed)
	if err != nil || json.Unmarshal(plain, &sess) != nil || sess.Key == "" || sess.CSRF == "" {
		return Session{}, ErrSessionEnded // not what Open sealed under this ID
	}
	sess.Expires = row.Expires
	if now.Sub(row.Used) >= touchEvery {
		err := ss.db.TouchSession(ctx, hash, now, ss.ends(row.Expires, now))
		if errors.Is(err, store.ErrNotFound) {
			return Session{}, ErrSessionEnded // signed out meanwhile
		}
		if err != nil {
			return Session{}, fmt.Errorf("use a session: %w", err)
		}
	}
	return sess, nil
}

// Close ends the session whose ID is id (a sign-out); one that has
// ended is no error.
func (ss *Sessions) Close(ctx context.Context, id string) error {
	if !wellFormed(id) {
		return nil
	}
	hash, _ := derive(id)
	if err := ss.db.DeleteSession(ctx, hash); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("close a session: %w", err)
	}
	return nil
}

// CheckCSRF says whether token is the session's CSRF token, in constant
// time.
func (sess Session) CheckCSRF(token string) bool {
	return token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(sess.CSRF)) == 1
}

// ends is when a session used at used ends unless used again.
func (ss *Sessions) ends(expires, used time.Time) time.Time {
	if e := used.Add(ss.opts.Idle); e.Before(expires) {
		return e
	}
	return expires
}

// idBytes is a session ID's length in bytes (it is written in hex).
const idBytes = 32

func random() string {
	b := make([]byte, idBytes)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func wellFormed(id string) bool {
	if len(id) != 2*idBytes {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}

// derive gives a session ID's name in the store and the key its payload
// is sealed under: two keys drawn from the ID, neither of which gives the
// other.
func derive(id string) (hash string, seal []byte) {
	name, err := hkdf.Key(sha256.New, []byte(id), nil, "harebox session name", sha256.Size)
	if err != nil {
		panic(err) // (only for a length SHA-256 cannot give)
	}
	seal, err = hkdf.Key(sha256.New, []byte(id), nil, "harebox session seal", secrets.DataKeySize)
	if err != nil {
		panic(err)
	}
	return hex.EncodeToString(name), seal
}
