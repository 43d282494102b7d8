// Package credproxy is the egress proxy's credential path: it puts real
// secret values into a sandbox's requests on the host, so the guest only
// ever holds placeholders.
//
// For a connection to a name that one of the sandbox's credential rules
// covers, the proxy terminates TLS with a leaf certificate minted from the
// sandbox's own CA (whose key never leaves the host), serves the guest's
// HTTP/1.1 or HTTP/2 (ALPN) requests with net/http (which refuses header
// smuggling: CR/LF in fields, obs-fold, a second Host), and forwards each
// one over TLS to the real host, verified against the host's roots. What
// is checked, and what is not:
//   - A placeholder is swapped for its value only when the TLS SNI, the
//     request's Host (or HTTP/2 :authority, or an absolute-form URI's host)
//     and the rule's host all agree, on a port the rule names. Otherwise
//     the request goes to the SNI's host as it came, placeholder and all.
//   - HTTP/1 framing that a lenient parser could read two ways (obs-fold,
//     bare CR or LF, Content-Length with Transfer-Encoding) ends the
//     connection before the request is served (strictConn).
//   - The guest must present the placeholder (in a header or the URL) for
//     the value to be put in; a rule with a header then sets that header
//     to its format, and the placeholder is replaced wherever it appears.
//   - Plain HTTP is intercepted only for rules that allow it.
//   - Redirects are never followed: each request is judged on its own.
//   - Answers are scrubbed on every path back to the guest (answer.go
//     lists them): a value echoed in a header, a trailer, a 1xx head, a
//     body in any content-coding the proxy can undo, or a WebSocket
//     message reaches the guest as the placeholder; an answer the proxy
//     cannot read (an unknown coding, another upgrade, a WebSocket
//     extension) is refused with a 502 and reported. Requests ask for
//     identity coding and no WebSocket extension; one carrying the value
//     asks for the whole answer (no Range). A value the upstream
//     transforms (hashes, re-encodes) is not seen.
//   - WebSocket upgrades get the swap on the handshake only: after it the
//     guest's frames go up as they are.
//   - CONNECT is refused: a tunnel would carry bytes the proxy cannot read.
package credproxy

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"

	"github.com/harebox/harebox/firewall"
)

// Rule is one secret a sandbox may use: where, how, and its placeholder
// and value (the value lives in host memory only).
type Rule struct {
	Hosts       []string
	Ports       []firewall.PortSpan // empty: 443 (and 80 when AllowHTTP)
	Header      string              // set to Format with {value}, if given
	Format      string
	AllowHTTP   bool
	Placeholder string
	Value       string
}

func (r *Rule) covers(host string, port uint16, secure bool) bool {
	if !secure && !r.AllowHTTP {
		return false
	}
	if !firewall.MatchHosts(r.Hosts, host) {
		return false
	}
	if len(r.Ports) == 0 {
		return port == 443 || (port == 80 && r.AllowHTTP)
	}
	for _, s := range r.Ports {
		if port >= s.Lo && port <= s.Hi {
			return true
		}
	}
	return false
}

// Sandbox is one sandbox's credentials: its CA and its rules.
type Sandbox struct {
	CA    *x509.Certificate
	CAKey crypto.Signer
	Rules []Rule
	// OnMisuse, if set, hears of a placeholder sent where it is not
	// swapped (the host it went to).
	OnMisuse func(host string)
	// OnRefused, if set, hears of an answer from host that the proxy
	// refused to pass on, since it could not scrub it (and why).
	OnRefused func(host, reason string)

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
	// transports keep upstream connections per host and port across the
	// guest's connections, so a new guest connection costs no new TLS
	// handshake upstream.
	transports map[string]*http.Transport
}

// transport returns the sandbox's transport to host:port, making it with
// dial on first use.
func (s *Sandbox) transport(host string, port uint16, roots *x509.CertPool, dial func(context.Context) (net.Conn, error)) *http.Transport {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := net.JoinHostPort(host, strconv.Itoa(int(port)))
	if t := s.transports[key]; t != nil {
		return t
	}
	t := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		TLSClientConfig: &tls.Config{
			RootCAs: roots, ServerName: host, MinVersion: tls.VersionTLS12,
		},
		ForceAttemptHTTP2:      true,
		MaxResponseHeaderBytes: maxAnswerHead,
		MaxIdleConnsPerHost:    8,
		IdleConnTimeout:        90 * time.Second,
		ResponseHeaderTimeout:  5 * time.Minute,
	}
	if s.transports == nil {
		s.transports = map[string]*http.Transport{}
	}
	s.transports[key] = t
	return t
}

// Close drops the sandbox's idle upstream connections.
func (s *Sandbox) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.transports {
		t.CloseIdleConnections()
	}
	s.transports = nil
}

// Misused reports that the guest sent one of its placeholders where no
// rule lets it be swapped: to another host, or with a Host that is not
// the connection's name. The engine records it in the audit log.
func (s *Sandbox) Misused(host string) {
	if s != nil && s.OnMisuse != nil {
		s.OnMisuse(host)
	}
}

// Refused reports an answer from host that was not passed on.
func (s *Sandbox) Refused(host, reason string) {
	if s != nil && s.OnRefused != nil {
		s.OnRefused(host, reason)
	}
}

// CarriedBy reports whether b (a request's head) holds one of the
// sandbox's placeholders.
func (s *Sandbox) CarriedBy(b []byte) bool {
	if s == nil {
		return false
	}
	for i := range s.Rules {
		if ph := s.Rules[i].Placeholder; ph != "" && bytes.Contains(b, []byte(ph)) {
			return true
		}
	}
	return false
}

// Covers reports whether a rule covers host on port (over TLS, or plain).
func (s *Sandbox) Covers(host string, port uint16, secure bool) bool {
	if s == nil {
		return false
	}
	for i := range s.Rules {
		if s.Rules[i].covers(host, port, secure) {
			return true
		}
	}
	return false
}

// NewCA makes a sandbox CA: a P-256 key and a self-signed certificate that
// may sign only leaves (path length 0).
func NewCA(name string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

// leaf returns a certificate for host signed by the sandbox's CA.
func (s *Sandbox) leaf(host string) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.leaves[host]; c != nil && time.Until(c.Leaf.NotAfter) > time.Hour {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.CA, &key.PublicKey, s.CAKey)
	if err != nil {
		return nil, err
	}
	leaf, _ := x509.ParseCertificate(der)
	c := &tls.Certificate{Certificate: [][]byte{der, s.CA.Raw}, PrivateKey: key, Leaf: leaf}
	if s.leaves == nil || len(s.leaves) > 256 {
		s.leaves = map[string]*tls.Certificate{}
	}
	s.leaves[host] = c
	return c, nil
}

// Proxy serves intercepted connections.
type Proxy struct {
	// Roots verify the real hosts; nil means the host's system roots.
	Roots *x509.CertPool
	Log   *slog.Logger

	buffers bufferPool
}

// Conn is one intercepted connection, as the egress proxy hands it over.
type Conn struct {
	Down    net.Conn // the guest's connection
	Head    []byte   // what the egress proxy already read from it
	Host    string   // the SNI (or, for plain HTTP, the first Host)
	Port    uint16
	Secure  bool // TLS (else plain HTTP)
	Sandbox *Sandbox
	// Dial connects to the real host (the egress proxy's checked dial of
	// the name, never an address the guest chose).
	Dial func(ctx context.Context) (net.Conn, error)
}

func (p *Proxy) log() *slog.Logger {
	if p.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Log
}

// Serve handles one connection until it ends.
func (p *Proxy) Serve(c Conn) {
	down := net.Conn(&replayConn{Conn: c.Down, r: io.MultiReader(bytes.NewReader(c.Head), c.Down)})
	tr := c.Sandbox.transport(c.Host, c.Port, p.Roots, c.Dial)
	if !c.Secure {
		tr = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return c.Dial(ctx) },
			MaxResponseHeaderBytes: maxAnswerHead}
		defer tr.CloseIdleConnections()
	}
	handler := p.handler(c, tr)
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 5 * time.Minute,
		ErrorLog: slogLogger(p.log())}
	if !c.Secure {
		srv.Serve(&oneConn{c: &strictConn{Conn: down}})
		return
	}
	tc := tls.Server(down, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if !strings.EqualFold(h.ServerName, c.Host) {
				return nil, errors.New("credproxy: SNI changed")
			}
			return c.Sandbox.leaf(c.Host)
		},
	})
	tc.SetDeadline(time.Now().Add(30 * time.Second))
	if err := tc.Handshake(); err != nil {
		p.log().Info("credproxy: guest handshake failed", "host", c.Host, "err", err)
		tc.Close()
		return
	}
	tc.SetDeadline(time.Time{})
	if tc.ConnectionState().NegotiatedProtocol == "h2" {
		(&http2.Server{}).ServeConn(tc, &http2.ServeConnOpts{Handler: handler, BaseConfig: srv})
		tc.Close()
		return
	}
	srv.Serve(&oneConn{c: &strictConn{Conn: tc}})
}

// maxAnswerHead bounds an upstream answer's head (and each 1xx head).
const maxAnswerHead = 1 << 20

func (p *Proxy) handler(c Conn, tr http.RoundTripper) http.Handler {
	scheme, defPort := "https", uint16(443)
	if !c.Secure {
		scheme, defPort = "http", 80
	}
	hostport := c.Host
	if c.Port != defPort {
		hostport = net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port)))
	}
	var vals *values
	if pairs := c.Sandbox.pairs(); len(pairs) > 0 {
		vals = newValues(pairs)
	}
	refused := func(reason string) {
		p.log().Warn("credproxy: answer refused", "host", c.Host, "reason", reason)
		c.Sandbox.Refused(c.Host, reason)
	}
	rp := &httputil.ReverseProxy{
		Transport:  tr,
		BufferPool: &p.buffers,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = scheme, hostport, hostport
			// Every answer is scrubbed, so it is asked for as it can be
			// read: no content-coding, no WebSocket extension.
			pr.Out.Header.Set("Accept-Encoding", "identity")
			pr.Out.Header.Del("Sec-WebSocket-Extensions")
			if !strings.EqualFold(hostOnly(pr.In.Host), c.Host) {
				if carries(pr.Out, c.Sandbox) {
					p.log().Warn("credproxy: placeholder sent with a Host that is not the connection's name; not swapped",
						"sni", c.Host, "host", pr.In.Host)
					c.Sandbox.Misused(hostOnly(pr.In.Host))
				}
				return
			}
			p.swap(pr.Out, c)
		},
		ModifyResponse: func(r *http.Response) error {
			if err := scrub(r, vals, refused); err != nil {
				return err
			}
			if bf, ok := r.Request.Context().Value(batchKey{}).(*batchFlush); ok && r.StatusCode != http.StatusSwitchingProtocols {
				// Coalescing ends with the body: ReverseProxy then writes
				// trailers into the header map, which a late made-up
				// flush (HTTP/2) would read at the same time. (An
				// upgrade's body is the connection, left as it is.)
				r.Body = &bodyEnd{ReadCloser: r.Body, end: bf.stop}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if rf, ok := errors.AsType[*refusal](err); ok {
				refused(rf.reason)
				http.Error(w, rf.Error(), http.StatusBadGateway)
				return
			}
			p.log().Info("credproxy: upstream failed", "host", c.Host, "err", err)
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect {
			// A tunnel inside the connection would carry bytes the proxy
			// cannot read (HTTP/2's extended CONNECT included).
			http.Error(w, "credproxy: CONNECT is not served on an intercepted connection", http.StatusMethodNotAllowed)
			return
		}
		// The upstream may answer before it has read the body: HTTP/1
		// would then close the body under the transport, which drops the
		// connection and the answer (golang/go#40747). Closing it when
		// done waits out a read in flight (golang/go#68560).
		http.NewResponseController(w).EnableFullDuplex()
		defer r.Body.Close()
		bf := &batchFlush{ResponseWriter: w, vals: vals}
		defer bf.stop()
		rp.ServeHTTP(bf, r.WithContext(context.WithValue(r.Context(), batchKey{}, bf)))
		// Trailers are written from the header map once the handler
		// returns: ReverseProxy has put the upstream's there.
		bf.stop()
		scrubHeader(w.Header(), vals)
	})
}

// bufferPool holds ReverseProxy's body copy buffers: larger than its
// default 32 KiB, so a download moves in fewer writes (and TLS records
// and syscalls) to the guest, and small enough that a guest holding many
// responses open pins little memory. The zero value is ready.
type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 128<<10)
}

func (b *bufferPool) Put(s []byte) { b.p.Put(&s) }

// batchFlush coalesces the flushes ReverseProxy makes after every write of
// a body of unknown length (a scrubbed body has one): at most one every
// flushEvery, except for event streams, which flush at once. Without it a
// large download becomes one TLS record and one syscall per 32 KiB. A
// flush it skips is made flushEvery after the last, so bytes of a stream
// that then falls quiet (a line of NDJSON) are not held back.
type batchFlush struct {
	http.ResponseWriter
	mu      sync.Mutex // (the made-up flush runs beside ReverseProxy's writes)
	last    time.Time
	pending *time.Timer
	done    bool
	every   time.Duration // flushEvery if 0 (tests)
	vals    *values       // scrubbed from every head written (a 1xx's too)
}

const flushEvery = 20 * time.Millisecond

func (b *batchFlush) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ResponseWriter.Write(p)
}

// WriteHeader scrubs the head first: ReverseProxy writes a 1xx answer's
// (103 Early Hints) straight from the upstream, past ModifyResponse.
func (b *batchFlush) WriteHeader(code int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	scrubHeader(b.Header(), b.vals)
	b.ResponseWriter.WriteHeader(code)
}

func (b *batchFlush) Flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	every := b.every
	if every == 0 {
		every = flushEvery
	}
	wait := every - time.Since(b.last)
	if wait <= 0 || b.done || strings.HasPrefix(b.Header().Get("Content-Type"), "text/event-stream") {
		b.flushLocked()
		return
	}
	if b.pending == nil {
		b.pending = time.AfterFunc(wait, func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if !b.done && b.pending != nil {
				b.flushLocked()
			}
		})
	}
}

// flushLocked flushes now; b.mu is held.
func (b *batchFlush) flushLocked() {
	if b.pending != nil {
		b.pending.Stop()
		b.pending = nil
	}
	b.last = time.Now()
	http.NewResponseController(b.ResponseWriter).Flush()
}

// batchKey carries a request's batchFlush to ModifyResponse.
type batchKey struct{}

// bodyEnd calls end once its body's read fails (its end, or an error).
type bodyEnd struct {
	io.ReadCloser
	end  func()
	once sync.Once
}

func (e *bodyEnd) Read(p []byte) (int, error) {
	n, err := e.ReadCloser.Read(p)
	if err != nil {
		e.once.Do(e.end)
	}
	return n, err
}

// stop ends coalescing, and the made-up flushes: the body has been
// copied (a flush after it is made at once) or the response is done
// (net/http flushes what is left).
func (b *batchFlush) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done = true
	if b.pending != nil {
		b.pending.Stop()
		b.pending = nil
	}
}

func (b *batchFlush) Unwrap() http.ResponseWriter { return b.ResponseWriter }

// carries reports whether a request holds any of the sandbox's
// placeholders.
func carries(r *http.Request, sb *Sandbox) bool {
	for i := range sb.Rules {
		if contains(r, sb.Rules[i].Placeholder) {
			return true
		}
	}
	return false
}

func contains(r *http.Request, ph string) bool {
	if strings.Contains(r.URL.RawQuery, ph) || strings.Contains(r.URL.Path, ph) || strings.Contains(r.URL.RawPath, ph) {
		return true
	}
	for _, vs := range r.Header {
		for _, v := range vs {
			if strings.Contains(v, ph) {
				return true
			}
		}
	}
	return false
}

// swap puts the values of the rules that cover the connection into a
// request that presents their placeholders.
func (p *Proxy) swap(r *http.Request, c Conn) {
	for i := range c.Sandbox.Rules {
		rule := &c.Sandbox.Rules[i]
		if !rule.covers(c.Host, c.Port, c.Secure) || !contains(r, rule.Placeholder) {
			continue
		}
		for k, vs := range r.Header {
			for j, v := range vs {
				r.Header[k][j] = strings.ReplaceAll(v, rule.Placeholder, rule.Value)
			}
		}
		r.URL.Path = strings.ReplaceAll(r.URL.Path, rule.Placeholder, rule.Value)
		r.URL.RawPath = strings.ReplaceAll(r.URL.RawPath, rule.Placeholder, rule.Value)
		r.URL.RawQuery = strings.ReplaceAll(r.URL.RawQuery, rule.Placeholder, rule.Value)
		if rule.Header != "" {
			r.Header.Set(rule.Header, strings.ReplaceAll(rule.Format, "{value}", rule.Value))
		}
		// A part of an answer could hold a part of the value, which no
		// scrub would find: an answer to a request with the value in it
		// comes whole.
		r.Header.Del("Range")
		r.Header.Del("If-Range")
	}
}

func hostOnly(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return h
}

// replayConn replays what was read before the handover.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// CloseWrite keeps half-closes working through the wrapper.
func (c *replayConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// oneConn is a listener of one connection, for http.Server.Serve.
type oneConn struct {
	c    net.Conn
	once sync.Once
	done chan struct{}
	mu   sync.Mutex
}

func (l *oneConn) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() {
		l.done = make(chan struct{})
		c = &closeNotify{Conn: l.c, l: l}
	})
	if c != nil {
		return c, nil
	}
	l.mu.Lock()
	done := l.done
	l.mu.Unlock()
	<-done
	return nil, net.ErrClosed
}

func (l *oneConn) Close() error   { return nil }
func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }

// closeNotify ends the one-connection listener when its connection closes.
type closeNotify struct {
	net.Conn
	l    *oneConn
	once sync.Once
}

func (c *closeNotify) Close() error {
	c.once.Do(func() { close(c.l.done) })
	return c.Conn.Close()
}
