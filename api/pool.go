package api

import (
	"net/http"

	"github.com/harebox/harebox/sandbox"
)

// getPool answers the warm pool as this host keeps it: the operator only.
func (s *Server) getPool(w http.ResponseWriter, r *http.Request) error {
	p, err := s.eng.Pool().Get(r.Context())
	return reply(w, http.StatusOK, p, err)
}

// setPool sets the pool of every host of the deployment: the operator
// only.
func (s *Server) setPool(w http.ResponseWriter, r *http.Request) error {
	var req struct {
		Pool *map[string]int `json:"pool"`
	}
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	if req.Pool == nil {
		return sandbox.Errorf(sandbox.ErrInvalid, "pool", `a pool is required: {"pool": {"IMAGE:PRESET": N, ...}} ({} keeps none)`)
	}
	p, err := s.eng.Pool().Set(r.Context(), *req.Pool)
	return reply(w, http.StatusOK, p, err)
}

// resetPool removes the deployment's pool: each host keeps its own
// hareboxd --pool again. The operator only.
func (s *Server) resetPool(w http.ResponseWriter, r *http.Request) error {
	p, err := s.eng.Pool().Reset(r.Context())
	return reply(w, http.StatusOK, p, err)
}
