package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/events"
	"github.com/harebox/harebox/sandbox"
)

// eventKeepalive is how often a followed stream with nothing to say sends
// a comment, so proxies and clients see it alive.
const eventKeepalive = 15 * time.Second

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request) error {
	qv := r.URL.Query()
	q := events.Query{Account: qv.Get("account")}
	if v := qv.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return badRequest("after", "must be a sequence number (the next of the last page)")
		}
		q.After = n
	}
	if v := qv.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return badRequest("limit", "must be 1 to 1000")
		}
		q.Limit = n
	}
	follow, err := boolParam(qv.Get("follow"), "follow")
	if err != nil {
		return err
	}
	if !follow {
		l, next, err := s.eng.Events().List(r.Context(), q)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, map[string]any{"events": l, "next": strconv.FormatInt(next, 10)})
		return nil
	}
	return s.followEvents(w, r, q)
}

// followEvents answers GET /v1/events?follow=true: the events after the
// cursor, each an "event" event, then every later one as it is
// appended, until the client goes. It reads again after each append
// through this server and every followRecheck (another host's). It ends
// as a followed audit log does: with an "error" event when the key is
// revoked or expires, and without one after Timeouts.Follow (opened again
// with after=the last event's seq, nothing is missed).
func (s *Server) followEvents(w http.ResponseWriter, r *http.Request, q events.Query) error {
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.Timeouts.Follow)
	defer cancel()
	keyID := authz.From(ctx).KeyID
	// Errors before the first byte are plain JSON errors; then events.
	changed := s.eng.Audit().Changed()
	l, next, err := s.eng.Events().List(ctx, q)
	if err != nil {
		return err
	}
	e := startSSE(w)
	quiet := time.Now()
	for {
		// A client that stops reading is cut off, not waited for.
		e.rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		for _, ev := range l {
			if err := e.event("event", ev); err != nil {
				return nil
			}
			quiet = time.Now()
		}
		// The cursor moved: there may be more at once. Else wait for an
		// append (changed was taken before the read: none is missed).
		if next == q.After {
			if time.Since(quiet) >= eventKeepalive {
				if err := e.comment("keepalive"); err != nil {
					return nil
				}
				quiet = time.Now()
			}
			if !awaitChange(ctx, changed) {
				return nil
			}
		}
		q.After = next
		changed = s.eng.Audit().Changed()
		if err := s.keyGone(ctx, keyID); err != nil {
			return s.endStream(ctx, e, "listEvents", err)
		}
		if l, next, err = s.eng.Events().List(ctx, q); err != nil {
			return s.endStream(ctx, e, "listEvents", err)
		}
	}
}

// followRecheck is how often a followed view is read again when
// the audit log says nothing: changes another host made, and states the
// engine moved on its own without an entry.
const followRecheck = 5 * time.Second

// followSandboxes answers GET /v1/sandboxes?follow=true: the list, as a
// "sandboxes" event ({"sandboxes": [...]}, what the list answers), as
// followView sends it.
func (s *Server) followSandboxes(w http.ResponseWriter, r *http.Request, f sandbox.ListFilter) error {
	return s.followView(w, r, "sandboxes", "listSandboxes", func(ctx context.Context) (any, error) {
		boxes, err := s.eng.List(ctx, f)
		return map[string]any{"sandboxes": boxes}, err
	})
}

// followSandbox answers GET /v1/sandboxes/{id}?follow=true: the sandbox,
// as a "sandbox" event (what GET answers), as followView sends it.
func (s *Server) followSandbox(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	return s.followView(w, r, "sandbox", "getSandbox", func(ctx context.Context) (any, error) {
		return s.eng.Get(ctx, id)
	})
}

// followView streams what read answers, as an event named name, at once
// and again whenever it changes, until the client goes. It reads again
// after each append to the audit log (every change made through this
// server appends one) and every followRecheck. The stream ends with an
// "error" event when a read fails (op's error, as the plain request's
// would be: a sandbox gone is not_found) or when the key it was opened
// with is revoked or expires, as the key's next request would be
// refused; and without one after Timeouts.Follow, to be opened again.
func (s *Server) followView(w http.ResponseWriter, r *http.Request, name, op string, read func(context.Context) (any, error)) error {
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.Timeouts.Follow)
	defer cancel()
	keyID := authz.From(ctx).KeyID
	// Errors before the first byte are plain JSON errors; then events.
	changed := s.eng.Audit().Changed()
	v, err := read(ctx)
	if err != nil {
		return err
	}
	e := startSSE(w)
	var last []byte
	quiet := time.Now()
	for {
		b, err := json.Marshal(v)
		if err != nil {
			return s.endStream(ctx, e, op, err)
		}
		// A client that stops reading is cut off, not waited for.
		e.rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		switch {
		case !bytes.Equal(b, last):
			if err := e.event(name, json.RawMessage(b)); err != nil {
				return nil
			}
			last, quiet = b, time.Now()
		case time.Since(quiet) >= eventKeepalive:
			if err := e.comment("keepalive"); err != nil {
				return nil
			}
			quiet = time.Now()
		}
		if !awaitChange(ctx, changed) {
			return nil
		}
		changed = s.eng.Audit().Changed()
		if err := s.keyGone(ctx, keyID); err != nil {
			return s.endStream(ctx, e, op, err)
		}
		if v, err = read(ctx); err != nil {
			return s.endStream(ctx, e, op, err)
		}
	}
}

// awaitChange waits, in a followed stream, for the next append to the
// audit log (changed; then a moment more, as appends come in bursts: one
// look for a burst) or followRecheck; false when ctx ends first.
func awaitChange(ctx context.Context, changed <-chan struct{}) bool {
	select {
	case <-ctx.Done():
		return false
	case <-changed:
		time.Sleep(100 * time.Millisecond)
	case <-time.After(followRecheck):
	}
	return true
}

// endStream ends a followed stream whose read of op failed with err: with
// an "error" event, unless the stream's own context ended (the client
// went, or its time is up).
func (s *Server) endStream(ctx context.Context, e *sse, op string, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return ignore(e.event("error", map[string]any{"error": s.streamError(ctx, op, err)}))
}

// keyGone says why a stream opened with the key keyID ("" for the
// operator) ends now: the key is revoked or expired, and its next request
// would be refused. Nil while it lives.
func (s *Server) keyGone(ctx context.Context, keyID string) error {
	if keyID == "" || s.eng.Keys().Live(ctx, keyID) {
		return nil
	}
	return sandbox.Errorf(sandbox.ErrUnauthenticated, "", "the API key this stream was opened with is revoked or expired")
}
