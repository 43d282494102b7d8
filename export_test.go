package harebox

import (
	"time"

	"github.com/harebox/harebox/internal/stall"
)

// SetStepHook sets the hook called at each step of a golden boot and of a
// pool refill (stepHook), for the crash tests' child engine.
func SetStepHook(f func(step, dir string)) { stepHook = f }

// SetMoveTiming sets how long a sandbox handed over waits for its source
// before its target takes it up on its own, and how often engines look
// (engines started after the call).
func SetMoveTiming(stale, every time.Duration) { moveStale, moveEvery = stale, every }

// SetBootStall sets when o's engine counts a cold boot as stalled: idle
// for idle, or cpu used, looked at every 200 ms.
func SetBootStall(o *Options, idle, cpu time.Duration) {
	o.bootStall = stall.Rule{Idle: idle, CPU: cpu, Every: 200 * time.Millisecond}
}
