package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/internal/procs"
)

// proc identifies a VMM process that may not be our child (it was
// daemonized, and the engine may have restarted since). The pid alone could
// be reused, so it is paired with the kernel's start time for that pid and a
// marker that must appear in its command line.
type proc struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"` // field 22 of /proc/PID/stat
	Marker    string `json:"marker"`     // a unique path on its command line
}

// procStartTime reads field 22 (starttime) of /proc/pid/stat; it also
// reports whether the process is a zombie (already exited).
func procStartTime(pid int) (start uint64, zombie bool, err error) {
	st, err := procs.ReadStat(pid)
	return st.StartTime, st.State == 'Z', err
}

// alive reports whether p still runs (not exited, not a reused pid).
func (p proc) alive() bool {
	start, zombie, err := procStartTime(p.PID)
	if err != nil || zombie || start != p.StartTime {
		return false
	}
	cmd, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/cmdline")
	return err == nil && bytes.Contains(cmd, []byte(p.Marker))
}

// identify fills StartTime for a freshly started pid and checks the marker.
func identify(pid int, marker string) (proc, error) {
	start, _, err := procStartTime(pid)
	if err != nil {
		return proc{}, err
	}
	p := proc{PID: pid, StartTime: start, Marker: marker}
	if !p.alive() {
		return proc{}, fmt.Errorf("pid %d is not the VMM we started", pid)
	}
	return p, nil
}

// wait blocks until p exits or ctx is done. It uses a pidfd, which works for
// processes that are not our children.
func (p proc) wait(ctx context.Context) error {
	fd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return fmt.Errorf("pidfd_open %d: %w", p.PID, err)
	}
	defer unix.Close(fd)
	// The pid may have been reused between the caller's check and pidfd_open.
	if !p.alive() {
		return nil
	}
	for {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 100)
		if err != nil && !errors.Is(err, syscall.EINTR) {
			return fmt.Errorf("poll pidfd: %w", err)
		}
		if n > 0 {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// signal sends sig to p if it is still the process we started.
func (p proc) signal(sig syscall.Signal) error {
	fd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil
		}
		return err
	}
	defer unix.Close(fd)
	if !p.alive() {
		return nil
	}
	// pidfd_send_signal cannot hit a reused pid once the fd is open.
	err = unix.PidfdSendSignal(fd, sig, nil, 0)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// kill sends SIGKILL and waits (bounded) for the exit.
func (p proc) kill(ctx context.Context) error {
	if err := p.signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill %d: %w", p.PID, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return p.wait(ctx)
}
