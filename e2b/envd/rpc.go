package envd

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/harebox/harebox/e2b/envdpb/process/processconnect"
	"github.com/harebox/harebox/model"
)

// envd's Connect services (process, filesystem) share this: a call is
// authorized by the sandbox's access token (X-Access-Token, compared in
// constant time) and acts as the user its Basic authorization names
// (DefaultUser when none), as the principal Access names for the sandbox;
// the engine then authorizes and audits each of its calls as that
// principal's. Errors reach the SDK as Connect codes by their kind.

// maxMessageBytes bounds one Connect message a caller sends (the largest
// is input to a process, 1 MiB of bytes, base64 in JSON).
const maxMessageBytes = 2 << 20

// mountRPC serves the Connect services whose parts Options has.
func (s *Server) mountRPC() {
	opts := connect.WithHandlerOptions(connect.WithInterceptors(&authInterceptor{s: s}),
		connect.WithReadMaxBytes(maxMessageBytes))
	if s.opts.Filesystem != nil {
		s.mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}, opts))
	}
	if s.opts.Processes != nil {
		s.mux.Handle(processconnect.NewProcessHandler(&processService{s: s}, opts))
	}
}

// A stream's keepalive is what its caller asks (Keepalive-Ping-Interval,
// in seconds), held to these bounds; a service's own default without an
// ask.
const (
	minKeepalive = time.Second
	maxKeepalive = time.Hour
)

// keepaliveOf is how often a quiet stream says it is alive.
func keepaliveOf(h http.Header, def time.Duration) time.Duration {
	secs, err := strconv.ParseInt(h.Get("Keepalive-Ping-Interval"), 10, 64)
	if err != nil || secs <= 0 {
		return def
	}
	if secs >= int64(maxKeepalive/time.Second) {
		return maxKeepalive
	}
	return max(time.Duration(secs)*time.Second, minKeepalive)
}

type userKey struct{}

// userOf is the user a Connect call acts as.
func userOf(ctx context.Context) string {
	if u, ok := ctx.Value(userKey{}).(string); ok {
		return u
	}
	return DefaultUser
}

// caller authorizes a Connect call on the sandbox in ctx from its
// headers, and returns ctx with the call's principal and user.
func (s *Server) caller(ctx context.Context, token, authorization string) (context.Context, error) {
	id := sandboxOf(ctx)
	user, err := basicUser(authorization)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	want, err := s.opts.Access.Token(ctx, id)
	if err != nil || want == "" {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("this sandbox's envd is not available"))
	}
	if token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(want)) != 1 {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("invalid access token"))
	}
	return context.WithValue(authz.WithPrincipal(ctx, actsAs(ctx)), userKey{}, user), nil
}

// basicUser is the user an Authorization header names (Basic, the user
// and an empty password, as the SDK sends it); DefaultUser without one.
func basicUser(h string) (string, error) {
	if h == "" {
		return DefaultUser, nil
	}
	scheme, cred, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "basic") {
		return "", errors.New("the Authorization header must be Basic")
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", errors.New("the Authorization header is not base64")
	}
	user, _, _ := strings.Cut(string(raw), ":")
	if user == "" {
		return DefaultUser, nil
	}
	if !userName.MatchString(user) {
		return "", errors.New("invalid user in the Authorization header")
	}
	return user, nil
}

// authInterceptor authorizes every Connect call (unary or streaming).
type authInterceptor struct{ s *Server }

func (a *authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, err := a.s.caller(ctx, req.Header().Get("X-Access-Token"), req.Header().Get("Authorization"))
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (a *authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (a *authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := a.s.caller(ctx, conn.RequestHeader().Get("X-Access-Token"), conn.RequestHeader().Get("Authorization"))
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

// rpcError is err as a Connect error, its code by its kind; an error of
// no kind is internal, its message the summary the REST API would give.
func rpcError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeInternal
	for _, k := range []struct {
		kind error
		code connect.Code
	}{
		{model.ErrInvalid, connect.CodeInvalidArgument},
		{model.ErrNotFound, connect.CodeNotFound},
		{model.ErrExists, connect.CodeAlreadyExists},
		{model.ErrState, connect.CodeFailedPrecondition},
		{model.ErrTooLarge, connect.CodeResourceExhausted},
		{model.ErrCapacity, connect.CodeResourceExhausted},
		{model.ErrRateLimited, connect.CodeResourceExhausted},
		{model.ErrBudget, connect.CodeResourceExhausted},
		{model.ErrUnauthenticated, connect.CodeUnauthenticated},
		{model.ErrForbidden, connect.CodePermissionDenied},
		{model.ErrUnavailable, connect.CodeUnavailable},
		{model.ErrTimeout, connect.CodeDeadlineExceeded},
	} {
		if errors.Is(err, k.kind) {
			code = k.code
			break
		}
	}
	if errors.Is(err, context.Canceled) {
		code = connect.CodeCanceled
	}
	if code == connect.CodeInternal {
		return connect.NewError(code, errors.New("internal error"))
	}
	return connect.NewError(code, errors.New(message(err)))
}
