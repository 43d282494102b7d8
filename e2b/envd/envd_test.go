package envd_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/e2b/envd"
	"github.com/harebox/harebox/e2b/envdpb/process"
	"github.com/harebox/harebox/e2b/envdpb/process/processconnect"
	"github.com/harebox/harebox/sandbox"
)

// access is the sandbox's token and acts as a key that sees only it.
type access struct{ id, token, account string }

func (a access) Token(_ context.Context, id string) (string, error) {
	if id != a.id {
		return "", errors.New("no such sandbox")
	}
	return a.token, nil
}

func (a access) Principal(_ context.Context, id string) (authz.Principal, error) {
	return authz.Principal{AccountID: a.account, KeyID: "envd", Scope: authz.Scope{Sandboxes: []string{id}}}, nil
}

// envd's files over a real engine on the in-memory hypervisor.
func TestFiles(t *testing.T) {
	ctx := context.Background()
	eng, ids, account := memEngine(t, 1)
	sb := struct{ ID, AccountID string }{ids[0], account}
	now := time.Now()
	s := envd.New(envd.Options{Files: eng, Access: access{id: sb.ID, token: "tok", account: sb.AccountID}, Now: func() time.Time { return now }})
	srv := httptest.NewServer(s.Handler(sb.ID))
	t.Cleanup(srv.Close)

	do := func(method, rawQuery string, hdr map[string]string, body io.Reader) (int, http.Header, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+"/files?"+rawQuery, body)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		req.Header.Set("Accept-Encoding", hdr["Accept-Encoding"]) // (no transparent gzip)
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}
	tok := map[string]string{"X-Access-Token": "tok"}
	errBody := func(b []byte, code int) bool {
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		return json.Unmarshal(b, &e) == nil && e.Code == code && e.Message != ""
	}

	// A raw upload, relative to the user's home, then a download.
	st, _, b := do("POST", "path=notes/a.txt", map[string]string{"X-Access-Token": "tok", "Content-Type": "application/octet-stream"}, strings.NewReader("hello"))
	var ents []map[string]string
	if st != 200 || json.Unmarshal(b, &ents) != nil || len(ents) != 1 || ents[0]["path"] != "/home/user/notes/a.txt" || ents[0]["type"] != "file" {
		t.Fatalf("raw upload: %d %s", st, b)
	}
	if st, _, b := do("GET", "path=notes/a.txt", tok, nil); st != 200 || string(b) != "hello" {
		t.Errorf("download: %d %q", st, b)
	}
	// gzip both ways.
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write([]byte("compressed"))
	zw.Close()
	if st, _, b := do("POST", "path=/tmp/z", map[string]string{"X-Access-Token": "tok", "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}, &zb); st != 200 {
		t.Errorf("gzip upload: %d %s", st, b)
	}
	st, h, b := do("GET", "path=/tmp/z", map[string]string{"X-Access-Token": "tok", "Accept-Encoding": "gzip"}, nil)
	zr, zerr := gzip.NewReader(bytes.NewReader(b))
	if st != 200 || h.Get("Content-Encoding") != "gzip" || zerr != nil {
		t.Fatalf("gzip download: %d %v %v", st, h, zerr)
	}
	if plain, _ := io.ReadAll(zr); string(plain) != "compressed" {
		t.Errorf("gzip download: %q", plain)
	}
	// Multipart: two files named by their parts.
	var mb bytes.Buffer
	mw := multipart.NewWriter(&mb)
	for name, content := range map[string]string{"/tmp/m1": "one", "m2": "two"} {
		fw, _ := mw.CreateFormFile("file", name)
		fw.Write([]byte(content))
	}
	mw.Close()
	st, _, b = do("POST", "", map[string]string{"X-Access-Token": "tok", "Content-Type": mw.FormDataContentType()}, &mb)
	if st != 200 || json.Unmarshal(b, &ents) != nil || len(ents) != 2 {
		t.Fatalf("multipart: %d %s", st, b)
	}
	// (Each to its own path, directories kept: the SDK names them so.)
	for p, want := range map[string]string{"/home/user/m2": "two", "/tmp/m1": "one"} {
		if _, _, b := do("GET", "path="+p, tok, nil); string(b) != want {
			t.Errorf("multipart file %s: %q, want %q", p, b, want)
		}
	}

	// Signed URLs, as the SDK signs them.
	sign := func(path, op, user string, exp int64) string {
		raw := path + ":" + op + ":" + user + ":tok"
		q := url.Values{"path": {path}}
		if user != "" {
			q.Set("username", user)
		}
		if exp != 0 {
			raw += ":" + strconv.FormatInt(exp, 10)
			q.Set("signature_expiration", strconv.FormatInt(exp, 10))
		}
		sum := sha256.Sum256([]byte(raw))
		q.Set("signature", "v1_"+base64.RawStdEncoding.EncodeToString(sum[:]))
		return q.Encode()
	}
	if st, _, b := do("GET", sign("notes/a.txt", "read", "", 0), nil, nil); st != 200 || string(b) != "hello" {
		t.Errorf("a signed download: %d %q", st, b)
	}
	if st, _, _ := do("GET", sign("notes/a.txt", "read", "user", now.Unix()+60), nil, nil); st != 200 {
		t.Errorf("a signed download that expires later: %d", st)
	}
	for what, q := range map[string]string{
		"expired":          sign("notes/a.txt", "read", "user", now.Unix()-1),
		"for writing":      sign("notes/a.txt", "write", "", 0),
		"for another file": strings.Replace(sign("notes/b.txt", "read", "", 0), "b.txt", "a.txt", 1),
		"no signature":     "path=notes/a.txt",
	} {
		if st, _, b := do("GET", q, nil, nil); st != 401 || !errBody(b, 401) {
			t.Errorf("%s: %d %s", what, st, b)
		}
	}
	if st, _, b := do("GET", "path=notes/a.txt", map[string]string{"X-Access-Token": "tak"}, nil); st != 401 || !errBody(b, 401) {
		t.Errorf("a wrong token: %d %s", st, b)
	}

	// Bad input: each an envd error, nothing written.
	for what, c := range map[string]struct {
		method, query string
		hdr           map[string]string
		body          string
		code          int
	}{
		"missing file": {"GET", "path=nothing", tok, "", 404},
		"a directory":  {"GET", "path=/tmp", tok, "", 400},
		"no path":      {"GET", "", tok, "", 400},
		"bad user":     {"GET", "path=a&username=..%2Fetc", tok, "", 401},
		"too large":    {"POST", "path=/tmp/big", map[string]string{"X-Access-Token": "tok", "Content-Type": "application/octet-stream"}, strings.Repeat("x", 2<<20), 413},
		"not gzip":     {"POST", "path=/tmp/ng", map[string]string{"X-Access-Token": "tok", "Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}, "plain", 400},
		"a bad type":   {"POST", "path=/tmp/t", map[string]string{"X-Access-Token": "tok", "Content-Type": "text/plain"}, "x", 400},
	} {
		if st, _, b := do(c.method, c.query, c.hdr, strings.NewReader(c.body)); st != c.code || !errBody(b, c.code) {
			t.Errorf("%s: %d %s, want %d", what, st, b, c.code)
		}
	}
	if _, err := eng.StatFile(ctx, sb.ID, "/tmp/big"); err == nil {
		t.Error("an oversized upload left a file")
	}
	if st, _, b := do("GET", "path=/tmp/z", map[string]string{"X-Access-Token": "tok", "Accept-Encoding": "br, identity;q=0"}, nil); st != 406 || !errBody(b, 406) {
		t.Errorf("no acceptable encoding: %d %s", st, b)
	}
}

// TestStalledCaller: a download its caller leaves unread, or an upload
// whose body stops coming, ends at the stall timeout and closes its
// connection, instead of holding the handler (and the guest's file) open.
func TestStalledCaller(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eng, ids, account := memEngineFiles(t, 1, 64<<20)
	sb := struct{ ID, AccountID string }{ids[0], account}
	// Far more than the loopback's socket buffers hold.
	const size = 32 << 20
	if _, err := eng.WriteFile(ctx, sb.ID, "/tmp/big", bytes.NewReader(make([]byte, size)), sandbox.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	s := envd.New(envd.Options{Files: eng, Access: scoped{access{id: sb.ID, token: "tok", account: sb.AccountID}, append([]string{"readFile", "statFile", "writeFile"}, processActions...)},
		Processes: eng.Processes(), StallTimeout: 300 * time.Millisecond})
	srv := httptest.NewServer(s.Handler(sb.ID))
	t.Cleanup(srv.Close)

	// ended sends req on a connection of its own, waits past the stall
	// timeout without reading, then reads what came: the connection must
	// have been closed by the server.
	ended := func(what, req string) int64 {
		t.Helper()
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		n, err := io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s: the connection is still open after the stall timeout (%d bytes came)", what, n)
		}
		return n
	}
	if n := ended("an unread download", "GET /files?path=/tmp/big HTTP/1.1\r\nHost: x\r\nX-Access-Token: tok\r\n\r\n"); n >= size {
		t.Errorf("an unread download: all of its %d bytes came", n)
	}
	ended("a stalled upload", "POST /files?path=/tmp/up HTTP/1.1\r\nHost: x\r\nX-Access-Token: tok\r\nContent-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\nonly this")
	if _, err := eng.StatFile(ctx, sb.ID, "/tmp/up"); err == nil {
		t.Error("a stalled upload left a file")
	}

	// A stream read as it comes and quiet for longer than the stall
	// timeout (a process that sleeps) is not stalled: it ends with the
	// process.
	c := processconnect.NewProcessClient(http.DefaultClient, srv.URL, connect.WithInterceptors(headerInterceptor{"X-Access-Token", "tok"}))
	st, err := c.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "sleep", Args: []string{"1"}}}))
	if err != nil {
		t.Fatal(err)
	}
	ev := eventsOf(st)
	ev.pid(t)
	if _, _, _, end, err := ev.rest(t); err != nil || end == nil || end.ExitCode != 0 {
		t.Errorf("a quiet stream: %v %v", end, err)
	}
}
