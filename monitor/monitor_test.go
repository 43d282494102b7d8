package monitor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/harebox/harebox/hypervisor"
)

// TestProcessUse reads this process's CPU time and resident memory as a
// sample reads a VMM's: both grow with what it does.
func TestProcessUse(t *testing.T) {
	cpu0, _ := processUse(os.Getpid())
	for start := time.Now(); time.Since(start) < 300*time.Millisecond; {
	}
	buf := make([]byte, 64<<20)
	for i := range buf {
		buf[i] = 1
	}
	cpu, rss := processUse(os.Getpid())
	if cpu <= cpu0 || rss < int64(len(buf)) {
		t.Fatalf("cpu %.2f s (was %.2f s), rss %d bytes after touching %d", cpu, cpu0, rss, len(buf))
	}
	if cpu, rss := processUse(-1); cpu != 0 || rss != 0 {
		t.Fatalf("no process: %v s, %d bytes", cpu, rss)
	}
	buf[0] = buf[len(buf)-1] // (keeps buf live until after the read)
}

// TestDiskUse counts a sparse file by what it holds, not by its size.
func TestDiskUse(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "overlay"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if n := DiskUse(dir); n < 1<<20 || n > 2<<20 {
		t.Fatalf("a 1 GiB file holding 1 MiB takes %d bytes", n)
	}
}

// process is a machine whose VMM is a given process (this test's own),
// started at a given time.
type process struct {
	hypervisor.Machine
	pid     int
	started time.Time
	err     error
}

func (p process) Info(context.Context) (hypervisor.Info, error) {
	return hypervisor.Info{State: hypervisor.StateRunning, PID: p.pid, Started: p.started}, p.err
}

// TestActivity says what a VMM did since it started: that it runs, and
// the CPU it used (here, this process's, after it spun for 0.3 CPU-s); a
// backend naming no process, or one that does not answer, says so.
func TestActivity(t *testing.T) {
	ctx := context.Background()
	cpu0, _ := processUse(os.Getpid())
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); {
		if cpu, _ := processUse(os.Getpid()); cpu >= cpu0+0.3 {
			break
		}
	}
	cpu1, _ := processUse(os.Getpid())
	s := Activity(ctx, process{pid: os.Getpid(), started: time.Now().Add(-time.Minute)})
	m := regexp.MustCompile(`^the VMM is running and used ([0-9.]+) CPU-s in the 60 s since it started$`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("activity: %q", s)
	}
	if cpu, _ := strconv.ParseFloat(m[1], 64); cpu < cpu1-0.05 {
		t.Fatalf("activity: %q, want at least the %.2f CPU-s this process used", s, cpu1)
	}
	if s := Activity(ctx, process{}); s != "the VMM is running" {
		t.Fatalf("no process: %q", s)
	}
	if s := Activity(ctx, process{err: errors.New("gone")}); s != "the VMM does not answer: gone" {
		t.Fatalf("no answer: %q", s)
	}
}
