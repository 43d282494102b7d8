package api

import "net/http"

// listHosts lists the hosts of the deployment (those that share the
// engine's store), up or down: the operator only.
func (s *Server) listHosts(w http.ResponseWriter, r *http.Request) error {
	hosts, err := s.hosts.Hosts(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"hosts": hosts})
	return nil
}

// deleteHost takes a host that is down out of the deployment for good:
// the operator only.
func (s *Server) deleteHost(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	deleted, err := s.hosts.Remove(r.Context(), name)
	if err != nil {
		return err
	}
	if deleted == nil {
		deleted = []string{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"host": name, "deleted_sandboxes": deleted})
	return nil
}

// rotateMeshKey has a host make a new key for its end of the mesh's
// tunnels: the operator only.
func (s *Server) rotateMeshKey(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if err := s.eng.RotateMeshKey(r.Context(), name); err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"host": name})
	return nil
}

// drainHost marks a host draining and moves its sandboxes to the other
// hosts (served by that host): the operator only.
func (s *Server) drainHost(w http.ResponseWriter, r *http.Request) error {
	rep, err := s.eng.Drain(r.Context(), r.PathValue("name"))
	return reply(w, http.StatusOK, rep, err)
}

// undrainHost lets new sandboxes go to a host again: the operator only.
func (s *Server) undrainHost(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if err := s.eng.Undrain(r.Context(), name); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"host": name})
	return nil
}
