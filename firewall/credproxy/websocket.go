package credproxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
)

// wsConn is an upgraded WebSocket connection to the upstream, as the
// proxy hands it to the guest. What the guest writes goes up as it is.
// What the upstream sends is read frame by frame (RFC 6455 section 5):
// each message's payload is scrubbed as one stream across its frames,
// and passed on in frames of its own (an intermediary may refragment a
// message when no extension is in use, and none is: the proxy offers
// none upstream). Control frames are scrubbed whole. A frame the proxy
// cannot read (reserved bits, as a compressed frame sets; a mask; an
// unknown opcode) ends the connection with a close frame to the guest.
type wsConn struct {
	up      io.ReadWriteCloser
	r       *bufio.Reader
	vals    *values
	refused func(reason string) // hears of a refusal

	out  []byte // frames for the guest, not yet read
	buf  []byte
	left uint64  // payload of the current data frame still to read
	fin  bool    // the current data frame ends its message
	msg  *stream // the message being scrubbed; nil between messages
	op   byte    // its opcode, until its first frame has gone (then 0)
	err  error
}

// wsBuf is how much payload a wsConn reads at a time.
const wsBuf = 32 << 10

// WebSocket opcodes and close codes.
const (
	wsCont, wsText, wsBinary, wsClose, wsPing, wsPong = 0, 1, 2, 8, 9, 10
	wsPolicy                                          = 1008
	maxControl                                        = 125
)

// errWSRefused ends an upgraded connection whose frames the proxy cannot
// read.
var errWSRefused = errors.New("credproxy: a WebSocket frame the proxy cannot scrub; connection closed")

func newWSConn(up io.ReadWriteCloser, v *values, refused func(string)) *wsConn {
	return &wsConn{up: up, r: bufio.NewReaderSize(up, wsBuf), vals: v, buf: make([]byte, wsBuf), refused: refused}
}

func (w *wsConn) Read(p []byte) (int, error) {
	for len(w.out) == 0 && w.err == nil {
		w.err = w.next()
	}
	if len(w.out) == 0 {
		return 0, w.err
	}
	n := copy(p, w.out)
	w.out = w.out[n:]
	return n, nil
}

func (w *wsConn) Write(p []byte) (int, error) { return w.up.Write(p) }
func (w *wsConn) Close() error                { return w.up.Close() }

// CloseWrite passes the guest's half-close on.
func (w *wsConn) CloseWrite() error {
	if cw, ok := w.up.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// next reads the next piece of the upstream's stream: payload of the
// current data frame, or a frame header (and a control frame's payload).
func (w *wsConn) next() error {
	if w.left > 0 {
		n, err := w.r.Read(w.buf[:min(uint64(len(w.buf)), w.left)])
		w.left -= uint64(n)
		if n > 0 {
			if perr := w.data(w.buf[:n], w.left == 0 && w.fin); perr != nil {
				return perr
			}
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	var h [14]byte
	if _, err := io.ReadFull(w.r, h[:2]); err != nil {
		return err // io.EOF between frames: the upstream is done
	}
	fin, rsv, op, masked := h[0]&0x80 != 0, h[0]&0x70, h[0]&0x0f, h[1]&0x80 != 0
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		if _, err := io.ReadFull(w.r, h[2:4]); err != nil {
			return unexpected(err)
		}
		n = uint64(binary.BigEndian.Uint16(h[2:4]))
	case 127:
		if _, err := io.ReadFull(w.r, h[2:10]); err != nil {
			return unexpected(err)
		}
		n = binary.BigEndian.Uint64(h[2:10])
		if n>>63 != 0 {
			return w.refuse("a frame length with its top bit set")
		}
	}
	switch {
	case rsv != 0:
		return w.refuse("reserved bits set (an extension the proxy did not offer)")
	case masked:
		return w.refuse("a masked frame from the server")
	case op >= wsClose:
		if op > wsPong || !fin || n > maxControl {
			return w.refuse("a malformed control frame")
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(w.r, payload); err != nil {
			return unexpected(err)
		}
		w.out = appendFrame(w.out, true, op, w.control(op, payload))
		return nil
	case op == wsCont:
		if w.msg == nil {
			return w.refuse("a continuation frame outside a message")
		}
	case op == wsText || op == wsBinary:
		if w.msg != nil {
			return w.refuse("a new message inside another")
		}
		w.msg, w.op = &stream{values: w.vals}, op
	default:
		return w.refuse("an unknown opcode")
	}
	w.left, w.fin = n, fin
	if n == 0 && fin {
		return w.data(nil, true)
	}
	return nil
}

// data scrubs payload of the current message and frames what may go now.
func (w *wsConn) data(b []byte, end bool) error {
	out, err := w.msg.push(b, end)
	if err != nil {
		return w.refuse("a message that holds back too much around secret values")
	}
	if len(out) == 0 && !end {
		return nil
	}
	w.out = appendFrame(w.out, end, w.op, out)
	w.op = wsCont
	if end {
		w.msg = nil
	}
	return nil
}

// control scrubs a control frame's payload; one the placeholders make too
// long is cut (a close frame keeps its code and loses its reason).
func (w *wsConn) control(op byte, b []byte) []byte {
	if op == wsClose && len(b) >= 2 {
		reason := w.vals.rep.Replace(string(b[2:]))
		if len(reason) > maxControl-2 {
			reason = ""
		}
		return append(b[:2:2], reason...)
	}
	s := w.vals.rep.Replace(string(b))
	return []byte(s[:min(len(s), maxControl)])
}

// refuse ends the connection: a close frame (policy violation) to the
// guest after what was scrubbed so far, then errWSRefused.
func (w *wsConn) refuse(why string) error {
	if w.refused != nil {
		w.refused("WebSocket: " + why)
	}
	reason := "harebox credentials proxy: " + why
	payload := binary.BigEndian.AppendUint16(nil, wsPolicy)
	payload = append(payload, reason[:min(len(reason), maxControl-2)]...)
	w.out = appendFrame(w.out, true, wsClose, payload)
	return errWSRefused
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// appendFrame appends an unmasked frame (a server's) to b.
func appendFrame(b []byte, fin bool, op byte, payload []byte) []byte {
	h := op
	if fin {
		h |= 0x80
	}
	b = append(b, h)
	switch n := len(payload); {
	case n <= 125:
		b = append(b, byte(n))
	case n <= 0xffff:
		b = append(b, 126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, 127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	return append(b, payload...)
}
