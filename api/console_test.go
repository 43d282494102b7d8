package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/harebox/harebox/api"
	"github.com/harebox/harebox/apikey"
	"github.com/harebox/harebox/console"
)

// browser is a client with a cookie jar, as the console's page is: its
// requests carry the session's cookie and no Authorization.
type browser struct {
	t      *testing.T
	f      *fastAPI
	c      *http.Client
	csrf   string
	origin string
}

func newBrowser(t *testing.T, f *fastAPI) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, f: f, c: &http.Client{Jar: jar}}
}

func (b *browser) do(method, path string, body any, hdr map[string]string) reply {
	b.t.Helper()
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = strings.NewReader(string(raw))
	}
	req, _ := http.NewRequest(method, b.f.url+path, rd)
	if b.origin != "" {
		req.Header.Set("Origin", b.origin)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, raw: raw, header: resp.Header}
	json.Unmarshal(raw, &r.body)
	return r
}

// call is a request with the session's CSRF token, as the page makes
// them all.
func (b *browser) call(method, path string, body any) reply {
	return b.do(method, path, body, map[string]string{console.CSRFHeader: b.csrf})
}

func (b *browser) signIn(key string) reply {
	b.t.Helper()
	r := b.do("POST", "/console/session", map[string]string{"key": key}, nil)
	if r.status == 200 {
		b.csrf = str(r, "csrf_token")
	}
	return r
}

func TestConsolePage(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	for _, p := range []string{"/console/", "/console/assets/app.js", "/console/assets/app.css"} {
		r := f.do(t, "GET", p, "", nil)
		if r.status != 200 {
			t.Fatalf("GET %s: %d", p, r.status)
		}
		csp := r.header.Get("Content-Security-Policy")
		for _, want := range []string{"script-src 'self'", "frame-ancestors 'none'", "default-src 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("GET %s: CSP %q lacks %s", p, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
			t.Errorf("GET %s: CSP %q allows inline or eval", p, csp)
		}
		if r.header.Get("X-Content-Type-Options") != "nosniff" || r.header.Get("X-Frame-Options") != "DENY" {
			t.Errorf("GET %s: headers %v", p, r.header)
		}
	}
	if r := f.do(t, "GET", "/console/", "", nil); !strings.HasPrefix(r.header.Get("Content-Type"), "text/html") ||
		strings.Contains(string(r.raw), "<script>") || strings.Contains(string(r.raw), "style=") {
		t.Errorf("the page: %s %q: no inline script or style allowed", r.header.Get("Content-Type"), r.raw)
	}
	for _, p := range []string{"/console/assets/%2e%2e%2findex.html", "/console/assets/..%2f..%2fopenapi.yaml", "/console/assets/nothing.js",
		"/console/other", "/console/assets/x/app.js"} {
		if r := f.do(t, "GET", p, "", nil); r.status != 404 {
			t.Errorf("GET %s: %d, want 404", p, r.status)
		}
	}
	// An API answer is never a page a browser runs.
	r := f.must(t, 200, "GET", "/v1/sandboxes", f.root, nil)
	if r.header.Get("X-Content-Type-Options") != "nosniff" || !strings.Contains(r.header.Get("Content-Security-Policy"), "sandbox") {
		t.Errorf("API answer's headers: %v", r.header)
	}
}

func TestConsoleSession(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	b := newBrowser(t, f)

	// Not signed in: the API refuses, as without a key.
	if r := b.do("GET", "/v1/sandboxes", nil, nil); r.status != 401 {
		t.Fatalf("no session: %d", r.status)
	}
	if r := b.do("GET", "/console/session", nil, nil); r.status != 401 {
		t.Fatalf("no session: GET /console/session %d", r.status)
	}
	if r := b.signIn("hbk_" + strings.Repeat("0", 64)); r.status != 401 || len(b.c.Jar.Cookies(mustURL(f.url))) != 0 {
		t.Fatalf("a wrong key: %d %s, cookies %v", r.status, r.raw, b.c.Jar.Cookies(mustURL(f.url)))
	}
	if r := b.do("POST", "/console/session", map[string]string{}, nil); r.status != 400 || errFieldOf(r) != "key" {
		t.Fatalf("no key: %d %s", r.status, r.raw)
	}

	// The root key: the cookie is HttpOnly and SameSite=Strict; the key
	// is not in the answer.
	req, _ := http.NewRequest("POST", f.url+"/console/session", strings.NewReader(`{"key":"`+f.root+`"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Contains(string(raw), f.root) {
		t.Fatalf("sign-in: %d %s", resp.StatusCode, raw)
	}
	ck := resp.Cookies()
	if len(ck) != 1 || ck[0].Name != console.Cookie || !ck[0].HttpOnly || ck[0].SameSite != http.SameSiteStrictMode || ck[0].Secure ||
		ck[0].Value == "" || strings.Contains(ck[0].Value, f.root) {
		t.Fatalf("cookie %+v", ck)
	}

	if r := b.signIn(f.root); r.status != 200 || str(r, "csrf_token") == "" || r.body["principal"].(map[string]any)["operator"] != true {
		t.Fatalf("sign-in: %d %s", r.status, r.raw)
	}
	if r := b.call("GET", "/v1/sandboxes", nil); r.status != 200 {
		t.Fatalf("signed in: list %d %s", r.status, r.raw)
	}
	if r := b.call("GET", "/console/session", nil); r.status != 200 || str(r, "csrf_token") != b.csrf {
		t.Fatalf("GET /console/session: %d %s", r.status, r.raw)
	}
	// The cookie alone opens nothing, a read neither: every request needs
	// the token (a cookie is shared by every port of a host name, where a
	// sandbox's page may be served).
	for _, p := range []string{"/v1/sandboxes", "/console/session", "/v1/keys"} {
		if r := b.do("GET", p, nil, nil); r.status != 401 {
			t.Fatalf("GET %s without the CSRF token: %d %s", p, r.status, r.raw)
		}
	}
	if r := b.do("POST", "/v1/accounts", map[string]string{"name": "nocsrf"}, nil); r.status != 401 {
		t.Fatalf("a change without the CSRF token: %d %s", r.status, r.raw)
	}
	if r := b.do("POST", "/v1/accounts", map[string]string{"name": "wrong"}, map[string]string{console.CSRFHeader: b.csrf + "0"}); r.status != 401 {
		t.Fatalf("a change with a wrong CSRF token: %d %s", r.status, r.raw)
	}
	// The token in the query counts only for a WebSocket's handshake.
	if r := b.do("GET", "/v1/sandboxes?csrf_token="+b.csrf, nil, nil); r.status != 401 {
		t.Fatalf("the token in a plain GET's query: %d %s", r.status, r.raw)
	}
	if r := b.call("POST", "/v1/accounts", map[string]string{"name": "alpha"}); r.status != 201 {
		t.Fatalf("a change with the token: %d %s", r.status, r.raw)
	}
	// Another site's page (its Origin) gets nothing, token or not.
	b.origin = "http://evil.example"
	if r := b.call("POST", "/v1/projects?account=alpha", map[string]string{"name": "x"}); r.status != 403 {
		t.Fatalf("from another origin: %d %s", r.status, r.raw)
	}
	if r := b.call("GET", "/v1/sandboxes", nil); r.status != 403 {
		t.Fatalf("a read from another origin: %d %s", r.status, r.raw)
	}
	b.origin = f.url
	if r := b.call("POST", "/v1/projects?account=alpha", map[string]string{"name": "web"}); r.status != 201 {
		t.Fatalf("from the console's origin: %d %s", r.status, r.raw)
	}

	// A scoped key's session sees what the key sees, and ends with it.
	box := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"account_id": "alpha", "project": "web"}), "id")
	other := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"account_id": "alpha"}), "id")
	keyID, secret := f.key(t, f.root, map[string]any{"account_id": "alpha", "scope": map[string]any{"projects": []string{"web"}}})
	s := newBrowser(t, f)
	if r := s.signIn(secret); r.status != 200 || r.body["principal"].(map[string]any)["key_id"] != keyID {
		t.Fatalf("scoped sign-in: %d %s", r.status, r.raw)
	}
	r := s.call("GET", "/v1/sandboxes", nil)
	if r.status != 200 || !strings.Contains(string(r.raw), box) || strings.Contains(string(r.raw), other) {
		t.Fatalf("a scoped session's list: %d %s", r.status, r.raw)
	}
	if r := s.call("GET", "/v1/sandboxes/"+other, nil); r.status != 404 {
		t.Fatalf("another project's sandbox: %d", r.status)
	}
	// The store keeps no session of a key revoked or rotated (each holds
	// the key's secret, sealed).
	stored := func(b *browser) error {
		for _, c := range b.c.Jar.Cookies(mustURL(f.url)) {
			if c.Name == console.Cookie {
				_, err := f.eng.Keys().Sessions(apikey.SessionOptions{}).Get(context.Background(), c.Value)
				return err
			}
		}
		return errors.New("no cookie")
	}
	if err := stored(s); err != nil {
		t.Fatalf("the scoped key's session: %v", err)
	}
	rotated := newBrowser(t, f)
	rotID, rotSecret := f.key(t, f.root, map[string]any{"account_id": "alpha"})
	if r := rotated.signIn(rotSecret); r.status != 200 {
		t.Fatalf("sign-in: %d %s", r.status, r.raw)
	}
	f.must(t, 200, "POST", "/v1/keys/"+rotID+"/rotate", f.root, nil)
	if err := stored(rotated); !errors.Is(err, apikey.ErrSessionEnded) {
		t.Fatalf("the session of a rotated key: %v", err)
	}
	f.must(t, 200, "DELETE", "/v1/keys/"+keyID, f.root, nil)
	if err := stored(s); !errors.Is(err, apikey.ErrSessionEnded) {
		t.Fatalf("the session of a revoked key: %v", err)
	}
	f.must(t, 201, "POST", "/v1/accounts", f.root, map[string]string{"name": "gone"})
	_, goneSecret := f.key(t, f.root, map[string]any{"account_id": "gone"})
	ofGone := newBrowser(t, f)
	if r := ofGone.signIn(goneSecret); r.status != 200 {
		t.Fatalf("sign-in: %d %s", r.status, r.raw)
	}
	f.must(t, 204, "DELETE", "/v1/accounts/gone", f.root, nil)
	if err := stored(ofGone); !errors.Is(err, apikey.ErrSessionEnded) {
		t.Fatalf("the session of a deleted account's key: %v", err)
	}
	if r := s.call("GET", "/v1/sandboxes", nil); r.status != 401 {
		t.Fatalf("after the key's revoke: %d %s", r.status, r.raw)
	}
	if r := s.call("GET", "/console/session", nil); r.status != 401 {
		t.Fatalf("the session of a revoked key: %d %s", r.status, r.raw)
	}

	// A bearer key wins over a cookie.
	if r := b.do("GET", "/v1/sandboxes", nil, map[string]string{"Authorization": "Bearer hbk_nothing", console.CSRFHeader: b.csrf}); r.status != 401 {
		t.Fatalf("a wrong bearer key beside a good session: %d", r.status)
	}

	// Sign-out needs the token, then the session is gone.
	if r := b.do("DELETE", "/console/session", nil, nil); r.status != 401 {
		t.Fatalf("sign-out without the token: %d", r.status)
	}
	if r := b.call("DELETE", "/console/session", nil); r.status != 204 {
		t.Fatalf("sign-out: %d %s", r.status, r.raw)
	}
	if r := b.call("GET", "/v1/sandboxes", nil); r.status != 401 {
		t.Fatalf("after sign-out: %d", r.status)
	}
	// The sign-ins are in the audit log.
	if r := f.must(t, 200, "GET", "/v1/audit?action=signIn", f.root, nil); strings.Count(string(r.raw), `"signIn"`) < 2 {
		t.Fatalf("audit: %s", r.raw)
	}
}

// TestConsoleSessionAcrossHosts: a session opened on one host is good on
// every host of the deployment (behind a load balancer, a browser's
// requests land on any of them), a sign-out on one ends it on all, and a
// restart keeps it.
func TestConsoleSessionAcrossHosts(t *testing.T) {
	a, b, _ := twoHosts(t, 900*time.Millisecond)
	onA := newBrowser(t, a)
	if r := onA.signIn(a.root); r.status != 200 {
		t.Fatalf("sign-in on a: %d %s", r.status, r.raw)
	}
	// (The jar sends the cookie to both: they share the host name.)
	onB := &browser{t: t, f: b, c: onA.c, csrf: onA.csrf}
	if r := onB.call("POST", "/v1/accounts", map[string]string{"name": "across"}); r.status != 201 {
		t.Fatalf("the session on b: %d %s", r.status, r.raw)
	}
	if r := onB.call("GET", "/console/session", nil); r.status != 200 || str(r, "csrf_token") != onA.csrf {
		t.Fatalf("GET /console/session on b: %d %s", r.status, r.raw)
	}
	if r := onB.call("DELETE", "/console/session", nil); r.status != 204 {
		t.Fatalf("sign-out on b: %d %s", r.status, r.raw)
	}
	for _, br := range []*browser{onA, onB} {
		if r := br.call("GET", "/v1/sandboxes", nil); r.status != 401 {
			t.Fatalf("after the sign-out, on %s: %d %s", br.f.url, r.status, r.raw)
		}
	}

	// One host (SQLite): a restart keeps the session.
	f := newFastAPI(t, api.Options{})
	br := newBrowser(t, f)
	if r := br.signIn(f.root); r.status != 200 {
		t.Fatalf("sign-in: %d %s", r.status, r.raw)
	}
	f.eng.Close()
	f.open(t, api.Options{})
	if r := br.call("GET", "/v1/sandboxes", nil); r.status != 200 {
		t.Fatalf("the session after a restart: %d %s", r.status, r.raw)
	}
}

// TestConsoleSecureCookie: over TLS the cookie is Secure.
func TestConsoleSecureCookie(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	hs := httptest.NewTLSServer(f.srv)
	defer hs.Close()
	resp, err := hs.Client().Post(hs.URL+"/console/session", "application/json", strings.NewReader(`{"key":"`+f.root+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ck := resp.Cookies(); resp.StatusCode != 200 || len(ck) != 1 || !ck[0].Secure {
		t.Fatalf("over TLS: %d %+v", resp.StatusCode, ck)
	}
}

func errFieldOf(r reply) string { _, field, _ := errField(r); return field }

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}

// TestConsoleOff: with NoConsole, neither the page nor a session is
// served.
func TestConsoleOff(t *testing.T) {
	off := newFastAPI(t, api.Options{NoConsole: true})
	for _, p := range []string{"/console/", "/console/assets/app.js", "/console/session"} {
		if r := off.do(t, "GET", p, "", nil); r.status != 404 {
			t.Errorf("GET %s: %d, want 404", p, r.status)
		}
	}
	if r := off.do(t, "POST", "/console/session", "", map[string]string{"key": off.root}); r.status != 404 || len(r.header.Values("Set-Cookie")) != 0 {
		t.Errorf("sign-in: %d %v, want 404 and no cookie", r.status, r.header.Values("Set-Cookie"))
	}
}

// TestConsoleWebSocket: a WebSocket's handshake (the terminal) carries the
// session's token in its query, which a browser can set, and its Origin.
func TestConsoleWebSocket(t *testing.T) {
	f := newFastAPI(t, api.Options{})
	b := newBrowser(t, f)
	if r := b.signIn(f.root); r.status != 200 {
		t.Fatal(r.status)
	}
	box := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{}), "id")
	dial := func(query, origin string) int {
		t.Helper()
		h := http.Header{}
		if origin != "" {
			h.Set("Origin", origin)
		}
		c, resp, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(f.url, "http")+"/v1/sandboxes/"+box+"/pty"+query,
			&websocket.DialOptions{HTTPClient: b.c, HTTPHeader: h})
		if err == nil {
			c.Close(websocket.StatusNormalClosure, "")
			return 101
		}
		if resp == nil {
			t.Fatal(err)
		}
		return resp.StatusCode
	}
	if got := dial("", f.url); got != 401 {
		t.Errorf("a handshake without the token: %d, want 401", got)
	}
	if got := dial("?csrf_token="+b.csrf+"0", f.url); got != 401 {
		t.Errorf("a handshake with a wrong token: %d, want 401", got)
	}
	if got := dial("?csrf_token="+b.csrf, "http://evil.example"); got != 403 {
		t.Errorf("a handshake from another origin: %d, want 403", got)
	}
	if got := dial("?csrf_token="+b.csrf, f.url); got != 101 {
		t.Errorf("the console's handshake: %d, want 101", got)
	}
}
