package procs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Stat is what HareBox reads of a process's /proc/PID/stat.
type Stat struct {
	// State is R, S, D, Z (exited, not yet reaped), X, ...
	State byte
	// CPU is its user and system time.
	CPU time.Duration
	// StartTime is when it started, in clock ticks since the host
	// booted: with its PID it names one process, as a PID is used again.
	StartTime uint64
}

// Exited reports whether the process has exited (its parent may not
// have reaped it yet).
func (s Stat) Exited() bool { return s.State == 'Z' || s.State == 'X' }

// clockTick is the unit of /proc/PID/stat's times (USER_HZ, 100 on
// Linux whatever the kernel's own tick).
const clockTick = 10 * time.Millisecond

// ReadStat reads process pid's /proc/PID/stat.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	s, err := ParseStat(b)
	if err != nil {
		return Stat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return s, nil
}

// ParseStat parses the text of a /proc/PID/stat.
func ParseStat(b []byte) (Stat, error) {
	// The command (field 2) may hold spaces and parentheses: the fields
	// are counted from its last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, errors.New("no command")
	}
	f := strings.Fields(string(b[i+1:]))
	// State is field 3, utime and stime 14 and 15, starttime 22: 0,
	// 11, 12 and 19 after ")".
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, errors.New("too short")
	}
	var n [3]uint64
	for j, k := range []int{11, 12, 19} {
		v, err := strconv.ParseUint(f[k], 10, 64)
		if err != nil {
			return Stat{}, fmt.Errorf("field %d: %w", k+3, err)
		}
		n[j] = v
	}
	return Stat{State: f[0][0], CPU: time.Duration(n[0]+n[1]) * clockTick, StartTime: n[2]}, nil
}
