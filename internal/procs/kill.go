package procs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// KillVMMs SIGKILLs the VMM processes that name dir on their command
// line, and waits (briefly) until they are gone: a VMM whose handle was
// never recorded because the engine died right after launching it, or one
// no record points at (a golden machine, a pool member). dir is a machine
// directory: the VMM's own sockets, pid file and overlays are in it, and
// no other machine's command line names it. Callers pass only paths
// under the engine's own data directory. It returns how many it stopped.
//
// A VMM caught while it starts may fork as it dies (QEMU's -daemonize
// forks twice: the process a scan saw can leave a child the scan did
// not), so it scans again after every kill, until a scan finds none
// (at most sweepRounds).
func KillVMMs(dir string) int {
	if dir == "" {
		return 0
	}
	n := 0
	for range sweepRounds {
		k := 0
		for _, p := range Naming(dir + "/") {
			// Only VMMs: an operator's `tail -f .../serial.log` is not a stray.
			if p.IsVMM() && killVMM(p.PID, dir+"/") {
				k++
			}
		}
		if k == 0 {
			break
		}
		n += k
	}
	return n
}

// sweepRounds bounds KillVMMs' scans: each round kills what the last one
// left behind (a fork per round at most, QEMU's two then its own).
const sweepRounds = 5

// strayWait bounds the wait for a killed stray to exit.
const strayWait = 5 * time.Second

// killVMM kills pid if it is still a VMM naming marker, and waits for its
// exit. The pid is held by a pidfd while it is checked and signalled, so a
// pid reused since the scan (by an unrelated process) is never hit.
func killVMM(pid int, marker string) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false // (gone)
	}
	defer unix.Close(fd)
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || !bytes.Contains(cmd, []byte(marker)) || !(Proc{PID: pid, Exe: exe}).IsVMM() {
		return false
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		return false
	}
	// The pidfd reads ready once the process has exited (reaped or not).
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for end := time.Now().Add(strayWait); time.Now().Before(end); {
		if n, err := unix.Poll(fds, 100); n > 0 || err != nil && !errors.Is(err, unix.EINTR) {
			break
		}
	}
	return true
}
