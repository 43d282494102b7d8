package cluster

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/harebox/harebox/store"
)

// The ingress of several hosts. A request that one host's ingress takes
// for a URL of a sandbox another host runs is served by the ingress of
// that host, over the internal endpoint: the URL, its protection and its
// rotation are checked there, once, where the sandbox runs. So is an
// OpenID Connect sign-in's callback that another host began (its state
// names that host).

// HeaderIngress marks a request another host's ingress forwarded: the
// internal endpoint gives it to its own ingress, not to the API.
const HeaderIngress = "X-Harebox-Ingress"

// Split is what a host's internal endpoint serves (inside Internal): a
// request another host's ingress forwarded goes to ingress (none here: a
// 404), anything else to api.
func Split(api, ingress http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(HeaderIngress) == "" {
			api.ServeHTTP(w, r)
			return
		}
		if ingress == nil {
			http.Error(w, "this host serves no ingress", http.StatusNotFound)
			return
		}
		ingress.ServeHTTP(w, r)
	})
}

// IngressHosts sends a host's ingress requests to the host that must
// serve them (the ingress's Hosts).
type IngressHosts struct {
	reg *Registry
	fwd *Forwarder
}

// NewIngressHosts returns the deployment's hosts as reg knows them, to
// which f forwards (a Forwarder of this host, with its own error page).
func NewIngressHosts(reg *Registry, t *TLS) *IngressHosts {
	return &IngressHosts{reg: reg, fwd: NewForwarder(reg.Name(), t, func(w http.ResponseWriter, _ *http.Request, err error) {
		// (The details, which name the deployment's hosts and their
		// addresses, are for the log, not the caller.)
		reg.opts.Log.Warn("ingress: cannot forward a request to its host", "err", err)
		http.Error(w, "the host that runs this URL's sandbox cannot be reached", http.StatusBadGateway)
	})}
}

// Self is this host's name.
func (h *IngressHosts) Self() string { return h.reg.Name() }

// ForwardSandbox serves r on the host that runs sandbox id, with the
// hosts' headers set (the ingress's), and reports whether it did (or
// answered why it cannot): false when this host runs it, or none does.
func (h *IngressHosts) ForwardSandbox(w http.ResponseWriter, r *http.Request, id string, set http.Header) bool {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	host, err := h.reg.Elsewhere(ctx, id)
	if err != nil {
		http.Error(w, "the host of this URL's sandbox cannot be looked up", http.StatusServiceUnavailable)
		h.reg.opts.Log.Warn("ingress: cannot look up a sandbox's host", "sandbox", id, "err", err)
		return true
	}
	if host == nil || host.Name == h.reg.Name() {
		return false
	}
	h.forward(w, r, host, set)
	return true
}

// ForwardHost serves r on host name and reports whether it did: false
// when name is this host or none of the deployment.
func (h *IngressHosts) ForwardHost(w http.ResponseWriter, r *http.Request, name string) bool {
	if name == h.reg.Name() {
		return false
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	host, err := h.reg.Get(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return false
	}
	if err != nil {
		http.Error(w, "the deployment's hosts cannot be looked up", http.StatusServiceUnavailable)
		return true
	}
	h.forward(w, r, host, nil)
	return true
}

func (h *IngressHosts) forward(w http.ResponseWriter, r *http.Request, host *Host, set http.Header) {
	if !host.Up {
		h.reg.opts.Log.Info("ingress: a request for a host that is down", "host", host.Name, "lease_until", host.LeaseUntil)
		http.Error(w, "the host that runs this URL's sandbox is down", http.StatusServiceUnavailable)
		return
	}
	client := ""
	if a, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		client = a
	}
	set = set.Clone()
	if set == nil {
		set = http.Header{}
	}
	set.Set(HeaderIngress, "1")
	h.fwd.Forward(w, r, host, client, set)
}
