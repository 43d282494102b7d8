package credproxy

import (
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// chunky returns its data a few bytes at a time.
type chunky struct {
	s   string
	rnd *rand.Rand
}

func (c *chunky) Read(p []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	n := min(1+c.rnd.IntN(7), len(c.s), len(p))
	copy(p, c.s[:n])
	c.s = c.s[n:]
	return n, nil
}

func (c *chunky) Close() error { return nil }

// A value split across reads anywhere is still replaced.
func TestScrubberAcrossReads(t *testing.T) {
	body := strings.Repeat("x", 50) + "sk-SECRET-1" + "yy" + "sk-SECRET-1sk-SECRET-1" + "tok-2" + strings.Repeat("z", 9) + "sk-SECRET"
	want := strings.NewReplacer("sk-SECRET-1", "PH1", "tok-2", "PH2").Replace(body)
	for seed := range uint64(200) {
		s := newScrubber(&chunky{s: body, rnd: rand.New(rand.NewPCG(seed, 1))}, []string{"sk-SECRET-1", "PH1", "tok-2", "PH2"})
		got, err := io.ReadAll(s)
		if err != nil || string(got) != want {
			t.Fatalf("seed %d: %q %v, want %q", seed, got, err, want)
		}
	}
}

func TestRuleCovers(t *testing.T) {
	r := Rule{Hosts: []string{"api.example.test", "*.openai.test"}}
	for _, c := range []struct {
		host   string
		port   uint16
		secure bool
		want   bool
	}{
		{"api.example.test", 443, true, true},
		{"x.openai.test", 443, true, true},
		{"api.example.test", 80, false, false},
		{"api.example.test", 8443, true, false},
		{"other.test", 443, true, false},
	} {
		if got := r.covers(c.host, c.port, c.secure); got != c.want {
			t.Errorf("%+v: %v", c, got)
		}
	}
	r.AllowHTTP = true
	if !r.covers("api.example.test", 80, false) {
		t.Error("plain HTTP allowed by the rule")
	}
}

// feedAll runs the framing check over a stream, in small pieces.
func feedAll(s string) error {
	c := &strictConn{}
	for len(s) > 0 {
		n := min(3, len(s))
		if err := c.feed([]byte(s[:n])); err != nil {
			return err
		}
		s = s[n:]
	}
	return nil
}

func TestStrictFraming(t *testing.T) {
	good := "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello" +
		"POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhe\r\nl\r\n0\r\nT: 1\r\n\r\n" +
		"GET /c HTTP/1.1\r\nHost: x\r\n\r\n"
	if err := feedAll(good); err != nil {
		t.Fatalf("keep-alive with bodies refused: %v", err)
	}
	// A body may hold anything, even what would be a smuggled head.
	if err := feedAll("POST / HTTP/1.1\r\nContent-Length: 14\r\n\r\n x: folded\r\n\r\n"); err != nil {
		t.Fatalf("a body was read as a head: %v", err)
	}
	for name, bad := range map[string]string{
		"obs-fold":           "GET / HTTP/1.1\r\nHost: x\r\nA: b\r\n c\r\n\r\n",
		"obs-fold second":    good + "GET / HTTP/1.1\r\nHost: x\r\nA: b\r\n\tc\r\n\r\n",
		"bare LF":            "GET / HTTP/1.1\r\nHost: x\nA: b\r\n\r\n",
		"CL and TE":          "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
		"two lengths":        "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
		"bad chunk":          "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"chunk without CRLF": "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY",
		"other coding":       "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
		"no colon":           "GET / HTTP/1.1\r\nHost x\r\n\r\n",
	} {
		if err := feedAll(bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// sized returns its data in reads of random sizes up to max.
type sized struct {
	b   []byte
	rnd *rand.Rand
	max int
}

func (c *sized) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.b[:min(1+c.rnd.IntN(c.max), len(c.b))])
	c.b = c.b[n:]
	return n, nil
}

func (c *sized) Close() error { return nil }

// A large body with values anywhere, read in pieces of any size on both
// sides, comes out as strings.Replacer makes it.
func TestScrubberLarge(t *testing.T) {
	pairs := []string{"sk-SECRET-value-1", "PH1", "tok-2", "PLACEHOLDER-2", "ab", "X"}
	for seed := range uint64(20) {
		rnd := rand.New(rand.NewPCG(seed, 2))
		var body strings.Builder
		for body.Len() < 1<<20 {
			if rnd.IntN(50) == 0 {
				body.WriteString(pairs[2*rnd.IntN(3)])
			} else {
				body.WriteByte("abcxyz-k"[rnd.IntN(8)])
			}
		}
		want := strings.NewReplacer(pairs...).Replace(body.String())
		s := newScrubber(&sized{b: []byte(body.String()), rnd: rnd, max: 1 + rnd.IntN(300<<10)}, pairs)
		var got strings.Builder
		buf := make([]byte, 1+rnd.IntN(70<<10))
		for {
			n, err := s.Read(buf[:1+rnd.IntN(len(buf))])
			got.Write(buf[:n])
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		if got.String() != want {
			t.Fatalf("seed %d: %d bytes out, want %d", seed, got.Len(), len(want))
		}
	}
}

// Where one value begins another, the longer one is replaced whole: no
// part of it reaches the guest.
func TestScrubPrefixValues(t *testing.T) {
	sb := &Sandbox{Rules: []Rule{
		{Value: "sk-abc", Placeholder: "PH_SHORT"},
		{Value: "sk-abcdef", Placeholder: "PH_LONG"},
	}}
	r := &http.Response{StatusCode: 200, Header: http.Header{"X-Echo": {"sk-abcdef sk-abc"}},
		Body: io.NopCloser(strings.NewReader("a sk-abcdef b sk-abc c"))}
	if err := scrub(r, newValues(sb.pairs()), nil); err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	if got := string(body); got != "a PH_LONG b PH_SHORT c" {
		t.Errorf("body %q", got)
	}
	if got := r.Header.Get("X-Echo"); got != "PH_LONG PH_SHORT" {
		t.Errorf("header %q", got)
	}
}

// A value that overlaps itself at every cut (a response made of it) is
// held back at most maxHold, then the response is cut off: the proxy
// does not buffer without end, and no part of a value is let through.
func TestScrubberHoldBound(t *testing.T) {
	body := strings.Repeat("a", 3*maxHold)
	s := newScrubber(io.NopCloser(strings.NewReader(body)), []string{strings.Repeat("a", 100), "PH"})
	n, err := io.Copy(io.Discard, s)
	if err != nil && !errors.Is(err, errHold) {
		t.Fatalf("%d bytes, %v", n, err)
	}
	if len(s.buf) > maxHold+scrubBuf {
		t.Errorf("held %d bytes", len(s.buf))
	}
}

// A stream's message is passed on as it is read, not when the next one
// comes: only an end that could begin a value waits for more.
func TestScrubberPassesMessagesWhole(t *testing.T) {
	src, feed := io.Pipe()
	s := newScrubber(src, []string{"sk-SECRET-1", "PH1"})
	next := func(send, want string) {
		t.Helper()
		go feed.Write([]byte(send))
		type read struct {
			b   []byte
			err error
		}
		done := make(chan read, 1)
		go func() {
			got := make([]byte, 64)
			n, err := s.Read(got)
			done <- read{got[:n], err}
		}()
		select {
		case r := <-done:
			if r.err != nil || string(r.b) != want {
				t.Fatalf("sent %q: read %q %v, want %q", send, r.b, r.err, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("sent %q: nothing passed on", send)
		}
	}
	next("data: one\n\n", "data: one\n\n")
	next("data: two sk-SEC", "data: two ")
	next("RET-1 three\n", "PH1 three\n")
	// (An end that could begin a value waits for more, or the end.)
	go func() { feed.Write([]byte("s")); feed.Close() }()
	if rest, err := io.ReadAll(s); err != nil || string(rest) != "s" {
		t.Fatalf("at the end: %q %v", rest, err)
	}
}

// flushCount is a ResponseWriter that counts its flushes.
type flushCount struct {
	http.ResponseWriter
	mu sync.Mutex
	n  int
}

func (f *flushCount) Flush() { f.mu.Lock(); f.n++; f.mu.Unlock() }

func (f *flushCount) count() int { f.mu.Lock(); defer f.mu.Unlock(); return f.n }

// A flush batchFlush skips is made up later; once the body has been read
// to its end, flushes are made at once and none is made up later
// (ReverseProxy then writes trailers into the header map).
func TestBatchFlush(t *testing.T) {
	fc := &flushCount{ResponseWriter: httptest.NewRecorder()}
	bf := &batchFlush{ResponseWriter: fc, every: time.Hour}
	bf.Write([]byte("a"))
	bf.Flush() // the first: at once
	bf.Write([]byte("b"))
	bf.Flush() // skipped, to be made up in an hour
	if n := fc.count(); n != 1 {
		t.Fatalf("%d flushes, want 1", n)
	}
	body := &bodyEnd{ReadCloser: io.NopCloser(strings.NewReader("")), end: bf.stop}
	if _, err := body.Read(make([]byte, 1)); err != io.EOF {
		t.Fatal(err)
	}
	bf.mu.Lock()
	pending := bf.pending
	bf.mu.Unlock()
	if pending != nil {
		t.Fatal("a flush is still to be made after the body's end")
	}
	bf.Flush() // after the body: at once
	if n := fc.count(); n != 2 {
		t.Fatalf("%d flushes after the body's end, want 2", n)
	}

	fc = &flushCount{ResponseWriter: httptest.NewRecorder()}
	bf = &batchFlush{ResponseWriter: fc, every: 10 * time.Millisecond}
	defer bf.stop()
	bf.Write([]byte("a"))
	bf.Flush()
	bf.Write([]byte("b"))
	bf.Flush() // skipped (or made at once, if 10 ms went by), then made up
	for deadline := time.Now().Add(5 * time.Second); fc.count() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the skipped flush was never made")
		}
	}
}
