package cluster

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/harebox/harebox/internal/testweb"
)

// A forwarded request's body and its answer stream at once: the other
// host answers before it has read the body (as an exec stream may, and
// as a fast answer does before the transport's last read of the body),
// and the body still reaches it whole. Without full duplex this host's
// server consumed and closed the body when the answer began: the caller
// waited for an answer that did not come, or the connection was dropped
// under it.
func TestForwardFullDuplex(t *testing.T) {
	load := deployment(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &http.Server{Handler: Internal(http.HandlerFunc(testweb.Echo))}
	go b.Serve(tls.NewListener(l, load("b").Server))
	defer b.Close()
	fwd := NewForwarder("a", load("a"), func(w http.ResponseWriter, r *http.Request, err error) {
		http.Error(w, err.Error(), http.StatusBadGateway)
	})
	host := &Host{Name: "b", Address: "https://" + l.Addr().String()}
	a := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fwd.Forward(w, r, host, "", nil)
	}))
	defer a.Close()
	// Chunked, and with a Content-Length (the transport's read after the
	// body's end is the one that failed).
	for _, length := range []int64{-1, int64(len("first\nsecond\n"))} {
		if err := testweb.CheckDuplex(func(body io.Reader) (*http.Response, error) {
			req, _ := http.NewRequest("POST", a.URL, body)
			req.ContentLength = length
			return http.DefaultClient.Do(req)
		}); err != nil {
			t.Errorf("length %d: %v", length, err)
		}
	}
}

// TestForwardHeaders: a forwarded request carries only the hosts' headers
// its forwarding host set, never a caller's: a caller's forged ingress
// mark or client certificate does not reach the other host's ingress
// through the API's forwarding, and a Connection header cannot take off
// what the forwarding host set.
func TestForwardHeaders(t *testing.T) {
	load := deployment(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	echo := func(who string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Served-By", who)
			for _, k := range hostHeaders {
				w.Header()["Got-"+k] = r.Header[k]
			}
		})
	}
	b := &http.Server{Handler: Internal(Split(echo("api"), echo("ingress")))}
	go b.Serve(tls.NewListener(l, load("b").Server))
	defer b.Close()
	fwd := NewForwarder("a", load("a"), func(w http.ResponseWriter, r *http.Request, err error) {
		http.Error(w, err.Error(), http.StatusBadGateway)
	})
	host := &Host{Name: "b", Address: "https://" + l.Addr().String()}
	forged := http.Header{HeaderIngress: {"1"}, HeaderClientCert: {"forged"}, HeaderServerName: {"forged"}, HeaderConn: {"forged"},
		HeaderClient: {"192.0.2.9"}, HeaderForwardedBy: {"x"}, "Connection": {HeaderIngress + ", " + HeaderClientCert}}
	send := func(set http.Header) http.Header {
		t.Helper()
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		for k, v := range forged {
			req.Header[k] = v
		}
		fwd.Forward(rec, req, host, "198.51.100.7", set)
		return rec.Result().Header
	}
	// As the API forwards: to the other host's API, none of the forged.
	got := send(nil)
	if got.Get("Served-By") != "api" || got.Get("Got-"+HeaderClientCert) != "" || got.Get("Got-"+HeaderConn) != "" ||
		got.Get("Got-"+HeaderClient) != "198.51.100.7" || got.Get("Got-"+HeaderForwardedBy) != "a" {
		t.Errorf("forwarded as the API does, the other host got %v", got)
	}
	// As the ingress forwards: its mark and chain, despite Connection.
	got = send(http.Header{HeaderIngress: {"1"}, HeaderClientCert: {"chain"}})
	if got.Get("Served-By") != "ingress" || got.Get("Got-"+HeaderClientCert) != "chain" || got.Get("Got-"+HeaderServerName) != "" {
		t.Errorf("forwarded as the ingress does, the other host got %v", got)
	}
}

// deployment makes a deployment CA for a test and returns what loads a
// host's TLS, its certificate issued for 127.0.0.1.
func deployment(t *testing.T) func(name string) *TLS {
	dir := t.TempDir()
	if _, err := MakeCA(dir); err != nil {
		t.Fatal(err)
	}
	return func(name string) *TLS {
		if err := IssueHost(dir, name, []string{"127.0.0.1"}); err != nil {
			t.Fatal(err)
		}
		c, err := LoadTLS(filepath.Join(dir, "ca.pem"), filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
}
