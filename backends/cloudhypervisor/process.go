package cloudhypervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/hypervisor"
)

// pidFD watches and signals one process through a pidfd, which keeps
// naming that process even if its pid is reused, and works whether or not
// the VMM is our child (after an engine restart it is not).
type pidFD struct {
	mu sync.Mutex
	fd int // -1 once closed
}

func openPidFD(pid int) (*pidFD, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, err
	}
	unix.CloseOnExec(fd)
	return &pidFD{fd: fd}, nil
}

// exited reports whether the process has exited (pidfd readable).
func (p *pidFD) exited() bool {
	done, _ := p.poll(0)
	return done
}

// poll waits up to ms milliseconds for the process to exit.
func (p *pidFD) poll(ms int) (bool, error) {
	p.mu.Lock()
	fd := p.fd
	p.mu.Unlock()
	if fd < 0 {
		return true, nil
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("poll pidfd: %w", err)
		}
		return n > 0 && fds[0].Revents&(unix.POLLIN|unix.POLLHUP|unix.POLLERR) != 0, nil
	}
}

// wait blocks until the process exits or ctx is done. Poll runs in short
// slices so a cancelled ctx is noticed promptly without a second fd.
func (p *pidFD) wait(ctx context.Context) error {
	for {
		done, err := p.poll(50)
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// kill sends SIGKILL; a process that is already gone is not an error.
func (p *pidFD) kill() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fd < 0 {
		return nil
	}
	err := unix.PidfdSendSignal(p.fd, unix.SIGKILL, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	return err
}

func (p *pidFD) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fd >= 0 {
		unix.Close(p.fd)
		p.fd = -1
	}
}

// adoptPid opens a pidfd for pid and checks, after opening it, that the
// process is our VMM: its command line carries "path=<apiSocket>". A pid
// alone may have been reused by anything since the handle was saved.
func adoptPid(pid int, apiSocket string) (*pidFD, error) {
	if pid <= 1 {
		return nil, hypervisor.Errorf(hypervisor.ErrNotFound, "no VMM with pid %d", pid)
	}
	p, err := openPidFD(pid)
	if err != nil {
		return nil, hypervisor.Errorf(hypervisor.ErrNotFound, "VMM pid %d: %v", pid, err)
	}
	if !cmdlineHasSocket(pid, apiSocket) {
		p.close()
		return nil, hypervisor.Errorf(hypervisor.ErrNotFound, "pid %d is not the VMM for %s", pid, apiSocket)
	}
	if p.exited() {
		p.close()
		return nil, hypervisor.Errorf(hypervisor.ErrNotFound, "VMM pid %d has exited", pid)
	}
	return p, nil
}

func cmdlineHasSocket(pid int, apiSocket string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	want := []byte("path=" + apiSocket)
	for _, arg := range bytes.Split(b, []byte{0}) {
		if bytes.Equal(arg, want) {
			return true
		}
	}
	return false
}

// killAndWait stops a process and waits briefly for it to go.
func killAndWait(p *pidFD) error {
	if err := p.kill(); err != nil {
		return fmt.Errorf("kill VMM: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return p.wait(ctx)
}
