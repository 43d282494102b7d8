// Package testimage builds, once per machine and cached, the guest agent
// and the minimal image that VM tests boot. Test packages run in parallel,
// so builds are serialised with a file lock.
package testimage

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/images"
)

// Root returns the repository root (the directory holding go.mod).
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("testimage: no go.mod above the working directory")
		}
		dir = parent
	}
}

// CacheDir is where built binaries and images are kept between runs.
func CacheDir(t testing.TB) string {
	if d := os.Getenv("HAREBOX_CACHE"); d != "" {
		return d
	}
	return filepath.Join(Root(t), ".cache")
}

var mu sync.Mutex

// lock serialises builds across test processes.
func lock(t testing.TB) func() {
	t.Helper()
	mu.Lock()
	dir := CacheDir(t)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		mu.Unlock()
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		mu.Unlock()
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		mu.Unlock()
		t.Fatal(err)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
		mu.Unlock()
	}
}

// Binary builds ./cmd/<name> (static, reproducible) into the cache and
// returns its path.
func Binary(t testing.TB, name string) string {
	return Package(t, "./cmd/"+name, name)
}

// Package builds the main package pkg (a path from the repository root)
// into the cache as name and returns its path.
func Package(t testing.TB, pkg, name string) string {
	t.Helper()
	unlock := lock(t)
	defer unlock()
	return buildPkg(t, pkg, name)
}

func build(t testing.TB, name string) string { return buildPkg(t, "./cmd/"+name, name) }

func buildPkg(t testing.TB, pkg, name string) string {
	out := filepath.Join(CacheDir(t), "bin", name)
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = Root(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testimage: build %s: %v\n%s", name, err, b)
	}
	return out
}

// Image builds (or finds cached) the named image ("minimal" or "default")
// with a freshly built agent.
func Image(t testing.TB, name string) images.Image {
	t.Helper()
	unlock := lock(t)
	defer unlock()
	agent := build(t, "harebox-agent")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	img, err := images.Build(ctx, images.Options{
		Name:      name,
		AgentPath: agent,
		OutDir:    filepath.Join(CacheDir(t), "images"),
		Progress:  testWriter{t},
	})
	if err != nil {
		t.Fatalf("testimage: build %s image: %v", name, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Logf("built %s image in %v", name, d.Round(time.Millisecond))
	}
	return img
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(fmt.Sprintf("%s", b))
	return len(b), nil
}
