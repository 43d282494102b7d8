package e2b

import (
	"context"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/console"
	"github.com/harebox/harebox/sandbox"
)

// A sandbox's other ports (a web server in it: what the SDK's getHost
// names) are served on the listener as E2B's edge serves them: public,
// unless the sandbox was created with network.allowPublicTraffic false,
// when a request must carry the sandbox's traffic token
// (e2b-traffic-access-token, compared in constant time; the create's
// trafficAccessToken, sealed under the sandbox's data key like its envd
// token). A port the sandbox's owner published as a HareBox URL is not
// served here at all: its URL's protection (token, OIDC, client
// certificate) is the only way in. The host dials the guest's port
// (network.Ingress, which opens it to the host's ingress only); the
// sandbox must be running.

// trafficHeader carries a sandbox's traffic token.
const trafficHeader = "E2b-Traffic-Access-Token"

// Guests dials a sandbox's guest ports (network.Ingress: linuxnet's).
type Guests interface {
	DialGuest(ctx context.Context, sandboxID string, port uint16) (net.Conn, error)
}

// portProxy forwards requests to guest ports.
type portProxy struct {
	h  *Handler
	rp *httputil.ReverseProxy
}

func newPortProxy(h *Handler) *portProxy {
	p := &portProxy{h: h}
	tr := &http.Transport{
		// The address is "ID:PORT", the dial key: one pool per port.
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			id, ps, _ := strings.Cut(addr, ":")
			port, err := strconv.ParseUint(ps, 10, 16)
			if err != nil {
				return nil, err
			}
			return h.o.Guests.DialGuest(ctx, id, uint16(port))
		},
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
		DisableCompression:    true,
	}
	p.rp = &httputil.ReverseProxy{
		Transport: tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(portKey{}).(portTarget)
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", t.id+":"+strconv.Itoa(t.port)
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			// (The sandbox's own credentials stay out of its traffic.)
			pr.Out.Header.Del(trafficHeader)
			pr.Out.Header.Del("X-Access-Token")
			pr.Out.Header.Del("X-Api-Key")
			console.DropCookie(pr.Out.Header)
		},
		ModifyResponse: func(resp *http.Response) error {
			console.DropSetCookie(resp.Header)
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t := r.Context().Value(portKey{}).(portTarget)
			h.o.Log.Debug("e2b: a sandbox port did not answer", "id", t.id, "port", t.port, "err", err)
			writeJSON(w, http.StatusBadGateway, Error{Code: http.StatusBadGateway,
				Message: "the sandbox is running but port " + strconv.Itoa(t.port) + " is not open"})
		},
		ErrorLog: slog.NewLogLogger(h.o.Log.Handler(), slog.LevelDebug),
	}
	return p
}

type portKey struct{}

type portTarget struct {
	id   string
	port int
}

// Port serves port of sandbox id (either form of the ID).
func (h *Handler) Port(id string, port int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h.mayReach(r, InternalID(id), port); err != nil {
			h.writeError(w, err)
			return
		}
		ctx := context.WithValue(r.Context(), portKey{}, portTarget{InternalID(id), port})
		h.ports.rp.ServeHTTP(w, r.WithContext(ctx))
	})
}

// mayReach checks a request for a sandbox's port.
func (h *Handler) mayReach(r *http.Request, id string, port int) error {
	if h.o.Guests == nil {
		return &Status{Code: http.StatusBadGateway, Msg: "this server reaches no sandbox port (no network)"}
	}
	ctx := authz.WithPrincipal(r.Context(), authz.Operator)
	box, err := h.o.Engine.Get(ctx, id)
	if err != nil || box.State != sandbox.StateRunning {
		return &Status{Code: http.StatusBadGateway, Msg: "the sandbox was not found or is not running"}
	}
	if err := h.checkTraffic(r, id); err != nil {
		return err
	}
	urls, err := h.o.Engine.URLs().List(ctx, id)
	if err != nil {
		return err
	}
	for _, u := range urls {
		if u.Port == port {
			return &Status{Code: http.StatusForbidden, Msg: "port " + strconv.Itoa(port) + " is published with its own protection: use its URL"}
		}
	}
	return nil
}

// checkTraffic refuses a request for a port of sandbox id that lacks the
// sandbox's traffic token, if it has one (compared in constant time).
func (h *Handler) checkTraffic(r *http.Request, id string) error {
	want, err := h.traffic.get(r.Context(), id)
	if errors.Is(err, errNoToken) {
		return nil
	}
	if err != nil {
		return err
	}
	got := r.Header.Get(trafficHeader)
	if got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		return &Status{Code: http.StatusForbidden, Msg: "this sandbox's ports need its traffic token (" + trafficHeader + ")"}
	}
	return nil
}

// Status is an answer of a given status (E2B's error body).
type Status struct {
	Code int
	Msg  string
}

func (s *Status) Error() string { return s.Msg }
