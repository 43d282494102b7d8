package api

import (
	"net/http"

	"github.com/harebox/harebox/volume"
)

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) error {
	var req volume.CreateRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	if p := project(r); p != "" && req.Project == "" {
		req.Project = p
	}
	v, err := s.eng.Volumes().Create(r.Context(), account(r), req)
	return reply(w, http.StatusCreated, v, err)
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) error {
	l, err := s.eng.Volumes().List(r.Context(), account(r), project(r))
	return reply(w, http.StatusOK, map[string]any{"volumes": l}, err)
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) error {
	v, err := s.eng.Volumes().Get(r.Context(), account(r), project(r), r.PathValue("volume"))
	return reply(w, http.StatusOK, v, err)
}

// resizeVolume takes {"size_gb": N}: a volume only grows.
func (s *Server) resizeVolume(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		SizeGB int `json:"size_gb"`
	}
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	v, err := s.eng.Volumes().Resize(r.Context(), account(r), project(r), r.PathValue("volume"), req.SizeGB)
	return reply(w, http.StatusOK, v, err)
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) error {
	if err := s.eng.Volumes().Delete(r.Context(), account(r), project(r), r.PathValue("volume")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
