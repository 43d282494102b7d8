package api

import (
	"net/http"

	"github.com/harebox/harebox/sandbox"
)

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var req sandbox.SnapshotRequest
	if r.ContentLength != 0 {
		if err := s.decode(w, r, &req); err != nil {
			return err
		}
	}
	sn, err := s.eng.Snapshots().Take(r.Context(), r.PathValue("id"), req)
	return reply(w, http.StatusCreated, sn, err)
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	l, err := s.eng.Snapshots().List(r.Context(), r.URL.Query().Get("sandbox"))
	return reply(w, http.StatusOK, map[string]any{"snapshots": l}, err)
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	sn, err := s.eng.Snapshots().Get(r.Context(), r.PathValue("snapshot"))
	return reply(w, http.StatusOK, sn, err)
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	if err := s.eng.Snapshots().Delete(r.Context(), r.PathValue("snapshot")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) hibernate(w http.ResponseWriter, r *http.Request) error {
	box, err := s.eng.Hibernate(r.Context(), r.PathValue("id"))
	return reply(w, http.StatusOK, box, err)
}

// move moves a sandbox to another host: the operator only.
func (s *Server) move(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		To string `json:"to" validate:"required,max=63"`
	}
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	res, err := s.eng.Move(r.Context(), r.PathValue("id"), req.To)
	return reply(w, http.StatusOK, res, err)
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) error {
	var req sandbox.ForkRequest
	if r.ContentLength != 0 {
		if err := s.decode(w, r, &req); err != nil {
			return err
		}
	}
	l, err := s.eng.Snapshots().Fork(r.Context(), r.PathValue("id"), req)
	return reply(w, http.StatusCreated, map[string]any{"sandboxes": l}, err)
}
