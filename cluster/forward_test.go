package cluster

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"
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
	for _, h := range []string{"a", "b"} {
		if err := IssueHost(dir, h, []string{"127.0.0.1"}); err != nil {
			t.Fatal(err)
		}
	}
	load := func(name string) *TLS {
		c, err := LoadTLS(filepath.Join(dir, "ca.pem"), filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// b answers at once, then echoes the body as it comes.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &http.Server{Handler: Internal(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		rc.EnableFullDuplex()
		w.WriteHeader(http.StatusOK)
		rc.Flush()
		buf := make([]byte, 1024)
		for {
			n, err := r.Body.Read(buf)
			w.Write(buf[:n])
			rc.Flush()
			if err != nil {
				return
			}
		}
	}))}
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

	body, feed := io.Pipe()
	defer feed.Close()
	req, _ := http.NewRequest("POST", a.URL, body)
	answered := make(chan *http.Response, 1)
	failed := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			failed <- err
			return
		}
		answered <- resp
	}()
	go feed.Write([]byte("first\n"))
	var resp *http.Response
	select {
	case resp = <-answered:
	case err := <-failed:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("no answer while the body was still coming")
	}
	defer resp.Body.Close()
	lines := bufio.NewReader(resp.Body)
	for _, want := range []string{"first\n", "second\n"} {
		got := make(chan string, 1)
		go func() { s, _ := lines.ReadString('\n'); got <- s }()
		select {
		case s := <-got:
			if s != want {
				t.Fatalf("echoed %q, want %q", s, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%q not echoed", want)
		}
		if want == "first\n" {
			go func() { feed.Write([]byte("second\n")); feed.Close() }()
		}
	}
	if rest, err := io.ReadAll(lines); err != nil || len(rest) != 0 {
		t.Fatalf("after the body: %q, %v", rest, err)
	}
}
