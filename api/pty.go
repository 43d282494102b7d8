package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/harebox/harebox/sandbox"
)

// The terminal's WebSocket protocol (GET /v1/sandboxes/{id}/pty; with
// tty=false, a command without a terminal whose input streams, and whose
// output messages start with a byte that names their stream: 1 stdout,
// 2 stderr):
//   - client to server: binary messages are typed into the terminal; text
//     messages are JSON controls: {"type": "resize", "rows": R, "cols": C},
//     {"type": "signal", "signal": N}, {"type": "eof"} (^D, the input's end);
//   - server to client: binary messages are what the terminal shows; the
//     last text message is {"type": "exit", "result": ExecResult} or
//     {"type": "error", "error": {code, message, field}}, then a normal
//     close.
//
// A message that breaks the protocol closes the session with status 1008
// (policy violation) and ends the command. A client that stops reading is
// cut off after Timeouts.Terminal, and its command ends too.
const (
	// maxPtyMessage bounds one message from the client.
	maxPtyMessage = 64 << 10
	// maxPtyDim bounds a terminal's rows and columns.
	maxPtyDim = 1000
)

// ptyControl is a text message from the client.
type ptyControl struct {
	Type   string `json:"type"`
	Rows   int    `json:"rows,omitempty"`
	Cols   int    `json:"cols,omitempty"`
	Signal int    `json:"signal,omitempty"`
}

func dim(q string, name string, def int) (int, error) {
	if q == "" {
		return def, nil
	}
	v, err := strconv.Atoi(q)
	if err != nil || v < 1 || v > maxPtyDim {
		return 0, badRequest(name, "must be 1 to %d", maxPtyDim)
	}
	return v, nil
}

func (s *Server) pty(w http.ResponseWriter, r *http.Request) error {
	// Errors before the upgrade are plain JSON errors; who may not use the
	// sandbox learns that first.
	id := r.PathValue("id")
	if err := s.eng.Authorize(r.Context(), "openPty", id); err != nil {
		return err
	}
	if _, err := s.eng.Get(r.Context(), id); err != nil {
		return err
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return apiError{status: http.StatusUpgradeRequired, code: "invalid", msg: "this is a WebSocket endpoint: ask for Upgrade: websocket"}
	}
	q := r.URL.Query()
	rows, err := dim(q.Get("rows"), "rows", 24)
	if err != nil {
		return err
	}
	cols, err := dim(q.Get("cols"), "cols", 80)
	if err != nil {
		return err
	}
	tty := true
	if v := q.Get("tty"); v != "" {
		if tty, err = strconv.ParseBool(v); err != nil {
			return badRequest("tty", "must be true or false")
		}
	}
	req := sandbox.ExecRequest{Cmd: q.Get("cmd"), User: q.Get("user"), Cwd: q.Get("cwd")}
	if !tty && req.Cmd == "" {
		return badRequest("cmd", "is required without a terminal")
	}
	if t := q.Get("timeout_seconds"); t != "" {
		v, err := strconv.ParseFloat(t, 64)
		if err != nil || v < 0 {
			return badRequest("timeout_seconds", "must be a number of seconds from 0 (none)")
		}
		req.TimeoutSeconds = v
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return nil // Accept answered the client already
	}
	defer conn.CloseNow()
	conn.SetReadLimit(maxPtyMessage)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()

	stdin, typed := io.Pipe()
	resize := make(chan [2]uint16, 4)
	signals := make(chan int, 4)
	var closeMu sync.Mutex
	closed := false
	closeWith := func(code websocket.StatusCode, why string) {
		closeMu.Lock()
		defer closeMu.Unlock()
		if !closed {
			closed = true
			conn.Close(code, why)
		}
	}
	go func() {
		// The client's messages; its going away ends the session.
		defer cancel()
		defer typed.Close()
		for {
			typ, b, err := conn.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				if _, err := typed.Write(b); err != nil {
					return
				}
				continue
			}
			var c ptyControl
			if err := json.Unmarshal(b, &c); err != nil {
				closeWith(websocket.StatusPolicyViolation, "a text message must be a JSON control")
				return
			}
			switch {
			case c.Type == "resize" && c.Rows >= 1 && c.Rows <= maxPtyDim && c.Cols >= 1 && c.Cols <= maxPtyDim:
				select {
				case resize <- [2]uint16{uint16(c.Rows), uint16(c.Cols)}:
				default: // (a newer size follows)
				}
			case c.Type == "signal" && c.Signal >= 1 && c.Signal <= 64:
				select {
				case signals <- c.Signal:
				default:
				}
			case c.Type == "eof":
				typed.Close()
			default:
				closeWith(websocket.StatusPolicyViolation, fmt.Sprintf("unknown or bad control %q", c.Type))
				return
			}
		}
	}()
	var res *sandbox.ExecResult
	if tty {
		out := &ptyWriter{ctx: ctx, conn: conn, timeout: s.opts.Timeouts.Terminal}
		res, err = s.eng.Shell(ctx, id, req, &sandbox.Terminal{Rows: uint16(rows), Cols: uint16(cols), Resize: resize, Signals: signals}, stdin, out, nil)
	} else {
		// Each output message starts with its stream: 1 stdout, 2 stderr.
		var mu sync.Mutex // (one message at a time on the connection)
		out := &ptyWriter{ctx: ctx, conn: conn, timeout: s.opts.Timeouts.Terminal, tag: 1, mu: &mu}
		errOut := &ptyWriter{ctx: ctx, conn: conn, timeout: s.opts.Timeouts.Terminal, tag: 2, mu: &mu}
		res, err = s.eng.Shell(ctx, id, req, nil, stdin, out, errOut)
	}
	stdin.Close()
	if ctx.Err() != nil {
		// The client left, broke the protocol or stopped reading.
		closeWith(websocket.StatusPolicyViolation, "session ended")
		return nil
	}
	var last any
	if err != nil {
		last = map[string]any{"type": "error", "error": s.streamError(ctx, "openPty", err)}
	} else {
		last = map[string]any{"type": "exit", "result": res}
	}
	b, _ := json.Marshal(last)
	wctx, wcancel := context.WithTimeout(ctx, s.opts.Timeouts.Terminal)
	defer wcancel()
	if conn.Write(wctx, websocket.MessageText, b) == nil {
		closeWith(websocket.StatusNormalClosure, "")
	}
	return nil
}

// ptyWriter sends what the terminal shows (or, with a tag, one of the
// command's outputs, the tag first), one binary message per write; a
// client that does not take one within timeout ends the session.
type ptyWriter struct {
	ctx     context.Context
	conn    *websocket.Conn
	timeout time.Duration
	tag     byte
	mu      *sync.Mutex
}

func (p *ptyWriter) Write(b []byte) (int, error) {
	ctx, cancel := context.WithTimeout(p.ctx, p.timeout)
	defer cancel()
	msg := b
	if p.tag != 0 {
		msg = append([]byte{p.tag}, b...)
		p.mu.Lock()
		defer p.mu.Unlock()
	}
	if err := p.conn.Write(ctx, websocket.MessageBinary, msg); err != nil {
		return 0, errors.Join(errors.New("the terminal's client does not read"), err)
	}
	return len(b), nil
}
