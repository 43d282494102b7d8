// Package testimage builds the guest agent (once per run, into the
// clone's .cache) and the images that VM tests boot (once per machine,
// into the user's cache: ImagesDir). Test packages run in parallel,
// so builds are serialised with a file lock.
package testimage

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// ImagesDir is where the images are built and kept: HAREBOX_TEST_IMAGES,
// else harebox/test-images in the user's cache directory (where make test
// keeps them too), shared by every clone of the repository on the
// machine, as Go's build cache is: a build is keyed by its inputs, so a
// clone finds the builds of the same inputs made by another.
func ImagesDir(t testing.TB) string {
	if d := os.Getenv("HAREBOX_TEST_IMAGES"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "harebox", "test-images")
	}
	return filepath.Join(CacheDir(t), "images")
}

// locks serialises the builds of this process by lock file; the files
// serialise them across this clone's test processes (and make test's
// prebuild, which takes the same files). Two clones may build the same
// image at once: the cache's own lock keeps it whole (images.Build takes
// the build that finished first).
var locks sync.Map // lock file name -> *sync.Mutex

// lock takes the lock file name in the cache: "lock" for the binaries,
// imageLock(NAME) for an image, so a test that needs the minimal image
// does not wait for the Debian one to build.
func lock(t testing.TB, name string) func() {
	t.Helper()
	m, _ := locks.LoadOrStore(name, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	dir := CacheDir(t)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		mu.Unlock()
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_RDWR, 0o644)
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

// imageLock is the lock file of the image name's builds.
func imageLock(name string) string { return "lock-image-" + name }

// agentCopy builds the agent and returns a copy of it of the caller's
// own: an image build reads it for minutes, while another test may
// build the binary again in place.
func agentCopy(t testing.TB) string {
	t.Helper()
	unlock := lock(t, "lock")
	defer unlock()
	b, err := os.ReadFile(build(t, "harebox-agent"))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "harebox-agent")
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
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
	unlock := lock(t, "lock")
	defer unlock()
	return buildPkg(t, pkg, name)
}

func build(t testing.TB, name string) string { return buildPkg(t, "./cmd/"+name, name) }

// made remembers what this test process built or found: the go command
// costs about half a CPU-second even when it has nothing to do, and each
// end-to-end test asks for three programs and two images. What it built
// does not change during a run.
var made struct {
	sync.Mutex
	bins   map[string]string       // package and name -> path
	images map[string]images.Image // name -> image
}

// buildPkg builds pkg as name once per process (the caller holds the
// "lock" lock).
func buildPkg(t testing.TB, pkg, name string) string {
	key := pkg + " " + name
	made.Lock()
	out, ok := made.bins[key]
	made.Unlock()
	if ok {
		return out
	}
	out = filepath.Join(CacheDir(t), "bin", name)
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = Root(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testimage: build %s: %v\n%s", name, err, b)
	}
	made.Lock()
	if made.bins == nil {
		made.bins = map[string]string{}
	}
	made.bins[key] = out
	made.Unlock()
	return out
}

// Image builds (or finds cached) the named image ("minimal", "default" or
// "code-interpreter") with a freshly built agent.
func Image(t testing.TB, name string) images.Image {
	t.Helper()
	made.Lock()
	img, ok := made.images[name]
	made.Unlock()
	if ok {
		return img
	}
	agent := agentCopy(t)
	unlock := lock(t, imageLock(name))
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	var log buildLog
	img, err := images.Build(ctx, images.Options{
		Name:      name,
		AgentPath: agent,
		OutDir:    ImagesDir(t),
		Progress:  &log,
	})
	if err != nil {
		t.Fatalf("testimage: build %s image: %v\n%s", name, err, log.tail())
	}
	t.Log(log.first())
	if d := time.Since(start); d > time.Second {
		t.Logf("built %s image in %v", name, d.Round(time.Millisecond))
	}
	made.Lock()
	if made.images == nil {
		made.images = map[string]images.Image{}
	}
	made.images[name] = img
	made.Unlock()
	return img
}

// buildLog keeps an image build's progress out of the test log (a
// debootstrap prints hundreds of lines, which buried the failure that
// mattered in CI output) but keeps its first line and its last 16 KiB for
// a failed build.
type buildLog struct {
	mu    sync.Mutex
	head  string
	lines []string
	size  int
}

func (l *buildLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	line := strings.TrimSpace(string(b))
	if l.head == "" {
		l.head = line
	}
	l.lines = append(l.lines, line)
	l.size += len(line) + 1
	for l.size > 16<<10 && len(l.lines) > 1 {
		l.size -= len(l.lines[0]) + 1
		l.lines = l.lines[1:]
	}
	return len(b), nil
}

func (l *buildLog) first() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.head
}

func (l *buildLog) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}
