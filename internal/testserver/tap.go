package testserver

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SlowTAP lists the tests in out, node --test's TAP output, that took
// longer than over, one "name: duration" a line, nested ones under their
// suite's name: a suite that ran long says which of its tests did (the
// Go test logs only its last lines).
func SlowTAP(out string, over time.Duration) string {
	type open struct {
		indent int
		name   string
	}
	var stack []open // the "ok"/"not ok" lines whose YAML block may follow
	var slow []string
	for _, l := range strings.Split(out, "\n") {
		t := strings.TrimLeft(l, " ")
		indent := len(l) - len(t)
		switch {
		case strings.HasPrefix(t, "ok ") || strings.HasPrefix(t, "not ok "):
			for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
				stack = stack[:len(stack)-1]
			}
			_, name, _ := strings.Cut(t, " - ")
			stack = append(stack, open{indent, name})
		case strings.HasPrefix(t, "duration_ms:") && len(stack) > 0:
			top := stack[len(stack)-1]
			ms, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimPrefix(t, "duration_ms:")), 64)
			if err != nil || indent != top.indent+2 {
				continue
			}
			if d := time.Duration(ms * float64(time.Millisecond)); d > over {
				slow = append(slow, fmt.Sprintf("%s: %v", top.name, d.Round(time.Millisecond)))
			}
		}
	}
	return strings.Join(slow, "\n")
}

// LogSlowTAP logs the tests in node --test's TAP output that took over
// 15 s: where a long run's time went.
func LogSlowTAP(t testing.TB, out string) {
	t.Helper()
	if s := SlowTAP(out, 15*time.Second); s != "" {
		t.Logf("node tests over 15 s:\n%s", s)
	}
}
