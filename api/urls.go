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
	u, err := s.urls.Create(r.Context(), r.PathValue("id"), req)
	return reply(w, http.StatusCreated, u, err)
}

func (s *Server) listURLs(w http.ResponseWriter, r *http.Request) error {
	l, err := s.urls.List(r.Context(), r.PathValue("id"))
	return reply(w, http.StatusOK, map[string]any{"urls": l}, err)
}

func (s *Server) getURL(w http.ResponseWriter, r *http.Request) error {
	u, err := s.urls.Get(r.Context(), r.PathValue("id"), r.PathValue("url_id"))
	return reply(w, http.StatusOK, u, err)
}

func (s *Server) rotateURL(w http.ResponseWriter, r *http.Request) error {
	u, err := s.urls.Rotate(r.Context(), r.PathValue("id"), r.PathValue("url_id"))
	return reply(w, http.StatusOK, u, err)
}

func (s *Server) deleteURL(w http.ResponseWriter, r *http.Request) error {
	if err := s.urls.Delete(r.Context(), r.PathValue("id"), r.PathValue("url_id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) getURLCA(w http.ResponseWriter, r *http.Request) error {
	ca, err := s.urls.CA(r.Context(), account(r), project(r))
	return reply(w, http.StatusOK, ca, err)
}

func (s *Server) setURLCA(w http.ResponseWriter, r *http.Request) error {
	var req sandbox.URLCARequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	ca, err := s.urls.SetCA(r.Context(), account(r), project(r), req)
	return reply(w, http.StatusOK, ca, err)
}

func (s *Server) deleteURLCA(w http.ResponseWriter, r *http.Request) error {
	if err := s.urls.DeleteCA(r.Context(), account(r), project(r)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) issueClientCert(w http.ResponseWriter, r *http.Request) error {
	var req sandbox.ClientCertRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	c, err := s.urls.IssueCert(r.Context(), account(r), project(r), req)
	if err == nil {
		w.Header().Set("Cache-Control", "no-store") // it carries a private key
	}
	return reply(w, http.StatusCreated, c, err)
}

func (s *Server) listClientCerts(w http.ResponseWriter, r *http.Request) error {
	l, err := s.urls.ListCerts(r.Context(), account(r), project(r))
	return reply(w, http.StatusOK, map[string]any{"certs": l}, err)
}

func (s *Server) revokeClientCert(w http.ResponseWriter, r *http.Request) error {
	c, err := s.urls.RevokeCert(r.Context(), account(r), project(r), r.PathValue("serial"))
	return reply(w, http.StatusOK, c, err)
}
