package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/sandbox"
)

// Several hosts: a request for a sandbox another host runs goes to that
// host (Options.Cluster), before authentication (the host that serves it
// authenticates it, once), and a create goes to the host placement picks.

// forward sends r to the host that must serve it, and reports whether it
// did (or answered with an error). A request that came from another host
// is served here, never sent on.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, rt Route) bool {
	if s.fwd == nil || rt.Public {
		return false
	}
	if cluster.FromHost(r) {
		return false
	}
	// Without a key nothing is looked up or sent on: the refusal is
	// made here.
	if bearer(r) == "" {
		return false
	}
	h, err := s.forwardTo(w, r, rt)
	if err != nil {
		writeError(w, toAPIError(err))
		return true
	}
	if h == nil || h.Name == s.hosts.Name() {
		return false
	}
	if !h.Up {
		// Said only to a caller who may see the sandbox (else it is the
		// usual refusal).
		ctx, err := s.authenticate(r)
		if err == nil && r.PathValue("id") != "" {
			if err = s.eng.Authorize(ctx, rt.OperationID, r.PathValue("id")); errors.Is(err, sandbox.ErrUnavailable) {
				err = nil
			}
		}
		if err != nil {
			writeError(w, toAPIError(err))
			return true
		}
		writeError(w, apiError{status: http.StatusServiceUnavailable, code: "unavailable",
			msg: fmt.Sprintf("host %s, which runs it, is down (its lease lapsed at %s); it is served again when the host is back", h.Name, h.LeaseUntil.UTC().Format(time.RFC3339))})
		return true
	}
	client := ""
	if a, ok := s.source(r); ok {
		client = a.String()
	}
	w.Header().Del("X-Request-ID") // (the other host's answer has it)
	s.fwd.Forward(w, r, h, client, nil)
	return true
}

// forwardTo is the host that must serve r, or nil for this one.
func (s *Server) forwardTo(w http.ResponseWriter, r *http.Request, rt Route) (*cluster.Host, error) {
	ctx := r.Context()
	switch {
	case rt.OperationID == "createSandbox":
		return s.placement(w, r)
	case rt.OperationID == "deleteSnapshot":
		return s.hosts.SnapshotElsewhere(ctx, r.PathValue("snapshot"))
	case rt.OperationID == "resizeVolume" || rt.OperationID == "deleteVolume":
		// (A volume is named in its project: the caller's, so it is
		// authenticated here first; a refusal is left to this host.)
		actx, err := s.authenticate(r)
		if err != nil {
			return nil, nil
		}
		return s.volumeHost(actx, s.eng.Volumes().HostOf(actx, account(r), project(r), r.PathValue("volume")), r.PathValue("volume"))
	case rt.OperationID == "drainHost" || rt.OperationID == "undrainHost":
		// (The host drains itself: its sandboxes move from there.)
		h, err := s.hosts.Get(ctx, r.PathValue("name"))
		if err != nil {
			return nil, nil // (no such host: the call here says so)
		}
		return h, nil
	case rt.OperationID == "getSandbox":
		// From the store, as a list shows it: what its host last wrote
		// (lost, if the host is down).
		return nil, nil
	case strings.HasPrefix(rt.Path, "/v1/sandboxes/{id}"):
		return s.hosts.Elsewhere(ctx, r.PathValue("id"))
	}
	return nil, nil
}

// placement is where a create goes: a restore to the host that has the
// snapshot, anything else to the least loaded host with room. A body this
// host cannot read is left to the create here, which says what is wrong
// with it.
func (s *Server) placement(w http.ResponseWriter, r *http.Request) (*cluster.Host, error) {
	http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.opts.Timeouts.Body))
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxJSONBody+1))
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
	if err != nil || len(body) > MaxJSONBody {
		return nil, nil
	}
	var req sandbox.CreateRequest
	if json.Unmarshal(body, &req) != nil {
		return nil, nil
	}
	if req.Snapshot != "" {
		return s.hosts.SnapshotElsewhere(r.Context(), req.Snapshot)
	}
	if len(req.Volumes) > 0 {
		// Where its volumes live.
		actx, err := s.authenticate(r)
		if err != nil {
			return nil, nil
		}
		host, err := s.eng.Volumes().Host(actx, req.AccountID, req.Project, req.Volumes)
		if err != nil {
			return nil, err
		}
		return s.volumeHost(actx, host, req.Volumes[0].Name)
	}
	size, _, err := req.Resolve()
	if err != nil {
		return nil, nil
	}
	h, err := s.hosts.Place(r.Context(), size, sandbox.Site{Name: req.Site, Country: req.Country})
	if err != nil {
		return nil, nil // (no host has room: the create here says so)
	}
	return h, nil
}

// volumeHost is the host a request for volume name goes to: nil for this
// one (or none: the request here says what is wrong), an error when it is
// down.
func (s *Server) volumeHost(ctx context.Context, host, name string) (*cluster.Host, error) {
	if host == "" || host == s.hosts.Name() {
		return nil, nil
	}
	h, err := s.hosts.Get(ctx, host)
	if err != nil {
		return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "volume %s lives on host %s, which is not in the deployment", name, host)
	}
	if !h.Up || !time.Now().Before(h.LeaseUntil) {
		return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "volume %s lives on host %s, which is down (its lease lapsed at %s); its sandboxes are made there when it is back", name, host, h.LeaseUntil.UTC().Format(time.RFC3339))
	}
	return h, nil
}

// fromHost reads what a forwarding host said of the caller: its address.
func fromHost(r *http.Request) (netip.Addr, bool) {
	a, err := netip.ParseAddr(r.Header.Get(cluster.HeaderClient))
	return a, err == nil
}
