package api

import (
	"net/http"
	"time"

	"github.com/harebox/harebox/budget"
)

func (s *Server) createBudget(w http.ResponseWriter, r *http.Request) error {
	var req budget.CreateRequest
	if err := s.decode(w, r, &req); err != nil {
		return err
	}
	b, err := s.budgets.Create(r.Context(), account(r), req)
	return reply(w, http.StatusCreated, b, err)
}

func (s *Server) listBudgets(w http.ResponseWriter, r *http.Request) error {
	l, err := s.budgets.List(r.Context(), account(r))
	return reply(w, http.StatusOK, map[string]any{"budgets": l}, err)
}

func (s *Server) getBudget(w http.ResponseWriter, r *http.Request) error {
	b, err := s.budgets.Get(r.Context(), r.PathValue("budget"))
	return reply(w, http.StatusOK, b, err)
}

func (s *Server) deleteBudget(w http.ResponseWriter, r *http.Request) error {
	if err := s.budgets.Delete(r.Context(), r.PathValue("budget")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) getUsage(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	uq := budget.UsageQuery{Account: q.Get("account"), GroupBy: q.Get("group_by")}
	for name, into := range map[string]*time.Time{"from": &uq.From, "to": &uq.To} {
		if v := q.Get(name); v != "" {
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				return badRequest(name, "not an RFC 3339 time: %q", v)
			}
			*into = t
		}
	}
	l, err := s.budgets.Usage(r.Context(), uq)
	return reply(w, http.StatusOK, map[string]any{"usage": l}, err)
}
