package api

import "net/http"

// listHosts lists the hosts of the deployment (those that share the
// engine's store), up or down: the operator only.
func (s *Server) listHosts(w http.ResponseWriter, r *http.Request) error {
	hosts, err := s.eng.Hosts(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"hosts": hosts})
	return nil
}
