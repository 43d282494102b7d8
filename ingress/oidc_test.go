package ingress

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"golang.org/x/oauth2"

	"github.com/harebox/harebox/sandbox"
)

// testIssuer is a real OpenID Connect issuer on loopback (TLS): its
// discovery document and its keys, which the test rotates.
type testIssuer struct {
	srv  *httptest.Server
	mu   sync.Mutex
	keys map[string]*ecdsa.PrivateKey // published
	down bool
	gets int // of the keys
	// The sign-in: who the next browser signs in as (its claims), and
	// the codes given out, with what the token request must match.
	user  map[string]any
	codes map[string]authCode
}

type authCode struct {
	clientID, redirectURI, challenge, nonce string
}

func newIssuer(t *testing.T) *testIssuer {
	is := &testIssuer{keys: map[string]*ecdsa.PrivateKey{}, codes: map[string]authCode{}}
	is.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		is.mu.Lock()
		defer is.mu.Unlock()
		if r.URL.Path == "/keys" {
			is.gets++ // (asked, up or down)
		}
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
		case "/auth":
			// A user who is signed in already: straight back with a code.
			q := r.URL.Query()
			if q.Get("response_type") != "code" || q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" {
				http.Error(w, "bad authorization request", 400)
				return
			}
			code := random()
			is.codes[code] = authCode{q.Get("client_id"), q.Get("redirect_uri"), q.Get("code_challenge"), q.Get("nonce")}
			http.Redirect(w, r, q.Get("redirect_uri")+"?code="+code+"&state="+url.QueryEscape(q.Get("state")), http.StatusFound)
		case "/token":
			r.ParseForm()
			c, ok := is.codes[r.PostForm.Get("code")]
			delete(is.codes, r.PostForm.Get("code"))
			if !ok || r.PostForm.Get("grant_type") != "authorization_code" || r.PostForm.Get("client_id") != c.clientID ||
				r.PostForm.Get("redirect_uri") != c.redirectURI || oauth2.S256ChallengeFromVerifier(r.PostForm.Get("code_verifier")) != c.challenge {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(400)
				io.WriteString(w, `{"error":"invalid_grant"}`)
				return
			}
			claims := map[string]any{"aud": c.clientID, "nonce": c.nonce}
			for k, v := range is.user {
				claims[k] = v
			}
			var kid string
			for kid = range is.keys {
			}
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(map[string]any{"access_token": "at", "token_type": "Bearer", "expires_in": 3600,
				"id_token": signWith(is.keys[kid], kid, is.srv.URL, claims)})
		case "/keys":
			var set jose.JSONWebKeySet
			for id, k := range is.keys {
				set.Keys = append(set.Keys, jose.JSONWebKey{Key: &k.PublicKey, KeyID: id, Algorithm: "ES256", Use: "sig"})
			}
			// With a key of a kind go-jose does not know, which a
			// verifier skips (RFC 7517 section 5).
			doc, _ := json.Marshal(set)
			w.Write(bytes.Replace(doc, []byte(`"keys":[`), []byte(`"keys":[{"kty":"XYZ","kid":"for-others"},`), 1))
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

// fetches is how often the keys were asked for.
func (is *testIssuer) fetches() int {
	is.mu.Lock()
	defer is.mu.Unlock()
	return is.gets
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
	return signWith(k, kid, iss, over)
}

func signWith(k *ecdsa.PrivateKey, kid string, iss string, over map[string]any) string {
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
		panic(err)
	}
	payload, _ := json.Marshal(c)
	obj, err := signer.Sign(payload)
	if err != nil {
		panic(err)
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
	var skew atomic.Int64          // (the clock, moved on past keysMinGap below)
	f.svc.opts.Now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	ctx := context.Background()

	// Rules are checked at create.
	for _, bad := range []sandbox.URLRequest{
		{Port: 9000, Auth: "oidc"},
		{Port: 9000, Auth: "oidc", OIDC: &sandbox.OIDCRule{Issuer: is.srv.URL, Audience: "app"}},
		{Port: 9000, Auth: "oidc", OIDC: &sandbox.OIDCRule{Issuer: "http://issuer.test", Audience: "app", Subjects: []string{"a"}}},
		{Port: 9000, Auth: "oidc", OIDC: &sandbox.OIDCRule{Issuer: is.srv.URL, Subjects: []string{"a"}}},
		{Port: 9000, OIDC: &sandbox.OIDCRule{Issuer: is.srv.URL, Audience: "app", Subjects: []string{"a"}}},
	} {
		if _, err := f.svc.Create(ctx, owner, bad); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("%+v: %v", bad.OIDC, err)
		}
	}
	rule := &sandbox.OIDCRule{Issuer: is.srv.URL, Audience: "app", Subjects: []string{"alice"},
		Emails: []string{"bob@example.com"}, Groups: []string{"ops"}}
	u, err := f.svc.Create(ctx, owner, sandbox.URLRequest{Port: 9000, Auth: "oidc", OIDC: rule})
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

	// A forged token under a key the issuer has does not make the keys
	// fetched again; one under a key it does not have does.
	gets := is.fetches
	before := gets()
	if resp, _ := f.get(t, u, "/", bearer(sign(t, other, "k1", is.srv.URL, nil))); resp.StatusCode != 401 || gets() != before {
		t.Errorf("a forged token under a known key: %d, keys fetched %d times", resp.StatusCode, gets()-before)
	}
	skew.Add(int64(keysMinGap))
	if resp, _ := f.get(t, u, "/", bearer(sign(t, other, "k9", is.srv.URL, nil))); resp.StatusCode != 401 || gets() != before+1 {
		t.Errorf("a forged token under an unknown key: %d, keys fetched %d times", resp.StatusCode, gets()-before)
	}
	// Tokens that name keys at random do not make the host ask again
	// before keysMinGap.
	for _, kid := range []string{"k8", "k7", ""} {
		if resp, _ := f.get(t, u, "/", bearer(sign(t, other, kid, is.srv.URL, nil))); resp.StatusCode != 401 || gets() != before+1 {
			t.Errorf("a forged token under key %q just after a fetch: %d, keys fetched %d times", kid, resp.StatusCode, gets()-before)
		}
	}

	// The issuer rotates its key: tokens under the new key work once the
	// last fetch is keysMinGap old (go-oidc's own key set could hand such
	// a token the keys of a fetch that had just finished), and tokens
	// that arrive together fetch the keys once.
	k2 := is.key("k2")
	is.drop("k1")
	skew.Add(int64(keysMinGap))
	before = gets()
	var wg sync.WaitGroup
	codes := make(chan int, 8)
	for range 8 {
		wg.Go(func() {
			resp, _ := f.get(t, u, "/", bearer(sign(t, k2, "k2", is.srv.URL, nil)))
			codes <- resp.StatusCode
		})
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Errorf("after the issuer's key rotation: %d", c)
		}
	}
	if n := gets() - before; n != 1 {
		t.Errorf("8 tokens under a new key fetched the keys %d times", n)
	}
	if resp, _ := f.get(t, u, "/", bearer(sign(t, k1, "k1", is.srv.URL, nil))); resp.StatusCode != 401 {
		t.Errorf("a token under the dropped key: %d", resp.StatusCode)
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
	u, err := f.svc.Create(context.Background(), owner, sandbox.URLRequest{Port: 9000, Auth: "oidc",
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

// TestOIDCKeyAge: a token that does not verify under the key it names
// makes the keys fetched again once they are a minute old (an issuer that
// gave a new key the old one's name), and keys over an hour old are not
// used without asking (a key the issuer withdrew).
func TestOIDCKeyAge(t *testing.T) {
	is := newIssuer(t)
	old := is.key("k")
	f := newFixture(t, false)
	f.svc.client = is.srv.Client()
	now := time.Now()
	f.svc.opts.Now = func() time.Time { return now }
	u, err := f.svc.Create(context.Background(), owner, sandbox.URLRequest{Port: 9000, Auth: "oidc",
		OIDC: &sandbox.OIDCRule{Issuer: is.srv.URL, Audience: "app", Subjects: []string{"alice"}}})
	if err != nil {
		t.Fatal(err)
	}
	status := func(k *ecdsa.PrivateKey, kid string) int {
		tok := sign(t, k, kid, is.srv.URL, map[string]any{"iat": now.Unix(), "exp": now.Add(time.Hour).Unix()})
		resp, _ := f.get(t, u, "/", http.Header{"Authorization": {"Bearer " + tok}})
		return resp.StatusCode
	}
	if got := status(old, "k"); got != 200 {
		t.Fatalf("a good token: %d", got)
	}
	renamed := is.key("k") // a new key under the old one's name
	if got := status(renamed, "k"); got != 401 {
		t.Errorf("a new key under a known name, keys just fetched: %d, want 401", got)
	}
	now = now.Add(keysRecheck)
	if got := status(renamed, "k"); got != 200 {
		t.Errorf("a new key under a known name, keys a minute old: %d, want 200", got)
	}
	withdrawn := renamed
	is.drop("k")
	j := is.key("j")
	if got := status(withdrawn, "k"); got != 200 {
		t.Errorf("a withdrawn key, keys fresh: %d (they are used until they are old)", got)
	}
	now = now.Add(keysMaxAge + time.Second)
	if got := status(withdrawn, "k"); got != 401 {
		t.Errorf("a withdrawn key, keys over an hour old: %d, want 401", got)
	}
	// The issuer goes down: the keys it gave last still count for a day,
	// asked again at most every 10 s; what they do not verify is 503 (the
	// keys cannot be fetched), not a wrong 401.
	is.mu.Lock()
	is.down = true
	is.mu.Unlock()
	now = now.Add(keysMaxAge + time.Second)
	gets := is.fetches
	before := gets()
	if got := status(j, "j"); got != 200 {
		t.Errorf("the issuer down, its last keys over an hour old: %d, want 200", got)
	}
	if got := status(withdrawn, "k"); got != 503 {
		t.Errorf("the issuer down, a key it withdrew: %d, want 503", got)
	}
	if n := gets() - before; n != 1 {
		t.Errorf("the issuer down: its keys asked for %d times in 10 s, want 1", n)
	}
	now = now.Add(keysGrace)
	if got := status(j, "j"); got != 503 {
		t.Errorf("the issuer down, its last keys over a day old: %d, want 503", got)
	}
	// Back up: the key it withdrew is refused, its key works.
	is.mu.Lock()
	is.down = false
	is.mu.Unlock()
	now = now.Add(retryDiscovery)
	if got, got2 := status(withdrawn, "k"), status(j, "j"); got != 401 || got2 != 200 {
		t.Errorf("the issuer back: a withdrawn key %d (want 401), its key %d (want 200)", got, got2)
	}
}

// TestOIDCSignIn: a browser opens an oidc URL, is sent to the issuer,
// comes back through the one callback on the ingress's host, gets its
// session cookie on the URL's own host and sees the guest's page; the
// guest sees no cookie of the ingress's. A user the rule does not allow
// is refused; a replayed or forged callback is refused; the session opens
// no other URL.
func TestOIDCSignIn(t *testing.T) {
	is := newIssuer(t)
	is.key("k1")
	f := newFixtureOn(t, true, "localhost")
	f.svc.client = is.srv.Client()
	ctx := context.Background()
	rule := &sandbox.OIDCRule{Issuer: is.srv.URL, Audience: "app", Emails: []string{"ana@example.com"}}
	u, err := f.svc.Create(ctx, owner, sandbox.URLRequest{Port: 9000, Auth: "oidc", OIDC: rule})
	if err != nil {
		t.Fatal(err)
	}
	other, err := f.svc.Create(ctx, owner, sandbox.URLRequest{Port: 9001, Auth: "oidc", OIDC: rule})
	if err != nil {
		t.Fatal(err)
	}
	ingressAddr := strings.TrimPrefix(f.base, "https://")
	roots := f.tls.RootCAs.Clone()
	roots.AddCert(is.srv.Certificate())
	browser := func() *http.Client {
		jar, _ := cookiejar.New(nil)
		return &http.Client{Jar: jar, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots},
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if h, _, _ := net.SplitHostPort(addr); h == "localhost" || strings.HasSuffix(h, ".localhost") {
					addr = ingressAddr
				}
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			}}}
	}
	open := func(c *http.Client, rawURL string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", rawURL, nil)
		req.Header.Set("Accept", "text/html")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}

	is.user = map[string]any{"sub": "ana-1", "email": "ana@example.com", "email_verified": true}
	for _, form := range []string{u.URL + "app?x=1", u.PathURL + "app?x=1"} {
		b := browser()
		resp, body := open(b, form)
		if resp.StatusCode != 200 || resp.Request.URL.String() != form {
			t.Fatalf("%s: %d at %s: %s", form, resp.StatusCode, resp.Request.URL, body)
		}
		var got map[string]any
		json.Unmarshal([]byte(body), &got)
		if got["path"] != "/app" || strings.Contains(body, SessionCookie) || strings.Contains(body, "ticket") {
			t.Errorf("%s: the guest got %s", form, body)
		}
		// The session works again without the issuer, and only here.
		if resp, _ := open(b, form); resp.StatusCode != 200 || resp.Request.URL.String() != form {
			t.Errorf("%s: again: %d at %s", form, resp.StatusCode, resp.Request.URL)
		}
		b.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		if resp, _ := open(b, other.URL); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), is.srv.URL) {
			t.Errorf("the session opened another URL: %d %s", resp.StatusCode, resp.Header.Get("Location"))
		}
	}

	// A script without a session gets 401, not the issuer's page.
	req, _ := http.NewRequest("GET", u.URL, nil)
	req.Header.Set("Sec-Fetch-Mode", "cors")
	if resp, err := browser().Do(req); err != nil || resp.StatusCode != 401 {
		t.Errorf("a script: %v %v", resp, err)
	}

	// Someone the rule does not allow signs in: refused.
	is.user = map[string]any{"sub": "eve", "email": "eve@example.com"}
	if resp, _ := open(browser(), u.URL); resp.StatusCode != 403 {
		t.Errorf("a user not allowed: %d", resp.StatusCode)
	}

	// A callback with a state the ingress did not give, or used twice.
	is.user = map[string]any{"sub": "ana-1", "email": "ana@example.com"}
	b := browser()
	var cb string
	b.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if req.URL.Path == CallbackPath {
			cb = req.URL.String()
			return http.ErrUseLastResponse
		}
		return nil
	}
	open(b, u.URL)
	if cb == "" {
		t.Fatal("no callback")
	}
	b.CheckRedirect = nil
	if resp, _ := open(b, cb); resp.StatusCode != 200 {
		t.Fatalf("the callback: %d", resp.StatusCode)
	}
	if resp, _ := open(browser(), cb); resp.StatusCode != 400 {
		t.Errorf("a replayed callback: %d", resp.StatusCode)
	}
	forged := strings.Replace(cb, "state=", "state=x", 1)
	if resp, _ := open(browser(), forged); resp.StatusCode != 400 {
		t.Errorf("a forged state: %d", resp.StatusCode)
	}
}
