// Package api is HareBox's REST API over the engine: routes, the OpenAPI
// document, authentication, JSON errors. cmd/hareboxd serves it.
package api

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/harebox/harebox/apikey"
	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/budget/money"
	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/images/catalog"
	"github.com/harebox/harebox/ingress"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/monitor"
	"github.com/harebox/harebox/move"
	"github.com/harebox/harebox/processes"
	"github.com/harebox/harebox/sandbox"
)

//go:embed openapi.yaml
var openapiYAML []byte

// Document returns the OpenAPI document, parsed and validated.
func Document() (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromData(openapiYAML)
	if err != nil {
		return nil, err
	}
	return doc, doc.Validate(context.Background())
}

// MaxJSONBody bounds a JSON request body.
const MaxJSONBody = 1 << 20

// Options configure a Server.
type Options struct {
	// Engine is the engine served (*harebox.Engine).
	Engine Engine
	// Auth authenticates the operator (the root key). Other keys are the
	// engine's scoped keys (Engine.Keys).
	Auth    Authenticator
	Version string
	Logger  *slog.Logger
	// TrustedProxies are the addresses whose X-Forwarded-For is believed
	// when checking a key's CIDRs; from anyone else it is ignored.
	TrustedProxies []netip.Prefix
	// Timeouts bound slow clients; zero fields take the defaults.
	Timeouts Timeouts
	// Cluster, when several hosts share the engine's store, is this host's
	// side of their mutual TLS: requests for other hosts' sandboxes are
	// forwarded to them with it (nil: every request is served here).
	Cluster *cluster.TLS
	// NoConsole: the web console (package console) is not served, and no
	// request is authenticated by a console session.
	NoConsole bool
	// Sessions bound the web console's sessions, which the engine's key
	// service keeps in the store (apikey.Sessions).
	Sessions apikey.SessionOptions
}

// Timeouts bound how long a client may take to send a request, so that slow
// clients (slowloris) cannot hold connections and handlers forever.
type Timeouts struct {
	// Header is the time to send the request line and headers (10 s).
	Header time.Duration
	// Body is the time to send a whole JSON body (30 s).
	Body time.Duration
	// BodyIdle is the longest pause inside a streamed file upload (30 s).
	BodyIdle time.Duration
	// Idle is how long a keep-alive connection waits for its next
	// request (2 min).
	Idle time.Duration
	// Terminal is how long a terminal session's client may leave one
	// message unread before the session ends (30 s).
	Terminal time.Duration
	// Follow is how long a followed sandbox list streams before the
	// server ends it, for the client to open it again: the new request is
	// authenticated again, a console session's end and idle time included
	// (5 min).
	Follow time.Duration
}

// MaxHeaderBytes bounds a request's line and headers.
const MaxHeaderBytes = 64 << 10

func (t Timeouts) withDefaults() Timeouts {
	for _, f := range []struct {
		d   *time.Duration
		def time.Duration
	}{{&t.Header, 10 * time.Second}, {&t.Body, 30 * time.Second}, {&t.BodyIdle, 30 * time.Second}, {&t.Idle, 2 * time.Minute}, {&t.Terminal, 30 * time.Second}, {&t.Follow, 5 * time.Minute}} {
		if *f.d <= 0 {
			*f.d = f.def
		}
	}
	return t
}

// HTTPServer returns an http.Server for s with its timeouts and limits;
// hareboxd serves with it.
func (s *Server) HTTPServer() *http.Server {
	return &http.Server{
		Handler:           s,
		ReadHeaderTimeout: s.opts.Timeouts.Header,
		IdleTimeout:       s.opts.Timeouts.Idle,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}

// Authenticator turns a request's bearer token into a principal, or fails
// with an *sandbox.Error of kind ErrUnauthenticated (or ErrForbidden,
// ErrRateLimited).
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (authz.Principal, error)
}

// Server serves the API.
type Server struct {
	opts Options
	eng  Engine
	// urls answers the URL and URL CA calls (the engine's ingress.Calls),
	// images the image calls (its catalog), monitor the sandboxes'
	// metrics (its monitoring), budgets the budget and usage calls (its
	// budgets), hosts the hosts' calls and where a request goes (its
	// registry of hosts).
	urls    *ingress.Calls
	images  *catalog.Catalog
	monitor *monitor.Service
	budgets *budget.Service
	hosts   *cluster.Registry
	// The last readiness answer (readiness).
	readyMu     sync.Mutex
	readyAt     time.Time
	readyChecks map[string]string
	readyOK     bool
	log         *slog.Logger
	mux         *http.ServeMux
	openapi     []byte
	metrics     http.Handler
	fwd         *cluster.Forwarder
	// sessions are the console's signed-in browsers.
	sessions *apikey.Sessions
}

// Internal is the handler of this host's internal endpoint, where the
// other hosts of the deployment forward requests (served over TLS with
// Options.Cluster.Server: only they get through): the API, and what
// their ingresses forward to this host's, ingress (nil: none here).
func (s *Server) Internal(ingress http.Handler) http.Handler {
	moves, rest := s.eng.Moves(), cluster.Split(s, ingress)
	// (Not a ServeMux: what an ingress forwards keeps its path as sent.)
	return cluster.Internal(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, move.Prefix) && r.Header.Get(cluster.HeaderIngress) == "" {
			moves.ServeHTTP(w, r)
			return
		}
		rest.ServeHTTP(w, r)
	}))
}

// Route is one API route: the router and the OpenAPI document must agree
// on the set of them (a test checks it).
type Route struct {
	Method, Path, OperationID string
	Public                    bool // no API key needed
	handler                   func(s *Server, w http.ResponseWriter, r *http.Request) error
}

// Routes lists every route the server serves.
func Routes() []Route {
	return []Route{
		{"GET", "/health", "getHealth", true, (*Server).health},
		{"GET", "/ready", "getReady", true, (*Server).ready},
		{"GET", "/openapi.json", "getOpenAPI", true, (*Server).openAPI},
		{"GET", "/v1/info", "getInfo", false, (*Server).info},
		{"POST", "/v1/sandboxes", "createSandbox", false, (*Server).create},
		{"GET", "/v1/sandboxes", "listSandboxes", false, (*Server).list},
		{"GET", "/v1/sandboxes/{id}", "getSandbox", false, (*Server).get},
		{"DELETE", "/v1/sandboxes/{id}", "deleteSandbox", false, (*Server).delete},
		{"POST", "/v1/sandboxes/{id}/pause", "pauseSandbox", false, (*Server).pause},
		{"POST", "/v1/sandboxes/{id}/resume", "resumeSandbox", false, (*Server).resume},
		{"POST", "/v1/sandboxes/{id}/stop", "stopSandbox", false, (*Server).stop},
		{"POST", "/v1/sandboxes/{id}/start", "startSandbox", false, (*Server).start},
		{"POST", "/v1/sandboxes/{id}/fork", "forkSandbox", false, (*Server).fork},
		{"POST", "/v1/sandboxes/{id}/hibernate", "hibernateSandbox", false, (*Server).hibernate},
		{"POST", "/v1/sandboxes/{id}/move", "moveSandbox", false, (*Server).move},
		{"POST", "/v1/sandboxes/{id}/timeout", "setSandboxTimeout", false, (*Server).setTimeout},
		{"POST", "/v1/sandboxes/{id}/snapshots", "createSnapshot", false, (*Server).createSnapshot},
		{"GET", "/v1/snapshots", "listSnapshots", false, (*Server).listSnapshots},
		{"GET", "/v1/images", "listImages", false, (*Server).listImages},
		{"POST", "/v1/images", "buildImage", false, (*Server).buildImage},
		{"DELETE", "/v1/images/{name}", "deleteImage", false, (*Server).deleteImage},
		{"POST", "/v1/sandboxes/{id}/urls", "createURL", false, (*Server).createURL},
		{"GET", "/v1/sandboxes/{id}/urls", "listURLs", false, (*Server).listURLs},
		{"GET", "/v1/sandboxes/{id}/urls/{url_id}", "getURL", false, (*Server).getURL},
		{"POST", "/v1/sandboxes/{id}/urls/{url_id}/rotate", "rotateURL", false, (*Server).rotateURL},
		{"GET", "/v1/url-ca", "getURLCA", false, (*Server).getURLCA},
		{"PUT", "/v1/url-ca", "setURLCA", false, (*Server).setURLCA},
		{"DELETE", "/v1/url-ca", "deleteURLCA", false, (*Server).deleteURLCA},
		{"POST", "/v1/url-ca/certs", "issueClientCert", false, (*Server).issueClientCert},
		{"GET", "/v1/url-ca/certs", "listClientCerts", false, (*Server).listClientCerts},
		{"POST", "/v1/url-ca/certs/{serial}/revoke", "revokeClientCert", false, (*Server).revokeClientCert},
		{"DELETE", "/v1/sandboxes/{id}/urls/{url_id}", "deleteURL", false, (*Server).deleteURL},
		{"GET", "/v1/snapshots/{snapshot}", "getSnapshot", false, (*Server).getSnapshot},
		{"DELETE", "/v1/snapshots/{snapshot}", "deleteSnapshot", false, (*Server).deleteSnapshot},
		{"POST", "/v1/sandboxes/{id}/exec", "exec", false, (*Server).exec},
		{"POST", "/v1/sandboxes/{id}/exec/stream", "execStream", false, (*Server).execStream},
		{"POST", "/v1/sandboxes/{id}/code", "runCode", false, (*Server).runCode},
		{"GET", "/v1/sandboxes/{id}/code/contexts", "listCodeContexts", false, (*Server).listCodeContexts},
		{"POST", "/v1/sandboxes/{id}/code/contexts", "createCodeContext", false, (*Server).createCodeContext},
		{"POST", "/v1/sandboxes/{id}/code/contexts/{context_id}/restart", "restartCodeContext", false, (*Server).restartCodeContext},
		{"DELETE", "/v1/sandboxes/{id}/code/contexts/{context_id}", "deleteCodeContext", false, (*Server).deleteCodeContext},
		{"POST", "/v1/sandboxes/{id}/processes", "startProcess", false, (*Server).startProcess},
		{"GET", "/v1/sandboxes/{id}/processes", "listProcesses", false, (*Server).listProcesses},
		{"GET", "/v1/sandboxes/{id}/processes/{pid}", "getProcess", false, (*Server).getProcess},
		{"GET", "/v1/sandboxes/{id}/processes/{pid}/output", "getProcessOutput", false, (*Server).processOutput},
		{"GET", "/v1/sandboxes/{id}/pty", "openPty", false, (*Server).pty},
		{"POST", "/v1/sandboxes/{id}/processes/{pid}/kill", "killProcess", false, (*Server).killProcess},
		{"POST", "/v1/sandboxes/{id}/processes/{pid}/input", "sendProcessInput", false, (*Server).sendProcessInput},
		{"PUT", "/v1/sandboxes/{id}/files", "writeFile", false, (*Server).writeFile},
		{"GET", "/v1/sandboxes/{id}/files", "readFile", false, (*Server).readFile},
		{"DELETE", "/v1/sandboxes/{id}/files", "removeFile", false, (*Server).removeFile},
		{"GET", "/v1/sandboxes/{id}/files/stat", "statFile", false, (*Server).statFile},
		{"GET", "/v1/sandboxes/{id}/files/list", "listFiles", false, (*Server).listFiles},
		{"POST", "/v1/sandboxes/{id}/files/mkdir", "mkdir", false, (*Server).mkdir},
		{"POST", "/v1/sandboxes/{id}/files/move", "moveFile", false, (*Server).moveFile},
		{"GET", "/v1/sandboxes/{id}/firewall", "getFirewall", false, (*Server).getFirewall},
		{"GET", "/v1/sandboxes/{id}/commands", "listCommands", false, (*Server).listCommands},
		{"PUT", "/v1/sandboxes/{id}/firewall", "setFirewall", false, (*Server).setFirewall},
		{"POST", "/v1/accounts", "createAccount", false, (*Server).createAccount},
		{"GET", "/v1/accounts", "listAccounts", false, (*Server).listAccounts},
		{"GET", "/v1/accounts/{account}", "getAccount", false, (*Server).getAccount},
		{"PATCH", "/v1/accounts/{account}", "updateAccount", false, (*Server).updateAccount},
		{"DELETE", "/v1/accounts/{account}", "deleteAccount", false, (*Server).deleteAccount},
		{"POST", "/v1/projects", "createProject", false, (*Server).createProject},
		{"GET", "/v1/projects", "listProjects", false, (*Server).listProjects},
		{"GET", "/v1/projects/{project}", "getProject", false, (*Server).getProject},
		{"PATCH", "/v1/projects/{project}", "updateProject", false, (*Server).updateProject},
		{"DELETE", "/v1/projects/{project}", "deleteProject", false, (*Server).deleteProject},
		{"POST", "/v1/projects/{project}/fleets", "createFleet", false, (*Server).createFleet},
		{"GET", "/v1/projects/{project}/fleets", "listFleets", false, (*Server).listFleets},
		{"GET", "/v1/projects/{project}/fleets/{fleet}", "getFleet", false, (*Server).getFleet},
		{"DELETE", "/v1/projects/{project}/fleets/{fleet}", "deleteFleet", false, (*Server).deleteFleet},
		{"POST", "/v1/keys", "createKey", false, (*Server).createKey},
		{"GET", "/v1/keys", "listKeys", false, (*Server).listKeys},
		{"GET", "/v1/keys/{key}", "getKey", false, (*Server).getKey},
		{"DELETE", "/v1/keys/{key}", "revokeKey", false, (*Server).revokeKey},
		{"POST", "/v1/keys/{key}/rotate", "rotateKey", false, (*Server).rotateKey},
		{"POST", "/v1/environments", "createEnvironment", false, (*Server).createEnvironment},
		{"GET", "/v1/environments", "listEnvironments", false, (*Server).listEnvironments},
		{"GET", "/v1/environments/{environment}", "getEnvironment", false, (*Server).getEnvironment},
		{"PATCH", "/v1/environments/{environment}", "updateEnvironment", false, (*Server).updateEnvironment},
		{"DELETE", "/v1/environments/{environment}", "deleteEnvironment", false, (*Server).deleteEnvironment},
		{"GET", "/v1/environments/{environment}/versions", "listEnvironmentVersions", false, (*Server).listEnvironmentVersions},
		{"GET", "/v1/environments/{environment}/versions/{version}", "getEnvironmentVersion", false, (*Server).getEnvironmentVersion},
		{"POST", "/v1/volumes", "createVolume", false, (*Server).createVolume},
		{"GET", "/v1/volumes", "listVolumes", false, (*Server).listVolumes},
		{"GET", "/v1/volumes/{volume}", "getVolume", false, (*Server).getVolume},
		{"PATCH", "/v1/volumes/{volume}", "resizeVolume", false, (*Server).resizeVolume},
		{"DELETE", "/v1/volumes/{volume}", "deleteVolume", false, (*Server).deleteVolume},
		{"GET", "/v1/audit", "listAudit", false, (*Server).listAudit},
		{"GET", "/v1/audit/verify", "verifyAudit", false, (*Server).verifyAudit},
		{"GET", "/v1/audit/key", "getAuditKey", false, (*Server).getAuditKey},
		{"POST", "/v1/budgets", "createBudget", false, (*Server).createBudget},
		{"GET", "/v1/budgets", "listBudgets", false, (*Server).listBudgets},
		{"GET", "/v1/budgets/{budget}", "getBudget", false, (*Server).getBudget},
		{"DELETE", "/v1/budgets/{budget}", "deleteBudget", false, (*Server).deleteBudget},
		{"GET", "/v1/usage", "getUsage", false, (*Server).getUsage},
		{"GET", "/v1/events", "listEvents", false, (*Server).listEvents},
		{"GET", "/v1/sandboxes/{id}/metrics", "getSandboxMetrics", false, (*Server).getSandboxMetrics},
		{"GET", "/metrics", "getServerMetrics", false, (*Server).getServerMetrics},
		{"GET", "/v1/hosts", "listHosts", false, (*Server).listHosts},
		{"DELETE", "/v1/hosts/{name}", "deleteHost", false, (*Server).deleteHost},
		{"POST", "/v1/hosts/{name}/drain", "drainHost", false, (*Server).drainHost},
		{"POST", "/v1/hosts/{name}/undrain", "undrainHost", false, (*Server).undrainHost},
		{"POST", "/v1/hosts/{name}/mesh-key", "rotateMeshKey", false, (*Server).rotateMeshKey},
		{"GET", "/v1/pool", "getPool", false, (*Server).getPool},
		{"PUT", "/v1/pool", "setPool", false, (*Server).setPool},
		{"DELETE", "/v1/pool", "resetPool", false, (*Server).resetPool},
	}
}

// New returns a server over an engine.
func New(opts Options) (*Server, error) {
	if opts.Engine == nil || opts.Auth == nil {
		return nil, errors.New("api: Engine and Auth are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.Timeouts = opts.Timeouts.withDefaults()
	doc, err := Document()
	if err != nil {
		return nil, fmt.Errorf("api: openapi document: %w", err)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, eng: opts.Engine, log: opts.Logger, mux: http.NewServeMux(), openapi: b, metrics: metricsHandler(opts.Engine),
		urls: opts.Engine.URLCalls(), images: opts.Engine.Images(), monitor: opts.Engine.Monitor(),
		budgets: opts.Engine.Budgets(), hosts: opts.Engine.Cluster(), sessions: opts.Engine.Keys().Sessions(opts.Sessions)}
	if opts.Cluster != nil {
		s.fwd = cluster.NewForwarder(s.hosts.Name(), opts.Cluster, func(w http.ResponseWriter, r *http.Request, err error) {
			s.log.Warn("cannot forward a request to its host", "path", r.URL.Path, "err", err)
			writeError(w, apiError{status: http.StatusBadGateway, code: "unavailable", msg: err.Error()})
		})
	}
	for _, rt := range Routes() {
		s.mux.Handle(rt.Method+" "+rt.Path, s.wrap(rt))
	}
	s.mux.Handle(MCPPath, s.mcpHandler())
	if !opts.NoConsole {
		s.consoleRoutes()
	}
	// Anything else is a JSON 404 (or 405), like every other error.
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, apiError{status: http.StatusNotFound, code: "not_found", msg: "no route " + r.Method + " " + r.URL.Path})
	})
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func (s *Server) wrap(rt Route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		// Every request has an ID, the client's if it is well formed; the
		// audit log records it with what the request did.
		rid := r.Header.Get("X-Request-ID")
		if !requestIDRE.MatchString(rid) {
			rid = newRequestID()
		}
		w.Header().Set("X-Request-ID", rid)
		r = r.WithContext(audit.WithRequestID(r.Context(), rid))
		if !cluster.FromHost(r) { // (only hosts say who forwarded, and for whom)
			cluster.DropHostHeaders(r.Header)
		}
		r.Header.Set("X-Request-ID", rid) // (a host it is forwarded to goes on with it)
		// No answer is a page a browser may run or frame.
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'; sandbox")
		if err := s.fromSession(r); err != nil {
			writeError(w, toAPIError(err))
			return
		}
		if s.forward(w, r, rt) {
			return
		}
		if !rt.Public {
			ctx, err := s.authenticate(r)
			if err != nil {
				ae := toAPIError(err)
				if ae.status == http.StatusUnauthorized {
					w.Header().Set("WWW-Authenticate", `Bearer realm="harebox"`)
				}
				writeError(w, ae)
				return
			}
			r = r.WithContext(ctx)
		}
		err := rt.handler(s, w, r)
		if err != nil {
			ae := toAPIError(err)
			if ae.status >= 500 {
				s.log.Warn("request failed", "op", rt.OperationID, "err", err)
			}
			writeError(w, ae)
		}
		s.log.Debug("request", "op", rt.OperationID, "path", r.URL.Path, "took", time.Since(start))
	})
}

func newRequestID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return "req_" + hex.EncodeToString(b)
}

// authenticate returns the request's context with the caller's address
// and principal: the root key is the operator, any other key is one of the
// engine's scoped keys.
func (s *Server) authenticate(r *http.Request) (context.Context, error) {
	ctx := r.Context()
	if addr, ok := s.source(r); ok {
		ctx = authz.WithSource(ctx, addr)
	}
	token := bearer(r)
	if token == "" {
		return nil, sandbox.Errorf(sandbox.ErrUnauthenticated, "", "an API key is required (Authorization: Bearer <key>)")
	}
	p, err := s.opts.Auth.Authenticate(ctx, token)
	if err != nil {
		if p, err = s.eng.Keys().Authenticate(ctx, token); err != nil {
			return nil, err
		}
	}
	return authz.WithPrincipal(ctx, p), nil
}

// bearer is the request's API key (Authorization: Bearer <key>), or "".
func bearer(r *http.Request) string {
	t, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return ""
	}
	return strings.TrimSpace(t)
}

// source is the caller's address: the socket's peer, or, when the peer is
// a trusted proxy, the last address in X-Forwarded-For that is not one.
func (s *Server) source(r *http.Request) (netip.Addr, bool) {
	if cluster.FromHost(r) { // (the host that forwarded it saw the caller)
		return fromHost(r)
	}
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, false // a Unix socket: no address
	}
	addr := ap.Addr().Unmap()
	fwd := r.Header.Values("X-Forwarded-For")
	if !s.trusted(addr) || len(fwd) == 0 {
		return addr, true
	}
	hops := strings.Split(strings.Join(fwd, ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			return netip.Addr{}, false // a trusted proxy sent garbage: unknown
		}
		if a = a.Unmap(); !s.trusted(a) {
			return a, true
		}
		addr = a
	}
	return addr, true
}

func (s *Server) trusted(a netip.Addr) bool {
	for _, p := range s.opts.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// apiError is an error as the API shows it.
type apiError struct {
	status     int
	code, msg  string
	field      string
	retryAfter time.Duration
}

func (e apiError) Error() string { return e.msg }

func badRequest(field, format string, args ...any) error {
	return apiError{status: http.StatusBadRequest, code: "invalid", msg: fmt.Sprintf(format, args...), field: field}
}

// streamError is the body of an error sent inside a stream that already
// began (an event, a WebSocket message, an NDJSON line). A server-side
// failure is logged with its cause, as a request that failed before its
// answer began is (wrap): the client gets only the summary. One that
// failed because the client went (ctx done) is not.
func (s *Server) streamError(ctx context.Context, op string, err error) map[string]any {
	ae := toAPIError(err)
	if ae.status >= 500 && ctx.Err() == nil {
		s.log.Warn("request failed", "op", op, "err", err)
	}
	body := map[string]any{"code": ae.code, "message": ae.msg}
	if ae.field != "" {
		body["field"] = ae.field
	}
	return body
}

// toAPIError maps engine errors to statuses and codes.
func toAPIError(err error) apiError {
	var ae apiError
	if errors.As(err, &ae) {
		return ae
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return apiError{status: http.StatusRequestEntityTooLarge, code: "too_large", msg: fmt.Sprintf("request body is larger than %d bytes", mbe.Limit)}
	}
	field := sandbox.FieldOf(err)
	msg := err.Error()
	var se *sandbox.Error
	if errors.As(err, &se) && se.Err != nil {
		// The cause of a server-side failure can name host paths; it goes
		// to the server's log, the client gets the summary.
		if errors.Is(err, sandbox.ErrUnavailable) || errors.Is(err, sandbox.ErrTimeout) {
			msg = se.Msg
		}
	}
	for _, k := range model.Kinds {
		if errors.Is(err, k.Kind) {
			ae := apiError{status: k.Status, code: k.Code, msg: msg, field: field}
			if se != nil {
				ae.retryAfter = se.RetryAfter
			}
			return ae
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return apiError{status: http.StatusGatewayTimeout, code: "timeout", msg: err.Error()}
	}
	return apiError{status: http.StatusInternalServerError, code: model.CodeInternal, msg: "internal error (see the server's log)"}
}

func writeError(w http.ResponseWriter, e apiError) {
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(e.retryAfter.Seconds()))))
	}
	body := map[string]any{"code": e.code, "message": e.msg}
	if e.field != "" {
		body["field"] = e.field
	}
	writeJSON(w, e.status, map[string]any{"error": body})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// decode reads one strict JSON value: bounded, no unknown fields, nothing
// after it. Errors name the field.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(s.jsonBody(w, r))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		var mbe *http.MaxBytesError
		var ae apiError
		if errors.As(err, &mbe) || errors.As(err, &ae) {
			return err
		}
		return badRequest("", "request body must be a single JSON value")
	}
	return nil
}

func jsonError(err error) error {
	var mbe *http.MaxBytesError
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	var ae apiError
	switch {
	case errors.As(err, &mbe), errors.As(err, &ae):
		return err
	case errors.Is(err, io.EOF):
		return badRequest("", "request body is empty; a JSON value is required")
	case errors.As(err, &se):
		return badRequest("", "invalid JSON at byte %d: %v", se.Offset, err)
	case errors.As(err, &te) && te.Type == reflect.TypeFor[money.USD]():
		return badRequest(te.Field, "%s: %s, such as \"25.00\"", te.Field, te.Value)
	case errors.As(err, &te):
		return badRequest(te.Field, "%s must be %s, not %s", te.Field, te.Type, te.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return badRequest(f, "unknown field %q", f)
	}
	return badRequest("", "invalid JSON: %v", err)
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

// ready answers whether the server can serve requests now (for load
// balancers and service managers): each part "ok" or "unavailable", and
// 503 unless all are ok. Why a part is unavailable goes to the log only:
// the route needs no key.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) error {
	checks, ready := s.readiness(r.Context())
	if !ready {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not_ready", "checks": checks})
		return nil
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "checks": checks})
	return nil
}

// readyFor is how long a readiness answer is reused: the route needs no
// key, and each check asks the database, the plugin and the kernel.
const readyFor = time.Second

// readiness checks the engine's parts, at most once per readyFor; a part
// that is not ready is logged when it changes, not on every request.
func (s *Server) readiness(ctx context.Context) (map[string]string, bool) {
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	if time.Since(s.readyAt) < readyFor {
		return s.readyChecks, s.readyOK
	}
	checks, ok := map[string]string{}, true
	for part, err := range s.eng.Ready(ctx) {
		checks[part] = "ok"
		if err != nil {
			checks[part], ok = "unavailable", false
			if s.readyChecks[part] != "unavailable" {
				s.log.Warn("not ready", "part", part, "err", err)
			}
		}
	}
	s.readyChecks, s.readyOK, s.readyAt = checks, ok, time.Now()
	return checks, ok
}

func (s *Server) openAPI(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	w.Write(s.openapi)
	return nil
}

func (s *Server) info(w http.ResponseWriter, r *http.Request) error {
	caps, err := s.eng.Capabilities(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"version": s.opts.Version,
		"backend": map[string]string{"name": caps.Name, "accelerator": caps.Accelerator, "notice": caps.Notice, "version": caps.Version},
		"site":    s.eng.Site(),
	})
	return nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) error {
	var req sandbox.CreateRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	box, err := s.eng.Create(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, box)
	return nil
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	f := sandbox.ListFilter{State: sandbox.State(q.Get("state")), Account: q.Get("account"), Project: q.Get("project"), Fleet: q.Get("fleet")}
	switch f.State {
	case "", sandbox.StateCreating, sandbox.StateRunning, sandbox.StatePaused, sandbox.StateStopped, sandbox.StateDeleted, sandbox.StateHibernated, sandbox.StateLost:
	default:
		return badRequest("state", "unknown state %q", f.State)
	}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return badRequest("label", "labels are key=value, got %q", l)
		}
		if f.Labels == nil {
			f.Labels = map[string]string{}
		}
		f.Labels[k] = v
	}
	follow, err := boolParam(q.Get("follow"), "follow")
	if err != nil {
		return err
	}
	if follow {
		return s.followSandboxes(w, r, f)
	}
	boxes, err := s.eng.List(r.Context(), f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": boxes})
	return nil
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) error {
	follow, err := boolParam(r.URL.Query().Get("follow"), "follow")
	if err != nil {
		return err
	}
	if follow {
		return s.followSandbox(w, r)
	}
	box, err := s.eng.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, box)
	return nil
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if err := s.eng.Delete(r.Context(), id); err != nil {
		return err
	}
	// The caller may delete it, so it may see what it deleted, even with a
	// key that lacks getSandbox.
	box, err := s.eng.Get(authz.WithPrincipal(r.Context(), authz.Operator), id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, box)
	return nil
}

func (s *Server) stop(w http.ResponseWriter, r *http.Request) error {
	box, err := s.eng.Stop(r.Context(), r.PathValue("id"))
	return reply(w, http.StatusOK, box, err)
}

func (s *Server) start(w http.ResponseWriter, r *http.Request) error {
	box, err := s.eng.Start(r.Context(), r.PathValue("id"))
	return reply(w, http.StatusOK, box, err)
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) error {
	box, err := s.eng.Pause(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, box)
	return nil
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	var req sandbox.TimeoutRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	if err := sandbox.Validate(&req); err != nil {
		return err
	}
	box, err := s.eng.SetTimeout(r.Context(), r.PathValue("id"), time.Duration(*req.TTLSeconds)*time.Second)
	return reply(w, http.StatusOK, box, err)
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request) error {
	box, err := s.eng.Resume(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, box)
	return nil
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	var req sandbox.ExecRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	res, err := s.eng.Exec(r.Context(), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// startSSE begins an answer of server-sent events: its header, sent at
// once.
func startSSE(w http.ResponseWriter) *sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	e := &sse{w: w, rc: http.NewResponseController(w)}
	e.rc.Flush()
	return e
}

// sse writes server-sent events; one writer at a time.
type sse struct {
	mu sync.Mutex
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (e *sse) event(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", name, b); err != nil {
		return err
	}
	return e.rc.Flush()
}

// comment writes an SSE comment line (a keepalive clients ignore).
func (e *sse) comment(text string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := fmt.Fprintf(e.w, ": %s\n\n", text); err != nil {
		return err
	}
	return e.rc.Flush()
}

type sseStream struct {
	e    *sse
	name string
}

func (s sseStream) Write(b []byte) (int, error) {
	if err := s.e.event(s.name, map[string]string{"data": base64.StdEncoding.EncodeToString(b)}); err != nil {
		return 0, err
	}
	return len(b), nil
}

func (s *Server) execStream(w http.ResponseWriter, r *http.Request) error {
	var req sandbox.ExecRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	if err := req.Check(); err != nil {
		return err
	}
	// Errors before the first byte are plain JSON errors; after it, events.
	if err := s.eng.Authorize(r.Context(), "execStream", r.PathValue("id")); err != nil {
		return err
	}
	e := startSSE(w)
	res, err := s.eng.ExecStream(r.Context(), r.PathValue("id"), req, nil, sseStream{e, "stdout"}, sseStream{e, "stderr"})
	if err != nil {
		return ignore(e.event("error", map[string]any{"error": s.streamError(r.Context(), "execStream", err)}))
	}
	return ignore(e.event("exit", res))
}

// ignore drops an error writing to a client that went away.
func ignore(error) error { return nil }

func (s *Server) startProcess(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		sandbox.ExecRequest
		KeepStdin bool   `json:"keep_stdin"`
		Tag       string `json:"tag"`
	}
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	p, err := s.eng.Processes().StartWith(r.Context(), r.PathValue("id"), req.ExecRequest,
		processes.StartOptions{KeepStdin: req.KeepStdin, Tag: req.Tag})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, p)
	return nil
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) error {
	ps, err := s.eng.Processes().List(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"processes": ps})
	return nil
}

func (s *Server) getProcess(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	timeout := 60.0
	if t := q.Get("timeout_seconds"); t != "" {
		v, err := strconv.ParseFloat(t, 64)
		if err != nil || v < 0 || v > 3600 {
			return badRequest("timeout_seconds", "must be a number from 0 to 3600")
		}
		timeout = v
	}
	wait, err := boolParam(q.Get("wait"), "wait")
	if err != nil {
		return err
	}
	if !wait {
		p, err := s.eng.Processes().Get(r.Context(), r.PathValue("id"), r.PathValue("pid"))
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, p)
		return nil
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Duration(timeout*float64(time.Second)))
	defer cancel()
	p, err := s.eng.Processes().Wait(ctx, r.PathValue("id"), r.PathValue("pid"))
	if errors.Is(err, sandbox.ErrTimeout) {
		// Still running after the wait: report it as it is.
		p, err = s.eng.Processes().Get(r.Context(), r.PathValue("id"), r.PathValue("pid"))
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, p)
	return nil
}

// processOutput streams a background process's output as server-sent
// events: stdout and stderr ({"offset", "data": base64}), then exit (the
// result without output) once it has ended; error if the stream breaks.
// Errors found before the first event are plain JSON errors.
func (s *Server) processOutput(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	follow, err := boolParam(q.Get("follow"), "follow")
	if err != nil {
		return err
	}
	var offsets [2]uint64
	for i, name := range []string{"stdout_offset", "stderr_offset"} {
		if v := q.Get(name); v != "" {
			if offsets[i], err = strconv.ParseUint(v, 10, 62); err != nil {
				return badRequest(name, "must be a byte offset (a whole number from 0)")
			}
		}
	}
	e := &sse{w: w, rc: http.NewResponseController(w)}
	var hmu sync.Mutex
	sent := false // the event stream's header
	begin := func() bool {
		hmu.Lock()
		defer hmu.Unlock()
		was := sent
		if !sent {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusOK)
			sent = true
		}
		return was
	}
	stop := make(chan struct{})
	var keepalive sync.WaitGroup
	if follow {
		// A quiet process's stream stays open through proxies.
		keepalive.Add(1)
		go func() {
			defer keepalive.Done()
			t := time.NewTicker(15 * time.Second)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					begin()
					e.comment("keepalive")
				}
			}
		}()
	}
	res, err := s.eng.Processes().Output(r.Context(), r.PathValue("id"), r.PathValue("pid"), offsets, follow, func(stderr bool, offset uint64, data []byte) error {
		begin()
		name := "stdout"
		if stderr {
			name = "stderr"
		}
		return e.event(name, map[string]any{"offset": offset, "data": base64.StdEncoding.EncodeToString(data)})
	})
	close(stop)
	keepalive.Wait()
	hmu.Lock()
	wasSent := sent
	hmu.Unlock()
	if err != nil && !wasSent {
		return err // nothing sent yet: a plain JSON error
	}
	begin()
	if err != nil {
		return ignore(e.event("error", map[string]any{"error": s.streamError(r.Context(), "getProcessOutput", err)}))
	}
	if res != nil {
		return ignore(e.event("exit", res))
	}
	return ignore(e.rc.Flush())
}

func (s *Server) killProcess(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Signal int `json:"signal"`
	}
	if r.ContentLength != 0 {
		if err := s.decode(w, r, &req); err != nil {
			return err
		}
	}
	if err := s.eng.Processes().Kill(r.Context(), r.PathValue("id"), r.PathValue("pid"), req.Signal); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) sendProcessInput(w http.ResponseWriter, r *http.Request) error {
	var in sandbox.ProcessInput
	if err := s.decode(w, r, &in); err != nil {
		return err
	}
	if err := s.eng.Processes().SendInput(r.Context(), r.PathValue("id"), r.PathValue("pid"), in); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func boolParam(v, name string) (bool, error) {
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, badRequest(name, "must be true or false")
	}
	return b, nil
}
