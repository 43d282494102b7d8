package apikey

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
)

// CreateRequest describes a new key.
type CreateRequest struct {
	// AccountID is the key's account (ID or name); only the operator may
	// name one: a key creates keys in its own account.
	AccountID   string      `json:"account_id,omitempty" validate:"max=64"`
	Description string      `json:"description,omitempty" validate:"max=256"`
	Scope       authz.Scope `json:"scope"`
	// TTLSeconds makes the key expire that long after creation; 0 never.
	TTLSeconds int64 `json:"ttl_seconds,omitempty" validate:"gte=0,lte=31536000"`
	// Format is the form of its secret: "harebox" (the default) or "e2b"
	// (E2BPrefix and hex digits, which E2B's SDKs accept); its rotations
	// keep it.
	Format string `json:"format,omitempty" validate:"omitempty,oneof=harebox e2b"`
}

// Created is a key with its secret, which is shown only here.
type Created struct {
	*Key
	Secret string `json:"secret"`
}

// Tx is what the key calls need of a store transaction.
type Tx interface {
	tenant.Resolver
	GetKey(ctx context.Context, id string) (*store.Key, error)
	PutKey(ctx context.Context, k *store.Key) error
	ListKeys(ctx context.Context, accountID string) ([]*store.Key, error)
	Notify(ctx context.Context, topic, payload string) error
	PutSession(ctx context.Context, s *store.Session) error
	PruneSessions(ctx context.Context, now time.Time, keyID string, keep int) error
	DeleteKeySessions(ctx context.Context, keyID string) error
}

// Store is what the key service needs of the store: transactions over
// Tx, a key read outside one, the shared rate limits, and sessions read,
// touched and deleted outside a transaction.
type Store interface {
	Update(ctx context.Context, fn func(tx Tx) error) error
	GetKey(ctx context.Context, id string) (*store.Key, error)
	TakeToken(ctx context.Context, id string, perSecond float64, burst int, now time.Time) (time.Duration, error)
	GetSession(ctx context.Context, idHash string) (*store.Session, error)
	TouchSession(ctx context.Context, idHash string, used, ends time.Time) error
	DeleteSession(ctx context.Context, idHash string) error
}

// Service manages keys for the principal in the context. It caches keys in
// memory so that Authenticate costs a map lookup and a hash; every change
// goes through it, so the cache stays true on one host.
type Service struct {
	db      Store
	tenants *tenant.Service
	// Audit, if set, records every change.
	Audit *audit.Log
	// Shared: hosts share the store, and rate limits are counted there
	// (one bucket per key for the whole deployment) rather than in memory.
	Shared bool
	now    func() time.Time

	mu       sync.Mutex
	keys     map[string]*Key
	limiters map[string]*rate.Limiter
	// gen counts the cache's invalidations: a key read from the store
	// before one is not cached (it may be what was revoked meanwhile).
	gen uint64
}

// New returns a key service over db.
func New(db store.Store, tenants *tenant.Service) *Service {
	return &Service{db: store.Narrow(db, func(tx store.Tx) Tx { return tx }), tenants: tenants, now: time.Now, keys: map[string]*Key{}, limiters: map[string]*rate.Limiter{}}
}

var errBadKey = sandbox.Errorf(sandbox.ErrUnauthenticated, "", "invalid, expired or revoked API key")

// Authenticate turns a key's secret into its principal. A wrong, expired or
// revoked key is ErrUnauthenticated; a caller outside the key's CIDRs is
// ErrForbidden; a key (or one of the keys above it) past its rate is
// ErrRateLimited with RetryAfter.
func (s *Service) Authenticate(ctx context.Context, secret string) (authz.Principal, error) {
	id, ok := keyIDOf(secret)
	if !ok {
		return authz.Principal{}, errBadKey
	}
	k, err := s.cached(ctx, id)
	if err != nil {
		return authz.Principal{}, errBadKey
	}
	sum := sha256.Sum256([]byte(secret))
	if subtle.ConstantTimeCompare(sum[:], k.Hash) != 1 || !k.Active(s.now()) {
		return authz.Principal{}, errBadKey
	}
	addr, known := authz.Source(ctx)
	if !k.Scope.AllowsAddr(addr, known) {
		return authz.Principal{}, sandbox.Errorf(sandbox.ErrForbidden, "", "this API key may not be used from %s", addrString(addr, known))
	}
	if err := s.spend(ctx, k); err != nil {
		return authz.Principal{}, err
	}
	return authz.Principal{AccountID: k.AccountID, KeyID: k.ID, Scope: k.Scope}, nil
}

// Live reports whether the key id may still be used: not revoked, not
// expired (a stream opened with it ends when it may not). It spends none
// of the key's rate.
func (s *Service) Live(ctx context.Context, id string) bool {
	k, err := s.cached(ctx, id)
	return err == nil && k.Active(s.now())
}

func addrString(a interface{ String() string }, known bool) string {
	if !known {
		return "an unknown address"
	}
	return a.String()
}

// spend takes one request from the bucket of the key and of every key above
// it that has a rate, so keys a key creates cannot multiply its rate.
func (s *Service) spend(ctx context.Context, k *Key) error {
	chain := []*Key{k}
	for _, id := range k.Ancestors {
		a, err := s.cached(ctx, id)
		if err != nil {
			return errBadKey
		}
		chain = append(chain, a)
	}
	now := s.now()
	if s.Shared {
		return s.spendShared(ctx, chain, now)
	}
	var taken []*rate.Reservation
	var wait time.Duration
	s.mu.Lock()
	for _, c := range chain {
		if c.Scope.Rate == nil {
			continue
		}
		l := s.limiters[c.ID]
		if l == nil {
			l = rate.NewLimiter(rate.Limit(c.Scope.Rate.PerSecond), c.Scope.Rate.Burst)
			s.limiters[c.ID] = l
		}
		r := l.ReserveN(now, 1)
		taken = append(taken, r)
		if d := r.DelayFrom(now); d > wait {
			wait = d
		}
	}
	if wait > 0 {
		for _, r := range taken {
			r.CancelAt(now)
		}
	}
	s.mu.Unlock()
	if wait > 0 {
		return &sandbox.Error{Kind: sandbox.ErrRateLimited, Msg: fmt.Sprintf("this API key's rate is spent; retry in %v", wait.Round(time.Millisecond)), RetryAfter: wait}
	}
	return nil
}

// spendShared takes from buckets in the store that every host of the
// deployment shares, the top key's first: a key limited there takes
// nothing from those below it. (One limited below its ancestors has
// taken from theirs: they count a request that was refused.)
func (s *Service) spendShared(ctx context.Context, chain []*Key, now time.Time) error {
	for i := len(chain) - 1; i >= 0; i-- {
		c := chain[i]
		if c.Scope.Rate == nil {
			continue
		}
		wait, err := s.db.TakeToken(ctx, c.ID, c.Scope.Rate.PerSecond, c.Scope.Rate.Burst, now)
		if err != nil {
			return &sandbox.Error{Kind: sandbox.ErrUnavailable, Msg: "the rate limit cannot be read from the database; try again", Err: err}
		}
		if wait > 0 {
			return &sandbox.Error{Kind: sandbox.ErrRateLimited, Msg: fmt.Sprintf("this API key's rate is spent; retry in %v", wait.Round(time.Millisecond)), RetryAfter: wait}
		}
	}
	return nil
}

// cached returns a key from the cache, loading it on a miss.
func (s *Service) cached(ctx context.Context, id string) (*Key, error) {
	s.mu.Lock()
	k, gen := s.keys[id], s.gen
	s.mu.Unlock()
	if k != nil {
		return k, nil
	}
	k, err := s.db.GetKey(ctx, id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.gen == gen {
		s.keys[id] = k
	}
	s.mu.Unlock()
	return k, nil
}

// ForgetAccount drops an account's keys from the cache: they were changed
// in the store by someone else (the account's deletion revokes them).
func (s *Service) ForgetAccount(accountID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	for id, k := range s.keys {
		if k.AccountID == accountID {
			delete(s.keys, id)
		}
	}
}

// NoticeTopic is the store notice of a key's change (revoked, rotated):
// every host that shares the store drops the key from its cache (Changed).
const NoticeTopic = "key"

// Changed drops a key changed by another host from the cache, or every
// key when id is "" (changes may have been missed).
func (s *Service) Changed(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	if id == "" {
		clear(s.keys)
		return
	}
	delete(s.keys, id)
}

// forget drops keys from the cache after a change.
func (s *Service) forget(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	for _, id := range ids {
		delete(s.keys, id)
	}
}

// Create makes a key. A key may only create keys in its own account that
// are narrower than or equal to itself on every dimension.
func (s *Service) Create(ctx context.Context, r CreateRequest) (out *Created, err error) {
	defer func() {
		target, account := "", ""
		if out != nil {
			target, account = out.ID, out.AccountID
		}
		s.Audit.Record(ctx, "createKey", account, target, err)
	}()
	p := authz.From(ctx)
	if err := authz.Allowed(p, "createKey"); err != nil {
		return nil, err
	}
	if err := sandbox.Validate(&r); err != nil {
		return nil, err
	}
	if err := r.Scope.Validate(); err != nil {
		return nil, err
	}
	now := s.now().UTC()
	k := &Key{ID: tenant.NewID(IDPrefix), Description: r.Description, Scope: r.Scope, CreatedAt: now}
	if r.TTLSeconds > 0 {
		exp := now.Add(time.Duration(r.TTLSeconds) * time.Second)
		k.ExpiresAt = &exp
	}
	secret, hash, err := newSecret(k.ID, r.Format)
	if err != nil {
		return nil, err
	}
	k.Hash, k.Hint = hash, hint(secret)
	err = s.db.Update(ctx, func(tx Tx) error {
		acc, err := s.tenants.Account(ctx, tx, r.AccountID)
		if err != nil {
			return err
		}
		k.AccountID = acc.ID
		// Projects are named by ID or name; the key keeps IDs.
		k.Scope.Projects = slices.Clone(r.Scope.Projects)
		for i, ref := range r.Scope.Projects {
			pr, err := s.tenants.Project(ctx, tx, acc, ref)
			if err != nil {
				return sandbox.Errorf(sandbox.ErrInvalid, fmt.Sprintf("scope.projects[%d]", i), "no project %q", ref)
			}
			k.Scope.Projects[i] = pr.ID
		}
		if !p.Operator {
			parent, err := tx.GetKey(ctx, p.KeyID)
			if err != nil || !parent.Active(now) {
				return errBadKey
			}
			var exp, pexp time.Time
			if k.ExpiresAt != nil {
				exp = *k.ExpiresAt
			}
			if parent.ExpiresAt != nil {
				pexp = *parent.ExpiresAt
			}
			if err := k.Scope.Within(&parent.Scope, exp, pexp); err != nil {
				return err
			}
			k.ParentID = parent.ID
			k.Ancestors = append([]string{parent.ID}, parent.Ancestors...)
		}
		return tx.PutKey(ctx, k)
	})
	if err != nil {
		return nil, err
	}
	return &Created{Key: k, Secret: secret}, nil
}

func accountOf(k *Key) string {
	if k == nil {
		return ""
	}
	return k.AccountID
}

// target describes k for authz.
func target(k *Key) authz.Target {
	return authz.Target{AccountID: k.AccountID, KeyID: k.ID, KeyAncestors: k.Ancestors}
}

// visible loads a key the principal may act on with action.
func (s *Service) visible(ctx context.Context, tx Tx, action, id string) (*Key, error) {
	if err := authz.Allowed(authz.From(ctx), action); err != nil {
		return nil, err
	}
	k, err := tx.GetKey(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && authz.Decide(authz.From(ctx), action, target(k)) != nil) {
		return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no key %q", id)
	}
	return k, err
}

// List returns the keys the principal sees (a key sees itself and the keys
// below it), oldest first. accountRef narrows the operator's list.
func (s *Service) List(ctx context.Context, accountRef string) ([]*Key, error) {
	p := authz.From(ctx)
	if err := authz.Allowed(p, "listKeys"); err != nil {
		return nil, err
	}
	out := []*Key{}
	err := s.db.Update(ctx, func(tx Tx) error {
		acc := ""
		if accountRef != "" || !p.Operator {
			a, err := s.tenants.Account(ctx, tx, accountRef)
			if err != nil {
				return err
			}
			acc = a.ID
		}
		all, err := tx.ListKeys(ctx, acc)
		for _, k := range all {
			if authz.Visible(p, target(k)) {
				out = append(out, k)
			}
		}
		return err
	})
	return out, err
}

// Get returns a key.
func (s *Service) Get(ctx context.Context, id string) (*Key, error) {
	var k *Key
	err := s.db.Update(ctx, func(tx Tx) (err error) {
		k, err = s.visible(ctx, tx, "getKey", id)
		return err
	})
	return k, err
}

// Revoke revokes a key and every key below it, at once and for good.
func (s *Service) Revoke(ctx context.Context, id string) (out *Key, err error) {
	defer func() { s.Audit.Record(ctx, "revokeKey", accountOf(out), id, err) }()
	var k *Key
	var gone []string
	err = s.db.Update(ctx, func(tx Tx) (err error) {
		k, err = s.visible(ctx, tx, "revokeKey", id)
		if err != nil {
			return err
		}
		all, err := tx.ListKeys(ctx, k.AccountID)
		if err != nil {
			return err
		}
		now := s.now().UTC()
		gone = gone[:0]
		for _, c := range all {
			if (c.ID == k.ID || slices.Contains(c.Ancestors, k.ID)) && c.RevokedAt == nil {
				c.RevokedAt = &now
				if err := tx.PutKey(ctx, c); err != nil {
					return err
				}
				// (Its sessions could open nothing now; they hold its secret.)
				if err := tx.DeleteKeySessions(ctx, c.ID); err != nil {
					return err
				}
				if err := tx.Notify(ctx, NoticeTopic, c.ID); err != nil {
					return err
				}
				gone = append(gone, c.ID)
				if c.ID == k.ID {
					k = c
				}
			}
		}
		return nil
	})
	s.forget(gone...)
	if err != nil {
		return nil, err
	}
	return k, nil
}

// Rotate replaces a key's secret: the old one stops working when Rotate
// returns, the new one is shown once. Scope and children stay.
func (s *Service) Rotate(ctx context.Context, id string) (out *Created, err error) {
	defer func() {
		var k *Key
		if out != nil {
			k = out.Key
		}
		s.Audit.Record(ctx, "rotateKey", accountOf(k), id, err)
	}()
	err = s.db.Update(ctx, func(tx Tx) error {
		k, err := s.visible(ctx, tx, "rotateKey", id)
		if err != nil {
			return err
		}
		if !k.Active(s.now()) {
			return sandbox.Errorf(sandbox.ErrState, "", "key %s is revoked or expired", id)
		}
		secret, hash, err := newSecret(k.ID, formatOf(k))
		if err != nil {
			return err
		}
		now := s.now().UTC()
		k.Hash, k.Hint, k.RotatedAt = hash, hint(secret), &now
		out = &Created{Key: k, Secret: secret}
		if err := tx.PutKey(ctx, k); err != nil {
			return err
		}
		if err := tx.DeleteKeySessions(ctx, k.ID); err != nil { // (they hold the old secret)
			return err
		}
		return tx.Notify(ctx, NoticeTopic, k.ID)
	})
	s.forget(id)
	return out, err
}
