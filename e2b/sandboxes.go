package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
)

// defaultTimeout is E2B's TTL when a create or resume names none.
const defaultTimeout = 15

// maxBody bounds a request body (they are all small JSON).
const maxBody = 1 << 20

// envdActions are what an envd access token lets its holder do in the
// sandbox: it is handed only to a key that may do them all, so that the
// token never does more than the key that asked for it.
var envdActions = []string{"execStream", "startProcess", "listProcesses", "getProcess", "getProcessOutput", "killProcess",
	"sendProcessInput", "openPty", "readFile", "writeFile", "statFile", "listFiles", "mkdir", "removeFile", "moveFile"}

func (h *Handler) create(w http.ResponseWriter, r *http.Request) error {
	var body NewSandbox
	if err := decode(r, &body); err != nil {
		return err
	}
	req, err := h.createRequest(r.Context(), &body)
	if err != nil {
		return err
	}
	ctx := r.Context()
	box, err := h.o.Engine.Create(ctx, req)
	if err != nil {
		return err
	}
	tok, err := h.tokens.issue(ctx, box.ID)
	if err == nil && body.Network.private() {
		_, err = h.traffic.issue(ctx, box.ID)
	}
	if err != nil {
		// A sandbox no E2B client could reach is of no use: it goes.
		if derr := h.o.Engine.Delete(ctx, box.ID); derr != nil {
			h.o.Log.Warn("e2b: delete a sandbox without its envd token", "id", box.ID, "err", derr)
		}
		return err
	}
	writeJSON(w, http.StatusCreated, h.sandbox(ctx, box, tok))
	return nil
}

// createRequest is the HareBox create for an E2B one; what HareBox
// cannot do as asked is a 400 that says so.
func (h *Handler) createRequest(ctx context.Context, b *NewSandbox) (sandbox.CreateRequest, error) {
	var req sandbox.CreateRequest
	if b.TemplateID == "" {
		return req, badRequest("templateID is required")
	}
	if img, ok := h.o.Templates[b.TemplateID]; ok {
		req.Image = img
	} else if sn, err := h.snapshot(ctx, b.TemplateID); err == nil {
		req.Snapshot = sn.ID // (its image and size are the snapshot's)
	} else {
		return req, badRequest("template '%s' not found", b.TemplateID)
	}
	ttl, err := ttlOf(b.Timeout, "timeout")
	if err != nil {
		return req, err
	}
	req.TTLSeconds = int64(ttl / time.Second)
	switch {
	case b.AutoPause != nil && *b.AutoPause:
		return req, badRequest("autoPause is not served by this server: a sandbox is killed at its timeout")
	case b.AutoResume != nil && b.AutoResume.Enabled:
		return req, badRequest("autoResume is not served by this server")
	case set(b.Mcp):
		return req, badRequest("mcp is not served by this server")
	case set(b.Iam):
		return req, badRequest("iam is not served by this server")
	}
	for _, m := range b.VolumeMounts {
		// (By name: the SDK sends the Volume's name.)
		req.Volumes = append(req.Volumes, sandbox.VolumeMount{Name: m.Name, Path: m.Path})
	}
	fw, err := policy(b.Network, b.AllowInternetAccess)
	if err != nil {
		return req, err
	}
	if fw != nil {
		if req.Firewall, err = json.Marshal(fw); err != nil {
			return req, err
		}
	}
	if len(b.Metadata) > 0 {
		if err := checkEach(b.Metadata, "metadata", func(k, v string) sandbox.CreateRequest {
			return sandbox.CreateRequest{Labels: map[string]string{k: v}}
		}); err != nil {
			return req, err
		}
		req.Labels = b.Metadata
	}
	if len(b.EnvVars) > 0 {
		if err := checkEach(b.EnvVars, "envVars", func(k, v string) sandbox.CreateRequest {
			return sandbox.CreateRequest{Env: map[string]string{k: v}}
		}); err != nil {
			return req, err
		}
		req.Env = b.EnvVars
	}
	// (The whole request too: the number of labels and variables.)
	if err := sandbox.Validate(&req); err != nil {
		return req, badRequest("%s", strings.NewReplacer("labels:", "metadata:", "env:", "envVars:").Replace(err.Error()))
	}
	return req, nil
}

// checkEach validates each entry of m alone with HareBox's own rules, so
// the error names the entry (E2B's metadata is any string; a label is
// not).
func checkEach(m map[string]string, what string, one func(k, v string) sandbox.CreateRequest) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		req := one(k, m[k])
		if err := sandbox.Validate(&req); err != nil {
			msg := err.Error()
			var e *model.Error
			if errors.As(err, &e) {
				msg = e.Msg
			}
			return badRequest("%s key %q (value of %d bytes) cannot be held by HareBox: %s", what, k, len(m[k]), msg)
		}
	}
	return nil
}

// set reports whether a JSON field is present and not null or empty.
func set(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s != "" && s != "null" && s != "{}" && s != "[]"
}

// ttlOf is a timeout in seconds as a TTL: absent is E2B's default, 0 is
// one second (the engine's 0 would mean no TTL, and E2B's means now).
func ttlOf(secs *int32, field string) (time.Duration, error) {
	n := int64(defaultTimeout)
	if secs != nil {
		n = int64(*secs)
	}
	switch {
	case n < 0:
		return 0, badRequest("%s must be at least 0", field)
	case n > int64(sandbox.MaxTTL/time.Second):
		return 0, badRequest("%s must be at most %d seconds (30 days)", field, int64(sandbox.MaxTTL/time.Second))
	case n == 0:
		n = 1
	}
	return time.Duration(n) * time.Second, nil
}

// requiredTimeout is the timeout a set-timeout body must give.
func requiredTimeout(r *http.Request) (time.Duration, error) {
	var body ConnectSandbox
	if err := decode(r, &body); err != nil {
		return 0, err
	}
	if body.Timeout == nil {
		return 0, badRequest("timeout is required")
	}
	return ttlOf(body.Timeout, "timeout")
}

func (h *Handler) connect(w http.ResponseWriter, r *http.Request) error {
	// SDKs from 2.51 send no timeout when the caller gives none: a
	// running sandbox keeps its own, a resumed one gets the default.
	var body ConnectSandbox
	if err := decode(r, &body); err != nil {
		return err
	}
	ttl, err := ttlOf(body.Timeout, "timeout")
	if err != nil {
		return err
	}
	ctx := r.Context()
	box, err := h.lookup(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	status := http.StatusOK
	if box.State != sandbox.StateRunning {
		if box, err = h.o.Engine.Resume(ctx, box.ID); err != nil {
			return err
		}
		status = http.StatusCreated
	}
	// A resumed sandbox gets the timeout (its pause cleared the TTL); a
	// running one's is only extended by one given (none at all stays
	// none).
	if exp := box.ExpiresAt; status == http.StatusCreated || body.Timeout != nil && exp != nil && exp.Before(time.Now().Add(ttl)) {
		if box, err = h.o.Engine.SetTimeout(ctx, box.ID, ttl); err != nil {
			return err
		}
	}
	tok, err := h.tokens.ensure(ctx, box.ID)
	if err != nil {
		return err
	}
	writeJSON(w, status, h.sandbox(ctx, box, tok))
	return nil
}

func (h *Handler) resume(w http.ResponseWriter, r *http.Request) error {
	var body ResumedSandbox
	if err := decode(r, &body); err != nil {
		return err
	}
	if body.AutoPause != nil && *body.AutoPause {
		return badRequest("autoPause is not served by this server: a sandbox is killed at its timeout")
	}
	ttl, err := ttlOf(body.Timeout, "timeout")
	if err != nil {
		return err
	}
	ctx := r.Context()
	box, err := h.lookup(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	if box.State == sandbox.StateRunning {
		return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is already running", ExternalID(box.ID))
	}
	if box, err = h.o.Engine.Resume(ctx, box.ID); err != nil {
		return err
	}
	if box, err = h.o.Engine.SetTimeout(ctx, box.ID, ttl); err != nil {
		return err
	}
	tok, err := h.tokens.ensure(ctx, box.ID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, h.sandbox(ctx, box, tok))
	return nil
}

func (h *Handler) pause(w http.ResponseWriter, r *http.Request) error {
	var body SandboxPauseRequest
	if err := decode(r, &body); err != nil {
		return err
	}
	if body.Memory != nil && !*body.Memory {
		return badRequest("a pause without memory is not served by this server")
	}
	ctx := r.Context()
	box, err := h.lookup(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	if box.State != sandbox.StateRunning {
		return sandbox.Errorf(sandbox.ErrState, "", "sandbox %s is already paused", ExternalID(box.ID))
	}
	if _, err := h.o.Engine.Pause(ctx, box.ID); err != nil {
		return err
	}
	// E2B's timeout does not run while a sandbox is paused: connect or
	// resume sets a new one.
	if _, err := h.o.Engine.SetTimeout(ctx, box.ID, 0); err != nil {
		return fmt.Errorf("e2b: paused, but its timeout stays: %w", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request) error {
	ttl, err := requiredTimeout(r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	box, err := h.lookup(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	if _, err := h.o.Engine.SetTimeout(ctx, box.ID, ttl); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	id := InternalID(r.PathValue("id"))
	box, err := h.o.Engine.Get(ctx, id)
	if err != nil {
		return err
	}
	if box.State == sandbox.StateDeleted {
		return notFound(id)
	}
	if err := h.o.Engine.Delete(ctx, id); err != nil {
		return err
	}
	// (Its data key went first: the tokens are already unreadable.)
	for _, t := range []*tokens{h.tokens, h.traffic} {
		if err := t.forget(context.WithoutCancel(ctx), id); err != nil {
			h.o.Log.Warn("e2b: forget a deleted sandbox's token", "id", id, "token", t.name, "err", err)
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *Handler) info(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	box, err := h.lookup(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	d := SandboxDetail{
		TemplateID: h.template(box.Image), Alias: h.template(box.Image), SandboxID: ExternalID(box.ID), ClientID: clientID,
		StartedAt: box.CreatedAt, EndAt: endAt(box), EnvdVersion: EnvdVersion, Domain: h.domain(),
		CPUCount: int32(box.Size.VCPUs), MemoryMB: int32(box.Size.MemoryMB), DiskSizeMB: int32(box.Size.DiskGB * 1024),
		Metadata: metadata(box), State: stateOf(box.State), Lifecycle: Lifecycle{OnTimeout: "kill"},
	}
	for _, m := range box.Volumes {
		d.VolumeMounts = append(d.VolumeMounts, VolumeMount{Name: m.Name, Path: m.Path})
	}
	if mayUseEnvd(ctx) {
		if d.EnvdAccessToken, err = h.tokens.ensure(ctx, box.ID); err != nil {
			return err
		}
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

// listV1 is the deprecated list: running sandboxes, all at once.
func (h *Handler) listV1(w http.ResponseWriter, r *http.Request) error {
	boxes, err := h.list(r, []string{StateRunning})
	if err != nil {
		return err
	}
	sort.Slice(boxes, func(i, j int) bool { return boxes[i].ID > boxes[j].ID }) // newest first, as v2
	out := make([]ListedSandbox, 0, len(boxes))
	for _, b := range boxes {
		out = append(out, h.listed(b))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listV2 filters by metadata, state, template and start, newest first
// (or oldest, order=asc), a page at a time: X-Next-Token is the cursor
// for the next page (nextToken), the last sandbox of this one.
func (h *Handler) listV2(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	states := []string{StateRunning, StatePaused}
	if vs := q["state"]; len(vs) > 0 {
		states = nil
		for _, v := range vs {
			for _, s := range strings.Split(v, ",") {
				if s != StateRunning && s != StatePaused {
					return badRequest("state %q: want running or paused", s)
				}
				states = append(states, s)
			}
		}
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return badRequest("limit must be between 1 and 100")
		}
		limit = n
	}
	asc := false
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		asc = true
	default:
		return badRequest("order must be asc or desc")
	}
	var after time.Time
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return badRequest("startedAfter must be a date-time (RFC 3339)")
		}
		after = t
	}
	cursor := q.Get("nextToken")
	if cursor != "" {
		if _, err := ulid.ParseStrict(strings.ToUpper(ExternalID(cursor))); err != nil {
			return badRequest("nextToken is not one this server gave")
		}
		cursor = InternalID(cursor)
	}
	template := q.Get("template")
	boxes, err := h.list(r, states)
	if err != nil {
		return err
	}
	// IDs are ULIDs: their order is their creation's.
	sort.Slice(boxes, func(i, j int) bool { return (boxes[i].ID < boxes[j].ID) == asc })
	var page []ListedSandbox
	running, next := 0, ""
	for _, b := range boxes {
		if (!after.IsZero() && b.CreatedAt.Before(after)) || (template != "" && h.template(b.Image) != template && b.Image != template) {
			continue
		}
		if b.State == sandbox.StateRunning {
			running++
		}
		if cursor != "" && ((asc && b.ID <= cursor) || (!asc && b.ID >= cursor)) {
			continue
		}
		if len(page) == limit {
			next = page[len(page)-1].SandboxID
			continue
		}
		page = append(page, h.listed(b))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	if slices.Contains(states, StateRunning) {
		w.Header().Set("X-Total-Running", strconv.Itoa(running))
	}
	if page == nil {
		page = []ListedSandbox{}
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// list is the sandboxes the caller sees in E2B's states, with the
// metadata query's labels.
func (h *Handler) list(r *http.Request, states []string) ([]*sandbox.Sandbox, error) {
	var f sandbox.ListFilter
	if m := r.URL.Query().Get("metadata"); m != "" {
		vals, err := url.ParseQuery(m)
		if err != nil {
			return nil, badRequest("metadata must be a query string such as user=abc&app=prod: %v", err)
		}
		f.Labels = map[string]string{}
		for k, v := range vals {
			f.Labels[k] = v[len(v)-1]
		}
	}
	all, err := h.o.Engine.List(r.Context(), f)
	if err != nil {
		return nil, err
	}
	var out []*sandbox.Sandbox
	for _, b := range all {
		if s := stateOf(b.State); s != "" && slices.Contains(states, s) {
			out = append(out, b)
		}
	}
	return out, nil
}

// lookup is a sandbox the caller sees in one of E2B's states (running,
// paused), by either form of its ID; anything else is E2B's 404.
func (h *Handler) lookup(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	box, err := h.o.Engine.Get(ctx, InternalID(id))
	if err != nil {
		return nil, err
	}
	if stateOf(box.State) == "" {
		return nil, notFound(id)
	}
	return box, nil
}

// stateOf is a HareBox state as E2B's ("" for one E2B has no word for:
// creating, stopped, deleted, lost). A hibernated sandbox is paused too.
func stateOf(s sandbox.State) string {
	switch s {
	case sandbox.StateRunning:
		return StateRunning
	case sandbox.StatePaused, sandbox.StateHibernated:
		return StatePaused
	}
	return ""
}

func (h *Handler) sandbox(ctx context.Context, box *sandbox.Sandbox, tok string) Sandbox {
	s := Sandbox{TemplateID: h.template(box.Image), Alias: h.template(box.Image), SandboxID: ExternalID(box.ID),
		ClientID: clientID, EnvdVersion: EnvdVersion, Domain: h.domain()}
	if mayUseEnvd(ctx) {
		s.EnvdAccessToken = tok
	}
	if t, err := h.traffic.get(ctx, box.ID); err == nil {
		s.TrafficAccessToken = &t
	}
	return s
}

func (h *Handler) listed(b *sandbox.Sandbox) ListedSandbox {
	return ListedSandbox{TemplateID: h.template(b.Image), Alias: h.template(b.Image), SandboxID: ExternalID(b.ID), ClientID: clientID,
		StartedAt: b.CreatedAt, EndAt: endAt(b), CPUCount: int32(b.Size.VCPUs), MemoryMB: int32(b.Size.MemoryMB),
		DiskSizeMB: int32(b.Size.DiskGB * 1024), Metadata: metadata(b), State: stateOf(b.State), EnvdVersion: EnvdVersion}
}

// template names an image as E2B does: its template's name, or the
// image's own.
func (h *Handler) template(image string) string {
	if t, ok := h.byImage[image]; ok {
		return t
	}
	return image
}

func (h *Handler) domain() *string {
	if h.o.Domain == "" {
		return nil
	}
	d := h.o.Domain
	return &d
}

// never is the endAt of a sandbox without a TTL (a paused one, or one
// made through HareBox's API without one): E2B's field is required.
var never = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

func endAt(b *sandbox.Sandbox) time.Time {
	if b.ExpiresAt == nil {
		return never
	}
	return *b.ExpiresAt
}

func metadata(b *sandbox.Sandbox) map[string]string {
	if b.Labels == nil {
		return map[string]string{}
	}
	return b.Labels
}

// mayUseEnvd reports whether the caller may do everything the envd
// access token allows.
func mayUseEnvd(ctx context.Context) bool {
	p := authz.From(ctx)
	for _, a := range envdActions {
		if authz.Allowed(p, a) != nil {
			return false
		}
	}
	return true
}

// decode reads a JSON body (an empty one is no fields set). Fields it
// does not know are ignored: a newer SDK may send them.
func decode(r *http.Request, v any) error {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &model.Error{Kind: model.ErrTooLarge, Msg: fmt.Sprintf("request body over %d bytes", maxBody)}
		}
		return badRequest("reading the body: %v", err)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return badRequest("invalid JSON body: %v", err)
	}
	return nil
}

func badRequest(format string, args ...any) error {
	return model.Errorf(model.ErrInvalid, "", format, args...)
}

func notFound(id string) error {
	return model.Errorf(model.ErrNotFound, "", "sandbox %q not found", ExternalID(id))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// writeError answers with E2B's error body and the status of err's kind
// (as HareBox's own API does); an error of no kind is a 500 whose detail
// stays in the log.
func (h *Handler) writeError(w http.ResponseWriter, err error) {
	status, msg := h.answerFor(err)
	var e *model.Error
	if errors.As(err, &e) && e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((e.RetryAfter+time.Second-1)/time.Second)))
	}
	writeJSON(w, status, Error{Code: status, Message: msg})
}

// answerFor is the status and message err is answered with: a Status's
// own, its kind's, or a logged 500 that names nothing.
func (h *Handler) answerFor(err error) (int, string) {
	var st *Status
	if errors.As(err, &st) {
		return st.Code, st.Msg
	}
	for _, k := range model.Kinds {
		if errors.Is(err, k.Kind) {
			if k.Status == http.StatusInternalServerError {
				h.o.Log.Warn("e2b: request failed", "err", err)
			}
			return k.Status, err.Error()
		}
	}
	h.o.Log.Warn("e2b: request failed", "err", err)
	return http.StatusInternalServerError, "internal error"
}
