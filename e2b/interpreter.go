package e2b

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
)

// InterpreterPort is the port E2B's code-interpreter SDK
// (@e2b/code-interpreter) reaches a sandbox's interpreter on. HareBox
// serves it on the host, over the engine's code interpreter (package
// codeinterp, which bounds and checks what the guest answers), in the
// SDK's protocol: POST /execute answers one JSON object a line (stdout,
// stderr, result, error, number_of_executions; ASCII only: the SDK
// decodes each network chunk on its own), and /contexts lists, makes,
// restarts and deletes contexts. Errors are plain text, as the SDK reads
// them (404 for an unknown context, 400 for a bad request).
//
// Who may: /execute needs the sandbox's envd access token
// (X-Access-Token), as envd's calls do; the SDK sends no token on its
// /contexts calls, which are therefore served as the sandbox's other
// ports are (public, unless the sandbox was created with
// allowPublicTraffic false: then its traffic token). Both act as the
// sandbox's own principal (Principal), so the engine authorizes and
// audits each call.
const InterpreterPort = 49999

// codeActions are what a request to the interpreter's port may do,
// with the access token (execute) and without (contexts).
var (
	codeActions    = []string{"runCode", "listCodeContexts", "createCodeContext", "restartCodeContext", "deleteCodeContext"}
	contextActions = codeActions[1:]
)

// maxCodeRequest bounds an /execute or /contexts body.
const maxCodeRequest = sandbox.MaxCodeBytes + 1<<20

// Interpreter serves sandbox id's interpreter port (either form of the ID).
func (h *Handler) Interpreter(id string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := InternalID(id)
		err := h.interpreter(w, r, id)
		if err == nil {
			return
		}
		// (Plain text, as the SDK reads it.)
		status, msg := h.answerFor(err)
		http.Error(w, msg, status)
	})
}

func (h *Handler) interpreter(w http.ResponseWriter, r *http.Request, id string) error {
	p, err := h.Principal(r.Context(), id)
	if err != nil {
		// (Gone or not running: what E2B's edge answers, which the SDK
		// reports as a sandbox that timed out.)
		return &Status{Code: http.StatusBadGateway, Msg: "the sandbox was not found or is not running"}
	}
	if err := h.checkTraffic(r, id); err != nil {
		return err
	}
	path := strings.TrimSuffix(r.URL.Path, "/")
	if path == "/execute" {
		if r.Method != http.MethodPost {
			return &Status{Code: http.StatusMethodNotAllowed, Msg: "use POST"}
		}
		want, err := h.Token(r.Context(), id)
		got := r.Header.Get("X-Access-Token")
		if err != nil || got == "" || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
			return &Status{Code: http.StatusUnauthorized, Msg: "execute needs the sandbox's access token (X-Access-Token)"}
		}
		p.Scope.Actions = codeActions
		return h.execute(w, r.WithContext(authz.WithPrincipal(r.Context(), p)), id)
	}
	p.Scope.Actions = contextActions
	ctx := authz.WithPrincipal(r.Context(), p)
	rest, isContexts := strings.CutPrefix(path, "/contexts")
	switch {
	case !isContexts:
		return &Status{Code: http.StatusNotFound, Msg: "not found: the interpreter serves /execute and /contexts"}
	case rest == "" && r.Method == http.MethodGet:
		l, err := h.o.Engine.Code().Contexts(ctx, id)
		if err != nil {
			return err
		}
		return writeASCII(w, http.StatusOK, l)
	case rest == "" && r.Method == http.MethodPost:
		var req struct {
			Language string `json:"language"`
			Cwd      string `json:"cwd"`
		}
		if err := readCodeJSON(r, &req); err != nil {
			return err
		}
		c, err := h.o.Engine.Code().CreateContext(ctx, id, sandbox.CodeContextRequest{Language: language(req.Language), Cwd: req.Cwd})
		if err != nil {
			return err
		}
		return writeASCII(w, http.StatusOK, c)
	}
	cid, restart := strings.CutSuffix(strings.TrimPrefix(rest, "/"), "/restart")
	switch {
	case cid == "" || strings.Contains(cid, "/"):
		return &Status{Code: http.StatusNotFound, Msg: "not found"}
	case restart && r.Method == http.MethodPost:
		c, err := h.o.Engine.Code().RestartContext(ctx, id, cid)
		if err != nil {
			return err
		}
		return writeASCII(w, http.StatusOK, c)
	case !restart && r.Method == http.MethodDelete:
		if err := h.o.Engine.Code().DeleteContext(ctx, id, cid); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	return &Status{Code: http.StatusMethodNotAllowed, Msg: "method not allowed"}
}

// execute runs a cell and streams it in the SDK's lines.
func (h *Handler) execute(w http.ResponseWriter, r *http.Request, id string) error {
	var req struct {
		Code      string            `json:"code"`
		ContextID string            `json:"context_id"`
		Language  string            `json:"language"`
		EnvVars   map[string]string `json:"env_vars"`
	}
	if err := readCodeJSON(r, &req); err != nil {
		return err
	}
	if req.ContextID != "" && req.Language != "" {
		return &Status{Code: http.StatusBadRequest, Msg: "Only one of context_id or language can be provided"}
	}
	cr := sandbox.CodeRequest{Code: req.Code, ContextID: req.ContextID, Language: language(req.Language), Env: req.EnvVars}
	if err := cr.Check(); err != nil {
		return err
	}
	// The answer starts with the first event (before it, an error is
	// still a status): the SDK reads the stream to its end.
	started := false
	start := func() {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusOK)
		}
	}
	rc := http.NewResponseController(w)
	line := func(v any) error {
		start()
		if err := writeLine(w, v); err != nil {
			return err
		}
		return rc.Flush()
	}
	x, err := h.o.Engine.Code().Run(r.Context(), id, cr, func(ev sandbox.CodeEvent) error {
		switch ev.Type {
		case "stdout", "stderr":
			return line(map[string]string{"type": ev.Type, "text": ev.Text})
		case "result":
			return line(e2bResult(ev.Result))
		case "error":
			return line(map[string]string{"type": "error", "name": ev.Error.Name, "value": ev.Error.Value, "traceback": ev.Error.Traceback})
		}
		return nil
	})
	if err != nil {
		if !started {
			return err
		}
		// (The SDK takes the end of the answer for the cell's: it is
		// told why as the cell's error.)
		line(map[string]string{"type": "error", "name": "UnexpectedEndOfExecution", "value": err.Error(), "traceback": ""})
		return nil
	}
	line(map[string]any{"type": "number_of_executions", "execution_count": x.ExecutionCount})
	line(map[string]string{"type": "end_of_execution"})
	return nil
}

// e2bResult is a result as the SDK reads it: its formats under short
// names, at the top level.
func e2bResult(r *sandbox.CodeResult) map[string]any {
	m := map[string]any{"type": "result", "is_main_result": r.IsMainResult}
	for k, v := range map[string]string{"text": r.Text, "html": r.HTML, "markdown": r.Markdown, "svg": r.SVG,
		"png": r.PNG, "jpeg": r.JPEG, "latex": r.LaTeX} {
		if v != "" {
			m[k] = v
		}
	}
	if len(r.JSON) > 0 {
		m["json"] = r.JSON
	}
	if len(r.Chart) > 0 {
		m["chart"] = r.Chart
	}
	return m
}

// language maps the SDK's language names onto the interpreter's.
func language(l string) string {
	switch strings.ToLower(l) {
	case "":
		return ""
	case "python", "python3":
		return sandbox.LangPython
	case "bash", "sh":
		return sandbox.LangBash
	case "javascript", "js":
		return sandbox.LangJavaScript
	case "typescript", "ts":
		return sandbox.LangTypeScript
	}
	return l // (refused by the request's check, by name)
}

// readCodeJSON decodes a bounded JSON body (an empty one is {}).
func readCodeJSON(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxCodeRequest+1))
	if err != nil {
		return err
	}
	if len(b) > maxCodeRequest {
		return &Status{Code: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("the request is over %d bytes", maxCodeRequest)}
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return &Status{Code: http.StatusBadRequest, Msg: "the request is not JSON: " + err.Error()}
	}
	return nil
}

// writeASCII writes v as one JSON answer, ASCII only.
func writeASCII(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return writeLine(w, v)
}

// writeLine writes v as one line of JSON with everything outside ASCII
// escaped (\uXXXX), as the SDK needs: it decodes each chunk it reads on
// its own, so a character split between two would be lost.
func writeLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	out := make([]byte, 0, len(b)+1)
	for len(b) > 0 {
		c := b[0]
		if c < utf8.RuneSelf {
			out, b = append(out, c), b[1:]
			continue
		}
		r, n := utf8.DecodeRune(b)
		b = b[n:]
		if r >= 0x10000 {
			r -= 0x10000
			out = fmt.Appendf(out, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			continue
		}
		out = fmt.Appendf(out, `\u%04x`, r)
	}
	_, err = w.Write(append(out, '\n'))
	return err
}
