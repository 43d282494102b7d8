package qemu

import (
	"cmp"
	"slices"
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
// passes this rate as tsc_early_khz, and the guest keeps time by it for
// good (tsc=reliable): it must be right. Each of seven 15 ms samples
// reads the TSC between two clock reads; a thread preempted there gets
// them far apart. The median of the three samples whose clock reads were
// closest is the rate.
func hostTSCKHz() int64 {
	tscOnce.Do(func() {
		type sample struct {
			khz  int64
			span time.Duration // of the clock reads around the TSC's
		}
		var samples []sample
		for range 7 {
			ta, c0, tb := time.Now(), rdtsc(), time.Now()
			time.Sleep(15 * time.Millisecond)
			tc, c1, td := time.Now(), rdtsc(), time.Now()
			ns := tc.Add(td.Sub(tc) / 2).Sub(ta.Add(tb.Sub(ta) / 2)).Nanoseconds()
			if ns > 0 && c1 > c0 {
				samples = append(samples, sample{int64((c1 - c0) * 1_000_000 / uint64(ns)), tb.Sub(ta) + td.Sub(tc)})
			}
		}
		slices.SortFunc(samples, func(a, b sample) int { return cmp.Compare(a.span, b.span) })
		best := samples[:min(3, len(samples))]
		slices.SortFunc(best, func(a, b sample) int { return cmp.Compare(a.khz, b.khz) })
		if len(best) > 0 {
			tscKHz = best[len(best)/2].khz
		}
	})
	return tscKHz
}
