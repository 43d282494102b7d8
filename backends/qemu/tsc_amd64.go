package qemu

import (
	"sync"
	"time"
)

func rdtsc() uint64

var (
	tscOnce sync.Once
	tscKHz  int64
)

// hostTSCKHz measures the host's TSC rate. Under TCG the guest's TSC is
// the host's, and the guest kernel's own calibration against the emulated
// PIT fails when the host is busy (the boot then hangs), so the backend
// passes this rate as tsc_early_khz.
func hostTSCKHz() int64 {
	tscOnce.Do(func() {
		t0, c0 := time.Now(), rdtsc()
		time.Sleep(50 * time.Millisecond)
		t1, c1 := time.Now(), rdtsc()
		if us := t1.Sub(t0).Microseconds(); us > 0 && c1 > c0 {
			tscKHz = int64(c1-c0) * 1000 / us
		}
	})
	return tscKHz
}
