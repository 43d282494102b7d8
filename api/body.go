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

// A read deadline bounds only the reading of a body. net/http clears it
// when the body's end is first read, and then watches the connection for
// a client that goes away; a deadline still set on that watch fires there
// and cancels the request, however long its work has left (a create that
// boots a VM, an exec). So a deadlineReader sets its deadline as it reads,
// never before, and clears it once its reader says the body ended: a body
// already read by someone else (placement), an empty one, or a read after
// the end leave no deadline behind. A body left unread keeps its
// deadline, so net/http's read of the rest before answering is bounded.

// jsonBody bounds a JSON body in size and in time (Timeouts.Body for the
// whole of it).
func (s *Server) jsonBody(w http.ResponseWriter, r *http.Request) io.Reader {
	return &deadlineReader{r: http.MaxBytesReader(w, r.Body, MaxJSONBody), w: w, rc: http.NewResponseController(w),
		whole: time.Now().Add(s.opts.Timeouts.Body)}
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
	whole    time.Time     // the whole body's deadline, if idle is 0
	idle     time.Duration // > 0: the deadline moves on with each read
	timedOut bool
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	if d.timedOut {
		return 0, errSlowBody
	}
	dl := d.whole
	if d.idle > 0 {
		dl = time.Now().Add(d.idle)
	}
	d.rc.SetReadDeadline(dl)
	n, err := d.r.Read(p)
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		// The rest of the body will not come: the connection is closed
		// after the answer.
		d.timedOut = true
		d.w.Header().Set("Connection", "close")
		err = errSlowBody
	case err == io.EOF:
		d.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}
