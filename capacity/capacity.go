// Package capacity is a host's admission: what its sandboxes may reserve
// (limits computed from the machine, or set), and what they reserve now.
// A sandbox reserves its size for as long as it may run.
package capacity

import (
	"bufio"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/sandbox"
)

// Options bound the resources sandboxes may reserve on this host.
type Options struct {
	// CPUOvercommit multiplies the host's cores (default 4).
	CPUOvercommit float64
	// MemoryOvercommit multiplies the host's memory (default 1: never more
	// guest memory than the host has, so the host does not swap).
	MemoryOvercommit float64
	// ReserveMB is kept for the host itself (default 1024).
	ReserveMB int
	// DiskOvercommit multiplies the size of the data directory's filesystem
	// for the sandboxes' disks (default 1: a guest that fills its disk
	// cannot fill the host's).
	DiskOvercommit float64
	// VCPUs, MemoryMB and DiskGB, when set, replace the computed limits.
	VCPUs    int
	MemoryMB int
	DiskGB   int
}

// Limits are o's limits on this machine, whose sandboxes' disks are in
// dataDir's filesystem.
func (o Options) Limits(dataDir string) sandbox.Resources {
	if o.CPUOvercommit == 0 {
		o.CPUOvercommit = 4
	}
	if o.MemoryOvercommit == 0 {
		o.MemoryOvercommit = 1
	}
	if o.ReserveMB == 0 {
		o.ReserveMB = 1024
	}
	if o.DiskOvercommit == 0 {
		o.DiskOvercommit = 1
	}
	r := sandbox.Resources{VCPUs: o.VCPUs, MemoryMB: o.MemoryMB, DiskGB: o.DiskGB}
	if r.DiskGB == 0 {
		var st unix.Statfs_t
		if err := unix.Statfs(dataDir, &st); err == nil {
			r.DiskGB = int(float64(st.Blocks*uint64(st.Bsize)>>30) * o.DiskOvercommit)
		}
	}
	if r.VCPUs == 0 {
		r.VCPUs = int(float64(runtime.NumCPU()) * o.CPUOvercommit)
	}
	if r.MemoryMB == 0 {
		r.MemoryMB = int(float64(hostMemoryMB())*o.MemoryOvercommit) - o.ReserveMB
	}
	return r
}

// hostMemoryMB reads MemTotal from /proc/meminfo.
func hostMemoryMB() int {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if f := strings.Fields(s.Text()); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.Atoi(f[1])
			return kb / 1024
		}
	}
	return 0
}

// Host is what a host's sandboxes reserve against its limits. It is safe
// for concurrent use.
type Host struct {
	limit sandbox.Resources
	// changed is called after each change (the host's row tells the
	// other hosts).
	changed func()

	mu   sync.Mutex
	used sandbox.Resources
}

// New counts reservations against limit; changed (optional) is called
// after each change.
func New(limit sandbox.Resources, changed func(), log *slog.Logger) *Host {
	if changed == nil {
		changed = func() {}
	}
	if log != nil {
		log.Info("admission limits", "vcpus", limit.VCPUs, "memory_mb", limit.MemoryMB, "disk_gb", limit.DiskGB)
	}
	return &Host{limit: limit, changed: changed}
}

// Reserve admits res, or refuses it naming the size field that does not
// fit (ErrCapacity).
func (h *Host) Reserve(res sandbox.Resources) error {
	if err := h.reserve(res); err != nil {
		return err
	}
	h.changed()
	return nil
}

func (h *Host) reserve(res sandbox.Resources) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	u, l := h.used, h.limit
	if u.VCPUs+res.VCPUs > l.VCPUs {
		return sandbox.Errorf(sandbox.ErrCapacity, "size.vcpus", "host is full: %d of %d vCPUs reserved, %d more asked", u.VCPUs, l.VCPUs, res.VCPUs)
	}
	if u.MemoryMB+res.MemoryMB > l.MemoryMB {
		return sandbox.Errorf(sandbox.ErrCapacity, "size.memory_mb", "host is full: %d of %d MB reserved, %d more asked", u.MemoryMB, l.MemoryMB, res.MemoryMB)
	}
	if u.DiskGB+res.DiskGB > l.DiskGB {
		return sandbox.Errorf(sandbox.ErrCapacity, "size.disk_gb", "host is full: %d of %d GB of disk reserved, %d more asked", u.DiskGB, l.DiskGB, res.DiskGB)
	}
	h.add(res, 1)
	return nil
}

// Force reserves res even over the limits, for a sandbox that already
// runs (re-adopted after a restart, with limits that may have been
// lowered); it returns what Reserve would have said.
func (h *Host) Force(res sandbox.Resources) error {
	err := h.reserve(res)
	if err != nil {
		h.mu.Lock()
		h.add(res, 1)
		h.mu.Unlock()
	}
	h.changed()
	return err
}

// Release ends a reservation of res.
func (h *Host) Release(res sandbox.Resources) {
	h.mu.Lock()
	h.add(res, -1)
	h.mu.Unlock()
	h.changed()
}

func (h *Host) add(res sandbox.Resources, sign int) {
	h.used.VCPUs += sign * res.VCPUs
	h.used.MemoryMB += sign * res.MemoryMB
	h.used.DiskGB += sign * res.DiskGB
}

// Used is what is reserved now.
func (h *Host) Used() sandbox.Resources {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.used
}

// Limit is what may be reserved.
func (h *Host) Limit() sandbox.Resources { return h.limit }
