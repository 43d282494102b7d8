package harebox

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"github.com/harebox/harebox/sandbox"
)

// Admission: what a host takes on. A sandbox reserves its size against
// the host's limits for as long as it may run, and a name once per
// account.

// reserve admits res against the host's limits.
func (e *Engine) reserve(res sandbox.Resources) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.used.VCPUs+res.VCPUs > e.limit.VCPUs {
		return sandbox.Errorf(sandbox.ErrCapacity, "size.vcpus", "host is full: %d of %d vCPUs reserved, %d more asked", e.used.VCPUs, e.limit.VCPUs, res.VCPUs)
	}
	if e.used.MemoryMB+res.MemoryMB > e.limit.MemoryMB {
		return sandbox.Errorf(sandbox.ErrCapacity, "size.memory_mb", "host is full: %d of %d MB reserved, %d more asked", e.used.MemoryMB, e.limit.MemoryMB, res.MemoryMB)
	}
	if e.used.DiskGB+res.DiskGB > e.limit.DiskGB {
		return sandbox.Errorf(sandbox.ErrCapacity, "size.disk_gb", "host is full: %d of %d GB of disk reserved, %d more asked", e.used.DiskGB, e.limit.DiskGB, res.DiskGB)
	}
	e.used.VCPUs += res.VCPUs
	e.used.MemoryMB += res.MemoryMB
	e.used.DiskGB += res.DiskGB
	e.usedChanged()
	return nil
}

func (e *Engine) release(res sandbox.Resources) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.used.VCPUs -= res.VCPUs
	e.used.MemoryMB -= res.MemoryMB
	e.used.DiskGB -= res.DiskGB
	e.usedChanged()
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

// claimName refuses a name that a live sandbox of the account, or a create
// in flight there, already has; release ends the claim. Names are per
// account, so a taken name says nothing about other accounts.
func (e *Engine) claimName(accountID, name string) (release func(), err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, b := range e.boxes {
		if b.rec.AccountID == accountID && b.rec.Name == name {
			return nil, sandbox.Errorf(sandbox.ErrExists, "name", "sandbox %s is already named %q", b.rec.ID, name)
		}
	}
	// A stopped sandbox keeps its name: it starts again under it.
	for _, r := range e.kept {
		if r.AccountID == accountID && r.Name == name {
			return nil, sandbox.Errorf(sandbox.ErrExists, "name", "sandbox %s (stopped) is already named %q", r.ID, name)
		}
	}
	claim := accountID + "/" + name
	if e.claimed[claim] {
		return nil, sandbox.Errorf(sandbox.ErrExists, "name", "a sandbox named %q is being created", name)
	}
	if e.claimed == nil {
		e.claimed = map[string]bool{}
	}
	e.claimed[claim] = true
	return func() {
		e.mu.Lock()
		delete(e.claimed, claim)
		e.mu.Unlock()
	}, nil
}
