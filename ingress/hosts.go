package ingress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/sandbox"
)

// Several hosts: every host's ingress takes every URL (one ingress
// address, in front of all of them), and sends a request for a sandbox
// that another host runs to that host's ingress, over the internal
// endpoint, which serves it as its own. A client certificate (mtls URLs)
// is taken by the TLS of the host the client reached, which passes the
// chain on (certHeader): the host that runs the sandbox checks it.

// Headers a forwarding ingress adds (cluster's), believed only from
// another host (cluster.FromHost), taken off everything else.
const (
	// certHeader is the client's certificate chain as the forwarding
	// host's TLS took it: each certificate's DER in base64, comma
	// separated.
	certHeader = cluster.HeaderClientCert
	// serverNameHeader is the name the client asked for in its TLS
	// handshake.
	serverNameHeader = cluster.HeaderServerName
	// connHeader names the client's connection to the forwarding host,
	// so that a grant is recorded once per connection, as for this
	// host's own.
	connHeader = cluster.HeaderConn
)

// maxRemoteGrants bounds the other hosts' connections a URL remembers
// the grant of (past it, it starts again: a grant may be recorded twice).
const maxRemoteGrants = 4096

// firstGrant notes that e's credential let a request through on its
// client's connection (c, here; or another host's, that forwarded it)
// and says whether that is new there: its grant is recorded once per
// connection.
func (s *Service) firstGrant(r *http.Request, c *conn, e *entry) bool {
	if c != nil {
		return c.firstGrant(e)
	}
	k := r.Header.Get(connHeader)
	if k == "" || !cluster.FromHost(r) {
		return true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.remote[k] {
		return false
	}
	if e.remote == nil || len(e.remote) >= maxRemoteGrants {
		e.remote = map[string]bool{}
	}
	e.remote[k] = true
	return true
}

// Hosts is the deployment's other hosts, as the ingress needs them
// (cluster.IngressHosts): a request for a URL of a sandbox that another
// host runs is served by that host's ingress, which checks it (its URL,
// its protection, its rotation) as it checks its own; so is a sign-in's
// callback that another host began.
type Hosts interface {
	// Self is this host's name.
	Self() string
	// ForwardSandbox serves r on the host that runs sandbox id, with the
	// hosts' headers set (and no other of them), and says whether it did
	// (or answered why not): false when this host runs it, or none does.
	ForwardSandbox(w http.ResponseWriter, r *http.Request, id string, set http.Header) bool
	// ForwardHost serves r on host name: false when that is this host,
	// or no host of the deployment.
	ForwardHost(w http.ResponseWriter, r *http.Request, name string) bool
}

// SetHosts makes the ingress one of a deployment's.
func (s *Service) SetHosts(h Hosts) { s.hosts.Store(&h) }

// elsewhere is the deployment's other hosts when r may be sent on to one
// of them (it came from a client, not from another host's ingress, which
// is served here), else nil.
func (s *Service) elsewhere(r *http.Request) Hosts {
	if h := s.hosts.Load(); h != nil && !cluster.FromHost(r) {
		return *h
	}
	return nil
}

// forwardSandbox sends r to the host that runs sandbox id, with its
// client certificate, and says whether it did (or answered why not).
func (s *Service) forwardSandbox(w http.ResponseWriter, r *http.Request, hosts Hosts, id string) bool {
	set := http.Header{}
	if c, _ := r.Context().Value(connKey{}).(*conn); c != nil {
		set.Set(connHeader, c.id)
	}
	if r.TLS != nil {
		set.Set(serverNameHeader, r.TLS.ServerName)
		if len(r.TLS.PeerCertificates) > 0 {
			var chain []string
			for _, c := range r.TLS.PeerCertificates {
				chain = append(chain, base64.StdEncoding.EncodeToString(c.Raw))
			}
			set.Set(certHeader, strings.Join(chain, ","))
		}
	}
	return hosts.ForwardSandbox(w, r, id, set)
}

// clientTLS is what r's client showed in its TLS handshake: on the
// connection, or, for a request another host forwarded, as that host
// passed it on (bounded as a handshake bounds it).
func clientTLS(r *http.Request) *tls.ConnectionState {
	if !cluster.FromHost(r) {
		return r.TLS
	}
	st := &tls.ConnectionState{ServerName: r.Header.Get(serverNameHeader)}
	v := r.Header.Get(certHeader)
	if v == "" || len(v) > 2*maxClientChainBytes {
		return st
	}
	parts := strings.Split(v, ",")
	if len(parts) > maxClientChain {
		return st
	}
	var chain []*x509.Certificate
	for _, p := range parts {
		der, err := base64.StdEncoding.DecodeString(p)
		if err != nil {
			return st
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return st
		}
		chain = append(chain, c)
	}
	st.PeerCertificates = chain
	return st
}

// remoteAuth is the protection of the URL of guest port t (a host
// form's) when another host runs its sandbox: a handshake asks for a client
// certificate when it is mtls. Found in the store and kept (an mtls one
// a minute, another or none 10 s: a URL published since is seen soon).
func (s *Service) remoteAuth(t target) string {
	if s.hosts.Load() == nil {
		return ""
	}
	now := time.Now()
	s.remote.mu.Lock()
	if c, ok := s.remote.auth[t]; ok && now.Before(c.exp) {
		s.remote.mu.Unlock()
		return c.auth
	}
	s.remote.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	urls, err := s.db.ListURLs(ctx, t.sandboxID)
	if err != nil {
		return ""
	}
	auth := ""
	for _, u := range urls {
		if u.Port == t.port {
			auth = u.Auth
		}
	}
	keep := 10 * time.Second
	if auth == sandbox.URLAuthMTLS {
		keep = time.Minute
	}
	s.remote.mu.Lock()
	defer s.remote.mu.Unlock()
	if s.remote.auth == nil || len(s.remote.auth) >= maxRemote {
		s.remote.auth = map[target]remoteEntry{}
	}
	s.remote.auth[t] = remoteEntry{auth: auth, exp: now.Add(keep)}
	return auth
}

// maxRemote bounds the remote URLs' protections kept.
const maxRemote = 10000

type remoteEntry struct {
	auth string
	exp  time.Time
}

// remoteAuths are the protections of other hosts' URLs, as remoteAuth
// found them.
type remoteAuths struct {
	mu   sync.Mutex
	auth map[target]remoteEntry
}
