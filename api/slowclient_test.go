package api_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/api"
)

// Slow, oversized and malformed requests against the server as hareboxd
// runs it (api.Server.HTTPServer), with short timeouts: each is cut off
// with a clear answer, and the server serves the next client as before.
func TestSlowAndMalformedClients(t *testing.T) {
	// (Not in parallel: its slow uploads pause a third of the idle bound,
	// which a loaded machine's scheduler ran past beside TestImages.)
	const step = 300 * time.Millisecond
	f := newFastAPI(t, api.Options{Timeouts: api.Timeouts{Header: step, Body: step, BodyIdle: step, Idle: 2 * step}})
	box := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{}), "id")
	addr := strings.TrimPrefix(f.url, "http://")

	// dial sends head (and part of a body), then stalls; it returns the
	// server's answer, or "" for a connection closed without one.
	dial := func(t *testing.T, send string) (status int, body string, took time.Duration) {
		t.Helper()
		// The server's clock starts when it accepts, which may come
		// before Dial returns: start ours before dialing.
		start := time.Now()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * step)) // the test's own bound
		if _, err := io.WriteString(c, send); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		took = time.Since(start)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("the server held a stalled request for %v", took)
			}
			return 0, "", took
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), took
	}
	auth := "Authorization: Bearer " + f.root + "\r\n"

	t.Run("SlowHeaders", func(t *testing.T) {
		status, _, took := dial(t, "GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\n"+auth)
		if status != 0 || took < step || took > 10*step {
			t.Fatalf("status %d after %v; want the connection closed after about %v", status, took, step)
		}
	})
	t.Run("SlowJSONBody", func(t *testing.T) {
		status, body, took := dial(t, "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n"+auth+
			"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"labels\":")
		if status != http.StatusRequestTimeout || !strings.Contains(body, `"code":"timeout"`) || took > 10*step {
			t.Fatalf("%d %s after %v", status, body, took)
		}
	})
	t.Run("DribbledJSONBody", func(t *testing.T) {
		// A byte now and then resets no clock: the whole body has Body.
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n%sContent-Length: 100\r\n\r\n", auth)
		start := time.Now()
		for i := 0; i < 20 && time.Since(start) < 10*step; i++ {
			if _, err := c.Write([]byte(" ")); err != nil {
				break // the server gave up, as it should
			}
			time.Sleep(step / 4)
		}
		c.SetReadDeadline(time.Now().Add(10 * step))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusRequestTimeout || time.Since(start) > 10*step {
			t.Fatalf("%v %v after %v", resp, err, time.Since(start))
		}
	})
	t.Run("StalledUpload", func(t *testing.T) {
		status, body, _ := dial(t, "PUT /v1/sandboxes/"+box+"/files?path=/tmp/half HTTP/1.1\r\nHost: x\r\n"+auth+
			"Content-Length: 1000\r\n\r\nhalf a file")
		if status != http.StatusRequestTimeout || !strings.Contains(body, `"code":"timeout"`) {
			t.Fatalf("%d %s", status, body)
		}
		if r := f.do(t, "GET", "/v1/sandboxes/"+box+"/files/stat?path=/tmp/half", f.root, nil); r.status != 404 {
			t.Errorf("a stalled upload left a file: %d %s", r.status, r.raw)
		}
	})
	t.Run("SlowUploadKeepsGoing", func(t *testing.T) {
		// Pauses shorter than BodyIdle, for longer than it in all: written.
		pr, pw := io.Pipe()
		go func() {
			for i := 0; i < 6; i++ {
				pw.Write([]byte("chunk\n"))
				time.Sleep(step / 3)
			}
			pw.Close()
		}()
		req, _ := http.NewRequest("PUT", f.url+"/v1/sandboxes/"+box+"/files?path=/tmp/slow", pr)
		req.Header.Set("Authorization", "Bearer "+f.root)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("slow but steady upload: %d", resp.StatusCode)
		}
		if r := f.must(t, 200, "GET", "/v1/sandboxes/"+box+"/files?path=/tmp/slow", f.root, nil); string(r.raw) != strings.Repeat("chunk\n", 6) {
			t.Errorf("read back %q", r.raw)
		}
	})
	t.Run("OversizedHeaders", func(t *testing.T) {
		status, _, _ := dial(t, "GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 2*api.MaxHeaderBytes)+"\r\n\r\n")
		if status != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("status %d", status)
		}
	})
	t.Run("Malformed", func(t *testing.T) {
		for _, req := range []string{"NOT HTTP AT ALL\r\n\r\n", "GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", "\x00\x01\x02\r\n\r\n"} {
			if status, _, _ := dial(t, req); status != http.StatusBadRequest {
				t.Errorf("%q: status %d", req, status)
			}
		}
	})
	// Through all of that, the server still answers.
	f.must(t, 200, "GET", "/v1/sandboxes/"+box, f.root, nil)
	// A long request is not cut by the body deadline after its body arrived.
	start := time.Now()
	r := f.must(t, 200, "POST", "/v1/sandboxes/"+box+"/exec", f.root, map[string]any{"cmd": fmt.Sprintf("sleep %.1f", (3 * step).Seconds())})
	if r.body["exit_code"] != 0.0 || r.body["timed_out"] == true || time.Since(start) < 3*step {
		t.Errorf("an exec past the body deadline: %s after %v", r.raw, time.Since(start))
	}
}
