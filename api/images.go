package api

import (
	"net/http"

	"github.com/harebox/harebox/sandbox"
)

func (s *Server) listImages(w http.ResponseWriter, r *http.Request) error {
	l, err := s.images.List(r.Context())
	return reply(w, http.StatusOK, map[string]any{"images": l}, err)
}

// buildImage answers once the image is built (minutes for a large one).
func (s *Server) buildImage(w http.ResponseWriter, r *http.Request) error {
	var req sandbox.ImageBuildRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	img, err := s.images.Build(r.Context(), req)
	return reply(w, http.StatusCreated, img, err)
}

func (s *Server) deleteImage(w http.ResponseWriter, r *http.Request) error {
	if err := s.images.Delete(r.Context(), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
