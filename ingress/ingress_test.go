package ingress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/console"
	"github.com/harebox/harebox/internal/testweb"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/servertls"
	"github.com/harebox/harebox/store"
)

// loopGuests stands in for the network: every guest port is one real
// HTTP server on loopback (the network's side is tested in linuxnet,
// and the whole path on a real VM in e2e).
type loopGuests struct {
	addr   string
	mu     sync.Mutex
	closed []uint16
}

func (g *loopGuests) DialGuest(ctx context.Context, _ string, _ uint16) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", g.addr)
}

func (g *loopGuests) ClosePorts(_ context.Context, _ string, ports ...uint16) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = append(g.closed, ports...)
	return nil
}

// upstream is the guest's app: internal/testweb's (events every 5 ms),
// and routes that set cookies, flood, or answer late.
func upstream(t *testing.T) string {
	mux := testweb.NewMux(5 * time.Millisecond)
	mux.HandleFunc("/setcookie", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Set-Cookie", CookieName+"=hburl_guest; Domain=harebox.test; Path=/")
		w.Header().Add("Set-Cookie", "app=1; Path=/")
		w.Header().Add("Set-Cookie", console.Cookie+"=fixated; Path=/")
		w.Header().Add("Set-Cookie", "HAREBOX_TOKEN=x")
		w.Header().Add("Set-Cookie", "wide=1; Domain=harebox.test; Path=/")
		w.Header().Set("Service-Worker-Allowed", "/")
	})
	mux.HandleFunc("/flood", func(w http.ResponseWriter, r *http.Request) {
		chunk := make([]byte, 64<<10)
		for {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(2 * time.Second):
			io.WriteString(w, "late")
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

type fixture struct {
	svc     *Service
	base    string // the ingress's address, http(s)://127.0.0.1:PORT
	guests  *loopGuests
	db      *store.DB
	records chan string
	who     chan string  // mtls decisions: who and whether allowed
	client  *http.Client // trusts the ingress's certificate (TLS fixtures)
	tls     *tls.Config
}

// newFixture serves an ingress on loopback, with TLS (and HTTP/2) or
// without.
func newFixture(t *testing.T, withTLS bool) *fixture { return newFixtureOn(t, withTLS, "harebox.test") }

// newFixtureOn serves an ingress whose base host is host (its
// certificate, with TLS, is for host and *.host too).
func newFixtureOn(t *testing.T, withTLS bool, host string) *fixture {
	return newFixtureDB(t, withTLS, host, nil)
}

// newFixtureDB is newFixtureOn over db (nil: a database of its own).
func newFixtureDB(t *testing.T, withTLS bool, host string, db *store.DB) *fixture {
	ctx, cancel := context.WithCancel(context.Background())
	own := db == nil
	if own {
		var err error
		if db, err = store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "db")); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{guests: &loopGuests{addr: upstream(t)}, records: make(chan string, 1000), who: make(chan string, 1000), client: &http.Client{}}
	scheme := "http"
	var tc *tls.Config
	if withTLS {
		scheme = "https"
		dir := t.TempDir()
		cert, key, _, err := servertls.SelfSigned(dir, []string{"localhost", "127.0.0.1", host, "*." + host})
		if err != nil {
			t.Fatal(err)
		}
		src, err := servertls.Load(cert, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		tc = servertls.Config(src)
		f.tls = &tls.Config{RootCAs: certPool(src), ServerName: "localhost"}
		f.client.Transport = &http.Transport{TLSClientConfig: f.tls, ForceAttemptHTTP2: true}
	}
	base, _ := url.Parse(scheme + "://" + host + ":" + fmt.Sprint(ln.Addr().(*net.TCPAddr).Port))
	f.base = scheme + "://" + ln.Addr().String()
	sec, err := secrets.NewSealed(db, filepath.Join(t.TempDir(), "master.key"))
	if err != nil {
		t.Fatal(err)
	}
	f.svc, err = New(ctx, Options{Store: db, Secrets: sec, Guests: f.guests, Base: base, Record: func(u *sandbox.URL, who string, ok bool) {
		// (Past what a test reads, dropped: a full channel would hold
		// the request up.)
		select {
		case f.records <- fmt.Sprintf("%s %v", u.ID, ok):
		default:
		}
		if strings.HasPrefix(who, "mtls") {
			select {
			case f.who <- fmt.Sprintf("%s %v", who, ok):
			default:
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { f.svc.Serve(ctx, ln, tc); close(done) }()
	f.db = db
	t.Cleanup(func() {
		cancel()
		<-done
		if own {
			db.Close()
		}
	})
	return f
}

var sbxID = sandbox.NewID()

// owner is the sandbox the tests publish ports of.
var owner = Owner{SandboxID: sbxID, AccountID: "acc_1", ProjectID: "prj_1"}

func (f *fixture) publish(t *testing.T, port int) *sandbox.URL {
	t.Helper()
	u, err := f.svc.Create(context.Background(), owner, sandbox.URLRequest{Port: port})
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// get sends a request to the ingress with the Host of a URL's host form.
func (f *fixture) get(t *testing.T, u *sandbox.URL, path string, h http.Header) (*http.Response, map[string]any) {
	t.Helper()
	pu, _ := url.Parse(u.URL)
	req, _ := http.NewRequest("GET", f.base+path, nil)
	req.Host = pu.Host
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if resp.StatusCode == 200 {
		json.NewDecoder(resp.Body).Decode(&body)
	}
	return resp, body
}

// TestToken: each way of presenting the token is accepted and taken off
// the request; anything else is refused and recorded.
func TestToken(t *testing.T) {
	f := newFixture(t, false)
	u := f.publish(t, 8080)
	if !strings.HasPrefix(u.Token, TokenPrefix) || u.URL != "http://8080-"+strings.TrimPrefix(sbxID, "sbx_")+".harebox.test:"+strings.Split(f.base, ":")[2]+"/" {
		t.Fatalf("created %+v", u)
	}
	if _, err := f.svc.Create(context.Background(), owner, sandbox.URLRequest{Port: 8080}); err == nil {
		t.Error("a second URL for the same port was created")
	}
	if _, err := f.svc.Create(context.Background(), owner, sandbox.URLRequest{Port: 70000}); err == nil {
		t.Error("port 70000 accepted")
	}

	for name, h := range map[string]http.Header{
		"none":         nil,
		"wrong header": {TokenHeader: {u.Token + "x"}},
		"basic":        {"Authorization": {"Basic " + u.Token}},
		"wrong cookie": {"Cookie": {CookieName + "=hburl_nope"}},
	} {
		resp, _ := f.get(t, u, "/x", h)
		if resp.StatusCode != 401 {
			t.Errorf("%s: status %d, want 401", name, resp.StatusCode)
		}
	}
	if got := <-f.records; got != u.ID+" false" {
		t.Errorf("recorded %q", got)
	}

	for name, h := range map[string]http.Header{
		"header": {TokenHeader: {u.Token}},
		"bearer": {"Authorization": {"Bearer " + u.Token}},
		"cookie": {"Cookie": {"app=1; " + CookieName + "=" + u.Token + "; other=2"}},
		// (The console's session cookie comes to any port of the host.)
		"console": {TokenHeader: {u.Token}, "Cookie": {console.Cookie + "=consolesession"}},
		"referer": {TokenHeader: {u.Token}, "Referer": {"https://x.test/p?a=b&" + QueryParam + "=" + u.Token}},
	} {
		resp, body := f.get(t, u, "/x/y?a=1", h)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", name, resp.StatusCode)
		}
		got, _ := json.Marshal(body)
		if strings.Contains(string(got), u.Token) || strings.Contains(string(got), CookieName) || strings.Contains(string(got), "consolesession") {
			t.Errorf("%s: the guest saw the credential: %s", name, got)
		}
		if body["path"] != "/x/y" || body["query"] != "a=1" {
			t.Errorf("%s: the guest got %v?%v", name, body["path"], body["query"])
		}
		if name == "referer" {
			if r := body["header"].(map[string]any)["Referer"]; fmt.Sprint(r) != "[https://x.test/p?a=b]" {
				t.Errorf("referer: %v", r)
			}
		}
		if name == "cookie" {
			if c := body["header"].(map[string]any)["Cookie"]; fmt.Sprint(c) != "[app=1; other=2]" {
				t.Errorf("the app's own cookies: %v", c)
			}
		}
	}
	if got := <-f.records; got != u.ID+" true" {
		t.Errorf("recorded %q", got)
	}

	// The guest cannot set (or shadow) the ingress's cookie.
	resp, _ := f.get(t, u, "/setcookie", http.Header{TokenHeader: {u.Token}})
	if sc := resp.Header.Values("Set-Cookie"); len(sc) != 2 || sc[0] != "app=1; Path=/" || sc[1] != "wide=1; Path=/" {
		t.Errorf("the guest's cookies reached the client as %q", sc)
	}
	// In the path form its cookies stay under the URL's path, and it
	// cannot widen a service worker's scope or register one.
	req, _ := http.NewRequest("GET", f.base+"/s/"+sbxID+"/8080/setcookie", nil)
	req.Header.Set(TokenHeader, u.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := []string{"app=1; Path=/s/" + sbxID + "/8080/", "wide=1; Path=/s/" + sbxID + "/8080/"}
	if sc := resp.Header.Values("Set-Cookie"); fmt.Sprint(sc) != fmt.Sprint(want) || resp.Header.Get("Service-Worker-Allowed") != "" {
		t.Errorf("path form: cookies %q, Service-Worker-Allowed %q", sc, resp.Header.Get("Service-Worker-Allowed"))
	}
	req.Header.Set("Service-Worker", "script")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 403 {
		t.Errorf("a service worker's script in the path form: %v %v", resp, err)
	}

	// The cookie does not act for a page of another site (another
	// sandbox's host form is the same site), except in a navigation.
	ck := http.Header{"Cookie": {CookieName + "=" + u.Token}}
	for _, c := range []struct {
		site, mode string
		want       int
	}{{"same-site", "cors", 403}, {"cross-site", "no-cors", 403}, {"same-site", "navigate", 200}, {"same-origin", "cors", 200}, {"none", "navigate", 200}} {
		h := ck.Clone()
		h.Set("Sec-Fetch-Site", c.site)
		h.Set("Sec-Fetch-Mode", c.mode)
		if resp, _ := f.get(t, u, "/x", h); resp.StatusCode != c.want {
			t.Errorf("cookie from %s (%s): %d, want %d", c.site, c.mode, resp.StatusCode, c.want)
		}
	}
	h := http.Header{TokenHeader: {u.Token}, "Sec-Fetch-Site": {"cross-site"}, "Sec-Fetch-Mode": {"cors"}}
	if resp, _ := f.get(t, u, "/x", h); resp.StatusCode != 200 {
		t.Errorf("a header token from another site (no cookie, so no forgery): %d", resp.StatusCode)
	}

	// Another port of the same sandbox, and another sandbox: not found.
	other := *u
	other.URL = strings.Replace(u.URL, "8080-", "8081-", 1)
	if resp, _ := f.get(t, &other, "/", http.Header{TokenHeader: {u.Token}}); resp.StatusCode != 404 {
		t.Errorf("unpublished port: %d", resp.StatusCode)
	}
}

// TestLink: a shared link's token is swapped for a cookie scoped to the
// URL (host form and path form), and the browser goes on without it.
// A request's body and its answer stream at once, over HTTP/1 and
// HTTP/2: the guest's app answers before it reads the body, and the body
// still reaches it whole.
func TestFullDuplex(t *testing.T) {
	for _, withTLS := range []bool{false, true} {
		f := newFixture(t, withTLS)
		u := f.publish(t, 8080)
		pu, _ := url.Parse(u.URL)
		if err := testweb.CheckDuplex(func(body io.Reader) (*http.Response, error) {
			req, _ := http.NewRequest("POST", f.base+"/echo", body)
			req.Host = pu.Host
			req.Header.Set(TokenHeader, u.Token)
			return f.client.Do(req)
		}); err != nil {
			t.Errorf("TLS %v: %v", withTLS, err)
		}
	}
}

func TestLink(t *testing.T) {
	f := newFixture(t, false)
	u := f.publish(t, 3000)
	for _, form := range []string{"path", "host"} {
		jar, _ := cookiejar.New(nil)
		c := &http.Client{Jar: jar}
		var link string
		if form == "path" {
			link = f.base + "/s/" + sbxID + "/3000/app/page?x=1&" + QueryParam + "=" + u.Token
		} else {
			link = f.base + "/app/page?x=1&" + QueryParam + "=" + u.Token
		}
		req, _ := http.NewRequest("GET", link, nil)
		if form == "host" {
			pu, _ := url.Parse(u.URL)
			req.Host = pu.Host
			// The jar keys cookies by the request URL's host, not Host.
			c.Jar = nil
		}
		c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusSeeOther || strings.Contains(loc, u.Token) || !strings.HasSuffix(loc, "/app/page?x=1") || resp.Header.Get("Referrer-Policy") != "no-referrer" {
			t.Fatalf("%s: %d to %q", form, resp.StatusCode, loc)
		}
		ck := resp.Cookies()
		wantPath := "/"
		if form == "path" {
			wantPath = "/s/" + sbxID + "/3000/"
		}
		if len(ck) != 1 || ck[0].Value != u.Token || !ck[0].HttpOnly || !ck[0].Secure || ck[0].SameSite != http.SameSiteLaxMode || ck[0].Path != wantPath {
			t.Fatalf("%s: cookie %+v", form, ck)
		}
		if form == "path" {
			// The jar does not send Secure cookies over http; as the
			// browser would over https, send it by hand.
			req, _ := http.NewRequest("GET", f.base+loc, nil)
			req.AddCookie(&http.Cookie{Name: CookieName, Value: u.Token})
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var body map[string]any
			json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if resp.StatusCode != 200 || body["path"] != "/app/page" {
				t.Errorf("after the link: %d %v", resp.StatusCode, body)
			}
		}
	}
	// A link whose path names another host keeps the browser here.
	pu, _ := url.Parse(u.URL)
	req, _ := http.NewRequest("GET", f.base+"//evil.test/x?"+QueryParam+"="+u.Token, nil)
	req.Host = pu.Host
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != 303 || !strings.HasPrefix(loc, "/") || strings.HasPrefix(loc, "//") {
		t.Errorf("redirected to %q", loc)
	}
	// A wrong link is refused and sets nothing.
	resp, err = http.Get(f.base + "/s/" + sbxID + "/3000/?" + QueryParam + "=hburl_wrong")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || len(resp.Cookies()) != 0 {
		t.Errorf("wrong link: %d %v", resp.StatusCode, resp.Cookies())
	}
	// The path form without its trailing slash is sent to it.
	resp, err = (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Get(f.base + "/s/" + sbxID + "/3000?" + QueryParam + "=x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 308 || resp.Header.Get("Location") != "/s/"+sbxID+"/3000/?"+QueryParam+"=x" {
		t.Errorf("no slash: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// TestDelete: a deleted URL is refused at once, its open streams are cut
// and its port closed to the ingress.
func TestDelete(t *testing.T) {
	f := newFixture(t, false)
	u := f.publish(t, 8080)
	ev := f.openSSE(t, u, u.Token)
	if err := f.svc.Delete(context.Background(), sbxID, u.ID); err != nil {
		t.Fatal(err)
	}
	if n := ev.after(time.Now()); n != 0 {
		t.Errorf("%d events after delete", n)
	}
	if resp, _ := f.get(t, u, "/", http.Header{TokenHeader: {u.Token}}); resp.StatusCode != 404 {
		t.Errorf("after delete: %d", resp.StatusCode)
	}
	if len(f.guests.closed) != 1 || f.guests.closed[0] != 8080 {
		t.Errorf("closed ports %v", f.guests.closed)
	}
	if l, _ := f.svc.List(context.Background(), sbxID); len(l) != 0 {
		t.Errorf("listed %v", l)
	}
}

// sse is an event stream opened through the ingress.
type sse struct {
	r      *bufio.Reader
	resp   *http.Response
	events atomic.Int64
	ended  chan struct{}
	mu     sync.Mutex
	stamps []int64 // when the guest wrote each event
}

func (f *fixture) openSSE(t *testing.T, u *sandbox.URL, tok string) *sse {
	t.Helper()
	pu, _ := url.Parse(u.URL)
	req, _ := http.NewRequest("GET", f.base+"/sse", nil)
	req.Host = pu.Host
	req.Header.Set(TokenHeader, tok)
	resp, err := f.client.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("sse: %v %v", resp, err)
	}
	s := &sse{r: bufio.NewReader(resp.Body), resp: resp, ended: make(chan struct{})}
	go func() {
		defer close(s.ended)
		for {
			line, err := s.r.ReadString('\n')
			if err != nil {
				return
			}
			if v, ok := strings.CutPrefix(line, "data: "); ok {
				ns, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				s.mu.Lock()
				s.stamps = append(s.stamps, ns)
				s.mu.Unlock()
				s.events.Add(1)
			}
		}
	}()
	t.Cleanup(func() { resp.Body.Close() })
	for s.events.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	return s
}

// after waits for the stream to end (it must, within a second) and counts
// the events it got that the guest wrote after t. (Events written before
// t may still arrive after it: they were on their way.)
func (s *sse) after(t time.Time) int64 {
	select {
	case <-s.ended:
	case <-time.After(time.Second):
		s.resp.Body.Close()
		<-s.ended
		return 1 << 30 // still open
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, ns := range s.stamps {
		if ns > t.UnixNano() {
			n++
		}
	}
	return n
}

// TestRotation rotates a URL's token again and again while clients use
// the old and the new one over keep-alive connections, HTTP/2 streams,
// event streams and WebSockets: after Rotate returns, no request sent with
// the old token succeeds and no stream it opened gets another byte, and
// every request with the new token succeeds.
//
// Through another host too: the sandbox runs on host a, the clients use
// host b's ingress, which sends them to a's; a rotate on a cuts what the
// old token opened through b.
func TestRotation(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"http1", "h2", "through-another-host"} {
		t.Run(mode, func(t *testing.T) {
			withTLS := mode != "http1"
			a := newFixture(t, withTLS)
			f := a
			if mode == "through-another-host" {
				f = throughAnotherHost(t, a)
			}
			u := a.publish(t, 8080)
			pu, _ := url.Parse(u.URL)
			tok := u.Token
			for round := 0; round < 15; round++ {
				// Streams opened with the current token.
				ev := f.openSSE(t, u, tok)
				ws := f.openWS(t, pu.Host, tok)

				// A loop on the current token, on one keep-alive client.
				var stop atomic.Bool
				var okAfter, sentAfter atomic.Int64
				var rotated atomic.Bool
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !stop.Load() {
						after := rotated.Load() // read before the request is sent
						req, _ := http.NewRequest("GET", f.base+"/loop", nil)
						req.Host = pu.Host
						req.Header.Set(TokenHeader, tok)
						resp, err := f.client.Do(req)
						if after {
							sentAfter.Add(1)
						}
						if err == nil {
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
							if after && resp.StatusCode == 200 {
								okAfter.Add(1)
							}
						}
					}
				}()
				time.Sleep(20 * time.Millisecond)
				nu, err := a.svc.Rotate(context.Background(), sbxID, u.ID)
				if err != nil {
					t.Fatal(err)
				}
				rotated.Store(true)
				returned := time.Now()
				// The old streams are cut: no event written from then on
				// reaches the client, no echo.
				if n := ev.after(returned); n != 0 {
					t.Errorf("round %d: %d events on the old token's stream after rotate", round, n)
				}
				wctx, cancel := context.WithTimeout(context.Background(), time.Second)
				err = ws.Write(wctx, websocket.MessageText, []byte("hi"))
				if err == nil {
					_, _, err = ws.Read(wctx)
				}
				cancel()
				if err == nil {
					t.Errorf("round %d: the old token's WebSocket still echoes", round)
				}
				// The new token works at once, many times.
				for i := 0; i < 20; i++ {
					resp, _ := f.get(t, u, "/new", http.Header{TokenHeader: {nu.Token}})
					if resp.StatusCode != 200 {
						t.Fatalf("round %d: new token refused: %d", round, resp.StatusCode)
					}
					if withTLS && resp.ProtoMajor != 2 {
						t.Fatalf("over TLS the client speaks %s, want HTTP/2", resp.Proto)
					}
				}
				// The loop sends with the old token after rotate (on a
				// busy machine it may not have been scheduled yet).
				for end := time.Now().Add(5 * time.Second); sentAfter.Load() < 2 && time.Now().Before(end); {
					time.Sleep(5 * time.Millisecond)
				}
				stop.Store(true)
				wg.Wait()
				if okAfter.Load() != 0 {
					t.Fatalf("round %d: %d of %d requests sent with the old token after rotate succeeded", round, okAfter.Load(), sentAfter.Load())
				}
				if sentAfter.Load() == 0 {
					t.Fatalf("round %d: the old-token loop sent nothing in 5 s after rotate", round)
				}
				tok = nu.Token
			}
		})
	}
}

func (f *fixture) openWS(t *testing.T, host, tok string) *websocket.Conn {
	t.Helper()
	h := http.Header{TokenHeader: {tok}}
	hc := &http.Client{}
	if f.tls != nil {
		// WebSockets go over HTTP/1.1.
		hc.Transport = &http.Transport{TLSClientConfig: f.tls}
	}
	wsURL := strings.Replace(f.base, "http", "ws", 1) + "/ws"
	return dialWS(t, wsURL, &websocket.DialOptions{HTTPHeader: h, HTTPClient: hc, Host: host})
}

// dialWS opens a WebSocket to the guest's echo through the ingress and
// checks that it echoes.
func dialWS(t *testing.T, wsURL string, opts *websocket.DialOptions) *websocket.Conn {
	t.Helper()
	c, _, err := websocket.Dial(context.Background(), wsURL, opts)
	if err != nil {
		t.Fatalf("websocket: %v", err)
	}
	t.Cleanup(func() { c.CloseNow() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, b, err := c.Read(ctx); err != nil || string(b) != "ping" {
		t.Fatalf("websocket echo: %q %v", b, err)
	}
	return c
}

func certPool(src *servertls.Source) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(src.Leaf())
	return p
}

// TestRotateUnblocked: a client that stops reading (its socket full, or
// its HTTP/2 window spent) does not hold Rotate or the URL's other calls,
// and a request cut before the guest answered is never a success.
func TestRotateUnblocked(t *testing.T) {
	t.Parallel()
	for _, withTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "http1", true: "h2"}[withTLS], func(t *testing.T) {
			f := newFixture(t, withTLS)
			u := f.publish(t, 8080)
			pu, _ := url.Parse(u.URL)
			req, _ := http.NewRequest("GET", f.base+"/flood", nil)
			req.Host = pu.Host
			req.Header.Set(TokenHeader, u.Token)
			resp, err := f.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close() // never read
			time.Sleep(500 * time.Millisecond)

			slow := make(chan int, 1)
			go func() {
				req, _ := http.NewRequest("GET", f.base+"/slow", nil)
				req.Host = pu.Host
				req.Header.Set(TokenHeader, u.Token)
				r, err := f.client.Do(req)
				if err != nil {
					slow <- 0
					return
				}
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
				slow <- r.StatusCode
			}()
			time.Sleep(200 * time.Millisecond)

			done := make(chan error, 1)
			go func() { _, err := f.svc.Rotate(context.Background(), sbxID, u.ID); done <- err }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Rotate is held by a client that does not read")
			}
			if _, err := f.svc.Get(context.Background(), sbxID, u.ID); err != nil {
				t.Fatal(err)
			}
			if code := <-slow; code == 200 {
				t.Error("a request cut by rotate before the guest answered got 200")
			}
		})
	}
}

// TestRotateDeleteRace: a rotation racing a delete never brings the URL
// back (in memory or in the store, for the next start).
func TestRotateDeleteRace(t *testing.T) {
	f := newFixture(t, false)
	ctx := context.Background()
	for i := range 30 {
		u := f.publish(t, 10000+i)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); f.svc.Rotate(ctx, sbxID, u.ID) }()
		go func() { defer wg.Done(); f.svc.Delete(ctx, sbxID, u.ID) }()
		wg.Wait()
		if _, err := f.svc.opts.Store.GetURL(ctx, u.ID); err == nil {
			t.Fatalf("round %d: the deleted URL is back in the store", i)
		}
		if _, err := f.svc.Get(ctx, sbxID, u.ID); err == nil {
			t.Fatalf("round %d: the deleted URL is still served", i)
		}
	}
}

// throughAnotherHost serves a second ingress, host b's, whose requests
// for the tests' sandbox (run by host a, whose ingress is a) go to a's
// ingress over a's internal endpoint (mutual TLS, as hosts forward), and
// returns b's fixture.
func throughAnotherHost(t *testing.T, a *fixture) *fixture {
	t.Helper()
	dir := t.TempDir()
	if _, err := cluster.MakeCA(dir); err != nil {
		t.Fatal(err)
	}
	load := func(name string) *cluster.TLS {
		if err := cluster.IssueHost(dir, name, []string{"127.0.0.1"}); err != nil {
			t.Fatal(err)
		}
		c, err := cluster.LoadTLS(filepath.Join(dir, "ca.pem"), filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "the API", http.StatusTeapot) })
	in := &http.Server{Handler: cluster.Internal(cluster.Split(api, a.svc))}
	go in.Serve(tls.NewListener(l, load("a").Server))
	t.Cleanup(func() { in.Close() })
	// a is one of the deployment too: what b forwards to it must be
	// served there, never sent on again.
	a.svc.SetHosts(localHost{t})
	// (The hosts share one store, as a deployment's do.)
	b := newFixtureDB(t, true, "harebox.test", a.db)
	b.svc.SetHosts(&otherHost{fwd: cluster.NewForwarder("b", load("b"), func(w http.ResponseWriter, _ *http.Request, err error) {
		http.Error(w, err.Error(), http.StatusBadGateway)
	}), a: &cluster.Host{Name: "a", Up: true, Address: "https://" + l.Addr().String()}})
	return b
}

// localHost is host a's view of the deployment: it runs the tests'
// sandbox.
type localHost struct{ t *testing.T }

func (h localHost) Self() string { return "a" }

func (h localHost) ForwardSandbox(w http.ResponseWriter, r *http.Request, id string, set http.Header) bool {
	if cluster.FromHost(r) {
		h.t.Error("a request another host forwarded was sent on again")
	}
	return false
}

func (h localHost) ForwardHost(w http.ResponseWriter, r *http.Request, name string) bool {
	if cluster.FromHost(r) {
		h.t.Error("a callback another host forwarded was sent on again")
	}
	return false
}

// otherHost is host b's view of the deployment: the tests' sandbox runs
// on host a.
type otherHost struct {
	fwd *cluster.Forwarder
	a   *cluster.Host
}

func (h *otherHost) Self() string { return "b" }

func (h *otherHost) ForwardSandbox(w http.ResponseWriter, r *http.Request, id string, set http.Header) bool {
	if id != sbxID {
		return false
	}
	set = set.Clone()
	set.Set(cluster.HeaderIngress, "1")
	h.fwd.Forward(w, r, h.a, "", set)
	return true
}

func (h *otherHost) ForwardHost(w http.ResponseWriter, r *http.Request, name string) bool {
	if name != "a" {
		return false
	}
	h.fwd.Forward(w, r, h.a, "", http.Header{cluster.HeaderIngress: {"1"}})
	return true
}

// TestCallbackThroughAnotherHost: a sign-in's callback that reaches
// another host's ingress is served by the host that began it (its state
// names it), where the sign-in waits; one naming no other host is
// answered where it arrives.
func TestCallbackThroughAnotherHost(t *testing.T) {
	a := newFixture(t, true)
	b := throughAnotherHost(t, a)
	u := a.publish(t, 8080)
	a.svc.mu.RLock()
	e := a.svc.byID[u.ID]
	a.svc.mu.RUnlock()
	a.svc.signIns.mu.Lock()
	a.svc.signIns.pending = map[string]*pending{"s1.a": {e: e, exp: time.Now().Add(time.Minute)}, "s2": {e: e, exp: time.Now().Add(time.Minute)}}
	a.svc.signIns.mu.Unlock()
	callback := func(state string) int {
		req, _ := http.NewRequest("GET", b.base+CallbackPath+"?error=access_denied&state="+state, nil)
		req.Host = "harebox.test"
		resp, err := b.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// (The issuer refused: the sign-in that waits on a says so.)
	if code := callback("s1.a"); code != http.StatusUnauthorized {
		t.Errorf("a's sign-in's callback through b: %d, want a's 401", code)
	}
	if code := callback("s2"); code != http.StatusBadRequest {
		t.Errorf("a callback naming no host, through b: %d, want b's 400 (unknown there)", code)
	}
}

// TestThroughAnotherHostHeaders: what the hosts tell each other stays
// between them: the guest gets none of their headers (nor a client's
// forgery of them), and one X-Forwarded-For. (That it names the client
// rather than the forwarding host is not shown here: on loopback both
// are 127.0.0.1.)
func TestThroughAnotherHostHeaders(t *testing.T) {
	a := newFixture(t, true)
	b := throughAnotherHost(t, a)
	u := a.publish(t, 8080)
	forged := http.Header{TokenHeader: {u.Token}, certHeader: {"forged"}, serverNameHeader: {"forged"},
		cluster.HeaderClient: {"192.0.2.1"}, cluster.HeaderForwardedBy: {"x"}, cluster.HeaderIngress: {"1"}}
	for _, via := range []*fixture{a, b} {
		resp, body := via.get(t, u, "/", forged)
		if resp.StatusCode != 200 {
			t.Fatalf("GET: %d", resp.StatusCode)
		}
		h, _ := body["header"].(map[string]any)
		for k := range h {
			if strings.HasPrefix(http.CanonicalHeaderKey(k), "X-Harebox-") {
				t.Errorf("the guest got %s: %v", k, h[k])
			}
		}
		if xff, _ := h["X-Forwarded-For"].([]any); len(xff) != 1 || xff[0] != "127.0.0.1" {
			t.Errorf("X-Forwarded-For: %v, want the client's 127.0.0.1 only", h["X-Forwarded-For"])
		}
	}
}

// TestGrantsThroughAnotherHost: a URL's grant is recorded once per client
// connection through another host too (the forwarding host names the
// connection), not once per request.
func TestGrantsThroughAnotherHost(t *testing.T) {
	a := newFixture(t, true)
	b := throughAnotherHost(t, a)
	u := a.publish(t, 8080)
	for i := 0; i < 5; i++ { // one kept-alive connection
		if resp, _ := b.get(t, u, "/", http.Header{TokenHeader: {u.Token}}); resp.StatusCode != 200 {
			t.Fatalf("GET through b: %d", resp.StatusCode)
		}
	}
	b.client.CloseIdleConnections()
	if resp, _ := b.get(t, u, "/", http.Header{TokenHeader: {u.Token}}); resp.StatusCode != 200 {
		t.Fatalf("GET through b: %d", resp.StatusCode)
	}
	grants := 0
	for len(a.records) > 0 {
		if r := <-a.records; r == u.ID+" true" {
			grants++
		}
	}
	if grants != 2 {
		t.Fatalf("%d grants recorded on a for 6 requests on 2 connections through b, want 2", grants)
	}
}
