package credproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
)

// errSmuggle fails a guest connection whose HTTP/1 framing a lenient
// parser could read two ways: an obs-fold continuation line, a bare CR or
// LF, a header without a colon, or a body with both Content-Length and
// Transfer-Encoding (or several lengths).
var errSmuggle = errors.New("credproxy: ambiguous HTTP/1 framing refused")

// maxHead bounds one request's head.
const maxHead = 64 << 10

// strictConn checks the framing of the HTTP/1.1 requests read through it,
// below net/http's own (lenient) parser: it follows each head, then skips
// its body by Content-Length or chunked coding, request after request, and
// fails the read at the first ambiguity. After an Upgrade it stops looking.
type strictConn struct {
	net.Conn
	err error

	// The current request's head, while it is being read.
	head []byte
	// Body left to pass: plain bytes, or chunked (state below).
	left    int64
	chunked bool
	chunk   []byte // a chunk-size or trailer line being read
	inData  bool   // inside chunk data (left counts it, then CRLF)
	crlf    int    // bytes of the CRLF after chunk data still due
	trailer bool   // reading trailer lines after the last chunk
	upgrade bool   // done: the connection is no longer HTTP
}

func (c *strictConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if n > 0 && !c.upgrade {
		if ferr := c.feed(p[:n]); ferr != nil {
			c.err = ferr
			return 0, ferr
		}
	}
	return n, err
}

// feed follows the stream.
func (c *strictConn) feed(b []byte) error {
	for len(b) > 0 && !c.upgrade {
		switch {
		case c.left > 0:
			k := min(int64(len(b)), c.left)
			b, c.left = b[k:], c.left-k
			if c.left == 0 && c.inData {
				c.inData, c.crlf = false, 2
			}
		case c.crlf > 0:
			if b[0] != "\r\n"[2-c.crlf] {
				return errSmuggle
			}
			b, c.crlf = b[1:], c.crlf-1
		case c.chunked:
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				c.chunk = append(c.chunk, b...)
				b = nil
				if len(c.chunk) > 4096 {
					return errSmuggle
				}
				continue
			}
			line := append(c.chunk, b[:i+1]...)
			c.chunk, b = nil, b[i+1:]
			if err := c.chunkLine(line); err != nil {
				return err
			}
		default:
			i := bytes.Index(b, []byte("\n"))
			if i < 0 {
				c.head = append(c.head, b...)
				b = nil
			} else {
				c.head = append(c.head, b[:i+1]...)
				b = b[i+1:]
				if bytes.HasSuffix(c.head, []byte("\r\n\r\n")) || bytes.Equal(c.head, []byte("\r\n")) {
					if err := c.endHead(); err != nil {
						return err
					}
				}
			}
			if len(c.head) > maxHead {
				return errSmuggle
			}
		}
	}
	return nil
}

// chunkLine takes a chunk-size line or a trailer line.
func (c *strictConn) chunkLine(line []byte) error {
	if !bytes.HasSuffix(line, []byte("\r\n")) || bytes.IndexByte(line[:len(line)-2], '\r') >= 0 {
		return errSmuggle
	}
	s := string(line[:len(line)-2])
	if c.trailer {
		if s == "" {
			c.chunked, c.trailer = false, false // the message ends
		} else if s[0] == ' ' || s[0] == '\t' || !strings.Contains(s, ":") {
			return errSmuggle
		}
		return nil
	}
	size, _, _ := strings.Cut(s, ";")
	n, err := strconv.ParseInt(strings.TrimSpace(size), 16, 64)
	if err != nil || n < 0 {
		return errSmuggle
	}
	if n == 0 {
		c.trailer = true
		return nil
	}
	c.left, c.inData = n, true
	return nil
}

// endHead checks a complete head and sets up its body.
func (c *strictConn) endHead() error {
	head := c.head
	c.head = nil
	if bytes.Equal(head, []byte("\r\n")) {
		return nil // a blank line between requests
	}
	lines := strings.Split(strings.TrimSuffix(string(head), "\r\n\r\n"), "\r\n")
	var lengths []string
	te := false
	for i, l := range lines {
		if strings.ContainsAny(l, "\r\n") {
			return errSmuggle // a bare CR or LF
		}
		if i == 0 {
			continue
		}
		if l == "" || l[0] == ' ' || l[0] == '\t' {
			return errSmuggle // obs-fold
		}
		k, v, ok := strings.Cut(l, ":")
		if !ok || strings.TrimSpace(k) != k {
			return errSmuggle
		}
		switch strings.ToLower(k) {
		case "content-length":
			lengths = append(lengths, strings.TrimSpace(v))
		case "transfer-encoding":
			te = true
			if !strings.EqualFold(strings.TrimSpace(v), "chunked") {
				return errSmuggle
			}
		case "upgrade":
			c.upgrade = true
		}
	}
	switch {
	case te && len(lengths) > 0, len(lengths) > 1:
		return errSmuggle
	case te:
		c.chunked = true
	case len(lengths) == 1:
		n, err := strconv.ParseInt(lengths[0], 10, 64)
		if err != nil || n < 0 {
			return errSmuggle
		}
		c.left = n
	}
	return nil
}

var _ io.Reader = (*strictConn)(nil)
