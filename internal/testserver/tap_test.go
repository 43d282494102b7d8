package testserver

import (
	"testing"
	"time"
)

// TestSlowTAP: node --test's TAP (a suite, its subtests, a top-level
// test) gives each test's time, whatever its depth.
func TestSlowTAP(t *testing.T) {
	out := `TAP version 13
# Subtest: walkthrough
    # Subtest: create
    ok 1 - create
      ---
      duration_ms: 1200.5
      ...
    # Subtest: files
    not ok 2 - files
      ---
      duration_ms: 301000
      failureType: 'testCodeFailure'
      ...
    1..2
ok 1 - walkthrough
  ---
  duration_ms: 302250.1
  type: 'suite'
  ...
ok 2 - quick
  ---
  duration_ms: 12
  ...
1..2
# duration_ms 302300
`
	want := "files: 5m1s\nwalkthrough: 5m2.25s"
	if got := SlowTAP(out, 2*time.Second); got != want {
		t.Errorf("SlowTAP:\n%s\nwant\n%s", got, want)
	}
	if got := SlowTAP(out, time.Second); got != "create: 1.201s\n"+want {
		t.Errorf("SlowTAP over 1s:\n%s", got)
	}
	if got := SlowTAP("not TAP\n  duration_ms: 9999999\n", 0); got != "" {
		t.Errorf("SlowTAP of no tests: %q", got)
	}
}
