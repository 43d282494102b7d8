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
	dir := t.TempDir()
	if _, err := MakeCA(dir); err != nil {
		t.Fatal(err)
	}
	load := func(name string) *TLS {
		if err := IssueHost(dir, name, []string{"127.0.0.1"}); err != nil {
			t.Fatal(err)
		}
		c, err := LoadTLS(filepath.Join(dir, "ca.pem"), filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
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
		fwd.Forward(w, r, host, "")
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
