package api

import (
	"errors"
	"io"
	"net"
	"net/http"
	"time"
)

// errSlowBody is what a request gets when its body does not arrive in
// time; the connection's read deadline is what fires.
var errSlowBody = apiError{status: http.StatusRequestTimeout, code: "timeout", msg: "the request body did not arrive in time"}

// The deadlines set here need no clearing: once the body is read to its
// end, net/http clears the read deadline itself before it watches the
// connection for a client that goes away; a body left unread keeps its
// deadline, so net/http's read of the rest before answering is bounded too.

// jsonBody bounds a JSON body in size and in time (Timeouts.Body for the
// whole of it).
func (s *Server) jsonBody(w http.ResponseWriter, r *http.Request) io.Reader {
	d := &deadlineReader{r: http.MaxBytesReader(w, r.Body, MaxJSONBody), w: w, rc: http.NewResponseController(w)}
	d.rc.SetReadDeadline(time.Now().Add(s.opts.Timeouts.Body))
	return d
}

// streamBody bounds a streamed body (a file upload) by its pauses: each
// read must bring bytes within Timeouts.BodyIdle, however long the whole
// upload takes.
func (s *Server) streamBody(w http.ResponseWriter, r *http.Request) io.Reader {
	return &deadlineReader{r: r.Body, w: w, rc: http.NewResponseController(w), idle: s.opts.Timeouts.BodyIdle}
}

type deadlineReader struct {
	r        io.Reader
	w        http.ResponseWriter
	rc       *http.ResponseController
	idle     time.Duration // > 0: the deadline moves on with each read
	timedOut bool
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	if d.timedOut {
		return 0, errSlowBody
	}
	if d.idle > 0 {
		d.rc.SetReadDeadline(time.Now().Add(d.idle))
	}
	n, err := d.r.Read(p)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		// The rest of the body will not come: the connection is closed
		// after the answer.
		d.timedOut = true
		d.w.Header().Set("Connection", "close")
		err = errSlowBody
	}
	return n, err
}
