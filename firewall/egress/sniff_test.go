package egress

import (
	"bytes"
	"crypto/tls"
	"net"
	"testing"
	"time"
)

func sniffBytes(t testing.TB, write func(c net.Conn)) (string, []byte, error) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go write(a)
	b.SetReadDeadline(time.Now().Add(2 * time.Second))
	return sniff(b)
}

func TestSniff(t *testing.T) {
	// TLS: the SNI, and the replayed bytes are exactly what the client sent.
	var sent bytes.Buffer
	host, head, err := sniffBytes(t, func(c net.Conn) {
		tls.Client(teeConn{c, &sent}, &tls.Config{ServerName: "PyPI.org"}).Handshake()
	})
	if err != nil || host != "pypi.org" || !bytes.Equal(head, sent.Bytes()[:len(head)]) || len(head) == 0 {
		t.Errorf("TLS: %q %v (head %d bytes)", host, err, len(head))
	}
	// TLS to an IP: no SNI, no name.
	if host, _, err := sniffBytes(t, func(c net.Conn) {
		tls.Client(c, &tls.Config{ServerName: "198.18.0.1", InsecureSkipVerify: true}).Handshake()
	}); err != nil || host != "" {
		t.Errorf("TLS without SNI: %q %v", host, err)
	}
	for _, c := range []struct {
		req, host string
		ok        bool
	}{
		{"GET / HTTP/1.1\r\nHost: Example.com:8080\r\n\r\n", "example.com", true},
		{"GET / HTTP/1.1\r\nHost: 198.18.0.12\r\n\r\n", "", true},
		{"GET / HTTP/1.1\r\n\r\n", "", false},
		{"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "", false},
		{"GET / HTTP/1.1\r\nHost: bad_name\r\n\r\n", "", false},
		{"\x00\x01binary", "", true},
	} {
		host, head, err := sniffBytes(t, func(conn net.Conn) { conn.Write([]byte(c.req)) })
		if (err == nil) != c.ok || host != c.host {
			t.Errorf("%q: host %q err %v", c.req, host, err)
		}
		if err == nil && !bytes.HasPrefix([]byte(c.req), head) {
			t.Errorf("%q: replay %q", c.req, head)
		}
	}
	// A client that says nothing times out instead of holding the proxy.
	if _, _, err := sniffBytes(t, func(net.Conn) {}); err == nil {
		t.Error("silent client: no error")
	}
}

func FuzzSniff(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a.b\r\n\r\n"))
	f.Add([]byte{0x16, 3, 1, 0, 5, 1, 0, 0, 1, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		host, head, err := sniffBytes(t, func(c net.Conn) { c.Write(data); c.Close() })
		if err == nil && !bytes.HasPrefix(data, head) {
			t.Fatalf("replay is not a prefix of the input")
		}
		_ = host
	})
}

type teeConn struct {
	net.Conn
	w *bytes.Buffer
}

func (c teeConn) Write(p []byte) (int, error) { c.w.Write(p); return c.Conn.Write(p) }
