package api

import (
	"context"
	"net/http"
	"strconv"

	"github.com/harebox/harebox/apikey"
	"github.com/harebox/harebox/env"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/tenant"
)

// The tenancy and key routes. The operator names another account than the
// default one with ?account=ID-or-name; a key always acts in its own.

func (s *Server) createAccount(w http.ResponseWriter, r *http.Request) error {
	var req tenant.CreateRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	a, err := s.eng.Tenants().CreateAccount(r.Context(), req)
	return reply(w, http.StatusCreated, a, err)
}

func (s *Server) listAccounts(w http.ResponseWriter, r *http.Request) error {
	l, err := s.eng.Tenants().ListAccounts(r.Context())
	return reply(w, http.StatusOK, map[string]any{"accounts": l}, err)
}

func (s *Server) getAccount(w http.ResponseWriter, r *http.Request) error {
	a, err := s.eng.Tenants().GetAccount(r.Context(), r.PathValue("account"))
	return reply(w, http.StatusOK, a, err)
}

func (s *Server) deleteAccount(w http.ResponseWriter, r *http.Request) error {
	if err := s.eng.Tenants().DeleteAccount(r.Context(), r.PathValue("account")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func account(r *http.Request) string { return r.URL.Query().Get("account") }

func (s *Server) createProject(w http.ResponseWriter, r *http.Request) error {
	var req tenant.CreateRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	p, err := s.eng.Tenants().CreateProject(r.Context(), account(r), req)
	return reply(w, http.StatusCreated, p, err)
}

func (s *Server) listProjects(w http.ResponseWriter, r *http.Request) error {
	l, err := s.eng.Tenants().ListProjects(r.Context(), account(r))
	return reply(w, http.StatusOK, map[string]any{"projects": l}, err)
}

func (s *Server) getProject(w http.ResponseWriter, r *http.Request) error {
	p, err := s.eng.Tenants().GetProject(r.Context(), account(r), r.PathValue("project"))
	return reply(w, http.StatusOK, p, err)
}

func (s *Server) deleteProject(w http.ResponseWriter, r *http.Request) error {
	if err := s.eng.Tenants().DeleteProject(r.Context(), account(r), r.PathValue("project")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) createFleet(w http.ResponseWriter, r *http.Request) error {
	var req tenant.CreateRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	f, err := s.eng.Tenants().CreateFleet(r.Context(), account(r), r.PathValue("project"), req)
	return reply(w, http.StatusCreated, f, err)
}

func (s *Server) listFleets(w http.ResponseWriter, r *http.Request) error {
	l, err := s.eng.Tenants().ListFleets(r.Context(), account(r), r.PathValue("project"))
	return reply(w, http.StatusOK, map[string]any{"fleets": l}, err)
}

func (s *Server) getFleet(w http.ResponseWriter, r *http.Request) error {
	f, err := s.eng.Tenants().GetFleet(r.Context(), account(r), r.PathValue("project"), r.PathValue("fleet"))
	return reply(w, http.StatusOK, f, err)
}

func (s *Server) deleteFleet(w http.ResponseWriter, r *http.Request) error {
	if err := s.eng.Tenants().DeleteFleet(r.Context(), account(r), r.PathValue("project"), r.PathValue("fleet")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) error {
	var req apikey.CreateRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	k, err := s.eng.Keys().Create(r.Context(), req)
	return reply(w, http.StatusCreated, k, err)
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) error {
	l, err := s.eng.Keys().List(r.Context(), account(r))
	return reply(w, http.StatusOK, map[string]any{"keys": l}, err)
}

func (s *Server) getKey(w http.ResponseWriter, r *http.Request) error {
	k, err := s.eng.Keys().Get(r.Context(), r.PathValue("key"))
	return reply(w, http.StatusOK, k, err)
}

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) error {
	k, err := s.eng.Keys().Revoke(r.Context(), r.PathValue("key"))
	return reply(w, http.StatusOK, k, err)
}

func (s *Server) rotateKey(w http.ResponseWriter, r *http.Request) error {
	k, err := s.eng.Keys().Rotate(r.Context(), r.PathValue("key"))
	return reply(w, http.StatusOK, k, err)
}

// reply writes v with status, or returns err.
func reply(w http.ResponseWriter, status int, v any, err error) error {
	if err != nil {
		return err
	}
	writeJSON(w, status, v)
	return nil
}

func (s *Server) updateProject(w http.ResponseWriter, r *http.Request) error {
	var req tenant.ProjectUpdate
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	p, err := s.eng.Tenants().UpdateProject(r.Context(), account(r), r.PathValue("project"), req)
	return reply(w, http.StatusOK, p, err)
}

// Environments: ?project= names the project (default: the default one).

func project(r *http.Request) string { return r.URL.Query().Get("project") }

func (s *Server) createEnvironment(w http.ResponseWriter, r *http.Request) error {
	var req env.CreateRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	if p := project(r); p != "" && req.Project == "" {
		req.Project = p
	}
	v, err := s.eng.Environments().Create(r.Context(), account(r), req)
	return reply(w, http.StatusCreated, v, err)
}

func (s *Server) listEnvironments(w http.ResponseWriter, r *http.Request) error {
	l, err := s.eng.Environments().List(r.Context(), account(r), project(r))
	return reply(w, http.StatusOK, map[string]any{"environments": l}, err)
}

func (s *Server) getEnvironment(w http.ResponseWriter, r *http.Request) error {
	v, err := s.eng.Environments().Get(r.Context(), account(r), project(r), r.PathValue("environment"))
	return reply(w, http.StatusOK, v, err)
}

func (s *Server) updateEnvironment(w http.ResponseWriter, r *http.Request) error {
	var req env.UpdateRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	v, err := s.eng.Environments().Update(r.Context(), account(r), project(r), r.PathValue("environment"), req)
	return reply(w, http.StatusOK, v, err)
}

func (s *Server) deleteEnvironment(w http.ResponseWriter, r *http.Request) error {
	if err := s.eng.Environments().Delete(r.Context(), account(r), project(r), r.PathValue("environment")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) listEnvironmentVersions(w http.ResponseWriter, r *http.Request) error {
	l, err := s.eng.Environments().Versions(r.Context(), account(r), project(r), r.PathValue("environment"))
	return reply(w, http.StatusOK, map[string]any{"versions": l}, err)
}

func (s *Server) getEnvironmentVersion(w http.ResponseWriter, r *http.Request) error {
	n, err := strconv.Atoi(r.PathValue("version"))
	if err != nil || n < 1 {
		return badRequest("version", "a version is a number from 1")
	}
	v, err := s.eng.Environments().Version(r.Context(), account(r), project(r), r.PathValue("environment"), n)
	return reply(w, http.StatusOK, v, err)
}

func (s *Server) updateAccount(w http.ResponseWriter, r *http.Request) error {
	var req tenant.AccountUpdate
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	a, err := s.eng.Tenants().UpdateAccount(r.Context(), r.PathValue("account"), req)
	return reply(w, http.StatusOK, a, err)
}

func (s *Server) listCommands(w http.ResponseWriter, r *http.Request) error {
	limit := 0
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			return badRequest("limit", "a number from 1 to 10000")
		}
		limit = n
	}
	id := r.PathValue("id")
	var l []sandbox.Command
	err := s.eng.OnSandbox(r.Context(), "listCommands", id, func(ctx context.Context) (err error) {
		l, err = s.eng.History().List(ctx, id, limit)
		return err
	})
	return reply(w, http.StatusOK, map[string]any{"commands": l}, err)
}
