package monitor

import (
	"os"
	"path/filepath"
	"testing"
	"time"
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
