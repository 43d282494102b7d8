package credproxy

import (
	"bytes"
	"errors"
	"io"
	"log"
	"log/slog"
	"strings"
)

// scrubber replaces values by placeholders in a stream. It holds back the
// end of what it read that a value could begin with (at most
// len(longest value)-1 bytes), so a value split between two reads is
// still found, and nothing else: a stream's message is passed on whole
// as it comes, not when the next one pushes it out. What holds no value
// (nearly always) is passed on from the buffer it was read into: one
// copy per byte.
type scrubber struct {
	src io.ReadCloser
	*values
	// buf[:n] is read and not yet passed on; ready is what Read passes
	// on next: buf[:cut] (aliased: the rest moves to the front once it
	// has gone) or a replaced copy.
	buf     []byte
	n, cut  int
	ready   []byte
	aliased bool
	err     error
}

// scrubBuf is how much a scrubber reads at a time; maxHold bounds what it
// holds back (values that overlap the cut, again and again: a response
// built to make it buffer without end is cut off instead).
const (
	scrubBuf = 64 << 10
	maxHold  = 1 << 20
)

// errHold ends a response whose values would hold back more than maxHold.
var errHold = errors.New("credproxy: a response holds back more than 1 MiB around secret values; cut off")

// values is what a scrubber looks for: the secret values (longest
// first, see scrub) and the replacer that puts placeholders for them.
type values struct {
	rep  *strings.Replacer
	olds [][]byte
	keep int // the longest value's length - 1
}

// newValues takes value, placeholder pairs.
func newValues(pairs []string) *values {
	v := &values{rep: strings.NewReplacer(pairs...)}
	for i := 0; i < len(pairs); i += 2 {
		v.olds = append(v.olds, []byte(pairs[i]))
		v.keep = max(v.keep, len(pairs[i])-1)
	}
	return v
}

func newScrubber(src io.ReadCloser, pairs []string) *scrubber {
	return &scrubber{src: src, values: newValues(pairs)}
}

func (s *scrubber) Read(p []byte) (int, error) {
	for len(s.ready) == 0 {
		if s.n == 0 && s.err != nil {
			return 0, s.err
		}
		if s.err == nil {
			if s.buf == nil {
				s.buf = make([]byte, scrubBuf+s.keep)
			}
			if s.n == len(s.buf) {
				// (Values that overlap the cut hold it back: rare.)
				if len(s.buf) >= maxHold {
					s.err, s.n = errHold, 0
					return 0, s.err
				}
				s.buf = append(s.buf, make([]byte, scrubBuf)...)
			}
			m, err := s.src.Read(s.buf[s.n:])
			s.n += m
			s.err = err
		}
		s.cut = s.cutAt(s.buf[:s.n], s.err != nil)
		if s.cut == 0 {
			continue
		}
		if s.holds(s.buf[:s.cut]) {
			s.ready = []byte(s.rep.Replace(string(s.buf[:s.cut])))
			s.shift()
		} else {
			s.ready, s.aliased = s.buf[:s.cut], true // the common case
		}
	}
	k := copy(p, s.ready)
	s.ready = s.ready[k:]
	if len(s.ready) == 0 && s.aliased {
		s.aliased = false
		s.shift()
	}
	return k, nil
}

// shift drops buf[:cut], which has been passed on.
func (s *scrubber) shift() {
	s.n = copy(s.buf, s.buf[s.cut:s.n])
	s.cut = 0
}

// cutAt is how much of b may be passed on: all of it at the end of the
// stream, else all but its longest end that begins a value, and never
// through a value (moving the cut back can put it inside another one:
// repeat until it stays).
func (v *values) cutAt(b []byte, end bool) int {
	if end {
		return len(b)
	}
	cut := len(b) - v.partial(b)
	for moved := true; moved; {
		moved = false
		for _, old := range v.olds {
			for i := max(cut-len(old)+1, 0); i < cut; {
				j := bytes.Index(b[i:], old)
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
	return cut
}

// partial is the length of b's longest end that is the beginning of a
// value (and not a whole one).
func (v *values) partial(b []byte) int {
	for k := min(v.keep, len(b)); k > 0; k-- {
		for _, old := range v.olds {
			if k < len(old) && bytes.HasPrefix(old, b[len(b)-k:]) {
				return k
			}
		}
	}
	return 0
}

// holds reports whether b contains a value.
func (v *values) holds(b []byte) bool {
	for _, old := range v.olds {
		if bytes.Contains(b, old) {
			return true
		}
	}
	return false
}

// holdsFold reports whether s contains a value in any letter case (a
// header name: net/http changes its case).
func (v *values) holdsFold(s string) bool {
	s = strings.ToLower(s)
	for _, old := range v.olds {
		if strings.Contains(s, strings.ToLower(string(old))) {
			return true
		}
	}
	return false
}

// stream is a scrubber that is pushed to rather than read from (a
// WebSocket message's frames): push passes on what may go now and holds
// back an end that could begin a value, until more comes or the end.
type stream struct {
	*values
	held []byte
}

func (s *stream) push(b []byte, end bool) ([]byte, error) {
	s.held = append(s.held, b...)
	cut := s.cutAt(s.held, end)
	var out []byte
	if s.holds(s.held[:cut]) {
		out = []byte(s.rep.Replace(string(s.held[:cut])))
	} else {
		out = bytes.Clone(s.held[:cut])
	}
	s.held = s.held[:copy(s.held, s.held[cut:])]
	if len(s.held) > maxHold {
		return nil, errHold
	}
	return out, nil
}

func (s *scrubber) Close() error { return s.src.Close() }

// slogLogger adapts slog for http.Server's error log.
func slogLogger(l *slog.Logger) *log.Logger {
	return slog.NewLogLogger(l.Handler(), slog.LevelInfo)
}
