package qemu_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/backends/qemu"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/internal/procs"
)

// TestLaunchCutShort: a launch whose caller gives up at any point (while
// QEMU daemonizes, before it answers on QMP) leaves no VMM behind. (The
// context kills the process QEMU daemonizes from; a VMM that process had
// forked by then lives on unless the driver kills it, which a run of the
// suite caught once after 150 ms.)
func TestLaunchCutShort(t *testing.T) {
	needQEMU(t)
	d, err := qemu.New(qemu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cut := 0
	for i, after := range []time.Duration{10, 25, 40, 60, 80, 110, 150, 200, 300} {
		after *= time.Millisecond
		spec := minimalSpec(t)
		spec.ID, spec.StateDir = fmt.Sprintf("cut%d", i), filepath.Join(dir, fmt.Sprint(i))
		spec.DataKey = make([]byte, hypervisor.KeySize)
		rand.Read(spec.DataKey)
		ctx, cancel := context.WithTimeout(context.Background(), after)
		m, err := d.Launch(ctx, spec)
		cancel()
		if err == nil {
			m.Kill(context.Background())
			m.Cleanup(context.Background())
			continue
		}
		cut++
		time.Sleep(300 * time.Millisecond) // (a VMM forked late would show by now)
		if ps := procs.Naming(spec.StateDir + "/"); len(ps) > 0 {
			t.Errorf("a launch cut short after %v (%v) left %v", after, err, ps)
			for _, p := range ps {
				syscall.Kill(p.PID, syscall.SIGKILL)
			}
		}
	}
	if cut == 0 {
		t.Error("no launch was cut short: the test checks nothing")
	}
}
