package transport

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hashicorp/yamux"
)

// The hello is how the host learns that the agent behind a byte stream was
// replaced. A virtio-serial port gives the host no EOF when the guest side
// closes, and a restarted agent answers the old session's keepalive pings
// (they are session-level), while every stream the host had open is gone on
// the new side: calls would hang until their deadline, forever. So every
// session the agent starts opens one stream of its own, right away, and
// writes a hello carrying a random instance nonce. The host expects exactly
// one hello per session; a second one means a new agent session is talking
// into the old host session, which the host then ends and redials.
const (
	helloMagic = "HBHELLO1"
	// HelloSize is the whole hello: the magic and a 16-byte nonce.
	HelloSize = len(helloMagic) + 16
	// HelloTimeout bounds how long the host waits for a hello's bytes
	// once the guest opened its stream.
	HelloTimeout = 5 * time.Second
)

// ErrAgentReplaced ends a host session on which a second agent session
// announced itself: the agent restarted (killed, crashed, OOM-killed).
var ErrAgentReplaced = errors.New("the guest agent restarted")

// ErrSessionEnded is WatchHellos' answer when the session ended for a
// reason other than a hello: it wraps the session's own (the host closed
// it, the link closed, keepalives went unanswered, a protocol error).
var ErrSessionEnded = errors.New("the agent session ended")

// ErrBadHello ends a host session whose guest opened a stream that is not
// a well-formed hello: the guest may open no other streams.
var ErrBadHello = errors.New("the guest opened a stream that is not a hello")

// NewNonce makes a session's hello nonce.
func NewNonce() []byte {
	n := make([]byte, HelloSize-len(helloMagic))
	rand.Read(n)
	return n
}

// SendHello opens the agent's hello stream on a new guest session and
// writes the hello with the session's nonce (NewNonce). Call it once per
// session, right after Server.
func SendHello(s *yamux.Session, nonce []byte) error {
	var b [HelloSize]byte
	copy(b[:], helloMagic)
	if copy(b[len(helloMagic):], nonce) != HelloSize-len(helloMagic) {
		return fmt.Errorf("hello: a nonce of %d bytes", len(nonce))
	}
	st, err := s.Open()
	if err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	defer st.Close()
	st.SetWriteDeadline(time.Now().Add(HelloTimeout))
	if _, err := st.Write(b[:]); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	return nil
}

// WatchHellos accepts the streams the guest opens on a host session until
// the session ends. The first well-formed hello is the agent's, if first
// (nil: always) takes it, given the hello's nonce: first says no when the
// host already used the session with an agent that sends no hello, so a
// hello means a new agent (see client.DialReady). Anything after it (a
// second hello, any other stream) is a reason to end the session, which
// WatchHellos returns (ErrAgentReplaced or ErrBadHello) for the caller to
// record before it closes the session. When the session ended for another
// reason it returns ErrSessionEnded wrapping the session's own. Guests
// that predate the hello send none, which is allowed.
func WatchHellos(s *yamux.Session, first func(nonce []byte) bool) error {
	seen := false
	for {
		st, err := s.Accept()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrSessionEnded, err)
		}
		nonce, ok := readHello(st)
		st.Close()
		switch {
		case !ok && s.IsClosed():
			// The link went as the hello was read (its end never came):
			// the session's own end, not a bad hello.
			return fmt.Errorf("%w: %w", ErrSessionEnded, yamux.ErrSessionShutdown)
		case !ok:
			return ErrBadHello
		case seen || (first != nil && !first(nonce)):
			return ErrAgentReplaced
		}
		seen = true
	}
}

// readHello reads exactly one hello from st, bounded in size and time,
// and returns its nonce.
func readHello(st net.Conn) ([]byte, bool) {
	st.SetReadDeadline(time.Now().Add(HelloTimeout))
	var b [HelloSize + 1]byte
	n, err := io.ReadFull(st, b[:])
	// Exactly HelloSize bytes, then EOF.
	if n != HelloSize || !errors.Is(err, io.ErrUnexpectedEOF) || string(b[:len(helloMagic)]) != helloMagic {
		return nil, false
	}
	return bytes.Clone(b[len(helloMagic):HelloSize]), true
}
