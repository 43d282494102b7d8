package guest

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal pair. It does not use creack/pty because
// that package calls File.Fd() on the master, which switches it to blocking
// mode: read deadlines and Close could then no longer interrupt a read, and
// an exec could leak a goroutine stuck on a terminal a grandchild holds.
func openPTY() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	var n int
	err = control(master, func(fd int) error {
		var e error
		if n, e = unix.IoctlGetInt(fd, unix.TIOCGPTN); e != nil {
			return fmt.Errorf("TIOCGPTN: %w", e)
		}
		if e = unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); e != nil {
			return fmt.Errorf("unlock pty: %w", e)
		}
		return nil
	})
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	name := "/dev/pts/" + strconv.Itoa(n)
	slave, err = os.OpenFile(name, os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("open %s: %w", name, err)
	}
	return master, slave, nil
}

// setWinsize sets the terminal size seen by the processes on the pty.
func setWinsize(f *os.File, rows, cols uint32) error {
	ws := &unix.Winsize{Row: uint16(min(rows, 0xffff)), Col: uint16(min(cols, 0xffff))}
	return control(f, func(fd int) error { return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, ws) })
}

// control runs fn on f's descriptor without making f blocking.
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var fnErr error
	if err := rc.Control(func(fd uintptr) { fnErr = fn(int(fd)) }); err != nil {
		return err
	}
	return fnErr
}
