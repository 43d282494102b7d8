package host

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/sandbox"
)

// ingressClient sends every request to one host's ingress (addr), trusting
// the ingresses' certificates (each host made its own) of dirs.
type ingressClient struct {
	cfg  *tls.Config
	addr string
}

func newIngressClient(t *testing.T, addr string, dataDirs ...string) *ingressClient {
	t.Helper()
	pool := x509.NewCertPool()
	for _, d := range dataDirs {
		b, err := os.ReadFile(filepath.Join(d, "ingress-tls", "cert.pem"))
		if err != nil || !pool.AppendCertsFromPEM(b) {
			t.Fatalf("the ingress certificate of %s: %v", d, err)
		}
	}
	return &ingressClient{cfg: &tls.Config{RootCAs: pool}, addr: addr}
}

func (c *ingressClient) dial(ctx context.Context, network, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, c.addr)
}

// http is a client of HTTP/2 (h2) or HTTP/1.1.
func (c *ingressClient) http(h2 bool) *http.Client {
	tr := &http.Transport{TLSClientConfig: c.cfg.Clone(), DialContext: c.dial, ForceAttemptHTTP2: h2}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// get sends GET u (with token) and returns its status and protocol (0 when
// the request failed).
func get(cl *http.Client, u, token string) (int, int) {
	req, _ := http.NewRequest("GET", u, nil)
	req.Header.Set("X-Harebox-Token", token)
	resp, err := cl.Do(req)
	if err != nil {
		return 0, 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.ProtoMajor
}

// publishGuestWeb starts a web server in sandbox id (port 8080, in the
// background) and publishes that port as a URL, through hb.
func publishGuestWeb(t *testing.T, hb func(...string) string, id string) sandbox.URL {
	t.Helper()
	web := testimage.Package(t, "./e2e/testdata/guestweb", "guestweb")
	hb("file", "write", id, "--path", "/tmp/guestweb", "--mode", "0755", "--from", web)
	hb("exec", id, "--background", "--", "/tmp/guestweb", "-listen", ":8080")
	var u sandbox.URL
	if err := json.Unmarshal([]byte(hb("url", "create", id, "--port", "8080")), &u); err != nil || u.Token == "" {
		t.Fatalf("url create: %v", err)
	}
	return u
}

// awaitURL waits up to a minute for URL u to answer 200 through cl (its
// server starts in the background).
func awaitURL(t *testing.T, cl *http.Client, u sandbox.URL, what string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for code, _ := get(cl, u.URL, u.Token); code != 200; code, _ = get(cl, u.URL, u.Token) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d", what, code)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// testURLThroughAnyHost: a URL of sandbox id, which host b runs, is
// served through host a's ingress (HTTP/1.1, HTTP/2, a WebSocket), and a
// rotate through a's API cuts the old token on both hosts' ingresses
// before it returns, while a hammer of old-token requests arrives
// through both.
func testURLThroughAnyHost(t *testing.T, hb func(...string) string, id, ingressA, ingressB string, dataDirs ...string) {
	u := publishGuestWeb(t, hb, id)
	viaA, viaB := newIngressClient(t, ingressA, dataDirs...), newIngressClient(t, ingressB, dataDirs...)
	h1, h2 := viaA.http(false), viaA.http(true)
	awaitURL(t, h1, u, "b's URL through a's ingress")
	if code, proto := get(h2, u.URL+"x?y=1", u.Token); code != 200 || proto != 2 {
		t.Fatalf("b's URL through a's ingress over HTTP/2: %d, HTTP/%d", code, proto)
	}
	if code, _ := get(h1, u.URL, u.Token+"x"); code != 401 {
		t.Fatalf("a wrong token through a's ingress: %d", code)
	}
	pu, _ := url.Parse(u.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "wss://"+pu.Host+"/ws", &websocket.DialOptions{
		HTTPClient: viaA.http(false), HTTPHeader: http.Header{"X-Harebox-Token": {u.Token}}})
	if err != nil {
		t.Fatalf("a WebSocket to b's URL through a's ingress: %v", err)
	}
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, m, err := ws.Read(ctx); err != nil || string(m) != "ping" {
		t.Fatalf("the WebSocket's echo: %q %v", m, err)
	}

	// The hammer: old-token requests through both hosts' ingresses.
	var rotated, stop atomic.Bool
	var okAfter, sentAfter atomic.Int64
	var wg sync.WaitGroup
	for _, cl := range []*http.Client{viaA.http(false), viaA.http(true), viaB.http(false), viaB.http(true)} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				after := rotated.Load() // (read before the request is sent)
				code, _ := get(cl, u.URL, u.Token)
				if after {
					sentAfter.Add(1)
					if code == 200 {
						okAfter.Add(1)
					}
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	var nu sandbox.URL
	if err := json.Unmarshal([]byte(hb("url", "rotate", id, u.ID)), &nu); err != nil || nu.Token == "" || nu.Token == u.Token {
		t.Fatalf("url rotate: %v", err)
	}
	rotated.Store(true)
	for end := time.Now().Add(10 * time.Second); sentAfter.Load() < 20 && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	if okAfter.Load() != 0 || sentAfter.Load() == 0 {
		t.Fatalf("%d of %d old-token requests sent through either host after the rotate succeeded", okAfter.Load(), sentAfter.Load())
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	if err := ws.Write(wctx, websocket.MessageText, []byte("after")); err == nil {
		if _, _, err := ws.Read(wctx); err == nil {
			t.Error("the old token's WebSocket through a still echoes after the rotate")
		}
	}
	for _, c := range []*ingressClient{viaA, viaB} {
		if code, _ := get(c.http(true), nu.URL, nu.Token); code != 200 {
			t.Errorf("the new token through %s: %d", c.addr, code)
		}
	}
	t.Logf("through a's ingress: b's URL over HTTP/1.1, HTTP/2 and a WebSocket; the rotate refused all %d old-token requests sent after it through both hosts", sentAfter.Load())
}
