package initproc

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"time"

	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/agent/guest"
)

const (
	minBackoff = 100 * time.Millisecond
	maxBackoff = 5 * time.Second
	// A service that ran this long was healthy: restart it at once.
	healthyRun = 30 * time.Second
	// How long processes get between SIGTERM and SIGKILL at power-off.
	termGrace = 3 * time.Second
)

// supervisor is PID 1 staying init: it runs the service, restarts it when
// it dies, reaps every orphan and powers off on request. One goroutine owns
// all waiting, so no child's status is ever lost to a second reaper.
type supervisor struct {
	opts    Options
	self    string
	pid     int // the running service, 0 when none
	started time.Time
	backoff time.Duration
	restart *time.Timer
}

func supervise(opts Options) error {
	self, err := os.Executable()
	if err != nil {
		self = "/proc/self/exe"
	}
	s := &supervisor{opts: opts, self: self, backoff: minBackoff}
	if os.Getpid() != 1 {
		// `harebox-agent init` outside PID 1 still reaps its orphans.
		unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	}
	// Ctrl-Alt-Del sends SIGINT to init instead of an instant reboot.
	unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF)

	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGUSR1, unix.SIGUSR2, unix.SIGTERM, unix.SIGINT, unix.SIGPWR)
	power := make(chan int, 1)
	go watchPowerButton("/sys", "/dev", opts.Logf, func() { power <- unix.LINUX_REBOOT_CMD_POWER_OFF })

	s.restart = time.NewTimer(0) // start the service now
	// Signals can coalesce; a slow tick reaps whatever slipped through.
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case sig := <-sigs:
			switch sig {
			case unix.SIGCHLD:
				s.reap()
			case unix.SIGUSR2, unix.SIGPWR:
				s.shutdown(unix.LINUX_REBOOT_CMD_POWER_OFF)
			case unix.SIGUSR1, unix.SIGTERM, unix.SIGINT:
				s.shutdown(unix.LINUX_REBOOT_CMD_RESTART)
			}
		case cmd := <-power:
			s.shutdown(cmd)
		case <-s.restart.C:
			s.startService()
		case <-tick.C:
			s.reap()
		}
	}
}

func (s *supervisor) startService() {
	env := append(os.Environ(), guest.ModeEnv+"=init")
	args := append([]string{s.self}, s.opts.ServiceArgs...)
	p, err := os.StartProcess(s.self, args, &os.ProcAttr{
		Env:   env,
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
	})
	if err != nil {
		s.opts.Logf("start service: %v", err)
		s.scheduleRestart()
		return
	}
	s.pid, s.started = p.Pid, time.Now()
	// We reap with wait4(-1); the handle is not needed.
	p.Release()
	s.opts.Logf("service started (pid %d)", s.pid)
}

func (s *supervisor) scheduleRestart() {
	if time.Since(s.started) > healthyRun {
		s.backoff = minBackoff
	}
	s.restart.Reset(s.backoff)
	s.backoff = min(2*s.backoff, maxBackoff)
}

// reap collects every exited child; the service's death schedules its
// restart.
func (s *supervisor) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if pid == s.pid {
			s.opts.Logf("service (pid %d) %s; restarting", pid, describe(ws))
			s.pid = 0
			s.scheduleRestart()
		}
	}
}

func describe(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return fmt.Sprintf("killed by signal %d", int(ws.Signal()))
	}
	return fmt.Sprintf("exited with %d", ws.ExitStatus())
}

// shutdown stops everything in order and powers off (or reboots): SIGTERM
// to all, a short grace, SIGKILL, sync, then the reboot system call.
func (s *supervisor) shutdown(cmd int) {
	what := "power off"
	if cmd == unix.LINUX_REBOOT_CMD_RESTART {
		what = "reboot"
	}
	s.restart.Stop()
	if os.Getpid() != 1 {
		// Not the machine's init: kill(-1) and reboot would hit the host.
		if s.pid > 0 {
			unix.Kill(s.pid, unix.SIGTERM)
		}
		s.opts.Logf("%s requested, but not PID 1: exiting", what)
		os.Exit(0)
	}
	s.opts.Logf("%s: stopping processes", what)
	unix.Kill(-1, unix.SIGTERM) // every process but us
	if !reapAll(termGrace) {
		unix.Kill(-1, unix.SIGKILL)
		reapAll(time.Second)
	}
	unix.Sync()
	s.opts.Logf("%s", what)
	if err := unix.Reboot(cmd); err != nil {
		s.opts.Logf("%s: %v", what, err)
	}
}

// reapAll reaps until no child is left (true) or the time is up.
func reapAll(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		switch {
		case errors.Is(err, unix.ECHILD):
			return true
		case pid > 0 || errors.Is(err, unix.EINTR):
			continue
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}
