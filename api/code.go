package api

import (
	"net/http"
	"strings"

	"github.com/harebox/harebox/sandbox"
)

// The code interpreter's calls (package codeinterp's Service): cells run
// in contexts of a sandbox made from an image that has one.

func (s *Server) runCode(w http.ResponseWriter, r *http.Request) error {
	var req sandbox.CodeRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	if err := req.Check(); err != nil {
		return err
	}
	id := r.PathValue("id")
	if !strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		x, err := s.eng.Code().Run(r.Context(), id, req, nil)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, x)
		return nil
	}
	// Streamed: errors before the first byte are plain JSON errors; after
	// it, an error event. The cell's own exception is an exception event.
	if err := s.eng.Authorize(r.Context(), "runCode", id); err != nil {
		return err
	}
	e := startSSE(w)
	x, err := s.eng.Code().Run(r.Context(), id, req, func(ev sandbox.CodeEvent) error {
		switch ev.Type {
		case "result":
			return e.event("result", ev.Result)
		case "error":
			return e.event("exception", ev.Error)
		default:
			return e.event(ev.Type, map[string]string{"text": ev.Text})
		}
	})
	if err != nil {
		return ignore(e.event("error", map[string]any{"error": s.streamError(r.Context(), "runCode", err)}))
	}
	// (What was streamed is not sent again.)
	x.Stdout, x.Stderr, x.Results = "", "", nil
	return ignore(e.event("end", x))
}

func (s *Server) listCodeContexts(w http.ResponseWriter, r *http.Request) error {
	l, err := s.eng.Code().Contexts(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"contexts": l})
	return nil
}

func (s *Server) createCodeContext(w http.ResponseWriter, r *http.Request) error {
	var req sandbox.CodeContextRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	c, err := s.eng.Code().CreateContext(r.Context(), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, c)
	return nil
}

func (s *Server) restartCodeContext(w http.ResponseWriter, r *http.Request) error {
	c, err := s.eng.Code().RestartContext(r.Context(), r.PathValue("id"), r.PathValue("context_id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, c)
	return nil
}

func (s *Server) deleteCodeContext(w http.ResponseWriter, r *http.Request) error {
	if err := s.eng.Code().DeleteContext(r.Context(), r.PathValue("id"), r.PathValue("context_id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
