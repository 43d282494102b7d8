package api

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/mcpserver"
)

// MCPPath serves the Model Context Protocol over streamable HTTP: the
// tools of harebox mcp, for agents that reach the server itself.
const MCPPath = "/mcp"

// mcpHandler serves MCPPath. It is stateless: every request is a session
// of its own, authenticated by its own API key, and its tools call this
// server's routes in process with that key and the caller's address, so
// an agent can do exactly what the key allows from where it is.
func (s *Server) mcpHandler() http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		if bearer(r) == "" {
			return nil // (authenticated below first: never the process's own key)
		}
		c, err := apiclient.Open(apiclient.Options{URL: "http://harebox.internal", Key: bearer(r),
			Transport: inProcess{s: s, remote: r.RemoteAddr, forwarded: r.Header.Values("X-Forwarded-For"),
				requestID: r.Header.Get("X-Request-ID")}})
		if err != nil {
			return nil
		}
		return mcpserver.New(c, s.opts.Version)
	}, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, MaxRequestBodyBytes: 32 << 20,
		// A key is required on every request and no cookie is ever
		// used: DNS rebinding gains a page nothing here, and the check
		// refuses a reverse proxy on the same host.
		DisableLocalhostProtection: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// One request ID for the MCP request and the API calls its tools
		// make: the audit log ties them together.
		rid := r.Header.Get("X-Request-ID")
		if !requestIDRE.MatchString(rid) {
			rid = newRequestID()
		}
		r.Header.Set("X-Request-ID", rid)
		w.Header().Set("X-Request-ID", rid)
		if _, err := s.authenticate(r); err != nil {
			ae := toAPIError(err)
			if ae.status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="harebox"`)
			}
			writeError(w, ae)
			return
		}
		// The body in time, as a REST call's (and no deadline left on a
		// stream's connection once it is read: body.go).
		r.Body = struct {
			io.Reader
			io.Closer
		}{&deadlineReader{r: r.Body, w: w, rc: http.NewResponseController(w), whole: time.Now().Add(s.opts.Timeouts.Body)}, r.Body}
		h.ServeHTTP(w, r)
	})
}

// inProcess carries a tool's API request to the server's own handler, as
// if it came from the agent's address.
type inProcess struct {
	s         *Server
	remote    string
	forwarded []string
	requestID string
}

func (t inProcess) RoundTrip(req *http.Request) (resp *http.Response, err error) {
	r := req.Clone(req.Context())
	r.RemoteAddr, r.RequestURI = t.remote, req.URL.RequestURI()
	r.Header.Del("X-Forwarded-For")
	for _, f := range t.forwarded {
		r.Header.Add("X-Forwarded-For", f)
	}
	r.Header.Set("X-Request-ID", t.requestID)
	if r.Body == nil {
		r.Body = http.NoBody
	}
	w := &buffered{header: http.Header{}}
	// A REST handler's panic ends its request (net/http recovers it);
	// here it would end the process.
	defer func() {
		if p := recover(); p != nil {
			t.s.log.Error("api: a route called by an MCP tool panicked", "path", r.URL.Path, "panic", p, "stack", string(debug.Stack()))
			resp, err = nil, fmt.Errorf("api: %s failed", r.URL.Path)
		}
	}()
	t.s.ServeHTTP(w, r)
	if w.over {
		return nil, errTooBig
	}
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return &http.Response{StatusCode: w.code, Status: strconv.Itoa(w.code) + " " + http.StatusText(w.code),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: w.header,
		Body: io.NopCloser(&w.body), ContentLength: int64(w.body.Len()), Request: req}, nil
}

// maxBuffered bounds a tool's API response kept in memory: a command's
// output (the engine caps each stream) or a file (which a guest could grow
// between read_file's stat and its read).
const maxBuffered = 64 << 20

var errTooBig = errors.New("api: the response is too big for an MCP tool")

// buffered is a response kept whole, up to maxBuffered.
type buffered struct {
	header http.Header
	code   int
	body   bytes.Buffer
	over   bool // more than maxBuffered was written
}

func (b *buffered) Header() http.Header { return b.header }
func (b *buffered) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}
func (b *buffered) Write(p []byte) (int, error) {
	if b.code == 0 {
		b.code = http.StatusOK
	}
	if b.over || b.body.Len()+len(p) > maxBuffered {
		b.over = true
		return 0, errTooBig
	}
	return b.body.Write(p)
}
