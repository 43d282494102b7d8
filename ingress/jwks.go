package ingress

import (
	"context"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	jose "github.com/go-jose/go-jose/v4"
)

// keySet is an issuer's signing keys, fetched from its jwks_uri:
//   - on first use, and when they are over an hour old (a key the issuer
//     withdrew is not trusted for longer while the issuer answers);
//   - when a token names a key the set does not have (the issuer's key
//     rotation), or does not verify under the key it names (an issuer
//     that reused a key's name), unless the keys were fetched less than
//     keysMinGap ago (or keysRecheck, for a name the set has): tokens
//     that name keys at random cannot make the host ask the issuer more
//     often;
//   - one fetch at a time, and not again for 10 s after one failed.
//
// While the issuer cannot be asked, the keys it gave last count for up
// to a day, and a token they do not verify is answered 503 (down), not
// 401.
//
// It stands in for go-oidc's RemoteKeySet, which can answer a token that
// arrives just as a refetch finishes with the keys from before that
// refetch (its in-flight fetch is marked done before it is cleared), so
// a token under a new key was refused after a rotation.
type keySet struct {
	url    string
	client *http.Client
	now    func() time.Time

	fetch  sync.Mutex // one fetch at a time; it guards failed too
	failed struct {
		at  time.Time // of the last failed fetch
		err error
	}
	down atomic.Bool // the last fetch failed

	mu      sync.Mutex
	keys    []jose.JSONWebKey
	fetched time.Time // when keys were fetched
}

const (
	// maxKeySet bounds an issuer's key set document, maxKeys the keys
	// kept of it, and maxRSABits an RSA key's size (a token is tried
	// against each key it may be under).
	maxKeySet  = 1 << 20
	maxKeys    = 100
	maxRSABits = 8192
	// keysMinGap is how old the keys must be before a token they do not
	// verify makes them fetched again; keysRecheck, when the token names
	// a key the set has.
	keysMinGap  = 5 * time.Second
	keysRecheck = time.Minute
	// keysMaxAge is how long keys are used without asking again;
	// keysGrace, while the issuer cannot be asked.
	keysMaxAge = time.Hour
	keysGrace  = 24 * time.Hour
)

// errKeysDown is a token the keys could not be fetched for.
var errKeysDown = errors.New("the issuer's keys cannot be fetched")

// signingAlgs are the algorithms an ID token may be signed with: those
// go-oidc's verifier knows.
var signingAlgs = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512, jose.ES256, jose.ES384, jose.ES512,
	jose.PS256, jose.PS384, jose.PS512, jose.EdDSA,
}

// VerifySignature implements oidc.KeySet.
func (k *keySet) VerifySignature(ctx context.Context, raw string) ([]byte, error) {
	jws, err := jose.ParseSigned(raw, signingAlgs)
	if err != nil {
		return nil, fmt.Errorf("malformed token: %w", err)
	}
	if len(jws.Signatures) != 1 {
		return nil, errors.New("want one signature")
	}
	kid := jws.Signatures[0].Header.KeyID
	keys, age := k.current()
	if age <= keysMaxAge {
		if payload, _ := verifyWith(jws, keys, kid); payload != nil {
			return payload, nil
		}
	}
	verifies := func(keys []jose.JSONWebKey) ([]byte, bool) { return verifyWith(jws, keys, kid) }
	payload, err := k.refresh(ctx, verifies)
	if err != nil && !errors.Is(err, errKeysDown) {
		return nil, err
	}
	if payload == nil && err != nil {
		// The issuer cannot be asked: the keys it gave last still count
		// for a while.
		if keys, age := k.current(); age <= keysGrace {
			payload, _ = verifyWith(jws, keys, kid)
		}
		if payload == nil {
			return nil, err
		}
	}
	if payload == nil {
		return nil, errors.New("no key of the issuer's verifies the token")
	}
	return payload, nil
}

// current is the keys and their age.
func (k *keySet) current() ([]jose.JSONWebKey, time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.keys, k.now().Sub(k.fetched)
}

// verifyWith verifies jws under the keys named kid (all of them when kid
// is empty), and says whether any key of that name was there.
func verifyWith(jws *jose.JSONWebSignature, keys []jose.JSONWebKey, kid string) ([]byte, bool) {
	known := false
	for i := range keys {
		if kid != "" && keys[i].KeyID != kid {
			continue
		}
		known = kid != ""
		if payload, err := jws.Verify(&keys[i]); err == nil {
			return payload, true
		}
	}
	return nil, known
}

// refresh fetches the keys again, one caller at a time, unless those it
// finds (fetched meanwhile by another) verify the token, or are too new
// to ask again for it. It returns the payload if they verify it, or an
// error wrapping errKeysDown when the keys cannot be fetched.
func (k *keySet) refresh(ctx context.Context, verifies func([]jose.JSONWebKey) ([]byte, bool)) ([]byte, error) {
	k.fetch.Lock()
	defer k.fetch.Unlock()
	keys, age := k.current()
	payload, known := verifies(keys)
	if age <= keysMaxAge {
		if payload != nil {
			return payload, nil
		}
		if gap := keysMinGap; age < gap || (known && age < keysRecheck) {
			return nil, nil
		}
	}
	if k.failed.err != nil && k.now().Sub(k.failed.at) < retryDiscovery {
		return nil, k.failed.err // (not asked again at once: each ask may take 10 s)
	}
	keys, err := k.get(context.WithoutCancel(ctx)) // (a caller that leaves does not fail the others)
	if err != nil {
		k.failed.at, k.failed.err = k.now(), fmt.Errorf("%w: %v", errKeysDown, err)
		k.down.Store(true)
		return nil, k.failed.err
	}
	k.failed.err = nil
	k.down.Store(false)
	k.mu.Lock()
	k.keys, k.fetched = keys, k.now()
	k.mu.Unlock()
	payload, _ = verifies(keys)
	return payload, nil
}

// get fetches the key set document.
func (k *keySet) get(ctx context.Context) ([]jose.JSONWebKey, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Cache-Control", "no-cache") // a rotation is what made us ask
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch the issuer's keys: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxKeySet+1))
	if err != nil {
		return nil, fmt.Errorf("fetch the issuer's keys: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch the issuer's keys: %s", resp.Status)
	}
	if len(body) > maxKeySet {
		return nil, fmt.Errorf("the issuer's key set is over %d bytes", maxKeySet)
	}
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(body, &set); err != nil {
		return nil, fmt.Errorf("the issuer's key set: %w", err)
	}
	// A key of a kind go-jose does not know is skipped, not the set
	// (RFC 7517 section 5): an issuer may publish keys for others too.
	// Only public keys for signatures are kept, and no more than
	// maxKeys of them.
	var keys []jose.JSONWebKey
	for _, raw := range set.Keys {
		var key jose.JSONWebKey
		if json.Unmarshal(raw, &key) != nil || !key.Valid() || !key.IsPublic() || (key.Use != "" && key.Use != "sig") {
			continue
		}
		if r, ok := key.Key.(*rsa.PublicKey); ok && r.N.BitLen() > maxRSABits {
			continue
		}
		if keys = append(keys, key); len(keys) == maxKeys {
			break
		}
	}
	return keys, nil
}

// keysOf is p's keySet and the signing algorithms it names that go-oidc
// checks.
func (s *Service) keysOf(p *oidc.Provider) (*keySet, []string, error) {
	var meta struct {
		JWKS string   `json:"jwks_uri"`
		Algs []string `json:"id_token_signing_alg_values_supported"`
	}
	if err := p.Claims(&meta); err != nil || meta.JWKS == "" {
		return nil, nil, errors.New("the issuer's discovery document names no jwks_uri")
	}
	if u, err := url.Parse(meta.JWKS); err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, nil, fmt.Errorf("the issuer's jwks_uri %q is not an https URL", meta.JWKS)
	}
	var algs []string
	for _, a := range meta.Algs {
		if slices.Contains(signingAlgs, jose.SignatureAlgorithm(a)) {
			algs = append(algs, a)
		}
	}
	return &keySet{url: meta.JWKS, client: s.client, now: s.opts.Now}, algs, nil
}
