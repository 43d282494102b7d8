package api

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/harebox/harebox/sandbox"
)

// An error sent inside a stream that already began gets no "request
// failed" line from wrap: streamError logs a server-side one with its
// cause (which the client does not see), and not a client's mistake.
func TestStreamErrorLogged(t *testing.T) {
	var log bytes.Buffer
	s := &Server{log: slog.New(slog.NewTextHandler(&log, nil))}
	cause := errors.New("exec: write output: the cause")
	ctx := context.Background()
	body := s.streamError(ctx, "openPty", &sandbox.Error{Kind: sandbox.ErrUnavailable, Msg: "the sandbox's agent failed", Err: cause})
	if body["code"] != "unavailable" || body["message"] != "the sandbox's agent failed" {
		t.Fatalf("body: %v", body)
	}
	if l := log.String(); !strings.Contains(l, "request failed") || !strings.Contains(l, "op=openPty") || !strings.Contains(l, "the cause") {
		t.Fatalf("log: %q", l)
	}
	log.Reset()
	body = s.streamError(ctx, "openPty", sandbox.Errorf(sandbox.ErrNotFound, "path", "no such file"))
	if body["code"] != "not_found" || body["field"] != "path" || log.Len() != 0 {
		t.Fatalf("body %v, log %q", body, log.String())
	}
	// A client that went is no server failure.
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if s.streamError(gone, "openPty", &sandbox.Error{Kind: sandbox.ErrUnavailable, Msg: "x", Err: context.Canceled}); log.Len() != 0 {
		t.Fatalf("logged a client that went: %q", log.String())
	}
}
