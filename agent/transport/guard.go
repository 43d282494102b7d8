package transport

import (
	"encoding/binary"
	"errors"
	"io"
	"time"
)

// MaxPingsPerSecond bounds the pings a peer may ask the host to answer.
// yamux answers each ping in a goroutine of its own that may wait seconds
// to write, so a guest flooding pings while not reading would make the
// host spawn goroutines without bound.
const MaxPingsPerSecond = 64

// ErrPingFlood ends a session whose peer sends pings faster than that.
var ErrPingFlood = errors.New("transport: peer floods pings")

// yamux frame header: version(1) type(1) flags(2) stream(4) length(4).
const (
	headerSize = 12
	typeData   = 0
	typePing   = 2
	flagSYN    = 1
)

// pingGuard follows the yamux frames a peer sends and fails the read when
// the peer asks for too many ping replies.
type pingGuard struct {
	r           io.Reader
	hdr         [headerSize]byte
	hdrN        int
	payloadLeft uint32
	window      time.Time
	pings       int
}

func (g *pingGuard) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	if n > 0 {
		if gerr := g.scan(p[:n]); gerr != nil {
			return 0, gerr
		}
	}
	return n, err
}

func (g *pingGuard) scan(b []byte) error {
	for len(b) > 0 {
		if g.payloadLeft > 0 {
			k := uint32(len(b))
			if k > g.payloadLeft {
				k = g.payloadLeft
			}
			b, g.payloadLeft = b[k:], g.payloadLeft-k
			continue
		}
		k := copy(g.hdr[g.hdrN:], b)
		g.hdrN, b = g.hdrN+k, b[k:]
		if g.hdrN < headerSize {
			return nil
		}
		g.hdrN = 0
		switch g.hdr[1] {
		case typeData:
			g.payloadLeft = binary.BigEndian.Uint32(g.hdr[8:])
		case typePing:
			if binary.BigEndian.Uint16(g.hdr[2:])&flagSYN == 0 {
				continue // an answer to our own ping
			}
			if now := time.Now(); now.Sub(g.window) > time.Second {
				g.window, g.pings = now, 0
			}
			if g.pings++; g.pings > MaxPingsPerSecond {
				return ErrPingFlood
			}
		}
	}
	return nil
}

// guarded is the host's view of the byte stream: reads go through the
// ping guard.
type guarded struct {
	io.Reader
	io.WriteCloser
}
