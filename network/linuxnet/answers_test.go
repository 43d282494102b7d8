package linuxnet

import (
	"bufio"
	"context"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/firewall/credproxy"
	"github.com/harebox/harebox/internal/testweb"
)

// answerHost is a test host behind a credential rule that echoes the
// value it got (the Authorization header's token) back in every way an
// answer can carry bytes: /answer/<how>.
func answerHost(w http.ResponseWriter, r *http.Request) {
	secret := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	body := "k=" + secret + " end"
	switch strings.TrimPrefix(r.URL.Path, "/answer/") {
	case "coding": // ?ce=gzip,br: the codings applied, in order, whatever was asked
		b := []byte(body)
		var names []string
		for c := range strings.SplitSeq(r.URL.Query().Get("ce"), ",") {
			if enc, err := testweb.Encode(c, b); err == nil {
				b = enc
			}
			names = append(names, strings.TrimSuffix(c, "-raw"))
		}
		w.Header().Set("Content-Encoding", strings.Join(names, ", "))
		w.Write(b)
	case "chunked": // the value split across chunks (HTTP/1) or DATA frames (HTTP/2)
		rc := http.NewResponseController(w)
		io.WriteString(w, "k="+secret[:5])
		rc.Flush()
		time.Sleep(20 * time.Millisecond)
		io.WriteString(w, secret[5:]+" end")
	case "trailer":
		w.Header().Set("Trailer", "X-Sum")
		io.WriteString(w, "body")
		w.Header().Set("X-Sum", secret)
		w.Header().Set(http.TrailerPrefix+"X-Late", "late "+secret)
	case "hints": // 103 Early Hints, then the answer
		w.Header().Set("Link", "</?k="+secret+">; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Set("X-Final", secret)
		io.WriteString(w, body)
	case "redirect":
		w.Header().Set("Location", "https://pypi.org/?k="+secret)
		w.WriteHeader(http.StatusFound)
		io.WriteString(w, body)
	case "name": // the value as a header's name
		w.Header().Set("X-"+secret, "1")
		io.WriteString(w, "ok")
	case "range": // honours Range: a part would hold a part of the value
		http.ServeContent(w, r, "", time.Time{}, strings.NewReader(body))
	case "ws": // WebSocket: the value in messages and in the close reason
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionContextTakeover})
		if err != nil {
			return
		}
		defer c.CloseNow()
		ctx := r.Context()
		c.Write(ctx, websocket.MessageText, []byte(body))
		c.Write(ctx, websocket.MessageBinary, []byte(strings.Repeat("b", 100<<10)+secret))
		if _, m, err := c.Read(ctx); err == nil {
			c.Write(ctx, websocket.MessageText, append([]byte("echo "), m...))
		}
		c.Close(websocket.StatusNormalClosure, "bye "+secret)
	case "ws-deflate", "ws-rsv", "upgrade-other", "after", "close", "rawchunk":
		raw(w, r, secret)
	default:
		http.NotFound(w, r)
	}
}

// raw answers on the bare connection (HTTP/1 only).
func raw(w http.ResponseWriter, r *http.Request, secret string) {
	c, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	accept := func() string {
		h := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		return base64.StdEncoding.EncodeToString(h[:])
	}
	switch strings.TrimPrefix(r.URL.Path, "/answer/") {
	case "ws-deflate": // an extension the proxy did not offer
		fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Accept: %s\r\nSec-WebSocket-Extensions: permessage-deflate\r\n\r\n", accept())
		deflated, _ := testweb.Encode("deflate-raw", []byte(secret))
		rw.Write(append([]byte{0xc1, byte(len(deflated))}, deflated...))
	case "ws-rsv": // no extension, then a compressed frame anyway
		fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Accept: %s\r\n\r\n", accept())
		deflated, _ := testweb.Encode("deflate-raw", []byte(secret))
		rw.Write(append([]byte{0x81, 2, 'o', 'k', 0xc1, byte(len(deflated))}, deflated...))
	case "upgrade-other":
		fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: foo\r\nConnection: Upgrade\r\n\r\n%s\n", secret)
	case "after": // an answer, then more bytes on the connection
		fmt.Fprintf(rw, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		fmt.Fprintf(rw, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\nk=%s", len(secret)+2, secret)
		rw.Flush()
		time.Sleep(300 * time.Millisecond)
		fmt.Fprintf(rw, "k=%s\r\n", secret)
	case "close": // no length: the body is the rest of the connection
		fmt.Fprintf(rw, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nk=%s", secret[:4])
		rw.Flush()
		time.Sleep(20 * time.Millisecond)
		fmt.Fprintf(rw, "%s end", secret[4:])
	case "rawchunk": // a chunk extension and a trailer with the value; the value across chunks
		fmt.Fprintf(rw, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n"+
			"4;x=%s\r\nk=%s\r\n%x\r\n%s end\r\n0\r\nX-T: %s\r\n\r\n", secret, secret[:2], len(secret)-2+4, secret[2:], secret)
	}
	rw.Flush()
}

// The credential proxy on real nftables, against a test host that echoes
// the value back every way an answer can: the guest gets the placeholder
// or an error, never the value, over HTTP/1 and HTTP/2 to the guest and
// to the host.
func TestCredentialProxyAnswers(t *testing.T) {
	e := newEnv(t)
	n := e.newNetwork("")
	g := e.attach(n, mustPolicy(t, `{"default_outbound": "deny", "outbound": [
		{"action": "allow", "protocol": "tcp", "ports": "443,9443", "hosts": ["pypi.org"]}]}`))
	ca, key, err := credproxy.NewCA("test sandbox CA")
	if err != nil {
		t.Fatal(err)
	}
	const (
		value = "real-secret-value-9f8e7d"
		ph    = "hbph_testplaceholder0123456789abcdefgh"
	)
	var mu sync.Mutex
	var refused []string
	sb := &credproxy.Sandbox{CA: ca, CAKey: key, Rules: []credproxy.Rule{{
		Hosts: []string{"pypi.org"}, Ports: []firewall.PortSpan{{Lo: 443, Hi: 443}, {Lo: 9443, Hi: 9443}},
		Header: "Authorization", Format: "Bearer {value}", Placeholder: ph, Value: value,
	}}, OnRefused: func(host, reason string) { mu.Lock(); refused = append(refused, host+": "+reason); mu.Unlock() }}
	n.SetCredentials(func(id string) *credproxy.Sandbox {
		if id == g.id {
			return sb
		}
		return nil
	})
	roots := e.certs.Clone()
	roots.AddCert(ca)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		_, port, _ := net.SplitHostPort(addr)
		return g.dial("tcp4", pypiIP+":"+port)
	}
	client := func(h2 bool) *http.Client {
		tr := &http.Transport{DialContext: dial, TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: h2}
		if !h2 {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 10 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	refusals := func() int { mu.Lock(); defer mu.Unlock(); return len(refused) }

	// seen is everything the guest can see of an answer.
	type seen struct {
		status int
		all    string
	}
	get := func(c *http.Client, url string, hdr ...string) seen {
		t.Helper()
		var s strings.Builder
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			Got1xxResponse: func(code int, h textproto.MIMEHeader) error { fmt.Fprintf(&s, "%d %v\n", code, h); return nil },
		})
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		req.Header.Set("Authorization", "Bearer "+ph)
		req.Header.Set("Accept-Encoding", "gzip, br, zstd") // the guest may ask for anything
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := c.Do(req)
		if err != nil {
			return seen{all: s.String() + "error: " + err.Error()}
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		fmt.Fprintf(&s, "%d %v\n%s\n%v %v", resp.StatusCode, resp.Header, b, resp.Trailer, err)
		return seen{resp.StatusCode, s.String()}
	}

	for _, h2 := range []bool{false, true} {
		c := client(h2)
		for _, port := range []string{"443", "9443"} {
			base := "https://pypi.org:" + port + "/answer/"
			// Scrubbed: the placeholder where the value was.
			for _, path := range []string{"coding?ce=identity", "coding?ce=gzip", "coding?ce=x-gzip", "coding?ce=deflate",
				"coding?ce=deflate-raw", "coding?ce=br", "coding?ce=zstd", "coding?ce=gzip,gzip", "coding?ce=gzip,br,zstd",
				"chunked", "trailer", "hints", "redirect", "name", "range", "close", "rawchunk"} {
				if port == "443" && (path == "close" || path == "rawchunk") {
					continue // raw answers are HTTP/1 only
				}
				s := get(c, base+path, "Range", "bytes=2-5")
				if strings.Contains(s.all, value) || (s.status != 200 && s.status != 302) {
					t.Errorf("h2=%v %s %s: the guest saw\n%s", h2, port, path, s.all)
				}
				if path != "name" && !strings.Contains(s.all, ph) {
					t.Errorf("h2=%v %s %s: no placeholder in\n%s", h2, port, path, s.all)
				}
			}
			// Refused: a 502 and a record, never the value.
			for _, path := range []string{"coding?ce=compress", "coding?ce=x-custom", "coding?ce=gzip,gzip,gzip,gzip"} {
				before := refusals()
				s := get(c, base+path)
				if strings.Contains(s.all, value) || s.status != http.StatusBadGateway || refusals() != before+1 {
					t.Errorf("h2=%v %s %s: %d refusals, the guest saw\n%s", h2, port, path, refusals()-before, s.all)
				}
			}
		}
		// More bytes on the connection after an answer: the next request
		// on it never gets them as they are.
		for range 2 {
			if s := get(c, "https://pypi.org:9443/answer/after"); strings.Contains(s.all, value) {
				t.Errorf("h2=%v after: the guest saw\n%s", h2, s.all)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// CONNECT is refused.
		req, _ := http.NewRequest("CONNECT", "https://pypi.org:443", nil)
		req.Host = "pypi.org:443"
		if resp, err := c.Do(req); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("h2=%v CONNECT: %v %v", h2, resp, err)
		} else {
			resp.Body.Close()
		}
	}

	// WebSocket: messages and the close reason scrubbed, the guest
	// offering permessage-deflate (the proxy strips it: frames stay
	// readable).
	for _, port := range []string{"443", "9443"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ws, resp, err := websocket.Dial(ctx, "wss://pypi.org:"+port+"/answer/ws", &websocket.DialOptions{
			HTTPClient: client(false), HTTPHeader: http.Header{"Authorization": {"Bearer " + ph}},
			CompressionMode: websocket.CompressionContextTakeover})
		if err != nil {
			t.Fatalf("ws %s: %v", port, err)
		}
		if resp.Header.Get("Sec-WebSocket-Extensions") != "" {
			t.Errorf("ws %s: an extension was negotiated: %v", port, resp.Header)
		}
		ws.SetReadLimit(1 << 20)
		var got []string
		for i := range 3 {
			_, m, err := ws.Read(ctx)
			if err != nil {
				got = append(got, "error: "+err.Error())
				break
			}
			got = append(got, string(m))
			if i == 1 {
				ws.Write(ctx, websocket.MessageText, []byte("from the guest "+ph))
			}
		}
		_, _, err = ws.Read(ctx)
		got = append(got, fmt.Sprint(err))
		all := strings.Join(got, "\n")
		if strings.Contains(all, value) || strings.Count(all, ph) != 4 || !strings.Contains(all, "echo from the guest "+ph) {
			t.Errorf("ws %s: the guest saw %.300q", port, all)
		}
		ws.CloseNow()
		cancel()
	}
	// WebSocket answers the proxy cannot read: an extension it did not
	// offer, a compressed frame anyway, another protocol.
	before := refusals()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, resp, err := websocket.Dial(ctx, "wss://pypi.org:9443/answer/ws-deflate", &websocket.DialOptions{
		HTTPClient: client(false), HTTPHeader: http.Header{"Authorization": {"Bearer " + ph}},
		CompressionMode: websocket.CompressionContextTakeover}); err == nil || resp == nil || resp.StatusCode != http.StatusBadGateway {
		t.Errorf("ws with an extension not offered: %v %v", resp, err)
	}
	ws, _, err := websocket.Dial(ctx, "wss://pypi.org:9443/answer/ws-rsv", &websocket.DialOptions{
		HTTPClient: client(false), HTTPHeader: http.Header{"Authorization": {"Bearer " + ph}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, m, err := ws.Read(ctx); err != nil || string(m) != "ok" {
		t.Errorf("ws-rsv first message: %q %v", m, err)
	}
	if _, m, err := ws.Read(ctx); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Errorf("ws-rsv: a compressed frame gave %q %v", m, err)
	}
	ws.CloseNow()
	{
		conn, err := g.dial("tcp4", pypiIP+":9443")
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		tc := tls.Client(conn, &tls.Config{ServerName: "pypi.org", RootCAs: roots, NextProtos: []string{"http/1.1"}})
		fmt.Fprintf(tc, "GET /answer/upgrade-other HTTP/1.1\r\nHost: pypi.org:9443\r\nUpgrade: foo\r\nConnection: Upgrade\r\nAuthorization: Bearer %s\r\n\r\n", ph)
		b, _ := io.ReadAll(bufio.NewReader(tc))
		if strings.Contains(string(b), value) || !strings.HasPrefix(string(b), "HTTP/1.1 502") {
			t.Errorf("an upgrade to another protocol: the guest saw %q", b)
		}
		conn.Close()
	}
	if got := refusals() - before; got != 3 {
		mu.Lock()
		t.Errorf("%d refusals recorded, want 3: %q", got, refused)
		mu.Unlock()
	}
}
