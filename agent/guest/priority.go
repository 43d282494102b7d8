package guest

import (
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// The agent's unit starts it at a raised priority (Nice=-15,
// images.agentUnit): while a guest boots, the agent shares its CPU with
// systemd's units, and the host waits on the agent alone (1.3 s less to
// the first command under TCG). A process inherits the priority of the
// thread that forked it, so before the agent starts its first command
// every thread of the agent goes back to the default: no command of the
// tenant's runs raised.

var unboostOnce sync.Once

// unboost sets every thread of the agent to nice 0, once.
func unboost() {
	unboostOnce.Do(func() {
		// (Twice: a thread made during the first pass took its
		// creator's priority.)
		for range 2 {
			tasks, err := os.ReadDir("/proc/self/task")
			if err != nil {
				return
			}
			for _, t := range tasks {
				if tid, err := strconv.Atoi(t.Name()); err == nil {
					unix.Setpriority(unix.PRIO_PROCESS, tid, 0)
				}
			}
		}
	})
}
