package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/store"
)

// requestIDRE is what a client's X-Request-ID may be; anything else is
// replaced by one the server makes.
var requestIDRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// auditFilter reads the listAudit query.
func auditFilter(r *http.Request) (store.AuditFilter, error) {
	q := r.URL.Query()
	f := store.AuditFilter{Principal: q.Get("principal"), Target: q.Get("target"), Action: q.Get("action"), Outcome: q.Get("outcome"), Limit: 100}
	for name, t := range map[string]*time.Time{"from": &f.From, "to": &f.To} {
		if v := q.Get(name); v != "" {
			parsed, err := time.Parse(time.RFC3339, v)
			if err != nil {
				return f, badRequest(name, "an RFC 3339 time, e.g. 2026-11-30T12:00:00Z")
			}
			*t = parsed
		}
	}
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return f, badRequest("after", "a sequence number (the cursor of the last page)")
		}
		f.After = n
	}
	newest, err := boolParam(q.Get("newest"), "newest")
	if err != nil {
		return f, err
	}
	if newest && q.Get("format") == "jsonl" {
		return f, badRequest("newest", "an export is every matching entry, oldest first: leave newest out")
	}
	f.Newest = newest
	if v := q.Get("limit"); v != "" && q.Get("format") != "jsonl" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return f, badRequest("limit", "a number from 1 to 1000")
		}
		f.Limit = n
	}
	return f, nil
}

func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) error {
	f, err := auditFilter(r)
	if err != nil {
		return err
	}
	if ref := r.URL.Query().Get("account"); ref != "" {
		// An ID or a name, as everywhere else (the operator's filter; a
		// key's list is its own account's whatever it asks).
		a, err := s.eng.Tenants().GetAccount(r.Context(), ref)
		if err != nil {
			return badRequest("account", "%v", err)
		}
		f.AccountID = a.ID
	}
	follow, err := boolParam(r.URL.Query().Get("follow"), "follow")
	if err != nil {
		return err
	}
	switch {
	case follow && r.URL.Query().Get("format") != "":
		return badRequest("follow", "a followed log is a stream of events: leave format out")
	case follow:
		return s.followAudit(w, r, f)
	case r.URL.Query().Get("format") == "jsonl":
		return s.exportAudit(w, r, f)
	}
	l, err := s.eng.Audit().List(r.Context(), f)
	if err != nil {
		return err
	}
	out := map[string]any{"entries": l}
	if len(l) == f.Limit && !f.Newest { // (a tail has nothing after it yet)
		out["next"] = strconv.FormatInt(l[len(l)-1].Seq, 10)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// followAudit answers GET /v1/audit?follow=true: what the list would
// answer (the entries after the cursor, or with newest the last limit of
// them), each an "entry" event, then every later entry that matches as
// it is appended, until the client goes. It reads the log again after
// each append through this server and every followRecheck (another
// host's appends). It ends as a followed sandbox list does: with an
// "error" event when the key is revoked or expires, and without one after
// Timeouts.Follow (opened again with after=the last seq, nothing is
// missed).
func (s *Server) followAudit(w http.ResponseWriter, r *http.Request, f store.AuditFilter) error {
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.Timeouts.Follow)
	defer cancel()
	keyID := authz.From(ctx).KeyID
	// Errors before the first byte are plain JSON errors; then events.
	changed := s.eng.Audit().Changed()
	l, err := s.eng.Audit().List(ctx, f)
	if err != nil {
		return err
	}
	e := startSSE(w)
	quiet := time.Now()
	for {
		full := len(l) == f.Limit && !f.Newest
		// A client that stops reading is cut off, not waited for.
		e.rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		for _, en := range l {
			if err := e.event("entry", en); err != nil {
				return nil
			}
			f.After, quiet = en.Seq, time.Now()
		}
		// Later reads take every entry after the last one sent, a page at
		// a time; a full page may have more behind it at once.
		f.Newest, f.Limit = false, 1000
		if !full {
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
		changed = s.eng.Audit().Changed()
		if err := s.keyGone(ctx, keyID); err != nil {
			return s.endStream(ctx, e, "listAudit", err)
		}
		if l, err = s.eng.Audit().List(ctx, f); err != nil {
			return s.endStream(ctx, e, "listAudit", err)
		}
	}
}

// exportAudit streams every matching entry as JSON Lines, for a SIEM.
func (s *Server) exportAudit(w http.ResponseWriter, r *http.Request, f store.AuditFilter) error {
	f.Limit = 1000
	first := true
	enc := json.NewEncoder(w)
	for {
		l, err := s.eng.Audit().List(r.Context(), f)
		if err != nil {
			if first {
				return err
			}
			// The stream already began: end it with the error, so a
			// partial export never looks complete.
			enc.Encode(map[string]any{"error": s.streamError(r.Context(), "listAudit", err)})
			return nil
		}
		if first {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			first = false
		}
		for _, e := range l {
			if err := enc.Encode(e); err != nil {
				return nil
			}
		}
		if len(l) < f.Limit {
			return nil
		}
		f.After = l[len(l)-1].Seq
	}
}

func (s *Server) verifyAudit(w http.ResponseWriter, r *http.Request) error {
	rep, err := s.eng.Audit().Verify(r.Context())
	return reply(w, http.StatusOK, rep, err)
}

func (s *Server) getAuditKey(w http.ResponseWriter, r *http.Request) error {
	if err := s.eng.Audit().MayReadKey(r.Context()); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]string{"algorithm": "ed25519", "public_key": base64.StdEncoding.EncodeToString(s.eng.Audit().PublicKey())})
	return nil
}
