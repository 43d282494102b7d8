//go:build !amd64

package qemu

// hostTSCKHz is unknown off x86-64; the guest calibrates by itself.
func hostTSCKHz() int64 { return 0 }
