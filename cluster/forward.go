package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"time"
)

// Headers a forwarded request carries. A host believes them only on its
// internal endpoint (mutual TLS); its public one drops them.
const (
	// HeaderForwardedBy names the host that forwarded the request: the
	// receiver serves it itself, never forwards it again.
	HeaderForwardedBy = "X-Harebox-Forwarded-By"
	// HeaderClient is the caller's address as the forwarding host saw it
	// (for keys limited by address).
	HeaderClient = "X-Harebox-Client"
	// HeaderClientCert is the client's TLS certificate chain as the
	// forwarding host's ingress took it (each certificate's DER in
	// base64, comma separated), HeaderServerName the name it asked for,
	// and HeaderConn its connection to that host (see ingress).
	HeaderClientCert = "X-Harebox-Client-Cert"
	HeaderServerName = "X-Harebox-Server-Name"
	HeaderConn       = "X-Harebox-Conn"
)

// hostHeaders are the headers hosts tell each other: a forwarded request
// carries only those its forwarding host set, never a caller's.
var hostHeaders = []string{HeaderForwardedBy, HeaderClient, HeaderIngress, HeaderClientCert, HeaderServerName, HeaderConn}

// DropHostHeaders takes the hosts' own headers off h (what a caller sent
// as one of them).
func DropHostHeaders(h http.Header) {
	for _, k := range hostHeaders {
		h.Del(k)
	}
}

// Forwarder sends requests to the host that runs their sandbox, over the
// deployment's mutual TLS, streaming both ways (server-sent events, file
// transfers and WebSocket upgrades pass as they come).
type Forwarder struct {
	self  string
	tr    *http.Transport
	onErr func(w http.ResponseWriter, r *http.Request, err error)
}

// NewForwarder returns a Forwarder for host self. onErr answers a request
// whose host could not be reached.
func NewForwarder(self string, t *TLS, onErr func(w http.ResponseWriter, r *http.Request, err error)) *Forwarder {
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       t.Client.Clone(),
		TLSHandshakeTimeout:   5 * time.Second,
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return &Forwarder{self: self, tr: tr, onErr: onErr}
}

// Forward sends r to host h and copies its answer to w; client is the
// caller's address as this host saw it ("" if unknown), and set the
// hosts' headers this host adds (HeaderIngress and the ingress's): the
// caller's own are dropped, after the hop-by-hop ones (a Connection
// header cannot take those set here off).
func (f *Forwarder) Forward(w http.ResponseWriter, r *http.Request, h *Host, client string, set http.Header) {
	target, err := url.Parse(h.Address)
	if err != nil || target.Scheme != "https" || target.Host == "" {
		f.onErr(w, r, fmt.Errorf("host %s has no usable internal address (%q)", h.Name, h.Address))
		return
	}
	// The other host may answer before this one's transport is done with
	// the request body: a stream that answers at once, or a read of the
	// body's end that the transport makes after sending it. HTTP/1 would
	// then consume and close the caller's body as the answer began, that
	// read would fail, and the transport would drop the connection under
	// the answer (golang/go#40747): the other host saw its caller go, and
	// cut the command. Full duplex leaves the body to the transport;
	// closing it when done waits out a read still in flight
	// (golang/go#68560). (HTTP/2 is full duplex already.)
	http.NewResponseController(w).EnableFullDuplex()
	defer r.Body.Close()
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			// The Host the caller asked for (a WebSocket's origin check on
			// the other host compares it); TLS checks the target's name.
			pr.Out.Host = pr.In.Host
			DropHostHeaders(pr.Out.Header)
			pr.Out.Header.Set(HeaderForwardedBy, f.self)
			if client != "" {
				pr.Out.Header.Set(HeaderClient, client)
			}
			for k, v := range set {
				if slices.Contains(hostHeaders, http.CanonicalHeaderKey(k)) {
					pr.Out.Header[http.CanonicalHeaderKey(k)] = v
				}
			}
		},
		Transport:     f.tr,
		FlushInterval: -1, // (events and output as they come)
		// A copy cut short is a caller or a host that went (or a stream
		// the other host cut): not worth a line in the server's log.
		ErrorLog: log.New(io.Discard, "", 0),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // (the caller went)
			}
			f.onErr(w, r, fmt.Errorf("host %s (%s) cannot be reached: %w", h.Name, h.Address, err))
		},
	}
	p.ServeHTTP(w, r)
}

// Internal wraps the handler of a host's internal endpoint: only a
// request whose client showed a deployment certificate gets through
// (the TLS config asks for one; this checks the connection had it), with
// ctx marked so the API believes its forwarding headers.
func Internal(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			http.Error(w, "a deployment certificate is required", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), internalKey{}, r.TLS)))
	})
}

type internalKey struct{}

// FromHost reports whether r came over a host's internal endpoint from
// another host of the deployment.
func FromHost(r *http.Request) bool {
	c, _ := r.Context().Value(internalKey{}).(*tls.ConnectionState)
	return c != nil
}
