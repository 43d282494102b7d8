package testweb

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Echo answers at once, before it reads the request's body, then sends
// the body back as it comes: a stream that answers while its caller is
// still sending, which a proxy in between must carry both ways at once.
func Echo(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	rc.EnableFullDuplex()
	w.WriteHeader(http.StatusOK)
	rc.Flush()
	buf := make([]byte, 4096)
	for {
		n, err := r.Body.Read(buf)
		if n > 0 {
			w.Write(buf[:n])
			rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

// CheckDuplex sends a body through send (which makes the request, to an
// Echo behind whatever is tested) in two lines, the second only once the
// answer has begun and the first came back. It fails if the answer waits
// for the whole body, or if the body does not come back whole.
func CheckDuplex(send func(body io.Reader) (*http.Response, error)) error {
	const wait = 10 * time.Second
	body, feed := io.Pipe()
	defer feed.Close()
	type answer struct {
		resp *http.Response
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := send(body)
		answered <- answer{resp, err}
	}()
	go feed.Write([]byte("first\n"))
	var resp *http.Response
	select {
	case a := <-answered:
		if a.err != nil {
			return a.err
		}
		resp = a.resp
	case <-time.After(wait):
		return errors.New("no answer while the body was still coming")
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	lines := bufio.NewReader(resp.Body)
	for _, want := range []string{"first\n", "second\n"} {
		got := make(chan string, 1)
		go func() { s, _ := lines.ReadString('\n'); got <- s }()
		select {
		case s := <-got:
			if s != want {
				return fmt.Errorf("echoed %q, want %q", s, want)
			}
		case <-time.After(wait):
			return fmt.Errorf("%q not echoed", want)
		}
		if want == "first\n" {
			go func() { feed.Write([]byte("second\n")); feed.Close() }()
		}
	}
	end := make(chan error, 1)
	go func() {
		rest, err := io.ReadAll(lines)
		if err == nil && len(rest) != 0 {
			err = fmt.Errorf("%q after the body", rest)
		}
		end <- err
	}()
	select {
	case err := <-end:
		return err
	case <-time.After(wait):
		return errors.New("the answer did not end after the body")
	}
}
