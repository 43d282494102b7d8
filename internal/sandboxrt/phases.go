package sandboxrt

import (
	"maps"
	"sync"
	"time"

	"github.com/harebox/harebox/monitor"
)

// phases times the steps of one create, for its result and the server's
// metrics. A nil *phases records nothing (Start, resume).
type phases struct {
	began, last time.Time
	ms          map[string]float64
}

func newPhases(start time.Time) *phases {
	return &phases{began: start, last: start, ms: map[string]float64{}}
}

// mark ends the step name: the time since the last mark is its.
func (p *phases) mark(name string) {
	if p == nil {
		return
	}
	now := time.Now()
	p.ms[name] += float64(now.Sub(p.last).Microseconds()) / 1000
	p.last = now
}

// createStats accumulates CreateStats by how creates were served.
type createStats struct {
	mu sync.Mutex
	m  map[string]*monitor.CreateStats
}

func (s *createStats) add(served string, total time.Duration, p *phases) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*monitor.CreateStats{}
	}
	c := s.m[served]
	if c == nil {
		c = &monitor.CreateStats{Phases: map[string]float64{}}
		s.m[served] = c
	}
	c.Count++
	c.Seconds += total.Seconds()
	for k, v := range p.ms {
		if k != "total" {
			c.Phases[k] += v / 1000
		}
	}
}

func (s *createStats) snapshot() map[string]monitor.CreateStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]monitor.CreateStats{}
	for k, c := range s.m {
		out[k] = monitor.CreateStats{Count: c.Count, Seconds: c.Seconds, Phases: maps.Clone(c.Phases)}
	}
	return out
}
