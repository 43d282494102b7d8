package guest

import (
	"encoding/binary"
	"unsafe"

	"golang.org/x/sys/unix"
)

func putInt32(b []byte, v int32) { binary.NativeEndian.PutUint32(b, uint32(v)) }

// ioctlPtr issues an ioctl whose argument is a pointer (or nil).
func ioctlPtr(fd int, req uint, arg *byte) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(arg)))
	if errno != 0 {
		return errno
	}
	return nil
}
