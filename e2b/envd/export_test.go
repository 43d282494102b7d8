package envd

import "time"

// Bounds for the tests.
const (
	MaxWatches      = maxWatches
	MaxQueuedEvents = maxQueuedEvents
)

// SetWatcherIdle makes polled watchers idle after d, until the test ends.
func SetWatcherIdle(d time.Duration) (restore func()) {
	old := watcherIdle
	watcherIdle = d
	return func() { watcherIdle = old }
}
