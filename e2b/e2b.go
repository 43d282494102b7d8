// Package e2b serves E2B's control-plane REST API (the calls the npm e2b
// SDK makes: create, connect, info, list, kill, timeout, pause, resume,
// network rules, metrics, snapshots, fork) over the HareBox engine, so that unmodified E2B SDK code
// creates and manages HareBox sandboxes.
//
// What is checked: every request carries X-API-KEY, a HareBox key (or the
// root key) authenticated as the REST API does, and its principal goes
// into the context, so every scope, project and label limit, rate and
// budget applies and the engine audits each call as its own. A sandbox the
// key may not see is E2B's 404. Template names map to HareBox images
// through a fixed map; metadata maps to labels, and what a label cannot
// hold is refused (400), never dropped; network rules go onto the host
// firewall (network.go). A create field HareBox does not serve yet
// (auto-pause, volumes, MCP, IAM, network transforms) is refused, not
// ignored.
//
// What is not: the request's source address is the socket's peer (no
// trusted proxies); fields this version does not know are ignored, as a
// newer SDK may send them.
//
// Sandbox IDs here are the HareBox ID without its "sbx_" prefix (a
// lower-case ULID), so that "<port>-<sandboxID>.<domain>" is a valid host
// name; both forms are accepted on the way in.
package e2b

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/harebox/harebox/apikey"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/clone"
	"github.com/harebox/harebox/codeinterp"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/ingress"
	"github.com/harebox/harebox/monitor"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/volume"
)

// Engine is what the handler needs of the HareBox engine (*harebox.Engine
// implements it).
type Engine interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (*sandbox.Sandbox, error)
	Get(ctx context.Context, id string) (*sandbox.Sandbox, error)
	List(ctx context.Context, f sandbox.ListFilter) ([]*sandbox.Sandbox, error)
	Delete(ctx context.Context, id string) error
	Pause(ctx context.Context, id string) (*sandbox.Sandbox, error)
	Resume(ctx context.Context, id string) (*sandbox.Sandbox, error)
	SetTimeout(ctx context.Context, id string, ttl time.Duration) (*sandbox.Sandbox, error)
	SetFirewall(ctx context.Context, id string, p *firewall.Policy) (*firewall.Policy, error)
	Monitor() *monitor.Service
	Snapshots() *clone.Snapshots
	URLs() *ingress.Service
	Keys() *apikey.Service
	Volumes() *volume.Service
	// The code interpreter (InterpreterPort).
	Code() *codeinterp.Service
}

// Authenticator checks a key that is not one of the engine's scoped keys
// (api.RootKey: the operator).
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (authz.Principal, error)
}

// Options configure a Handler.
type Options struct {
	Engine Engine
	// Secrets is the engine's secret store: each sandbox's envd access
	// token is kept there, in the sandbox's scope, sealed under its data
	// key (so the sandbox's crypto-erase takes it too).
	Secrets secrets.Store
	// Root, if set, authenticates the root key as the operator.
	Root Authenticator
	// Templates maps E2B template names (or IDs) to HareBox images;
	// default DefaultTemplates.
	Templates map[string]string
	// VolumeGB is the size of a volume made through E2B's API (which
	// names none); default 10.
	VolumeGB int
	// Domain is the domain sandboxes are reported under ("" reports
	// none: the SDK then uses its E2B_DOMAIN or E2B_SANDBOX_URL).
	Domain string
	// Guests dials the sandboxes' ports (Port); nil: none is served.
	Guests Guests
	Log    *slog.Logger
}

// DefaultTemplates maps E2B's default template to HareBox's default image,
// and its code interpreter's (the code-interpreter SDK's default) to the
// code-interpreter image.
var DefaultTemplates = map[string]string{"base": sandbox.DefaultImage, "code-interpreter-v1": "code-interpreter"}

// EnvdVersion is the envd version the sandboxes report. The SDK turns
// features on by it (its envd/versions.ts): 0.1.4 recursive watch, 0.3.0
// stdin to commands, 0.4.0 envd's default user (no user sent), 0.5.2
// CloseStdin, 0.5.7 (0.6.0 in some releases) octet-stream uploads, all of
// which HareBox's envd is to serve. It stays below 0.6.2 (file metadata
// in xattrs), 0.6.3 (entry info in watch events) and 0.6.4 (watches on
// network mounts), which it does not.
const EnvdVersion = "0.6.0"

// clientID fills Sandbox.clientID, which E2B deprecated but still
// requires.
const clientID = "harebox"

// Handler serves the control plane.
type Handler struct {
	o      Options
	mux    *http.ServeMux
	tokens *tokens
	// traffic: the traffic tokens of sandboxes whose ports are private.
	traffic *tokens
	ports   *portProxy
	// byImage maps images back to template names, for templateID.
	byImage map[string]string
}

// New returns the control plane's handler.
func New(o Options) *Handler {
	if o.Templates == nil {
		o.Templates = DefaultTemplates
	}
	if o.VolumeGB == 0 {
		o.VolumeGB = 10
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	h := &Handler{o: o, mux: http.NewServeMux(), tokens: &tokens{sec: o.Secrets, name: envdTokenName},
		traffic: &tokens{sec: o.Secrets, name: trafficTokenName}, byImage: map[string]string{}}
	h.ports = newPortProxy(h)
	// (Several names for one image: the first in order names it.)
	names := make([]string, 0, len(o.Templates))
	for name := range o.Templates {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if _, ok := h.byImage[o.Templates[name]]; !ok {
			h.byImage[o.Templates[name]] = name
		}
	}
	for _, r := range []struct {
		pattern string
		fn      func(*Handler, http.ResponseWriter, *http.Request) error
	}{
		// SDKs before 2.51 create and connect on v1, later ones on v2.
		{"POST /sandboxes", (*Handler).create},
		{"POST /v2/sandboxes", (*Handler).create},
		{"GET /sandboxes", (*Handler).listV1},
		{"GET /v2/sandboxes", (*Handler).listV2},
		{"GET /sandboxes/{id}", (*Handler).info},
		{"DELETE /sandboxes/{id}", (*Handler).kill},
		{"POST /sandboxes/{id}/connect", (*Handler).connect},
		{"POST /v2/sandboxes/{id}/connect", (*Handler).connect},
		{"POST /sandboxes/{id}/timeout", (*Handler).setTimeout},
		{"POST /sandboxes/{id}/pause", (*Handler).pause},
		{"POST /sandboxes/{id}/resume", (*Handler).resume},
		{"PUT /sandboxes/{id}/network", (*Handler).updateNetwork},
		{"GET /sandboxes/{id}/metrics", (*Handler).metrics},
		{"POST /sandboxes/{id}/snapshots", (*Handler).createSnapshot},
		{"GET /snapshots", (*Handler).listSnapshots},
		{"DELETE /templates/{id}", (*Handler).deleteTemplate},
		{"POST /sandboxes/{id}/fork", (*Handler).fork},
		{"GET /volumes", (*Handler).listVolumes},
		{"POST /volumes", (*Handler).createVolume},
		{"GET /volumes/{id}", (*Handler).getVolume},
		{"DELETE /volumes/{id}", (*Handler).deleteVolume},
		{"/volumecontent/", (*Handler).volumeContent},
	} {
		fn := r.fn
		h.mux.HandleFunc(r.pattern, func(w http.ResponseWriter, r *http.Request) {
			ctx, err := h.authenticate(r)
			if err == nil {
				err = fn(h, w, r.WithContext(ctx))
			}
			if err != nil {
				h.writeError(w, err)
			}
		})
	}
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, Error{Code: http.StatusNotFound, Message: "no such endpoint: " + r.Method + " " + r.URL.Path})
	})
	return h
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// authenticate puts the caller's principal (and address) in the context:
// the root key is the operator, any other key is one of the engine's.
func (h *Handler) authenticate(r *http.Request) (context.Context, error) {
	ctx := r.Context()
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		ctx = authz.WithSource(ctx, ap.Addr().Unmap())
	}
	key := strings.TrimSpace(r.Header.Get("X-API-Key"))
	if key == "" {
		return nil, sandbox.Errorf(sandbox.ErrUnauthenticated, "", "an API key is required (X-API-KEY)")
	}
	if h.o.Root != nil {
		if p, err := h.o.Root.Authenticate(ctx, key); err == nil {
			return authz.WithPrincipal(ctx, p), nil
		}
	}
	p, err := h.o.Engine.Keys().Authenticate(ctx, key)
	if err != nil {
		return nil, err
	}
	return authz.WithPrincipal(ctx, p), nil
}

// ExternalID is a HareBox sandbox ID as E2B's clients see it.
func ExternalID(id string) string { return strings.TrimPrefix(id, sandbox.IDPrefix) }

// InternalID is the HareBox ID of an ID a client sent (either form).
func InternalID(id string) string {
	if strings.HasPrefix(id, sandbox.IDPrefix) {
		return id
	}
	return sandbox.IDPrefix + id
}
