package e2b

import (
	"context"
	"net/http"
	"sort"
	"strconv"

	"github.com/harebox/harebox/sandbox"
)

// E2B's snapshots are HareBox's (clone.Snapshots): taken of a running or
// paused sandbox, kept under a key of their own (crypto-erased on
// delete), each usable as a template: a create whose templateID is a
// snapshot's ID or name makes a sandbox from it. A name is unique in its
// account (a second snapshot under a taken name is a 409, where E2B would
// add a build to the existing one). Fork makes its sandboxes all or none
// (HareBox's fork), at most sandbox.MaxFork at once.

// SnapshotInfo is E2B's SnapshotInfo.
type SnapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func snapshotInfo(sn *sandbox.Snapshot) SnapshotInfo {
	names := []string{}
	if sn.Name != "" {
		names = append(names, sn.Name)
	}
	return SnapshotInfo{SnapshotID: sn.ID, Names: names}
}

// createSnapshot is POST /sandboxes/{id}/snapshots.
func (h *Handler) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Name string `json:"name"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	ctx := r.Context()
	box, err := h.lookup(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	sn, err := h.o.Engine.Snapshots().Take(ctx, box.ID, sandbox.SnapshotRequest{Name: body.Name})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, snapshotInfo(sn))
	return nil
}

// listSnapshots is GET /snapshots?sandboxID=&name=&limit=&nextToken=:
// newest first, a page at a time (X-Next-Token).
func (h *Handler) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return badRequest("limit must be between 1 and 100")
		}
		limit = n
	}
	cursor := q.Get("nextToken")
	if cursor != "" && !sandbox.ValidSnapshotID(cursor) {
		return badRequest("nextToken is not one this server gave")
	}
	var sbx string
	if v := q.Get("sandboxID"); v != "" {
		sbx = InternalID(v)
	}
	all, err := h.o.Engine.Snapshots().List(r.Context(), sbx)
	if err != nil {
		return err
	}
	sort.Slice(all, func(i, j int) bool { return all[i].ID > all[j].ID })
	page, next := []SnapshotInfo{}, ""
	for _, sn := range all {
		if (q.Get("name") != "" && sn.Name != q.Get("name")) || (cursor != "" && sn.ID >= cursor) {
			continue
		}
		if len(page) == limit {
			next = page[len(page)-1].SnapshotID
			break
		}
		page = append(page, snapshotInfo(sn))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// deleteTemplate is DELETE /templates/{id}: the SDK deletes a snapshot
// so. Only snapshots are deleted here; a template name is not one.
func (h *Handler) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	sn, err := h.snapshot(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := h.o.Engine.Snapshots().Delete(ctx, sn.ID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// snapshot is the caller's snapshot with ref as its ID or name.
func (h *Handler) snapshot(ctx context.Context, ref string) (*sandbox.Snapshot, error) {
	if sandbox.ValidSnapshotID(ref) {
		return h.o.Engine.Snapshots().Get(ctx, ref)
	}
	all, err := h.o.Engine.Snapshots().List(ctx, "")
	if err != nil {
		return nil, err
	}
	for _, sn := range all {
		if sn.Name != "" && sn.Name == ref {
			return sn, nil
		}
	}
	return nil, sandbox.Errorf(sandbox.ErrNotFound, "", "no snapshot %q", ref)
}

// fork is POST /sandboxes/{id}/fork: count new sandboxes from one
// snapshot of it, each with its own envd token (and traffic token, when
// the source's ports are private).
func (h *Handler) fork(w http.ResponseWriter, r *http.Request) error {
	var body struct {
		Timeout *int32 `json:"timeout"`
		Count   *int32 `json:"count"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	req := sandbox.ForkRequest{Count: 1}
	if body.Count != nil {
		if *body.Count < 1 || *body.Count > sandbox.MaxFork {
			return badRequest("count must be between 1 and %d on this server", sandbox.MaxFork)
		}
		req.Count = int(*body.Count)
	}
	ttl, err := ttlOf(body.Timeout, "timeout")
	if err != nil {
		return err
	}
	req.TTLSeconds = int64(ttl.Seconds())
	ctx := r.Context()
	box, err := h.lookup(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	// A private sandbox's forks are private too: each its own token.
	_, terr := h.traffic.get(ctx, box.ID)
	private := terr == nil
	clones, err := h.o.Engine.Snapshots().Fork(ctx, box.ID, req)
	if err != nil {
		return err
	}
	type result struct {
		Sandbox *Sandbox `json:"sandbox,omitempty"`
		Error   *Error   `json:"error,omitempty"`
	}
	out := make([]result, 0, len(clones))
	for _, c := range clones {
		tok, err := h.tokens.issue(ctx, c.ID)
		if err == nil && private {
			_, err = h.traffic.issue(ctx, c.ID)
		}
		if err != nil {
			// (That clone is of no use to an E2B client: it goes.)
			if derr := h.o.Engine.Delete(ctx, c.ID); derr != nil {
				h.o.Log.Warn("e2b: delete a fork without its envd token", "id", c.ID, "err", derr)
			}
			out = append(out, result{Error: &Error{Code: http.StatusInternalServerError, Message: "the fork's envd token could not be kept"}})
			continue
		}
		s := h.sandbox(ctx, c, tok)
		out = append(out, result{Sandbox: &s})
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}
