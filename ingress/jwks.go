package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	jose "github.com/go-jose/go-jose/v4"
)

// keySet is an issuer's signing keys, fetched from its jwks_uri on first
// use and again when a token names a key this set does not have (the
// issuer's key rotation; such fetches go one at a time), or when one does
// not verify under the key it names and the keys are over a minute old
// (an issuer that kept a key's name for a new key), or when they are over
// an hour old. While the issuer cannot be asked, the keys it gave last
// still count.
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

	mu      sync.Mutex
	keys    []jose.JSONWebKey
	fetched time.Time // when keys were fetched
	started uint64    // fetches started
	from    uint64    // the fetch keys came from
}

const (
	// maxKeySet bounds an issuer's key set document.
	maxKeySet = 1 << 20
	// keysRecheck is how old the keys must be before a token that does
	// not verify under the key it names makes them fetched again: a
	// forger naming a key the issuer has cannot make the host ask more
	// often than that.
	keysRecheck = time.Minute
	// keysMaxAge is how long keys are used without asking again: a key
	// the issuer withdrew is not trusted for longer.
	keysMaxAge = time.Hour
)

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
	k.mu.Lock()
	last, arrived, age := k.keys, k.started, k.now().Sub(k.fetched)
	k.mu.Unlock()
	keys := last
	if age > keysMaxAge {
		keys = nil
	}
	payload, known := verifyWith(jws, keys, kid)
	if payload != nil {
		return payload, nil
	}
	if known && age < keysRecheck {
		// A key the issuer has, and the token does not verify under it.
		return nil, errors.New("bad signature")
	}
	if err := k.refresh(ctx, arrived); err != nil {
		if keys == nil { // (too old to use while the issuer answers)
			if payload, _ := verifyWith(jws, last, kid); payload != nil {
				return payload, nil
			}
		}
		return nil, err
	}
	k.mu.Lock()
	keys = k.keys
	k.mu.Unlock()
	if payload, _ := verifyWith(jws, keys, kid); payload != nil {
		return payload, nil
	}
	return nil, errors.New("no key of the issuer's verifies the token")
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

// refresh fetches the keys again unless a fetch that started after the
// caller arrived (the arrived-th) has already replaced them.
func (k *keySet) refresh(ctx context.Context, arrived uint64) error {
	k.fetch.Lock()
	defer k.fetch.Unlock()
	k.mu.Lock()
	if k.from > arrived {
		k.mu.Unlock()
		return nil
	}
	k.started++
	n := k.started
	k.mu.Unlock()
	if k.failed.err != nil && k.now().Sub(k.failed.at) < retryDiscovery {
		return k.failed.err // (not asked again at once: each ask may take 10 s)
	}
	keys, err := k.get(context.WithoutCancel(ctx)) // (a caller that leaves does not fail the others)
	if err != nil {
		k.failed.at, k.failed.err = k.now(), err
		return err
	}
	k.failed.err = nil
	k.mu.Lock()
	k.keys, k.from, k.fetched = keys, n, k.now()
	k.mu.Unlock()
	return nil
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
	var keys []jose.JSONWebKey
	for _, raw := range set.Keys {
		var key jose.JSONWebKey
		if json.Unmarshal(raw, &key) == nil && key.Valid() && key.IsPublic() {
			keys = append(keys, key)
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
