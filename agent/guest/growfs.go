package guest

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ext4IocResizeFS is EXT4_IOC_RESIZE_FS, _IOW('f', 16, __u64): grow a
// mounted ext4 filesystem to a new block count, as resize2fs does online.
const ext4IocResizeFS = 0x40086610

// GrowFS grows the ext4 filesystem mounted at mnt to fill dev. Each
// sandbox's root disk is a copy-on-write overlay as large as its size asks,
// over a smaller base image; the filesystem follows it in the host-
// controlled init, before the guest's own userland runs. A volume's
// follows its disk when it is mounted (a volume grown while detached).
// It does nothing when the filesystem already fills the device.
func GrowFS(dev, mnt string) (grown bool, err error) {
	f, err := os.Open(dev)
	if err != nil {
		return false, err
	}
	devBytes, err := unix.IoctlGetUint64(int(f.Fd()), unix.BLKGETSIZE64)
	f.Close()
	if err != nil {
		return false, fmt.Errorf("size of %s: %w", dev, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		return false, err
	}
	bsize := uint64(st.Bsize)
	if bsize == 0 {
		return false, fmt.Errorf("statfs %s: block size 0", mnt)
	}
	want := devBytes / bsize
	if want <= st.Blocks+st.Blocks/20 {
		return false, nil // already about full size (f_blocks leaves out metadata)
	}
	d, err := os.Open(mnt)
	if err != nil {
		return false, err
	}
	defer d.Close()
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, d.Fd(), ext4IocResizeFS, uintptr(unsafe.Pointer(&want))); errno != 0 {
		return false, fmt.Errorf("resize %s to %d blocks: %w", mnt, want, errno)
	}
	return true, nil
}
