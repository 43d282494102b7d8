// Package envd serves, on the host, what E2B's in-sandbox daemon (envd)
// answers, translated onto the engine's calls for one sandbox a request:
// the guest stays untrusted, and every check, bound and audit record stays
// on the host. This file has its HTTP half: /health and /files (download,
// and upload as multipart or a raw body, either gzip-compressed), each
// authorized by the sandbox's access token or a file URL signed with it.
package envd

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
)

// Files are the engine's file calls envd makes (harebox.Engine has them).
type Files interface {
	ReadFile(ctx context.Context, id, path string, w io.Writer) (int64, error)
	WriteFile(ctx context.Context, id, path string, r io.Reader, o sandbox.WriteOptions) (*sandbox.FileInfo, error)
	StatFile(ctx context.Context, id, path string) (*sandbox.FileInfo, error)
}

// Access says who may use a sandbox's envd.
type Access interface {
	// Token is sandbox id's envd access token: a request carries it
	// (X-Access-Token), or a file URL is signed with it.
	Token(ctx context.Context, id string) (string, error)
	// Principal is whom such a request acts as on sandbox id (the engine
	// authorizes and audits its calls as that principal's); an error when
	// sandbox id is not running (or is not there).
	Principal(ctx context.Context, id string) (authz.Principal, error)
}

// Options are a Server's parts.
type Options struct {
	Files  Files
	Access Access
	// Filesystem, if set, serves envd's filesystem service (Connect).
	Filesystem Filesystem
	// Processes, if set, serves envd's process service (Connect).
	Processes Processes
	// Now is the clock signed URLs expire by (default time.Now).
	Now func() time.Time
	// StallTimeout ends a request whose caller takes none of what is
	// written to it, or sends none of its body, for this long (default
	// DefaultStallTimeout): a stream or a download left unread holds
	// nothing on the host past it. A process such a stream followed runs
	// on.
	StallTimeout time.Duration
}

// DefaultStallTimeout is Options.StallTimeout's default.
const DefaultStallTimeout = time.Minute

// Server serves envd's endpoints for a sandbox.
type Server struct {
	opts Options
	mux  *http.ServeMux
}

// New returns a Server.
func New(opts Options) *Server {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.StallTimeout <= 0 {
		opts.StallTimeout = DefaultStallTimeout
	}
	s := &Server{opts: opts, mux: http.NewServeMux()}
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	s.mux.HandleFunc("GET /files", s.files("read", s.download))
	s.mux.HandleFunc("POST /files", s.files("write", s.upload))
	s.mountRPC()
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such envd endpoint: "+r.Method+" "+r.URL.Path)
	})
	return s
}

// DefaultUser is whom a request that names no user acts as, as in E2B.
const DefaultUser = "user"

type (
	sandboxKey        struct{}
	principalOfSbxKey struct{}
)

// Handler serves sandbox id's envd. A sandbox that is not running (or
// not there) is a 502 to every request, /health included, as E2B's edge
// answers: the SDK's isRunning reads it so.
func (s *Server) Handler(id string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := s.opts.Access.Principal(r.Context(), id)
		if err != nil {
			writeError(w, http.StatusBadGateway, "the sandbox was not found or is not running")
			return
		}
		ctx := context.WithValue(r.Context(), sandboxKey{}, id)
		ctx = context.WithValue(ctx, principalOfSbxKey{}, p)
		r = r.WithContext(ctx)
		sw := &stallWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: s.opts.StallTimeout}
		r.Body = &stallReader{ReadCloser: r.Body, rc: sw.rc, d: sw.d}
		s.mux.ServeHTTP(sw, r)
	})
}

// stallWriter gives each write and flush of an answer StallTimeout to
// reach the caller: one that does not read fails the handler's next
// write, which ends the request and closes its connection. (The deadline
// is lifted after each that succeeds: a stream quiet between keepalives
// is not stalled.)
type stallWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *stallWriter) Write(b []byte) (int, error) {
	w.rc.SetWriteDeadline(time.Now().Add(w.d))
	n, err := w.ResponseWriter.Write(b)
	if err == nil {
		w.rc.SetWriteDeadline(time.Time{})
	}
	return n, err
}

func (w *stallWriter) Flush() {
	w.rc.SetWriteDeadline(time.Now().Add(w.d))
	if w.rc.Flush() == nil {
		w.rc.SetWriteDeadline(time.Time{})
	}
}

func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// stallReader gives each read of a request's body StallTimeout. (A
// deadline that passed stays: the server's own read of what is left of
// the body, after the handler, must fail too.)
type stallReader struct {
	io.ReadCloser
	rc *http.ResponseController
	d  time.Duration
}

func (r *stallReader) Read(b []byte) (int, error) {
	r.rc.SetReadDeadline(time.Now().Add(r.d))
	n, err := r.ReadCloser.Read(b)
	if err == nil || err == io.EOF {
		r.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// sandboxOf is the sandbox a request is for (Handler's id).
func sandboxOf(ctx context.Context) string {
	id, _ := ctx.Value(sandboxKey{}).(string)
	return id
}

// actsAs is whom a request for the sandbox acts as, once its token is
// checked (Access.Principal, read by Handler).
func actsAs(ctx context.Context) authz.Principal {
	p, _ := ctx.Value(principalOfSbxKey{}).(authz.Principal)
	return p
}

// fileRequest is a /files request, authorized: its path is absolute.
type fileRequest struct {
	id, path, user string
}

var userName = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// files authorizes a /files request for operation ("read" or "write"):
// the access token, or a signature made with it (as the SDK makes it: v1_
// and the unpadded base64 of SHA-256 over path:operation:user:token, and
// :expiration when it expires).
func (s *Server) files(operation string, h func(http.ResponseWriter, *http.Request, fileRequest) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := sandboxOf(r.Context())
		q := r.URL.Query()
		user := q.Get("username")
		if user == "" {
			user = DefaultUser
		}
		if !userName.MatchString(user) {
			writeError(w, http.StatusUnauthorized, "invalid user "+strconv.Quote(user))
			return
		}
		token, err := s.opts.Access.Token(r.Context(), id)
		if err != nil || token == "" {
			writeError(w, http.StatusUnauthorized, "this sandbox's envd is not available")
			return
		}
		if !s.authorized(r, q, operation, token) {
			writeError(w, http.StatusUnauthorized, "invalid access token or signature")
			return
		}
		p := actsAs(r.Context())
		fr := fileRequest{id: id, user: user, path: Resolve(q.Get("path"), user)}
		if err := h(w, r.WithContext(authz.WithPrincipal(r.Context(), p)), fr); err != nil {
			writeError(w, status(err), message(err))
		}
	}
}

func (s *Server) authorized(r *http.Request, q map[string][]string, operation, token string) bool {
	if t := r.Header.Get("X-Access-Token"); t != "" {
		return subtle.ConstantTimeCompare([]byte(t), []byte(token)) == 1
	}
	sig, exp := first(q, "signature"), first(q, "signature_expiration")
	if sig == "" {
		return false
	}
	raw := first(q, "path") + ":" + operation + ":" + first(q, "username") + ":" + token
	if exp != "" {
		at, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || s.opts.Now().Unix() > at {
			return false
		}
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	return subtle.ConstantTimeCompare([]byte(sig), []byte(want)) == 1
}

func first(q map[string][]string, k string) string {
	if v := q[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Resolve is an envd path for user: a relative one is from the user's
// home (/root for root, /home/NAME otherwise), and "" is the home.
func Resolve(p, user string) string {
	home := "/home/" + user
	if user == "root" {
		home = "/root"
	}
	if !strings.HasPrefix(p, "/") {
		p = home + "/" + p
	}
	return path.Clean(p)
}

// entry is envd's EntryInfo as an upload answers it.
type entry struct {
	Path string `json:"path"`
	Name string `json:"name"`
	Type string `json:"type"`
}

// writeError answers in envd's error shape.
func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"code": code, "message": msg})
}

// status is what envd answers for err, by its kind.
func status(err error) int {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe), errors.Is(err, model.ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, model.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, model.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, model.ErrUnauthenticated), errors.Is(err, model.ErrForbidden):
		return http.StatusUnauthorized
	case errors.Is(err, model.ErrCapacity):
		return http.StatusInsufficientStorage
	case errors.Is(err, model.ErrState), errors.Is(err, model.ErrUnavailable):
		return http.StatusBadGateway
	}
	return http.StatusInternalServerError
}

// message is err's summary: the kind's message without a cause that can
// name host paths, as the REST API answers it.
func message(err error) string {
	var me *model.Error
	if errors.As(err, &me) && me.Err != nil && (errors.Is(err, model.ErrUnavailable) || errors.Is(err, model.ErrTimeout)) {
		return me.Msg
	}
	return err.Error()
}

func jsonEncode(w http.ResponseWriter, v any) error {
	w.WriteHeader(http.StatusOK)
	return json.NewEncoder(w).Encode(v)
}
