package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"image/png"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/go-jose/go-jose/v4"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/internal/testserver"
	"github.com/harebox/harebox/sandbox"
)

// TestIngress publishes a port of a real VM through hareboxd's ingress:
// the guest's web app answers through the host form and the path form,
// only with the token (header, bearer, or a link's cookie), never sees
// it, and streams and WebSockets pass through. Rotating with the CLI cuts
// what the old token opened by the time the command returns; deleting
// the URL shuts the port again. An oidc URL takes ID tokens of a real
// issuer the test stands up, an mtls URL client certificates the CLI
// issued, until it revokes them. Every decision is in the audit log.
func TestIngress(t *testing.T) {
	s := testserver.Prepare(t)
	web := testimage.Package(t, "./e2e/testdata/guestweb", "guestweb")
	dataDir, err := os.MkdirTemp("", "hbing")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	ingressAddr := testserver.FreeAddr(t)
	// hareboxd trusts the test's OpenID Connect issuer as its system roots
	// (its environment only: this process's roots stay the system's).
	iss := newIssuer(t)
	srv := testserver.StartEnv(t, s, dataDir, []string{"SSL_CERT_FILE=" + iss.certFile}, "--ingress-listen", ingressAddr)
	defer testserver.Finish(t, srv, dataDir)
	hb := func(args ...string) string {
		t.Helper()
		return testserver.Run(t, srv, s, s.Root, 3*time.Minute, "harebox", args...)
	}
	var box struct{ ID string }
	if err := json.Unmarshal([]byte(hb("new", "--image", "minimal", "--label", "e2e=ingress")), &box); err != nil || box.ID == "" {
		t.Fatalf("new: %v", err)
	}
	defer hb("delete", box.ID)
	hb("file", "write", box.ID, "--path", "/tmp/guestweb", "--mode", "0755", "--from", web)
	hb("exec", box.ID, "--background", "--", "/tmp/guestweb", "-listen", ":8080")

	var u sandbox.URL
	if err := json.Unmarshal([]byte(hb("url", "create", box.ID, "--port", "8080")), &u); err != nil || u.Token == "" {
		t.Fatalf("url create: %v", err)
	}
	_, port, _ := net.SplitHostPort(ingressAddr)
	wantHost := "8080-" + strings.TrimPrefix(box.ID, "sbx_") + ".localhost:" + port
	if u.URL != "https://"+wantHost+"/" || u.PathURL != "https://localhost:"+port+"/s/"+box.ID+"/8080/" {
		t.Fatalf("url create: %+v", u)
	}

	// A client that trusts the ingress's certificate and sends every
	// host name to the ingress's address (no wildcard DNS here).
	cfg, err := apiclient.TLSConfig(filepath.Join(dataDir, "ingress-tls", "cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, ingressAddr)
	}
	tr := &http.Transport{TLSClientConfig: cfg, DialContext: dial, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Minute}
	get := func(rawURL string, h http.Header) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest("GET", rawURL, nil)
		for k, v := range h {
			req.Header[k] = v
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", rawURL, err)
		}
		defer resp.Body.Close()
		var body map[string]any
		if resp.StatusCode == 200 {
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body["from"] != "guest" {
				t.Fatalf("GET %s: %v %v", rawURL, body, err)
			}
		}
		return resp.StatusCode, body
	}

	// Refused without the token, or with a wrong one.
	if code, _ := get(u.URL, nil); code != 401 {
		t.Errorf("no token: %d", code)
	}
	if code, _ := get(u.URL, http.Header{"X-Harebox-Token": {u.Token + "x"}}); code != 401 {
		t.Errorf("wrong token: %d", code)
	}
	// The guest starts its app in the background: wait for it.
	deadline := time.Now().Add(time.Minute)
	var code int
	var body map[string]any
	for {
		code, body = get(u.URL+"a/b?q=1", http.Header{"X-Harebox-Token": {u.Token}})
		if code == 200 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if code != 200 {
		t.Fatalf("through the ingress: %d", code)
	}
	seen, _ := json.Marshal(body)
	if strings.Contains(string(seen), u.Token) || body["path"] != "/a/b" || body["query"] != "q=1" || body["host"] != wantHost {
		t.Errorf("the guest got %s", seen)
	}
	if code, body := get(u.PathURL+"p", http.Header{"Authorization": {"Bearer " + u.Token}}); code != 200 || body["path"] != "/p" {
		t.Errorf("path form with a bearer token: %d %v", code, body)
	} else if seen, _ := json.Marshal(body); strings.Contains(string(seen), u.Token) {
		t.Errorf("the guest saw the bearer token: %s", seen)
	}

	// A shared link: the token becomes a cookie, the browser goes on.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Transport: tr, Jar: jar, Timeout: time.Minute}
	resp, err := browser.Get(u.Link)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.Contains(string(b), u.Token) || resp.Request.URL.RawQuery != "" {
		t.Errorf("link: %d at %s: %s", resp.StatusCode, resp.Request.URL, b)
	}

	// A real browser follows the link, keeps the cookie and shows the page.
	t.Run("browser", func(t *testing.T) { browse(t, filepath.Join(dataDir, "ingress-tls", "cert.pem"), u) })

	// Streams opened with the token, then the CLI rotates it.
	sseReq, _ := http.NewRequest("GET", u.URL+"sse", nil)
	sseReq.Header.Set("X-Harebox-Token", u.Token)
	sse, err := client.Do(sseReq)
	if err != nil || sse.StatusCode != 200 {
		t.Fatalf("sse: %v %v", sse, err)
	}
	defer sse.Body.Close()
	events := bufio.NewReader(sse.Body)
	if line, err := events.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("sse: %q %v", line, err)
	}
	ws := openWS(t, cfg, dial, u.URL, u.Token)
	var nu sandbox.URL
	if err := json.Unmarshal([]byte(hb("url", "rotate", box.ID, u.ID)), &nu); err != nil || nu.Token == "" || nu.Token == u.Token {
		t.Fatalf("url rotate: %+v %v", nu, err)
	}
	// The stream ends (what was already on its way when rotate cut it may
	// still be read first).
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := events.ReadString('\n'); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Error("the old token's event stream still runs after rotate")
	}
	sse.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err = ws.Write(ctx, websocket.MessageText, []byte("after"))
	if err == nil {
		_, _, err = ws.Read(ctx)
	}
	cancel()
	if err == nil {
		t.Error("the old token's WebSocket still echoes after rotate")
	}
	if code, _ := get(u.URL, http.Header{"X-Harebox-Token": {u.Token}}); code != 401 {
		t.Errorf("old token after rotate: %d", code)
	}
	if code, _ := get(u.URL, http.Header{"X-Harebox-Token": {nu.Token}}); code != 200 {
		t.Errorf("new token after rotate: %d", code)
	}
	// Client certificates: the CLI makes the default project's CA and
	// issues two from it; the guest's second port is published with mtls.
	hb("exec", box.ID, "--background", "--", "/tmp/guestweb", "-listen", ":8081")
	hb("url", "ca", "create")
	certDir := t.TempDir()
	var alice, bob sandbox.ClientCert
	for name, c := range map[string]*sandbox.ClientCert{"alice": &alice, "bob": &bob} {
		if err := json.Unmarshal([]byte(hb("url", "cert", "issue", name, "--ttl", "1h", "--out", filepath.Join(certDir, name))), c); err != nil || c.Serial == "" {
			t.Fatalf("url cert issue %s: %+v %v", name, c, err)
		}
	}
	var mu sandbox.URL
	if err := json.Unmarshal([]byte(hb("url", "create", box.ID, "--port", "8081", "--auth", "mtls")), &mu); err != nil || mu.Token != "" || mu.Auth != "mtls" {
		t.Fatalf("url create --auth mtls: %+v %v", mu, err)
	}
	certClient := func(name string) *http.Client {
		c := cfg.Clone()
		if name != "" {
			kp, err := tls.LoadX509KeyPair(filepath.Join(certDir, name+".crt"), filepath.Join(certDir, name+".key"))
			if err != nil {
				t.Fatal(err)
			}
			c.Certificates = []tls.Certificate{kp}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: c, DialContext: dial, ForceAttemptHTTP2: true}, Timeout: time.Minute}
	}
	certGet := func(c *http.Client, rawURL string) int {
		t.Helper()
		resp, err := c.Get(rawURL)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == 200 && (strings.Contains(string(b), "alice") || strings.Contains(string(b), "BEGIN")) {
			t.Errorf("the guest saw the client certificate: %s", b)
		}
		return resp.StatusCode
	}
	aliceC, bobC := certClient("alice"), certClient("bob")
	for deadline := time.Now().Add(time.Minute); certGet(aliceC, mu.URL) != 200; {
		if time.Now().After(deadline) {
			t.Fatal("mtls: alice's certificate never got through")
		}
		time.Sleep(500 * time.Millisecond)
	}
	if code := certGet(certClient(""), mu.URL); code != 0 {
		t.Errorf("mtls without a certificate: %d", code)
	}
	if code := certGet(aliceC, mu.PathURL); code != 403 {
		t.Errorf("mtls in the path form: %d", code)
	}
	hb("url", "cert", "revoke", alice.Serial)
	if code := certGet(aliceC, mu.URL); code != 403 {
		t.Errorf("alice after revoke, on her open connection: %d", code)
	}
	if code := certGet(bobC, mu.URL); code != 200 {
		t.Errorf("bob after alice's revoke: %d", code)
	}

	// OpenID Connect: ID tokens of the issuer, for the audience, naming an
	// allowed subject; the token never reaches the guest.
	hb("exec", box.ID, "--background", "--", "/tmp/guestweb", "-listen", ":8082")
	var ou sandbox.URL
	if err := json.Unmarshal([]byte(hb("url", "create", box.ID, "--port", "8082", "--auth", "oidc", "--issuer", iss.url,
		"--audience", "app", "--subjects", "alice")), &ou); err != nil || ou.Auth != "oidc" || ou.Token != "" {
		t.Fatalf("url create --auth oidc: %+v %v", ou, err)
	}
	aliceTok := iss.sign(map[string]any{"sub": "alice"})
	bearer := func(tok string) http.Header { return http.Header{"Authorization": {"Bearer " + tok}} }
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		code, body := get(ou.URL, bearer(aliceTok))
		if code == 200 {
			if seen, _ := json.Marshal(body); strings.Contains(string(seen), aliceTok) {
				t.Errorf("the guest saw the ID token: %s", seen)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("oidc: alice's ID token never got through: %d", code)
		}
	}
	for name, c := range map[string]struct {
		h    http.Header
		want int
	}{
		"none":           {nil, 401},
		"not allowed":    {bearer(iss.sign(map[string]any{"sub": "mallory"})), 403},
		"wrong audience": {bearer(iss.sign(map[string]any{"aud": "other"})), 401},
		"expired":        {bearer(iss.sign(map[string]any{"exp": time.Now().Add(-time.Hour).Unix()})), 401},
		"a URL token":    {http.Header{"X-Harebox-Token": {nu.Token}}, 401},
	} {
		if code, _ := get(ou.URL, c.h); code != c.want {
			t.Errorf("oidc, %s: %d, want %d", name, code, c.want)
		}
	}

	// hareboxd killed and started again: the URL, its new token and the
	// guest's opened port are all still there.
	srv.Cmd.Process.Signal(syscall.SIGKILL)
	srv.Cmd.Wait()
	testserver.Relaunch(t, srv)
	tr.CloseIdleConnections()
	if code, _ := get(u.URL, http.Header{"X-Harebox-Token": {nu.Token}}); code != 200 {
		t.Errorf("new token after a restart: %d", code)
	}
	if code, _ := get(u.URL, http.Header{"X-Harebox-Token": {u.Token}}); code != 401 {
		t.Errorf("old token after a restart: %d", code)
	}
	ws = openWS(t, cfg, dial, u.URL, nu.Token)
	// And so are the CA, the mtls URL and the revocation.
	if code := certGet(certClient("bob"), mu.URL); code != 200 {
		t.Errorf("bob after a restart: %d", code)
	}
	if code := certGet(certClient("alice"), mu.URL); code != 403 {
		t.Errorf("alice after a restart: %d", code)
	}

	// Delete: refused at once, the WebSocket is cut.
	hb("url", "delete", box.ID, u.ID)
	if code, _ := get(u.URL, http.Header{"X-Harebox-Token": {nu.Token}}); code != 404 {
		t.Errorf("after delete: %d", code)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	_, _, err = ws.Read(ctx)
	cancel()
	if err == nil {
		t.Error("the WebSocket outlived its URL")
	}
	if out := hb("url", "list", box.ID); strings.Contains(out, u.ID) || !strings.Contains(out, mu.ID) {
		t.Errorf("url list after delete: %s", out)
	}

	// The audit log has the ingress's decisions.
	_, audit := srv.Call(t, "GET", "/v1/audit?action=accessURL&limit=100", srv.Key, nil)
	outcomes := map[string]bool{}
	for _, e := range audit["entries"].([]any) {
		m := e.(map[string]any)
		if m["target"] == u.ID {
			outcomes[m["outcome"].(string)] = true
		}
	}
	if !outcomes["ok"] || !outcomes["denied"] {
		t.Errorf("audit outcomes for the URL: %v (%v)", outcomes, audit)
	}
}

// openWS opens a WebSocket to the guest's /ws through the ingress and
// checks that it echoes.
func openWS(t *testing.T, cfg *tls.Config, dial func(context.Context, string, string) (net.Conn, error), base, tok string) *websocket.Conn {
	t.Helper()
	pu, _ := url.Parse(base)
	wsURL := "wss://" + pu.Host + "/ws"
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, DialContext: dial}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPClient: hc, HTTPHeader: http.Header{"X-Harebox-Token": {tok}}})
	if err != nil {
		t.Fatalf("websocket: %v", err)
	}
	t.Cleanup(func() { c.CloseNow() })
	if err := c.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, b, err := c.Read(ctx); err != nil || string(b) != "ping" {
		t.Fatalf("websocket echo: %q %v", b, err)
	}
	return c
}

// browse opens a URL's link to its /page in headless Chromium, trusting
// the ingress's certificate by its key: the link's token becomes a cookie,
// the guest's page renders (a screenshot is blue where the page is, with
// its heading drawn), and the guest saw no token. Without the link, the
// browser gets the ingress's refusal.
func browse(t *testing.T, certFile string, u sandbox.URL) {
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (make deps installs it)")
	}
	blk, _ := pem.Decode(testserver.ReadFile(t, certFile))
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	spki := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	dir := t.TempDir()
	chrome := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"--headless=new", "--no-sandbox", "--disable-gpu",
			"--no-first-run", "--user-data-dir=" + filepath.Join(dir, "profile"), "--window-size=800,600",
			"--ignore-certificate-errors-spki-list=" + base64.StdEncoding.EncodeToString(spki[:])}, args...)...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			t.Fatalf("chromium %v: %v\n%s", args, err, errOut.String())
		}
		return out.String()
	}
	page := u.URL + "page"
	link := page + "?harebox_token=" + url.QueryEscape(u.Token)
	if dom := chrome("--dump-dom", page); !strings.Contains(dom, "needs its token") || strings.Contains(dom, "served by the guest") {
		t.Errorf("without the link the browser got: %s", dom)
	}
	dom := chrome("--dump-dom", link)
	if !strings.Contains(dom, "served by the guest") || strings.Contains(dom, u.Token) || strings.Contains(dom, "harebox_token") {
		t.Errorf("through the link the browser got: %s", dom)
	}
	shot := filepath.Join(dir, "shot.png")
	chrome("--screenshot="+shot, link)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	b := img.Bounds()
	blue := func(x, y int) bool {
		r, g, bl, _ := img.At(x, y).RGBA()
		return r>>8 < 60 && g>>8 > 120 && g>>8 < 170 && bl>>8 > 230
	}
	if !blue(b.Dx()/2, b.Dy()*3/4) {
		t.Errorf("the screenshot is not the guest's blue page: %v at the centre", img.At(b.Dx()/2, b.Dy()*3/4))
	}
	drawn := 0 // the heading's dark pixels on the blue
	for y := 0; y < min(b.Dy(), 80); y++ {
		for x := 0; x < min(b.Dx(), 400); x++ {
			if r, g, bl, _ := img.At(x, y).RGBA(); r>>8 < 40 && g>>8 < 40 && bl>>8 < 80 {
				drawn++
			}
		}
	}
	if drawn < 200 {
		t.Errorf("the heading is not drawn (%d dark pixels)", drawn)
	}
}

// testIssuer is an OpenID Connect issuer on loopback (TLS): its
// discovery document and one signing key.
type testIssuer struct {
	url, certFile string
	key           *ecdsa.PrivateKey
}

func newIssuer(t *testing.T) *testIssuer {
	is := &testIssuer{}
	is.key, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/.well-known/openid-configuration":
			json.NewEncoder(w).Encode(map[string]any{"issuer": is.url, "jwks_uri": is.url + "/keys",
				"authorization_endpoint": is.url + "/auth", "token_endpoint": is.url + "/token",
				"id_token_signing_alg_values_supported": []string{"ES256"}})
		case "/keys":
			json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &is.key.PublicKey, KeyID: "k1", Algorithm: "ES256", Use: "sig"}}})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	is.url = srv.URL
	is.certFile = filepath.Join(t.TempDir(), "issuer.pem")
	if err := os.WriteFile(is.certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	return is
}

// sign makes an ID token: this issuer, audience "app", subject "alice",
// valid for an hour, with over's claims over those.
func (is *testIssuer) sign(over map[string]any) string {
	c := map[string]any{"iss": is.url, "aud": "app", "sub": "alice", "iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()}
	for k, v := range over {
		c[k] = v
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: is.key, KeyID: "k1"}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		panic(err)
	}
	payload, _ := json.Marshal(c)
	sig, err := signer.Sign(payload)
	if err != nil {
		panic(err)
	}
	tok, _ := sig.CompactSerialize()
	return tok
}
