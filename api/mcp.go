package api

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

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
			Transport: inProcess{s: s, remote: r.RemoteAddr, forwarded: r.Header.Values("X-Forwarded-For")}})
		if err != nil {
			return nil
		}
		return mcpserver.New(c, s.opts.Version)
	}, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := s.authenticate(r); err != nil {
			ae := toAPIError(err)
			if ae.status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="harebox"`)
			}
			writeError(w, ae)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 32<<20)
		h.ServeHTTP(w, r)
	})
}

func bearer(r *http.Request) string {
	t, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return strings.TrimSpace(t)
}

// inProcess carries a tool's API request to the server's own handler, as
// if it came from the agent's address.
type inProcess struct {
	s         *Server
	remote    string
	forwarded []string
}

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.RemoteAddr, r.RequestURI = t.remote, req.URL.RequestURI()
	r.Header.Del("X-Forwarded-For")
	for _, f := range t.forwarded {
		r.Header.Add("X-Forwarded-For", f)
	}
	if r.Body == nil {
		r.Body = http.NoBody
	}
	w := &buffered{header: http.Header{}}
	t.s.ServeHTTP(w, r)
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
	if b.body.Len()+len(p) > maxBuffered {
		return 0, errTooBig
	}
	return b.body.Write(p)
}
