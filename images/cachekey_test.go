package images

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// linkKernel makes a boot and a modules directory elsewhere that hold
// the host's kernel kver (by symbolic links): the same kernel at other
// paths.
func linkKernel(t *testing.T, kver string) (bootDir, modulesDir string) {
	t.Helper()
	d := t.TempDir()
	bootDir, modulesDir = filepath.Join(d, "boot"), filepath.Join(d, "modules")
	for _, p := range []string{bootDir, modulesDir} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/boot/vmlinuz-"+kver, filepath.Join(bootDir, "vmlinuz-"+kver)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("/lib/modules", kver), filepath.Join(modulesDir, kver)); err != nil {
		t.Fatal(err)
	}
	return bootDir, modulesDir
}

// copyAgent copies the agent binary to a new temporary directory.
func copyAgent(t *testing.T, agent string) string {
	t.Helper()
	return copyTo(t, agent, "harebox-agent")
}

// copyTo copies file src to a new temporary directory, as name.
func copyTo(t *testing.T, src, name string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bin", name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := copyFile(context.Background(), src, p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCacheKeyIgnoresPaths: the same agent (and kernel, modules, busybox)
// at other paths is the same image: the second build is a cache hit on
// the first one's directory, and a build into another cache directory
// has the same input hash. Other agent bytes are another image.
func TestCacheKeyIgnoresPaths(t *testing.T) {
	kver := needHost(t)
	agent := testAgent(t)
	agent1, agent2 := copyAgent(t, agent), copyAgent(t, agent)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	img1, err := Build(ctx, Options{Name: Minimal, AgentPath: agent1, OutDir: out})
	if err != nil {
		t.Fatal(err)
	}
	boot, mods := linkKernel(t, kver)
	bb := copyTo(t, "/bin/busybox", "busybox") // (its applets by its name)
	var progress bytes.Buffer
	img2, err := Build(ctx, Options{Name: Minimal, AgentPath: agent2, OutDir: out, BootDir: boot, ModulesDir: mods,
		BusyboxPath: bb, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	if img2.InputHash != img1.InputHash || img2.Dir != img1.Dir {
		t.Fatalf("the same agent at %s and at %s: builds %s and %s", agent1, agent2, img1.Dir, img2.Dir)
	}
	if !img2.BuiltAt.Equal(img1.BuiltAt) || !strings.Contains(progress.String(), "cached: "+img1.Dir) ||
		strings.Contains(progress.String(), "building") {
		t.Errorf("the second build was no cache hit (built at %v and %v):\n%s", img1.BuiltAt, img2.BuiltAt, progress.String())
	}
	if ds, _ := filepath.Glob(filepath.Join(out, "minimal-*")); len(ds) != 1 {
		t.Errorf("builds in the cache: %v", ds)
	}

	// Another cache directory: another place, the same key.
	img3, err := Build(ctx, Options{Name: Minimal, AgentPath: agent2, OutDir: filepath.Join(t.TempDir(), "other")})
	if err != nil {
		t.Fatal(err)
	}
	if img3.InputHash != img1.InputHash || filepath.Base(img3.Dir) != filepath.Base(img1.Dir) {
		t.Errorf("another cache directory: hash %s, want %s", img3.InputHash, img1.InputHash)
	}

	// Other bytes: another image.
	b, err := os.ReadFile(agent2)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(agent2, append(b, 0), 0o755); err != nil {
		t.Fatal(err)
	}
	img4, err := Build(ctx, Options{Name: Minimal, AgentPath: agent2, OutDir: out})
	if err != nil {
		t.Fatal(err)
	}
	if img4.InputHash == img1.InputHash || img4.Dir == img1.Dir {
		t.Errorf("other agent bytes kept hash %s", img1.InputHash)
	}
}

// TestGCBuilds runs GC on real minimal builds: the older build of two
// goes once it is superseded for longer than the grace, unless it is in
// use or a cache hit just used it.
func TestGCBuilds(t *testing.T) {
	needHost(t)
	agent := testAgent(t)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a, err := Build(ctx, Options{Name: Minimal, AgentPath: agent, OutDir: out})
	if err != nil {
		t.Fatal(err)
	}
	agentB := copyAgent(t, agent)
	b, err := os.ReadFile(agentB)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(agentB, append(b, 1), 0o755); err != nil {
		t.Fatal(err)
	}
	// Build a as if two days ago; b supersedes it a day ago.
	setBuiltAt(t, a.Dir, a, time.Now().Add(-48*time.Hour))
	bImg, err := Build(ctx, Options{Name: Minimal, AgentPath: agentB, OutDir: out})
	if err != nil {
		t.Fatal(err)
	}
	setBuiltAt(t, bImg.Dir, bImg, time.Now().Add(-24*time.Hour))

	// In use: kept.
	r, err := GC(ctx, out, GCOptions{InUse: []string{a.Dir}})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Removed) != 0 || len(r.Kept) != 2 || !exists(a.Dir) {
		t.Fatalf("with %s in use: %+v", a.Dir, r)
	}
	// A cache hit on it (someone builds that agent again, and gets it):
	// kept for the grace.
	if hit, err := Build(ctx, Options{Name: Minimal, AgentPath: agent, OutDir: out}); err != nil || hit.Dir != a.Dir {
		t.Fatalf("cache hit: %v, %v", hit.Dir, err)
	}
	if r, err = GC(ctx, out, GCOptions{}); err != nil {
		t.Fatal(err)
	}
	if len(r.Removed) != 0 || !exists(a.Dir) {
		t.Fatalf("a build a cache hit just used was removed: %+v", r)
	}
	// After the grace: removed, b (the newest) kept, and it still loads;
	// only once told that no engine uses the cache (none wrote there).
	later := func() time.Time { return time.Now().Add(GCGrace + time.Minute) }
	if _, err = GC(ctx, out, GCOptions{Now: later}); err == nil || !exists(a.Dir) {
		t.Fatalf("GC removed builds where no engine wrote its references: %v", err)
	}
	if r, err = GC(ctx, out, GCOptions{Now: later, NoEngine: true}); err != nil {
		t.Fatal(err)
	}
	if len(r.Removed) != 1 || r.Removed[0].Dir != a.Dir || exists(a.Dir) || r.FreedBytes < 1<<20 {
		t.Errorf("GC after the grace: %+v", r)
	}
	if _, err := Load(bImg.Dir); err != nil {
		t.Errorf("the newest build: %v", err)
	}
}
