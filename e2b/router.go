package e2b

import (
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/harebox/harebox/sandbox"
)

// EnvdPort is the port E2B's SDK reaches a sandbox's envd on.
const EnvdPort = 49983

// Router serves one E2B listener: a request for a sandbox's port goes to
// that sandbox, named by the SDK's headers (E2b-Sandbox-Id and
// E2b-Sandbox-Port, sent with every envd call: what E2B_SANDBOX_URL users
// get) or by its host name (<port>-<sandboxID>.<Domain>: what E2B_DOMAIN
// users and the URLs the SDK builds without headers get); any other
// request is the control plane's. Envd's port is served on the host by
// Envd, the code interpreter's by Interpreter, another port of a sandbox
// by Ports.
type Router struct {
	// API is the control plane (a *Handler).
	API http.Handler
	// Envd serves sandbox id's envd (envd.Server.Handler).
	Envd func(id string) http.Handler
	// Interpreter serves sandbox id's InterpreterPort (Handler.Interpreter);
	// nil: that port is one of Ports.
	Interpreter func(id string) http.Handler
	// Ports serves another port of sandbox id (Handler.Port); nil: such
	// a request is refused.
	Ports func(id string, port int) http.Handler
	// Domain is the sandboxes' domain for host-name routing ("" for
	// none).
	Domain string
}

// ServeHTTP implements http.Handler.
func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, ok, err := rt.target(r)
	switch {
	case err != nil:
		writeJSON(w, http.StatusBadRequest, Error{Code: http.StatusBadRequest, Message: err.Error()})
	case !ok:
		rt.API.ServeHTTP(w, r)
	case port == EnvdPort:
		rt.Envd(InternalID(id)).ServeHTTP(w, r)
	case port == InterpreterPort && rt.Interpreter != nil:
		rt.Interpreter(id).ServeHTTP(w, r)
	case rt.Ports != nil:
		rt.Ports(id, port).ServeHTTP(w, r)
	default:
		writeJSON(w, http.StatusBadGateway, Error{Code: http.StatusBadGateway,
			Message: "port " + strconv.Itoa(port) + " of sandbox " + id + " is not served through this listener (only envd's, " + strconv.Itoa(EnvdPort) + ")"})
	}
}

// target is the sandbox and port r is for (ok false: the control plane's
// request).
func (rt *Router) target(r *http.Request) (id string, port int, ok bool, err error) {
	if h := r.Header.Get("E2b-Sandbox-Id"); h != "" {
		p := EnvdPort
		if ps := r.Header.Get("E2b-Sandbox-Port"); ps != "" {
			if p, err = parsePort(ps); err != nil {
				return "", 0, false, err
			}
		}
		if !validExternalID(h) {
			return "", 0, false, errBadID(h)
		}
		return strings.ToLower(h), p, true, nil
	}
	if rt.Domain == "" {
		return "", 0, false, nil
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	sub, found := strings.CutSuffix(host, "."+strings.ToLower(rt.Domain))
	if !found || strings.Contains(sub, ".") {
		return "", 0, false, nil // the domain itself, or another name: the API's
	}
	ps, sid, found := strings.Cut(sub, "-")
	if !found {
		return "", 0, false, nil
	}
	if port, err = parsePort(ps); err != nil {
		return "", 0, false, err
	}
	if !validExternalID(sid) {
		return "", 0, false, errBadID(sid)
	}
	return sid, port, true, nil
}

func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, badRequest("invalid sandbox port %q", s)
	}
	return p, nil
}

// validExternalID reports whether id is a sandbox ID as E2B's clients
// send it (with or without "sbx_"), before any look-up.
func validExternalID(id string) bool { return sandbox.ValidID(strings.ToLower(InternalID(id))) }

func errBadID(id string) error {
	if len(id) > 64 {
		id = id[:64] + "..."
	}
	return badRequest("invalid sandbox ID %q", id)
}
