package credproxy

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
)

// The answer path: every way an answer on an intercepted connection can
// carry bytes back to the guest, and what the proxy does with each.
//
//   - Header and trailer values: scrubbed. A header or trailer whose name
//     holds a value (in any case) is dropped.
//   - 1xx answers (103 Early Hints): their headers are scrubbed as they
//     are written to the guest.
//   - 3xx answers: scrubbed as any answer (Location is a header); never
//     followed.
//   - The body, identity or chunked (HTTP/1) or DATA frames (HTTP/2):
//     scrubbed as a stream, a value split across reads or chunks included.
//     Chunk extensions are dropped by net/http's reader.
//   - A content-coding (the proxy asks for identity; an upstream may
//     ignore that): gzip, x-gzip, deflate (zlib or raw), br and zstd are
//     decoded, at most maxCodings of them stacked, and the decoded body is
//     scrubbed and passed on as identity. Any other coding, or more of
//     them, is refused: a 502 to the guest and OnRefused.
//   - WebSocket, after the handshake: frames are read and each message's
//     payload scrubbed across its frames (wsConn). No extension is
//     offered upstream; an answer naming one, or a frame using reserved
//     bits, is refused. Any other upgrade is refused.
//   - Bytes the upstream sends after its answer on the connection: never
//     passed on (net/http reads them as no answer, or as the next answer,
//     which is scrubbed in turn).
//
// What the proxy cannot see: a value the upstream transforms (hashes,
// encrypts, re-encodes as base64 or hex, changes its case, splits across
// answers or messages, or sends inside a payload that is itself
// compressed, such as a .gz file served as application/gzip).

// maxCodings bounds how many content-codings an answer may stack.
const maxCodings = 3

// maxAfterEnd bounds what is read, and dropped, after an encoded body's
// end to reach the answer's end (and its trailers).
const maxAfterEnd = 4 << 10

// zstdWindow bounds the memory a zstd decoder may ask for.
const zstdWindow = 8 << 20

// refusal is an answer the proxy will not pass on: the guest gets a 502
// saying why, and the sandbox's OnRefused hears of it.
type refusal struct{ reason string }

func (r *refusal) Error() string { return "credproxy: answer refused: " + r.reason }

func refuse(format string, args ...any) error { return &refusal{reason: fmt.Sprintf(format, args...)} }

// pairs returns the sandbox's value, placeholder pairs, longest value
// first (where one value begins another, the longer one is replaced
// whole: a Replacer takes the first pair that matches); nil if it has no
// values.
func (s *Sandbox) pairs() []string {
	var rules []*Rule
	for i := range s.Rules {
		if s.Rules[i].Value != "" {
			rules = append(rules, &s.Rules[i])
		}
	}
	sort.SliceStable(rules, func(i, j int) bool { return len(rules[i].Value) > len(rules[j].Value) })
	var pairs []string
	for _, r := range rules {
		pairs = append(pairs, r.Value, r.Placeholder)
	}
	return pairs
}

// scrubHeader replaces values by placeholders in h, and drops a field
// whose name holds a value.
func scrubHeader(h http.Header, v *values) {
	if v == nil {
		return
	}
	for k, vs := range h {
		if v.holdsFold(k) {
			delete(h, k)
			continue
		}
		for j, x := range vs {
			vs[j] = v.rep.Replace(x)
		}
	}
}

// scrub makes an answer safe to pass on: headers scrubbed, content-codings
// undone and the body scrubbed, an upgrade checked and its frames
// scrubbed. An error is a refusal; refused hears of one found later
// (in a WebSocket's frames).
func scrub(r *http.Response, v *values, refused func(reason string)) error {
	if v == nil {
		return nil
	}
	scrubHeader(r.Header, v)
	if r.StatusCode == http.StatusSwitchingProtocols {
		if up := r.Header.Get("Upgrade"); !strings.EqualFold(up, "websocket") {
			return refuse("an upgrade to %q, whose bytes the proxy cannot read", up)
		}
		if ext := r.Header.Get("Sec-WebSocket-Extensions"); ext != "" {
			return refuse("a WebSocket extension the proxy did not offer (%q)", ext)
		}
		rw, ok := r.Body.(io.ReadWriteCloser)
		if !ok {
			return errors.New("credproxy: an upgrade without a connection")
		}
		r.Body = newWSConn(rw, v, refused)
		return nil
	}
	if r.Body == nil {
		return nil
	}
	if err := decode(r); err != nil {
		return err
	}
	r.Body = &scrubber{src: r.Body, values: v}
	r.ContentLength = -1
	r.Header.Del("Content-Length")
	return nil
}

// decode undoes r's content-codings (outermost first), or refuses one it
// does not know.
func decode(r *http.Response) error {
	var codings []string
	for _, f := range r.Header.Values("Content-Encoding") {
		for c := range strings.SplitSeq(f, ",") {
			c = strings.ToLower(strings.TrimSpace(c))
			switch c {
			case "", "identity":
			case "gzip", "x-gzip", "deflate", "br", "zstd":
				codings = append(codings, c)
			default:
				return refuse("the content-coding %q, which the proxy cannot undo to scrub", c)
			}
		}
	}
	if len(codings) > maxCodings {
		return refuse("%d content-codings stacked (at most %d)", len(codings), maxCodings)
	}
	for i := len(codings) - 1; i >= 0; i-- {
		r.Body = &decoder{src: r.Body, coding: codings[i]}
	}
	r.Header.Del("Content-Encoding")
	return nil
}

// decoder undoes one content-coding. It starts on the first read (an
// empty body, as HEAD's, is no error), and at the coding's end reads the
// rest of src (at most maxAfterEnd bytes, dropped) so that the answer's
// trailers arrive.
type decoder struct {
	src    io.ReadCloser
	coding string
	br     *bufio.Reader // src, read through
	r      io.Reader
	close  func()
	done   bool
}

func (d *decoder) Read(p []byte) (int, error) {
	if d.done {
		return 0, io.EOF
	}
	if d.r == nil {
		if err := d.start(); err != nil {
			return 0, err
		}
	}
	n, err := d.r.Read(p)
	if err == io.EOF {
		d.done = true
		if m, _ := io.CopyN(io.Discard, d.br, maxAfterEnd+1); m > maxAfterEnd {
			return n, fmt.Errorf("credproxy: more than %d bytes after the %s body's end", maxAfterEnd, d.coding)
		}
	}
	return n, err
}

func (d *decoder) start() error {
	br := bufio.NewReader(d.src)
	d.br = br
	if _, err := br.Peek(1); err == io.EOF {
		d.r = br // empty
		return nil
	}
	switch d.coding {
	case "gzip", "x-gzip":
		z, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("credproxy: gzip body: %w", err)
		}
		d.r, d.close = z, func() { z.Close() }
	case "deflate":
		// zlib, as RFC 9110 says; some servers send raw deflate.
		h, _ := br.Peek(2)
		if len(h) == 2 && h[0]&0x0f == 8 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0 {
			z, err := zlib.NewReader(br)
			if err != nil {
				return fmt.Errorf("credproxy: deflate body: %w", err)
			}
			d.r, d.close = z, func() { z.Close() }
		} else {
			f := flate.NewReader(br)
			d.r, d.close = f, func() { f.Close() }
		}
	case "br":
		d.r = brotli.NewReader(br)
	case "zstd":
		z, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(zstdWindow))
		if err != nil {
			return fmt.Errorf("credproxy: zstd body: %w", err)
		}
		d.r, d.close = z, z.Close
	}
	return nil
}

func (d *decoder) Close() error {
	if d.close != nil {
		d.close()
	}
	return d.src.Close()
}
