package ingress

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/harebox/harebox/sandbox"
)

// testIssuer is a real OpenID Connect issuer on loopback (TLS): its
// discovery document and its keys, which the test rotates.
type testIssuer struct {
	srv  *httptest.Server
	mu   sync.Mutex
	keys map[string]*ecdsa.PrivateKey // published
	down bool
}

func newIssuer(t *testing.T) *testIssuer {
	is := &testIssuer{keys: map[string]*ecdsa.PrivateKey{}}
	is.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		is.mu.Lock()
		defer is.mu.Unlock()
		if is.down {
			http.Error(w, "down", 500)
			return
		}
		switch r.URL.Path {
		case "/.well-known/openid-configuration":
			json.NewEncoder(w).Encode(map[string]any{
				"issuer": is.srv.URL, "jwks_uri": is.srv.URL + "/keys",
				"authorization_endpoint": is.srv.URL + "/auth", "token_endpoint": is.srv.URL + "/token",
				"id_token_signing_alg_values_supported": []string{"ES256"},
			})
		case "/keys":
			var set jose.JSONWebKeySet
			for id, k := range is.keys {
				set.Keys = append(set.Keys, jose.JSONWebKey{Key: &k.PublicKey, KeyID: id, Algorithm: "ES256", Use: "sig"})
			}
			json.NewEncoder(w).Encode(set)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(is.srv.Close)
	return is
}

// key makes a key, published under id.
func (is *testIssuer) key(id string) *ecdsa.PrivateKey {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	is.mu.Lock()
	is.keys[id] = k
	is.mu.Unlock()
	return k
}

func (is *testIssuer) drop(id string) {
	is.mu.Lock()
	delete(is.keys, id)
	is.mu.Unlock()
}

// sign makes an ID token with claims over the defaults (this issuer,
// audience "app", sub "alice", valid for an hour).
func sign(t *testing.T, k *ecdsa.PrivateKey, kid string, iss string, over map[string]any) string {
	t.Helper()
	c := map[string]any{"iss": iss, "aud": "app", "sub": "alice", "iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()}
	for n, v := range over {
		if v == nil {
			delete(c, n)
		} else {
			c[n] = v
		}
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: k, KeyID: kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	payload, _ := json.Marshal(c)
	obj, err := signer.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := obj.CompactSerialize()
	return s
}

// TestOIDC checks ID tokens against a real issuer the test stands up:
// discovery, its keys and their rotation, and every way a token is wrong.
func TestOIDC(t *testing.T) {
	is := newIssuer(t)
	k1 := is.key("k1")
	f := newFixture(t, false)
	f.svc.client = is.srv.Client() // trusts the issuer's test certificate
	ctx := context.Background()

	// Rules are checked at create.
	for _, bad := range []sandbox.URLRequest{
		{Port: 9000, Auth: "oidc"},
		{Port: 9000, Auth: "oidc", OIDC: &sandbox.OIDCRule{Issuer: is.srv.URL, Audience: "app"}},
		{Port: 9000, Auth: "oidc", OIDC: &sandbox.OIDCRule{Issuer: "http://issuer.test", Audience: "app", Subjects: []string{"a"}}},
		{Port: 9000, Auth: "oidc", OIDC: &sandbox.OIDCRule{Issuer: is.srv.URL, Subjects: []string{"a"}}},
		{Port: 9000, OIDC: &sandbox.OIDCRule{Issuer: is.srv.URL, Audience: "app", Subjects: []string{"a"}}},
	} {
		if _, err := f.svc.Create(ctx, sbxID, "acc_1", bad); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("%+v: %v", bad.OIDC, err)
		}
	}
	rule := &sandbox.OIDCRule{Issuer: is.srv.URL, Audience: "app", Subjects: []string{"alice"},
		Emails: []string{"bob@example.com"}, Groups: []string{"ops"}}
	u, err := f.svc.Create(ctx, sbxID, "acc_1", sandbox.URLRequest{Port: 9000, Auth: "oidc", OIDC: rule})
	if err != nil {
		t.Fatal(err)
	}
	if u.Token != "" || u.Link != "" || u.OIDC == nil {
		t.Errorf("an oidc URL: %+v", u)
	}
	if _, err := f.svc.Rotate(ctx, sbxID, u.ID); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("rotate an oidc URL: %v", err)
	}
	bearer := func(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }

	good := sign(t, k1, "k1", is.srv.URL, nil)
	resp, body := f.get(t, u, "/", bearer(good))
	if resp.StatusCode != 200 {
		t.Fatalf("a good token: %d", resp.StatusCode)
	}
	if h := body["header"].(map[string]any); h["Authorization"] != nil {
		t.Errorf("the guest saw the ID token: %v", h["Authorization"])
	}
	if got := <-f.records; got != u.ID+" true" {
		t.Errorf("recorded %q", got)
	}

	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for name, c := range map[string]struct {
		tok  string
		want int
	}{
		"none":                    {"", 401},
		"garbage":                 {"not.a.token", 401},
		"expired":                 {sign(t, k1, "k1", is.srv.URL, map[string]any{"exp": time.Now().Add(-time.Minute).Unix()}), 401},
		"wrong audience":          {sign(t, k1, "k1", is.srv.URL, map[string]any{"aud": "other"}), 401},
		"wrong issuer":            {sign(t, k1, "k1", "https://evil.test", nil), 401},
		"unknown key":             {sign(t, other, "k1", is.srv.URL, nil), 401},
		"subject not allowed":     {sign(t, k1, "k1", is.srv.URL, map[string]any{"sub": "mallory"}), 403},
		"email allowed":           {sign(t, k1, "k1", is.srv.URL, map[string]any{"sub": "b", "email": "Bob@example.com"}), 200},
		"email not verified":      {sign(t, k1, "k1", is.srv.URL, map[string]any{"sub": "b", "email": "bob@example.com", "email_verified": false}), 403},
		"group allowed":           {sign(t, k1, "k1", is.srv.URL, map[string]any{"sub": "c", "groups": []string{"dev", "ops"}}), 200},
		"group not allowed":       {sign(t, k1, "k1", is.srv.URL, map[string]any{"sub": "c", "groups": []string{"dev"}}), 403},
		"a URL token, not an IDT": {"hburl_x", 401},
	} {
		h := http.Header{}
		if c.tok != "" {
			h = bearer(c.tok)
		}
		if resp, _ := f.get(t, u, "/", h); resp.StatusCode != c.want {
			t.Errorf("%s: %d, want %d", name, resp.StatusCode, c.want)
		}
	}

	// The issuer rotates its key: tokens under the new key work at once.
	k2 := is.key("k2")
	is.drop("k1")
	if resp, _ := f.get(t, u, "/", bearer(sign(t, k2, "k2", is.srv.URL, nil))); resp.StatusCode != 200 {
		t.Errorf("after the issuer's key rotation: %d", resp.StatusCode)
	}
}

// TestOIDCIssuerDown: a URL whose issuer cannot be asked answers 503, and
// works once the issuer is back (discovery is tried again).
func TestOIDCIssuerDown(t *testing.T) {
	is := newIssuer(t)
	k := is.key("k")
	f := newFixture(t, false)
	f.svc.client = is.srv.Client()
	now := time.Now()
	f.svc.opts.Now = func() time.Time { return now }
	is.down = true
	u, err := f.svc.Create(context.Background(), sbxID, "acc_1", sandbox.URLRequest{Port: 9000, Auth: "oidc",
		OIDC: &sandbox.OIDCRule{Issuer: is.srv.URL, Audience: "app", Subjects: []string{"alice"}}})
	if err != nil {
		t.Fatal(err)
	}
	tok := http.Header{"Authorization": {"Bearer " + sign(t, k, "k", is.srv.URL, nil)}}
	if resp, _ := f.get(t, u, "/", tok); resp.StatusCode != 503 {
		t.Errorf("issuer down: %d", resp.StatusCode)
	}
	is.mu.Lock()
	is.down = false
	is.mu.Unlock()
	now = now.Add(retryDiscovery)
	if resp, _ := f.get(t, u, "/", tok); resp.StatusCode != 200 {
		t.Errorf("issuer back: %d", resp.StatusCode)
	}
}
