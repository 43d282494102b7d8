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

// process is a machine whose VMM is a given process (this test's own).
type process struct {
	hypervisor.Machine
	pid int
	err error
}

func (p process) Info(context.Context) (hypervisor.Info, error) {
	return hypervisor.Info{State: hypervisor.StateRunning, PID: p.pid}, p.err
}

// TestActivity says what a VMM did while its guest was waited for: the
// CPU it used (here, this process spinning for 300 ms), that it runs;
// a backend naming no process, or one that does not answer, says so.
func TestActivity(t *testing.T) {
	ctx := context.Background()
	a := Watch(ctx, process{pid: os.Getpid()})
	for start := time.Now(); time.Since(start) < 300*time.Millisecond; {
	}
	m := regexp.MustCompile(`^the VMM is running and used ([0-9.]+) CPU-s in the [0-9]+ s waited$`).FindStringSubmatch(a.String())
	if m == nil {
		t.Fatalf("activity: %q", a.String())
	}
	if cpu, _ := strconv.ParseFloat(m[1], 64); cpu < 0.2 || cpu > 5 {
		t.Fatalf("activity: %q, want about 0.3 CPU-s", a.String())
	}
	if s := Watch(ctx, process{}).String(); s != "the VMM is running" {
		t.Fatalf("no process: %q", s)
	}
	if s := Watch(ctx, process{err: errors.New("gone")}).String(); s != "the VMM does not answer: gone" {
		t.Fatalf("no answer: %q", s)
	}
}
