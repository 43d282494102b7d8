package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/harebox/harebox/api"
)

// dialPty opens a terminal session on the fast API's sandbox id.
func dialPty(t *testing.T, f *fastAPI, id, query string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := http.Header{"Authorization": {"Bearer " + f.root}}
	c, resp, err := websocket.Dial(ctx, strings.Replace(f.url, "http", "ws", 1)+"/v1/sandboxes/"+id+"/pty?"+query, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		t.Fatalf("dial: %v %+v", err, resp)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

// TestPtyProtocol: a session shows its command's output as binary
// messages and ends with an exit message and a normal close; a text
// message that is not a control, or a message over the limit, ends it with
// 1008 or 1009; a client that never reads is cut off; every failure before
// the upgrade is a JSON error.
func TestPtyProtocol(t *testing.T) {
	f := newFastAPI(t, api.Options{Timeouts: api.Timeouts{Terminal: 500 * time.Millisecond}})
	box := f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{})
	id := str(box, "id")
	ctx := context.Background()

	c := dialPty(t, f, id, "cmd=echo+hello&rows=30&cols=100")
	var shown strings.Builder
	var last map[string]any
	for {
		typ, b, err := c.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("read: %v", err)
			}
			break
		}
		if typ == websocket.MessageBinary {
			shown.Write(b)
			continue
		}
		if last != nil {
			t.Fatalf("a second text message: %s", b)
		}
		json.Unmarshal(b, &last)
	}
	if shown.String() != "hello\n" || last["type"] != "exit" || last["result"].(map[string]any)["exit_code"] != float64(0) {
		t.Fatalf("shown %q, last %v", shown.String(), last)
	}

	for name, send := range map[string]struct {
		typ  websocket.MessageType
		b    []byte
		code websocket.StatusCode
	}{
		"not JSON":        {websocket.MessageText, []byte("hello"), websocket.StatusPolicyViolation},
		"unknown control": {websocket.MessageText, []byte(`{"type":"reboot"}`), websocket.StatusPolicyViolation},
		"a bad size":      {websocket.MessageText, []byte(`{"type":"resize","rows":0,"cols":80}`), websocket.StatusPolicyViolation},
		"too big":         {websocket.MessageBinary, make([]byte, 65<<10), websocket.StatusMessageTooBig},
	} {
		c := dialPty(t, f, id, "cmd=sleep+30")
		if err := c.Write(ctx, send.typ, send.b); err != nil && !strings.Contains(name, "big") {
			t.Fatalf("%s: write: %v", name, err)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, _, err := c.Read(rctx)
		cancel()
		if websocket.CloseStatus(err) != send.code {
			t.Errorf("%s: %v, want close %d", name, err, send.code)
		}
	}

	// A client that never reads a flood: cut off, the server goes on.
	f.must(t, 200, "PUT", "/v1/sandboxes/"+id+"/files?path=/tmp/big", f.root, strings.Repeat("x", 8<<20))
	c = dialPty(t, f, id, "cmd=cat+/tmp/big")
	time.Sleep(3 * time.Second) // (several write timeouts)
	start := time.Now()
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, _, err := c.Read(rctx)
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatal("the session of a client that did not read was not ended")
			}
			// (Cut: the write that timed out dropped the connection; a
			// session that ran to its end closes normally.)
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				t.Fatal("the session of a client that did not read ran to its end")
			}
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatal("still reading after 10 s")
		}
	}
	f.must(t, 200, "GET", "/v1/sandboxes/"+id, f.root, nil)

	// Without a terminal: each output message names its stream.
	c = dialPty(t, f, id, "tty=false&cmd=echo+out%3B+echo+err+%3E%262")
	var streams [3]strings.Builder
	for {
		typ, b, err := c.Read(ctx)
		if err != nil {
			break
		}
		if typ == websocket.MessageBinary {
			if len(b) == 0 || b[0] < 1 || b[0] > 2 {
				t.Fatalf("an output message without its stream: %q", b)
			}
			streams[b[0]].Write(b[1:])
		}
	}
	if streams[1].String() != "out\n" || streams[2].String() != "err\n" {
		t.Fatalf("tty=false: stdout %q, stderr %q", streams[1].String(), streams[2].String())
	}

	// Before the upgrade: JSON errors.
	for _, c := range []struct {
		path string
		want int
	}{
		{"/v1/sandboxes/" + id + "/pty", 426},
		{"/v1/sandboxes/sbx_nope/pty", 404},
	} {
		r := f.do(t, "GET", c.path, f.root, nil)
		if r.status != c.want || r.body["error"] == nil {
			t.Errorf("GET %s: %d %s", c.path, r.status, r.raw)
		}
	}
}
