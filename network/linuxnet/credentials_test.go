package linuxnet

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/harebox/harebox/firewall/credproxy"
	"github.com/harebox/harebox/internal/testweb"
)

// The credential proxy on real nftables, with a guest namespace and test
// hosts: the real value reaches only the rule's host, when SNI, Host and
// rule agree; the guest sees only its placeholder.
func TestCredentialProxy(t *testing.T) {
	e := newEnv(t)
	n := e.newNetwork("")
	g := e.attach(n, mustPolicy(t, `{"default_outbound": "deny", "outbound": [
		{"action": "allow", "protocol": "tcp", "ports": "443", "hosts": ["pypi.org", "example.com"]}]}`))
	ca, key, err := credproxy.NewCA("test sandbox CA")
	if err != nil {
		t.Fatal(err)
	}
	const (
		value = "real-secret-value-9f8e7d"
		ph    = "hbph_testplaceholder0123456789abcdefgh"
	)
	var misuses []string // hosts the placeholder was sent to unswapped
	var mmu sync.Mutex
	sb := &credproxy.Sandbox{CA: ca, CAKey: key, Rules: []credproxy.Rule{{
		Hosts: []string{"pypi.org"}, Header: "Authorization", Format: "Bearer {value}", Placeholder: ph, Value: value,
	}}, OnMisuse: func(host string) { mmu.Lock(); misuses = append(misuses, host); mmu.Unlock() }}
	n.SetCredentials(func(id string) *credproxy.Sandbox {
		if id == g.id {
			return sb
		}
		return nil
	})
	// The guest trusts its sandbox CA (installed at boot) and, for the
	// hosts it reaches directly, the test hosts' own certificates.
	roots := e.certs.Clone()
	roots.AddCert(ca)
	client := func(h2 bool) *http.Client {
		tr := &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				ip := map[string]string{"pypi.org": pypiIP, "example.com": exampleIP}[strings.Split(addr, ":")[0]]
				return g.dial("tcp4", ip+":443")
			},
			TLSClientConfig:   &tls.Config{RootCAs: roots},
			ForceAttemptHTTP2: h2,
		}
		if !h2 {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		return &http.Client{Transport: tr, Timeout: 10 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	get := func(c *http.Client, url, host string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer "+ph)
		if host != "" {
			req.Host = host
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	for _, h2 := range []bool{false, true} {
		c := client(h2)
		resp, body := get(c, "https://pypi.org/?key="+ph, "")
		if got := e.saw("pypi.org"); got != "auth=Bearer "+value+" query=key="+value {
			t.Errorf("h2=%v: the rule's host received %q", h2, got)
		}
		if strings.Contains(body, value) || !strings.Contains(body, "auth=Bearer "+ph) || resp.Header.Get("X-Echo") != "Bearer "+ph {
			t.Errorf("h2=%v: the guest saw the value: %q %v", h2, body, resp.Header)
		}
		if h2 && resp.ProtoMajor != 2 {
			t.Errorf("HTTP/2 was not negotiated: %s", resp.Proto)
		}
		if resp.TLS == nil || resp.TLS.PeerCertificates[0].Issuer.CommonName != "test sandbox CA" {
			t.Errorf("h2=%v: the connection was not intercepted", h2)
		}
	}
	// A body and its answer stream at once through the interception
	// (the test host answers before it reads the body).
	if err := testweb.CheckDuplex(func(body io.Reader) (*http.Response, error) {
		return client(false).Post("https://pypi.org/echo", "text/plain", body)
	}); err != nil {
		t.Errorf("full duplex: %v", err)
	}
	c := client(false)
	// Another host (no rule): passthrough, the placeholder stays.
	if _, body := get(c, "https://example.com/", ""); e.saw("example.com") != "auth=Bearer "+ph+" query=" || !strings.HasPrefix(body, "server=example.com") {
		t.Errorf("another host received %q", e.saw("example.com"))
	}
	// SNI pypi.org, Host example.com: not swapped, and reported.
	get(c, "https://pypi.org/", "example.com")
	if got := e.saw("pypi.org"); got != "auth=Bearer "+ph+" query=" {
		t.Errorf("Host differing from SNI: %q", got)
	}
	mmu.Lock()
	if len(misuses) != 1 || misuses[0] != "example.com" {
		t.Errorf("the placeholder sent with Host example.com was reported as %v", misuses)
	}
	mmu.Unlock()
	// A redirect to another host is not followed by the proxy.
	resp, _ := get(c, "https://pypi.org/redirect", "")
	if resp.StatusCode != http.StatusFound || e.saw("example.com") != "auth=Bearer "+ph+" query=" {
		t.Errorf("redirect: %d, example.com saw %q", resp.StatusCode, e.saw("example.com"))
	}

	// HTTP/2 with an :authority that is not the SNI: not swapped.
	h2 := client(true)
	if resp, _ := get(h2, "https://pypi.org/", "example.com"); resp.ProtoMajor != 2 || e.saw("pypi.org") != "auth=Bearer "+ph+" query=" {
		t.Errorf("HTTP/2 :authority example.com on SNI pypi.org (%s): %q", resp.Proto, e.saw("pypi.org"))
	}

	// A WebSocket upgrade gets the value on its handshake only: the
	// guest's frames go up as they are, placeholder and all.
	{
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ws, _, err := websocket.Dial(ctx, "wss://pypi.org/ws", &websocket.DialOptions{
			HTTPClient: client(false), HTTPHeader: http.Header{"Authorization": {"Bearer " + ph}}})
		if err != nil {
			t.Fatalf("upgrade: %v", err)
		}
		if got := e.saw("pypi.org"); got != "auth=Bearer "+value+" query=" {
			t.Errorf("the handshake carried %q", got)
		}
		msg := "frame with " + ph
		ws.Write(ctx, websocket.MessageText, []byte(msg))
		_, echo, err := ws.Read(ctx)
		if err != nil || string(echo) != msg || e.saw("pypi.org ws") != msg {
			t.Errorf("after the upgrade the host got %q and the guest %q (%v), want the message as sent", e.saw("pypi.org ws"), echo, err)
		}
		ws.CloseNow()
		cancel()
	}

	// Another sandbox's placeholder is worthless here: only this
	// sandbox's own placeholders are swapped.
	g2 := e.attach(n, mustPolicy(t, `{"default_outbound": "deny", "outbound": [{"action": "allow", "protocol": "tcp", "ports": "443", "hosts": ["pypi.org"]}]}`))
	other := &credproxy.Sandbox{CA: ca, CAKey: key, Rules: []credproxy.Rule{{
		Hosts: []string{"pypi.org"}, Header: "Authorization", Format: "Bearer {value}", Placeholder: "hbph_othersandboxplaceholder0123456789", Value: value,
	}}}
	n.SetCredentials(func(id string) *credproxy.Sandbox {
		switch id {
		case g.id:
			return sb
		case g2.id:
			return other
		}
		return nil
	})
	{
		conn, err := g2.dial("tcp4", pypiIP+":443")
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		tc := tls.Client(conn, &tls.Config{ServerName: "pypi.org", RootCAs: roots, NextProtos: []string{"http/1.1"}})
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: pypi.org\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", ph)
		if _, err := http.ReadResponse(bufio.NewReader(tc), nil); err != nil {
			t.Fatal(err)
		}
		conn.Close()
		if got := e.saw("pypi.org"); got != "auth=Bearer "+ph+" query=" {
			t.Errorf("sandbox A's placeholder sent from sandbox B: the host got %q", got)
		}
	}

	// Plain HTTP shows its request: the placeholder sent to a host no
	// rule names goes out as it is, and is reported.
	if err := n.SetPolicy(context.Background(), g.id, mustPolicy(t, `{"default_outbound": "deny", "outbound": [
		{"action": "allow", "protocol": "tcp", "ports": "80,443", "hosts": ["pypi.org", "example.com"]}]}`)); err != nil {
		t.Fatal(err)
	}
	mmu.Lock()
	reported := len(misuses) // the HTTP/2 :authority case above is one
	mmu.Unlock()
	if conn, err := g.dial("tcp4", exampleIP+":80"); err == nil {
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: example.com\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", ph)
		io.ReadAll(conn)
		conn.Close()
	}
	mmu.Lock()
	if len(misuses) != reported+1 || misuses[reported] != "example.com" {
		t.Errorf("the placeholder sent over plain HTTP to example.com was reported as %v", misuses)
	}
	mmu.Unlock()
	if got := e.saw("example.com:80"); got != "auth=Bearer "+ph {
		t.Errorf("plain HTTP to a host without a rule carried %q", got)
	}
	// A rule that allows plain HTTP swaps there too; the pypi.org rule,
	// which does not, leaves plain HTTP to pypi.org alone.
	const plainPH, plainValue = "hbph_plainplaceholder0123456789abcdef", "plain-http-value"
	sb.Rules = append(sb.Rules, credproxy.Rule{Hosts: []string{"example.com"}, AllowHTTP: true, Header: "Authorization",
		Format: "Bearer {value}", Placeholder: plainPH, Value: plainValue})
	plain := func(ip, host, ph string) {
		t.Helper()
		conn, err := g.dial("tcp4", ip+":80")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", host, ph)
		io.ReadAll(conn)
	}
	plain(exampleIP, "example.com", plainPH)
	if got := e.saw("example.com:80"); got != "auth=Bearer "+plainValue {
		t.Errorf("plain HTTP under an allow_http rule: the host got %q", got)
	}
	plain(pypiIP, "pypi.org", ph)
	if got := e.saw("pypi.org:80"); got != "auth=Bearer "+ph {
		t.Errorf("plain HTTP to pypi.org, whose rule does not allow it: the host got %q", got)
	}
	sb.Rules = sb.Rules[:1]

	// Raw requests: absolute-form naming another host, and smuggling.
	raw := func(req string) string {
		conn, err := g.dial("tcp4", pypiIP+":443")
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		tc := tls.Client(conn, &tls.Config{ServerName: "pypi.org", RootCAs: roots, NextProtos: []string{"http/1.1"}})
		fmt.Fprint(tc, req)
		line, _ := bufio.NewReader(tc).ReadString('\n')
		return line
	}
	e.mu.Lock()
	e.seen["pypi.org"] = ""
	e.mu.Unlock()
	raw("GET https://example.com/ HTTP/1.1\r\nHost: example.com\r\nAuthorization: Bearer " + ph + "\r\nConnection: close\r\n\r\n")
	if got := e.saw("pypi.org"); strings.Contains(got, value) {
		t.Errorf("absolute-form URI to another host was swapped: %q", got)
	}
	for _, smuggle := range []string{
		"GET / HTTP/1.1\r\nHost: pypi.org\r\nHost: example.com\r\nAuthorization: Bearer " + ph + "\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: pypi.org\r\nAuthorization: Bearer " + ph + "\r\n x: folded\r\n\r\n",
	} {
		e.mu.Lock()
		e.seen["pypi.org"] = ""
		e.mu.Unlock()
		if line := raw(smuggle); !strings.Contains(line, "400") {
			t.Errorf("smuggled request answered %q", line)
		}
		if got := e.saw("pypi.org"); got != "" {
			t.Errorf("a smuggled request reached the host: %q", got)
		}
	}
}
