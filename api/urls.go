package api

import (
	"net/http"

	"github.com/harebox/harebox/sandbox"
)

func (s *Server) createURL(w http.ResponseWriter, r *http.Request) error {
	var req sandbox.URLRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	u, err := s.eng.CreateURL(r.Context(), r.PathValue("id"), req)
	return reply(w, http.StatusCreated, u, err)
}

func (s *Server) listURLs(w http.ResponseWriter, r *http.Request) error {
	l, err := s.eng.ListURLs(r.Context(), r.PathValue("id"))
	return reply(w, http.StatusOK, map[string]any{"urls": l}, err)
}

func (s *Server) getURL(w http.ResponseWriter, r *http.Request) error {
	u, err := s.eng.GetURL(r.Context(), r.PathValue("id"), r.PathValue("url"))
	return reply(w, http.StatusOK, u, err)
}

func (s *Server) rotateURL(w http.ResponseWriter, r *http.Request) error {
	u, err := s.eng.RotateURL(r.Context(), r.PathValue("id"), r.PathValue("url"))
	return reply(w, http.StatusOK, u, err)
}

func (s *Server) deleteURL(w http.ResponseWriter, r *http.Request) error {
	if err := s.eng.DeleteURL(r.Context(), r.PathValue("id"), r.PathValue("url")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
