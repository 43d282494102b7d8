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
func KillVMMs(dir string) int {
	if dir == "" {
		return 0
	}
	return killVMMs(dir, Naming)
}

// killVMMs is KillVMMs over a scan (Naming; a test's in its tests).
//
// A VMM caught while it starts forks as it goes: QEMU's -daemonize forks
// twice, and the middle process exits as soon as it has forked the VMM
// proper. A scan is a snapshot, so it can list that middle process, which
// is gone (a zombie with no command line: not killed) by the time it is
// killed, and miss the fork it left, made after the snapshot. So the
// sweep ends only after two scans in a row found nothing: the fork, alive
// at the second one's snapshot, is in it. (A round that found a VMM and
// killed none is not an end: that is the case above.) At most
// sweepRounds scans.
func killVMMs(dir string, scan func(string) []Proc) int {
	n, empty := 0, 0
	for range sweepRounds {
		found := 0
		for _, p := range scan(dir + "/") {
			// Only VMMs: an operator's `tail -f .../serial.log` is not a stray.
			if !p.IsVMM() {
				continue
			}
			found++
			if killVMM(p.PID, dir+"/") {
				n++
			}
		}
		if found > 0 {
			empty = 0
		} else if empty++; empty == 2 {
			break
		}
	}
	return n
}

// sweepRounds bounds KillVMMs' scans: each kills what the last one left
// behind (a fork per round at most: QEMU's two, then its own), and two
// more find none.
const sweepRounds = 8

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
