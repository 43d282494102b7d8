package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/coder/websocket"
	"golang.org/x/term"

	"github.com/harebox/harebox/sandbox"
)

// cmdShell is "harebox shell ID": an interactive terminal in the sandbox.
// The local terminal is put in raw mode (every key, ^C included, goes to
// the sandbox) and restored when the session ends, however it ends; its
// size follows the local window.
func cmdShell(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox shell", flag.ContinueOnError)
	cmd := fs.String("c", "", "run this shell string on the terminal instead of the login shell")
	user := fs.String("user", "", `user to run as (default "user"; "root" for root)`)
	cwd := fs.String("cwd", "", "working directory")
	pos, err := parse(fs, c, args, 1)
	if err != nil {
		return 0, err
	}
	in, _ := c.stdin.(*os.File)
	tty := in != nil && term.IsTerminal(int(in.Fd()))
	q := url.Values{}
	for k, v := range map[string]string{"cmd": *cmd, "user": *user, "cwd": *cwd} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if tty {
		if w, h, err := term.GetSize(int(in.Fd())); err == nil {
			q.Set("rows", strconv.Itoa(h))
			q.Set("cols", strconv.Itoa(w))
		}
	}
	conn, err := c.c.DialPty(ctx, pos[0], q)
	if err != nil {
		return 0, err
	}
	defer conn.CloseNow()
	if tty {
		old, err := term.MakeRaw(int(in.Fd()))
		if err != nil {
			return 0, fmt.Errorf("raw mode: %w", err)
		}
		defer term.Restore(int(in.Fd()), old)
		// The window's size, as it changes.
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if w, h, err := term.GetSize(int(in.Fd())); err == nil {
					b, _ := json.Marshal(map[string]any{"type": "resize", "rows": h, "cols": w})
					conn.Write(ctx, websocket.MessageText, b)
				}
			}
		}()
	}
	// What is typed goes to the terminal; the input's end is ^D there.
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := c.stdin.Read(buf)
			if n > 0 {
				if conn.Write(ctx, websocket.MessageBinary, buf[:n]) != nil {
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					conn.Write(ctx, websocket.MessageText, []byte(`{"type":"eof"}`))
				}
				return
			}
		}
	}()
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			return 0, fmt.Errorf("the terminal session ended: %w", err)
		}
		if typ == websocket.MessageBinary {
			if _, err := c.stdout.Write(b); err != nil {
				return 0, err
			}
			continue
		}
		res, err := lastMessage(conn, b)
		if err != nil {
			return 0, err
		}
		if tty {
			// (Raw mode is undone by the deferred restore; the next
			// line starts at the left edge.)
			defer fmt.Fprint(c.stderr, "\r")
		}
		return c.exitCode("shell", res), nil
	}
}

// lastMessage reads a session's closing text message (the exit, or the
// server's error) and closes the session.
func lastMessage(conn *websocket.Conn, b []byte) (*sandbox.ExecResult, error) {
	var last struct {
		Type   string              `json:"type"`
		Result *sandbox.ExecResult `json:"result"`
		Error  *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &last); err != nil {
		return nil, fmt.Errorf("the server sent a bad message: %w", err)
	}
	conn.Close(websocket.StatusNormalClosure, "")
	switch {
	case last.Type == "exit" && last.Result != nil:
		return last.Result, nil
	case last.Type == "error" && last.Error != nil:
		return nil, errors.New(last.Error.Message)
	}
	return nil, fmt.Errorf("the server sent an unknown message %q", last.Type)
}

// execStreamingStdin runs req with the CLI's stdin streaming to it (the
// terminal endpoint without a terminal): input goes as it comes, so a
// command that does not read an idle, open pipe is not held up by it, and
// the pipe's end closes the command's stdin.
func execStreamingStdin(ctx context.Context, c *cli, id string, req sandbox.ExecRequest) (int, error) {
	q := url.Values{"tty": {"false"}}
	cmd := req.Cmd
	if cmd == "" {
		cmd = shellQuote(req.Argv)
	}
	q.Set("cmd", cmd)
	for k, v := range map[string]string{"user": req.User, "cwd": req.Cwd} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if req.TimeoutSeconds > 0 {
		q.Set("timeout_seconds", strconv.FormatFloat(req.TimeoutSeconds, 'f', -1, 64))
	}
	if len(req.Env) > 0 {
		// (The endpoint takes no environment: it is set in the command.)
		var pre []string
		for k, v := range req.Env {
			pre = append(pre, "export "+k+"="+shellQuote([]string{v})+";")
		}
		q.Set("cmd", strings.Join(pre, " ")+" "+q.Get("cmd"))
	}
	conn, err := c.c.DialPty(ctx, id, q)
	if err != nil {
		return 0, err
	}
	defer conn.CloseNow()
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := c.stdin.Read(buf)
			if n > 0 && conn.Write(ctx, websocket.MessageBinary, buf[:n]) != nil {
				return
			}
			if err != nil {
				conn.Write(ctx, websocket.MessageText, []byte(`{"type":"eof"}`))
				return
			}
		}
	}()
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			return 0, fmt.Errorf("the command's stream ended: %w", err)
		}
		if typ == websocket.MessageBinary {
			if len(b) == 0 {
				continue
			}
			w := c.stdout
			if b[0] == 2 {
				w = c.stderr
			}
			if _, err := w.Write(b[1:]); err != nil {
				return 0, err
			}
			continue
		}
		res, err := lastMessage(conn, b)
		if err != nil {
			return 0, err
		}
		return c.exitCode("exec", res), nil
	}
}

// shellQuote joins argv as one /bin/sh command line, each word quoted.
func shellQuote(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
