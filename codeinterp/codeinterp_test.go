package codeinterp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
)

// The host's side against interpreters that answer as the guest's server
// does, and as a hostile one could. (The real server, in a real guest,
// is e2e's TestCodeInterpreter.)

func pngOf(t *testing.T, w, h int) string {
	t.Helper()
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

// serve answers /execute with lines, after refusing the first n calls
// with 503.
func serve(t *testing.T, unready int32, lines ...string) (*Client, *atomic.Int32) {
	t.Helper()
	calls := &atomic.Int32{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= unready {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		switch r.URL.Path {
		case "/execute":
			w.Header().Set("Content-Type", "application/x-ndjson")
			for _, l := range lines {
				fmt.Fprintln(w, l)
				w.(http.Flusher).Flush()
			}
		case "/contexts/nope/restart":
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"error": "no context nope"}`)
		default:
			w.Write([]byte(lines[0]))
		}
	}))
	t.Cleanup(srv.Close)
	addr := strings.TrimPrefix(srv.URL, "http://")
	c := New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}, Options{MaxOutput: 10, MaxStream: 20, ReadyTimeout: 10 * time.Second, Grace: time.Second})
	t.Cleanup(c.Close)
	return c, calls
}

func TestRun(t *testing.T) {
	chart := pngOf(t, 640, 480)
	c, calls := serve(t, 2,
		`{"type": "stdout", "text": "hello "}`,
		`{"type": "stdout", "text": "world, and more"}`,
		"{\"type\": \"stderr\", \"text\": \"careful\xff\"}",
		`{"type": "stdout", "text": "past the stream's bound"}`,
		// (Jupyter wraps base64 at 76 columns.)
		`{"type": "result", "main": false, "data": {"image/png": "`+chart[:40]+`\n`+chart[40:]+`", "text/plain": "<Figure size 640x480>", "application/x-unknown": "dropped"}, "metadata": {}}`,
		`{"type": "result", "main": false, "data": {"application/x-unknown": "nothing kept"}, "metadata": {}}`,
		`{"type": "result", "main": true, "data": {"text/plain": "42", "text/html": "<b>42</b>", "application/json": {"a": [1, 2]}}, "metadata": {}}`,
		`{"type": "count", "count": 7}`,
		`{"type": "end", "status": "ok"}`)
	var evs []sandbox.CodeEvent
	x, err := c.Run(context.Background(), sandbox.CodeRequest{Code: "x + 1"}, nil, func(ev sandbox.CodeEvent) error {
		evs = append(evs, ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 3 {
		t.Errorf("calls: %d (two refused while starting)", calls.Load())
	}
	if x.Status != "ok" || x.ExecutionCount != 7 || x.ContextID != "default" || x.Error != nil {
		t.Errorf("execution: %+v", x)
	}
	if x.Stdout != "hello worl" || !x.StdoutTruncated || x.Stderr != "careful\uFFFD" || x.StderrTruncated {
		t.Errorf("output kept: %q %v %q %v", x.Stdout, x.StdoutTruncated, x.Stderr, x.StderrTruncated)
	}
	if len(x.Results) != 2 || x.ResultsDropped != 1 {
		t.Fatalf("results %d, dropped %d", len(x.Results), x.ResultsDropped)
	}
	if r := x.Results[0]; r.IsMainResult || r.PNG != chart || r.Width != 640 || r.Height != 480 || r.Text != "<Figure size 640x480>" {
		t.Errorf("chart: main %v size %dx%d text %q png equal %v", r.IsMainResult, r.Width, r.Height, r.Text, r.PNG == chart)
	}
	if r := x.Results[1]; !r.IsMainResult || r.Text != "42" || r.HTML != "<b>42</b>" || string(r.JSON) != `{"a":[1,2]}` {
		t.Errorf("main result: %+v", r)
	}
	// Forwarded: up to 20 bytes of stdout, then nothing more of it.
	var types, out []string
	for _, ev := range evs {
		types = append(types, ev.Type)
		if ev.Type == "stdout" {
			out = append(out, ev.Text)
		}
	}
	if strings.Join(types, ",") != "stdout,stdout,stderr,result,result" || strings.Join(out, "") != "hello world, and mor" {
		t.Errorf("events %v, stdout %q", types, out)
	}
}

func TestRunErrors(t *testing.T) {
	c, _ := serve(t, 0,
		`{"type": "stdout", "text": "a"}`,
		`{"type": "error", "name": "ZeroDivisionError", "value": "division by zero", "traceback": "Traceback...\nZeroDivisionError"}`,
		`{"type": "count", "count": 1}`,
		`{"type": "end", "status": "error"}`)
	x, err := c.Run(context.Background(), sandbox.CodeRequest{Code: "1/0"}, nil, nil)
	if err != nil || x.Status != "error" || x.Error == nil || x.Error.Name != "ZeroDivisionError" || !strings.Contains(x.Error.Traceback, "Traceback") {
		t.Fatalf("%+v %v", x, err)
	}
	// The caller stopped reading: the run stops with its error.
	stop := errors.New("gone")
	if _, err := c.Run(context.Background(), sandbox.CodeRequest{Code: "1/0"}, nil, func(sandbox.CodeEvent) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("emit's error: %v", err)
	}
	if _, err := c.RestartContext(context.Background(), "nope"); !errors.Is(err, model.ErrNotFound) || !strings.Contains(err.Error(), "no context nope") {
		t.Errorf("restart of an unknown context: %v", err)
	}
	for _, r := range []sandbox.CodeRequest{{}, {Code: "x", Language: "cobol"}, {Code: "x", ContextID: "../x"}, {Code: "x", TimeoutSeconds: 7200}} {
		if _, err := c.Run(context.Background(), r, nil, nil); !errors.Is(err, model.ErrInvalid) {
			t.Errorf("%+v: %v", r, err)
		}
	}
	// Without a context, the language's default one.
	for lang, want := range map[string]string{"": "default", "python": "default", "bash": "default-bash", "javascript": "default-javascript", "typescript": "default-typescript"} {
		c, _ := serve(t, 0, `{"type": "end", "status": "ok"}`)
		if x, err := c.Run(context.Background(), sandbox.CodeRequest{Code: "1", Language: lang}, nil, nil); err != nil || x.ContextID != want {
			t.Errorf("language %q: %+v %v", lang, x, err)
		}
	}
}

// TestLyingInterpreter: every way an answer can break the protocol is an
// error of kind unavailable, caused by ErrInterpreter, and none hangs.
func TestLyingInterpreter(t *testing.T) {
	huge := pngOf(t, 20000, 1)
	end := `{"type": "end", "status": "ok"}`
	for name, lines := range map[string][]string{
		"unknown type":      {`{"type": "shell", "text": "rm -rf /"}`, end},
		"unknown field":     {`{"type": "stdout", "text": "a", "extra": 1}`, end},
		"text not a string": {`{"type": "stdout", "text": 5}`, end},
		"not json":          {`hello`, end},
		"no end":            {`{"type": "stdout", "text": "a"}`},
		"bad status":        {`{"type": "end", "status": "great"}`},
		"failed, no error":  {`{"type": "end", "status": "error"}`},
		"bad count":         {`{"type": "count", "count": -1}`, end},
		"png not base64":    {`{"type": "result", "main": true, "data": {"image/png": "%%%"}}`, end},
		"png that is jpeg":  {`{"type": "result", "main": true, "data": {"image/jpeg": "` + pngOf(t, 2, 2) + `"}}`, end},
		"png too wide":      {`{"type": "result", "main": true, "data": {"image/png": "` + huge + `"}}`, end},
		"html not a string": {`{"type": "result", "main": true, "data": {"text/html": ["<b>"]}}`, end},
		"result no main":    {`{"type": "result", "data": {"text/plain": "1"}}`, end},
		"line too long":     {`{"type": "stdout", "text": "` + strings.Repeat("a", MaxLine) + `"}`, end},
	} {
		t.Run(name, func(t *testing.T) {
			c, _ := serve(t, 0, lines...)
			done := make(chan error, 1)
			go func() {
				_, err := c.Run(context.Background(), sandbox.CodeRequest{Code: "x"}, nil, nil)
				done <- err
			}()
			select {
			case err := <-done:
				if !errors.Is(err, ErrInterpreter) || !errors.Is(err, model.ErrUnavailable) {
					t.Errorf("got %v", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("the run did not end")
			}
		})
	}
}

func TestContexts(t *testing.T) {
	c, _ := serve(t, 0, `[{"id": "default", "language": "python", "cwd": "/home/user"}]`)
	l, err := c.Contexts(context.Background())
	if err != nil || len(l) != 1 || l[0].ID != "default" {
		t.Fatalf("%+v %v", l, err)
	}
	c, _ = serve(t, 0, `[{"id": "../x", "language": "python", "cwd": "/home/user"}]`)
	if _, err := c.Contexts(context.Background()); !errors.Is(err, ErrInterpreter) {
		t.Errorf("a bad context ID: %v", err)
	}
	c, _ = serve(t, 0, `{"id": "abc", "language": "javascript", "cwd": "/"}`)
	if cc, err := c.CreateContext(context.Background(), sandbox.CodeContextRequest{Language: "javascript"}); err != nil || cc.Language != "javascript" {
		t.Errorf("a javascript context: %+v %v", cc, err)
	}
	c, _ = serve(t, 0, `{"id": "abc", "language": "cobol", "cwd": "/"}`)
	if _, err := c.CreateContext(context.Background(), sandbox.CodeContextRequest{}); !errors.Is(err, ErrInterpreter) {
		t.Errorf("a bad language: %v", err)
	}
	if _, err := c.CreateContext(context.Background(), sandbox.CodeContextRequest{Cwd: "relative"}); !errors.Is(err, model.ErrInvalid) {
		t.Errorf("a relative cwd: %v", err)
	}
}

// TestNotReady: an interpreter that never listens is waited for up to
// ReadyTimeout, then the call fails with a kind.
func TestNotReady(t *testing.T) {
	dials := 0
	c := New(func(ctx context.Context) (net.Conn, error) {
		dials++
		return nil, &model.Error{Kind: model.ErrUnavailable, Msg: "nothing listens", Err: agentclient.ErrNotListening}
	}, Options{ReadyTimeout: 2 * time.Second})
	start := time.Now()
	_, err := c.Contexts(context.Background())
	if !errors.Is(err, model.ErrUnavailable) || dials < 3 {
		t.Errorf("after %d dials: %v", dials, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("gave up after %v", d)
	}
	var buf bytes.Buffer
	json.NewEncoder(&buf).Encode(err.Error())
	t.Log(buf.String())
}

// TestRunKeepsItsConnection: cells one after another go over one
// connection (each new one is a dial through the agent), the answer read
// to its end even when its last chunk comes late; an answer that stalls
// after its end line still returns the cell, within a second or so, and
// that connection is dropped.
func TestRunKeepsItsConnection(t *testing.T) {
	var stall atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		fmt.Fprintln(w, `{"type": "end", "status": "ok"}`)
		w.(http.Flusher).Flush()
		if stall.Load() {
			<-r.Context().Done()
			return
		}
		time.Sleep(50 * time.Millisecond) // (the last chunk in a later segment)
	}))
	defer srv.Close()
	var dials atomic.Int32
	c := New(func(ctx context.Context) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, "tcp", strings.TrimPrefix(srv.URL, "http://"))
	}, Options{ReadyTimeout: time.Second, Grace: time.Minute})
	defer c.Close()
	for range 3 {
		if x, err := c.Run(context.Background(), sandbox.CodeRequest{Code: "1"}, nil, nil); err != nil || x.Status != "ok" {
			t.Fatalf("%+v %v", x, err)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("3 cells dialed %d times", n)
	}
	stall.Store(true)
	start := time.Now()
	if x, err := c.Run(context.Background(), sandbox.CodeRequest{Code: "1"}, nil, nil); err != nil || x.Status != "ok" {
		t.Fatalf("%+v %v", x, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a stalled answer held the cell %s", d)
	}
	stall.Store(false)
	c.Run(context.Background(), sandbox.CodeRequest{Code: "1"}, nil, nil)
	if n := dials.Load(); n != 2 {
		t.Errorf("after the stalled answer: %d dials, want 2", n)
	}
}
