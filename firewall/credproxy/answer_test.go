package credproxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/harebox/harebox/internal/testweb"
)

const (
	testValue = "sk-live-9f8e7d6c5b4a"
	testPH    = "hbph_placeholder_0123456789"
)

var testVals = newValues([]string{testValue, testPH})

// encode applies one content-coding, as an upstream would.
func encode(t *testing.T, coding string, b []byte) []byte {
	t.Helper()
	out, err := testweb.Encode(coding, b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func answer(header http.Header, body []byte) *http.Response {
	return &http.Response{StatusCode: 200, Header: header, Body: io.NopCloser(bytes.NewReader(body))}
}

// An answer in any coding the proxy can undo, stacked or not, reaches the
// guest decoded and scrubbed; any other is refused; none passes the value.
func TestScrubCodings(t *testing.T) {
	plain := []byte(strings.Repeat("x", 3000) + "key=" + testValue + " and again " + testValue)
	want := strings.ReplaceAll(string(plain), testValue, testPH)
	for _, c := range []struct {
		header string
		codes  []string // applied in order
	}{
		{"", nil},
		{"identity", nil},
		{"gzip", []string{"gzip"}},
		{"x-gzip", []string{"x-gzip"}},
		{"deflate", []string{"deflate"}},
		{"deflate", []string{"deflate-raw"}},
		{"br", []string{"br"}},
		{"zstd", []string{"zstd"}},
		{"gzip, gzip", []string{"gzip", "gzip"}},
		{"GZIP ,br, identity, zstd", []string{"gzip", "br", "zstd"}},
	} {
		body := plain
		for _, code := range c.codes {
			body = encode(t, code, body)
		}
		h := http.Header{"Content-Length": {"1"}}
		if c.header != "" {
			h.Set("Content-Encoding", c.header)
		}
		r := answer(h, body)
		if err := scrub(r, testVals, nil); err != nil {
			t.Fatalf("%q: %v", c.header, err)
		}
		got, err := io.ReadAll(r.Body)
		if err != nil || string(got) != want {
			t.Errorf("%q: %d bytes %v, want the scrubbed body", c.header, len(got), err)
		}
		if r.Header.Get("Content-Encoding") != "" || r.Header.Get("Content-Length") != "" {
			t.Errorf("%q: the header still says %v", c.header, r.Header)
		}
	}
	for _, header := range []string{"compress", "x-custom", "gzip, aes128gcm", "gzip, gzip, gzip, gzip"} {
		r := answer(http.Header{"Content-Encoding": {header}}, encode(t, "gzip", plain))
		if err := scrub(r, testVals, nil); !errors.As(err, new(*refusal)) {
			t.Errorf("%q: %v, want a refusal", header, err)
		}
	}
	// An empty body (HEAD's) in a coding is no error.
	r := answer(http.Header{"Content-Encoding": {"gzip"}}, nil)
	if err := scrub(r, testVals, nil); err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(r.Body); err != nil || len(b) != 0 {
		t.Errorf("empty gzip body: %q %v", b, err)
	}
	// A corrupt body fails the read: nothing of it is passed on as is.
	r = answer(http.Header{"Content-Encoding": {"gzip"}}, append([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff}, testValue...))
	if err := scrub(r, testVals, nil); err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(r.Body); err == nil || bytes.Contains(b, []byte(testValue)) {
		t.Errorf("corrupt gzip body: %q %v", b, err)
	}
	// Bytes after the coding's end beyond a bound fail the read.
	r = answer(http.Header{"Content-Encoding": {"deflate"}}, append(encode(t, "deflate", plain), make([]byte, 2*maxAfterEnd)...))
	scrub(r, testVals, nil)
	if _, err := io.ReadAll(r.Body); err == nil {
		t.Error("8 KiB after a deflate body's end were dropped silently")
	}
}

// Header values and names: the value is never in what the guest sees.
func TestScrubHeaderNames(t *testing.T) {
	h := http.Header{"X-Echo": {"Bearer " + testValue}, http.CanonicalHeaderKey("x-" + testValue): {"1"}, "Ok": {"ok"}}
	scrubHeader(h, testVals)
	if h.Get("X-Echo") != "Bearer "+testPH || len(h) != 2 || h.Get("Ok") != "ok" {
		t.Errorf("scrubbed header %v", h)
	}
}

// stream.push, fed in random pieces, gives what strings.Replacer gives
// on the whole.
func TestStreamPush(t *testing.T) {
	vals := newValues([]string{"sk-SECRET-1", "PH1", "tok-2", "PH2"})
	body := strings.Repeat("x", 50) + "sk-SECRET-1" + "yy" + "sk-SECRET-1sk-SECRET-1" + "tok-2" + "sk-SECRET"
	want := vals.rep.Replace(body)
	for seed := range uint64(200) {
		rnd := rand.New(rand.NewPCG(seed, 2))
		s := &stream{values: vals}
		var got []byte
		for rest := body; rest != ""; {
			n := min(1+rnd.IntN(7), len(rest))
			out, err := s.push([]byte(rest[:n]), false)
			if err != nil {
				t.Fatal(err)
			}
			got, rest = append(got, out...), rest[n:]
		}
		out, _ := s.push(nil, true)
		if got = append(got, out...); string(got) != want {
			t.Fatalf("seed %d: %q, want %q", seed, got, want)
		}
	}
}

// rwc is an upgraded connection: reads from r, writes to w.
type rwc struct {
	io.Reader
	w bytes.Buffer
}

func (c *rwc) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c *rwc) Close() error                { return nil }

// frame is one WebSocket frame as a server sends it, or (masked) a client.
func frame(fin bool, rsv, op byte, payload []byte, masked bool) []byte {
	b := appendFrame(nil, fin, op, payload)
	b[0] |= rsv
	if masked { // (the payload is left as it is: the proxy refuses it unread)
		head := len(b) - len(payload)
		b[1] |= 0x80
		b = slices.Concat(b[:head], []byte{1, 2, 3, 4}, payload)
	}
	return b
}

// wsFrame is a frame the guest read.
type wsFrame struct {
	fin     bool
	op      byte
	payload []byte
}

func readFrames(t *testing.T, r io.Reader) ([]wsFrame, error) {
	t.Helper()
	var fs []wsFrame
	for {
		var h [10]byte
		if _, err := io.ReadFull(r, h[:2]); err != nil {
			return fs, err
		}
		if h[0]&0x70 != 0 || h[1]&0x80 != 0 {
			t.Fatalf("the guest got a frame with reserved bits or a mask: %x", h[:2])
		}
		n := uint64(h[1] & 0x7f)
		switch n {
		case 126:
			io.ReadFull(r, h[2:4])
			n = uint64(binary.BigEndian.Uint16(h[2:4]))
		case 127:
			io.ReadFull(r, h[2:10])
			n = binary.BigEndian.Uint64(h[2:10])
		}
		p := make([]byte, n)
		if _, err := io.ReadFull(r, p); err != nil {
			return fs, err
		}
		fs = append(fs, wsFrame{h[0]&0x80 != 0, h[0] & 0x0f, p})
	}
}

// A WebSocket message is scrubbed across its frames, control frames
// whole; the guest's writes go up as they are.
func TestWSConnScrubs(t *testing.T) {
	big := strings.Repeat("b", 70000) + testValue
	var up []byte
	up = append(up, frame(true, 0, wsText, []byte("one "+testValue), false)...)
	up = append(up, frame(false, 0, wsText, []byte("two sk-live-"), false)...)
	up = append(up, frame(true, 0, wsPing, []byte("ping "+testValue), false)...)
	up = append(up, frame(false, 0, wsCont, []byte("9f8e7d"), false)...)
	up = append(up, frame(true, 0, wsCont, []byte("6c5b4a end"), false)...)
	up = append(up, frame(true, 0, wsBinary, []byte(big), false)...)
	up = append(up, frame(true, 0, wsText, nil, false)...)
	up = append(up, frame(true, 0, wsClose, append([]byte{3, 232}, "bye "+testValue...), false)...)
	c := &rwc{Reader: bytes.NewReader(up)}
	w := newWSConn(c, testVals, func(string) { t.Error("refused") })
	fs, err := readFrames(t, w)
	if err != io.EOF {
		t.Fatal(err)
	}
	var msgs []string
	var cur []byte
	for _, f := range fs {
		switch {
		case f.op >= wsClose:
			msgs = append(msgs, "control:"+string(f.payload))
		default:
			cur = append(cur, f.payload...)
			if f.fin {
				msgs, cur = append(msgs, string(cur)), nil
			}
		}
	}
	want := []string{"one " + testPH, "control:ping " + testPH, "two " + testPH + " end",
		strings.ReplaceAll(big, testValue, testPH), "", "control:\x03\xe8bye " + testPH}
	if len(msgs) != len(want) {
		t.Fatalf("messages %q", msgs)
	}
	for i := range want {
		if msgs[i] != want[i] {
			t.Errorf("message %d: %.80q, want %.80q", i, msgs[i], want[i])
		}
	}
	w.Write([]byte("guest " + testPH))
	if c.w.String() != "guest "+testPH {
		t.Errorf("upstream got %q", c.w.String())
	}
}

// A frame the proxy cannot read ends the connection with a close frame,
// and is reported; its payload never reaches the guest.
func TestWSConnRefuses(t *testing.T) {
	deflated := encode(t, "deflate-raw", []byte(testValue))
	for name, bad := range map[string][]byte{
		"compressed (rsv1)":  frame(true, 0x40, wsText, deflated, false),
		"masked":             frame(true, 0, wsText, []byte(testValue), true),
		"unknown opcode":     frame(true, 0, 3, []byte(testValue), false),
		"long control":       frame(true, 0, wsPing, bytes.Repeat([]byte(testValue), 7), false),
		"stray continuation": frame(true, 0, wsCont, []byte(testValue), false),
	} {
		var reasons []string
		w := newWSConn(&rwc{Reader: bytes.NewReader(append(frame(true, 0, wsText, []byte("ok"), false), bad...))},
			testVals, func(r string) { reasons = append(reasons, r) })
		fs, err := readFrames(t, w)
		if !errors.Is(err, errWSRefused) {
			t.Errorf("%s: %v", name, err)
		}
		if len(fs) != 2 || string(fs[0].payload) != "ok" || fs[1].op != wsClose || binary.BigEndian.Uint16(fs[1].payload) != wsPolicy {
			t.Errorf("%s: the guest got %v", name, fs)
		}
		for _, f := range fs {
			if bytes.Contains(f.payload, []byte(testValue)) || bytes.Contains(f.payload, deflated) {
				t.Errorf("%s: the guest got the value", name)
			}
		}
		if len(reasons) != 1 {
			t.Errorf("%s: reported %q", name, reasons)
		}
	}
}
