package capacity

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/harebox/harebox/sandbox"
)

func TestReserveNamesTheFieldThatDoesNotFit(t *testing.T) {
	h := New(sandbox.Resources{VCPUs: 4, MemoryMB: 4096, DiskGB: 10}, nil, nil)
	if err := h.Reserve(sandbox.Resources{VCPUs: 2, MemoryMB: 2048, DiskGB: 5}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		res   sandbox.Resources
		field string
	}{
		{sandbox.Resources{VCPUs: 3, MemoryMB: 1, DiskGB: 1}, "size.vcpus"},
		{sandbox.Resources{VCPUs: 1, MemoryMB: 2049, DiskGB: 1}, "size.memory_mb"},
		{sandbox.Resources{VCPUs: 1, MemoryMB: 1, DiskGB: 6}, "size.disk_gb"},
	} {
		err := h.Reserve(c.res)
		var se *sandbox.Error
		if !errors.Is(err, sandbox.ErrCapacity) || !errors.As(err, &se) || se.Field != c.field {
			t.Errorf("Reserve(%+v) = %v, want ErrCapacity on %s", c.res, err, c.field)
		}
	}
	// A refusal reserves nothing.
	if got, want := h.Used(), (sandbox.Resources{VCPUs: 2, MemoryMB: 2048, DiskGB: 5}); got != want {
		t.Fatalf("Used = %+v after refusals, want %+v", got, want)
	}
	h.Release(sandbox.Resources{VCPUs: 2, MemoryMB: 2048, DiskGB: 5})
	if err := h.Reserve(sandbox.Resources{VCPUs: 4, MemoryMB: 4096, DiskGB: 10}); err != nil {
		t.Fatalf("the whole host after a release: %v", err)
	}
}

func TestForceCountsWhatAlreadyRuns(t *testing.T) {
	var changes atomic.Int32
	h := New(sandbox.Resources{VCPUs: 1, MemoryMB: 512, DiskGB: 1}, func() { changes.Add(1) }, nil)
	err := h.Force(sandbox.Resources{VCPUs: 2, MemoryMB: 1024, DiskGB: 2})
	if !errors.Is(err, sandbox.ErrCapacity) {
		t.Fatalf("Force over the limits = %v, want the refusal Reserve would give", err)
	}
	if got := h.Used(); got.VCPUs != 2 || got.MemoryMB != 1024 || got.DiskGB != 2 {
		t.Fatalf("Used = %+v, want the forced reservation counted", got)
	}
	if err := h.Reserve(sandbox.Resources{VCPUs: 1}); err == nil {
		t.Fatal("a reservation on a host over its limits was admitted")
	}
	if changes.Load() != 1 {
		t.Fatalf("changed called %d times, want once (the refused Reserve changes nothing)", changes.Load())
	}
}

func TestConcurrentReservesNeverExceedTheLimit(t *testing.T) {
	h := New(sandbox.Resources{VCPUs: 10, MemoryMB: 1 << 20, DiskGB: 1 << 20}, nil, nil)
	var ok atomic.Int32
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if h.Reserve(sandbox.Resources{VCPUs: 1, MemoryMB: 1, DiskGB: 1}) == nil {
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 10 || h.Used().VCPUs != 10 {
		t.Fatalf("%d of 100 one-vCPU reserves admitted on a 10-vCPU host (used %+v), want 10", ok.Load(), h.Used())
	}
}

func TestLimits(t *testing.T) {
	set := Options{VCPUs: 3, MemoryMB: 700, DiskGB: 9}.Limits(t.TempDir())
	if set != (sandbox.Resources{VCPUs: 3, MemoryMB: 700, DiskGB: 9}) {
		t.Fatalf("set limits = %+v", set)
	}
	got := Options{}.Limits(t.TempDir())
	if got.VCPUs != 4*runtime.NumCPU() {
		t.Errorf("default vCPUs = %d, want 4 per core (%d cores)", got.VCPUs, runtime.NumCPU())
	}
	if mem := hostMemoryMB(); mem == 0 || got.MemoryMB != mem-1024 {
		t.Errorf("default memory = %d MB, want the host's %d MB less 1024", got.MemoryMB, mem)
	}
	if got.DiskGB <= 0 {
		t.Errorf("default disk = %d GB, want the data directory's filesystem", got.DiskGB)
	}
	if half := (Options{CPUOvercommit: 0.5}).Limits(t.TempDir()); half.VCPUs != runtime.NumCPU()/2 {
		t.Errorf("CPUOvercommit 0.5: %d vCPUs, want %d", half.VCPUs, runtime.NumCPU()/2)
	}
}
