package initproc

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/agent/guest"
)

const (
	newRoot       = "/newroot"
	deviceTimeout = 10 * time.Second
)

// switchRoot mounts dev (ext4) and makes it the root, then execs init on
// it, as switch_root(8) does. It returns only on failure, before the point
// of no return where it can.
func switchRoot(dev, init string, logf func(string, ...any)) error {
	if err := waitForDevice(dev, deviceTimeout); err != nil {
		return err
	}
	if err := os.MkdirAll(newRoot, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dev, newRoot, "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount %s: %w", dev, err)
	}
	// init is usually an absolute symlink (/sbin/init -> /lib/systemd/
	// systemd), so only check that something is there.
	if _, err := os.Lstat(filepath.Join(newRoot, init)); err != nil {
		unix.Unmount(newRoot, 0)
		return fmt.Errorf("no %s on %s: %w", init, dev, err)
	}
	if grown, err := guest.GrowFS(dev, newRoot); err != nil {
		logf("root filesystem not grown to the disk: %v", err)
	} else if grown {
		logf("grew the root filesystem to fill %s", dev)
	}
	logf("mounted %s, switching to %s", dev, init)

	for _, m := range []string{"/dev", "/proc", "/sys", "/run"} {
		target := filepath.Join(newRoot, m)
		os.MkdirAll(target, 0o755)
		if err := unix.Mount(m, target, "", unix.MS_MOVE, ""); err != nil {
			logf("move %s: %v", m, err)
		}
	}
	// The initramfs /tmp would be hidden under the new root; drop it.
	unix.Unmount("/tmp", unix.MNT_DETACH)

	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("chdir: %w", err)
	}
	// Free the initramfs's memory: nothing will see it again.
	freeRamfs(logf)
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	err := unix.Exec(init, []string{init}, os.Environ())
	return fmt.Errorf("exec %s: %w", init, err)
}

// waitForDevice waits for dev to appear: virtio-blk may probe a little
// after its module loaded.
func waitForDevice(dev string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		_, err := os.Stat(dev)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %v: %w", dev, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freeRamfs deletes the initramfs's files. It refuses unless it is PID 1
// and / really is a ramfs or tmpfs, so a mistaken run can never delete a
// disk; it never crosses into another filesystem (the new root, mounts).
func freeRamfs(logf func(string, ...any)) {
	if os.Getpid() != 1 {
		return
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs("/", &sfs); err != nil {
		return
	}
	if sfs.Type != unix.RAMFS_MAGIC && sfs.Type != unix.TMPFS_MAGIC {
		logf("/ is not a ramfs; leaving it alone")
		return
	}
	var st unix.Stat_t
	if err := unix.Lstat("/", &st); err != nil {
		return
	}
	removeSameDev("/", st.Dev)
}

func removeSameDev(dir string, dev uint64) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil || st.Dev != dev {
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			removeSameDev(p, dev)
			unix.Rmdir(p)
			continue
		}
		unix.Unlink(p)
	}
}
