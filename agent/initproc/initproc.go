// Package initproc is the agent's PID 1 in the initramfs: it mounts the
// kernel filesystems, loads the listed modules, then either hands over to
// the root disk's init (switch_root) or stays init, supervising the agent
// service, reaping orphans and powering off on request.
package initproc

import (
	"errors"
	"fmt"
	"log"
	"os"

	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/agent/kmod"
	"github.com/harebox/harebox/agent/layout"
)

// Options configure Run. The zero value is the real PID 1.
type Options struct {
	// ServiceArgs start the service, relative to this binary;
	// default ["serve"].
	ServiceArgs []string
	// Logf logs one progress line; nil logs to stderr (the console).
	Logf func(format string, args ...any)
}

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Hostname is the name the machine boots with; Reseed can change it.
const Hostname = "harebox"

// Run does the PID-1 work. It returns only if staying init fails to start.
func Run(opts Options) error {
	if opts.Logf == nil {
		opts.Logf = log.New(os.Stderr, "harebox-agent: ", 0).Printf
	}
	if len(opts.ServiceArgs) == 0 {
		opts.ServiceArgs = []string{"serve"}
	}
	logf := opts.Logf
	// The kernel starts init with a bare environment.
	if os.Getenv("PATH") == "" {
		os.Setenv("PATH", defaultPath)
	}
	mountAll(logf)
	useConsole(logf)
	logf("init starting (pid %d)", os.Getpid())
	loadModules(layout.ModulesLoad, logf)
	if err := unix.Sethostname([]byte(Hostname)); err != nil {
		logf("set hostname: %v", err)
	}
	if err := loopbackUp(); err != nil {
		logf("lo: %v", err)
	}

	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		logf("read /proc/cmdline: %v", err)
	}
	params := ParseCmdline(string(cmdline))
	// An image whose init is the agent itself (an OCI image without
	// systemd) comes back here after the switch, on the root disk: stay.
	if dev := params[layout.ParamRoot]; dev != "" && inInitramfs() {
		init := params[layout.ParamInit]
		if init == "" {
			init = layout.DefaultInit
		}
		if err := kmod.Stage(layout.ModulesOnDemand, layout.ModulesStagedDir, layout.ModulesStaged); err != nil {
			logf("on-demand modules: %v", err)
		}
		err := switchRoot(dev, init, logf) // returns only on failure
		logf("switch to %s failed: %v; staying init", dev, err)
	}
	return supervise(opts)
}

// inInitramfs reports whether / is still the initramfs (a ramfs or
// tmpfs), not a root disk switched to.
func inInitramfs() bool {
	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err != nil {
		return true
	}
	return st.Type == unix.RAMFS_MAGIC || st.Type == unix.TMPFS_MAGIC
}

type mountSpec struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}

const (
	noSuidDev     = unix.MS_NOSUID | unix.MS_NODEV
	noSuidDevExec = noSuidDev | unix.MS_NOEXEC
)

var mounts = []mountSpec{
	{"proc", "/proc", "proc", noSuidDevExec, ""},
	{"sysfs", "/sys", "sysfs", noSuidDevExec, ""},
	{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
	// gid 5 is "tty" on Debian; with mode 0620 only the owner and tty can
	// write to a terminal.
	{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "ptmxmode=0666,mode=0620,gid=5"},
	{"tmpfs", "/dev/shm", "tmpfs", noSuidDev, "mode=1777"},
	{"tmpfs", "/run", "tmpfs", noSuidDev, "mode=0755"},
	{"tmpfs", "/tmp", "tmpfs", noSuidDev, "mode=1777"},
}

// mountAll mounts the kernel and scratch filesystems. Failures are logged,
// not fatal: a half-working guest the host can still talk to beats a
// kernel panic.
func mountAll(logf func(string, ...any)) {
	for _, m := range mounts {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			logf("mkdir %s: %v", m.target, err)
		}
		err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data)
		if err != nil && !errors.Is(err, unix.EBUSY) {
			logf("mount %s on %s: %v", m.fstype, m.target, err)
		}
	}
	// Links shells expect (process substitution uses /dev/fd).
	for link, target := range map[string]string{
		"/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0",
		"/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2",
	} {
		os.Symlink(target, link)
	}
}

// useConsole points stdio at /dev/console, so progress lines (ours and the
// service's) reach the serial log even when the initramfs had no console
// node for the kernel to open.
func useConsole(logf func(string, ...any)) {
	fd, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		logf("open /dev/console: %v", err)
		return
	}
	for i := 0; i <= 2; i++ {
		unix.Dup3(fd, i, 0)
	}
	if fd > 2 {
		unix.Close(fd)
	}
}

// loadModules loads each module listed in the file at list, in order.
func loadModules(list string, logf func(string, ...any)) {
	loaded, total, err := kmod.LoadList(list)
	if errors.Is(err, kmod.ErrNoList) {
		return
	}
	if err != nil {
		logf("modules: %v", err)
	}
	logf("loaded %d of %d modules", loaded, total)
}

// loopbackUp brings lo up; the kernel then gives it 127.0.0.1 and ::1.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set flags: %w", err)
	}
	return nil
}
