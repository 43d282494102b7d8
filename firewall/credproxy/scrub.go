package credproxy

import (
	"bytes"
	"io"
	"log"
	"log/slog"
	"strings"
)

// scrubber replaces values by placeholders in a stream. It holds back the
// last len(longest value)-1 bytes of what it read, so a value split
// between two reads is still found.
type scrubber struct {
	src     io.ReadCloser
	rep     *strings.Replacer
	olds    [][]byte
	keep    int
	pending []byte
	buf     []byte
	out     bytes.Buffer
	err     error
}

func newScrubber(src io.ReadCloser, pairs []string) *scrubber {
	s := &scrubber{src: src, rep: strings.NewReplacer(pairs...)}
	for i := 0; i < len(pairs); i += 2 {
		s.olds = append(s.olds, []byte(pairs[i]))
		s.keep = max(s.keep, len(pairs[i])-1)
	}
	return s
}

func (s *scrubber) Read(p []byte) (int, error) {
	for s.out.Len() == 0 && s.err == nil {
		if s.buf == nil {
			s.buf = make([]byte, 64<<10)
		}
		n, err := s.src.Read(s.buf)
		s.pending = append(s.pending, s.buf[:n]...)
		s.err = err
		cut := len(s.pending)
		if err == nil {
			cut = max(len(s.pending)-s.keep, 0)
			// Never cut through a value (moving the cut back can put it
			// inside another one: repeat until it stays).
			for moved := true; moved; {
				moved = false
				for _, old := range s.olds {
					for i := 0; ; {
						j := bytes.Index(s.pending[i:], old)
						if j < 0 {
							break
						}
						start := i + j
						if start < cut && start+len(old) > cut {
							cut, moved = start, true
						}
						i = start + 1
					}
				}
			}
		}
		if s.holds(s.pending[:cut]) {
			s.out.WriteString(s.rep.Replace(string(s.pending[:cut])))
		} else {
			s.out.Write(s.pending[:cut]) // the common case: nothing to replace
		}
		s.pending = append(s.pending[:0], s.pending[cut:]...)
	}
	if s.out.Len() > 0 {
		return s.out.Read(p)
	}
	return 0, s.err
}

// holds reports whether b contains a value.
func (s *scrubber) holds(b []byte) bool {
	for _, old := range s.olds {
		if bytes.Contains(b, old) {
			return true
		}
	}
	return false
}

func (s *scrubber) Close() error { return s.src.Close() }

// slogLogger adapts slog for http.Server's error log.
func slogLogger(l *slog.Logger) *log.Logger {
	return slog.NewLogLogger(l.Handler(), slog.LevelInfo)
}
