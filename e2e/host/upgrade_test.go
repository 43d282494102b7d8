package host

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testserver"
)

// TestUpgrade: a sandbox started by the previous release's hareboxd (built
// here from git: the commit before the newest database migration) keeps
// running across an upgrade in place; the new hareboxd re-adopts it and
// execs into it, its agent (the old image's) included. Going back to the
// old hareboxd is then refused with a clear error: the database is newer
// than it.
func TestUpgrade(t *testing.T) {
	s := testserver.Prepare(t)
	base := previousRelease(t, s.Root)
	t.Logf("upgrading from %s", base)
	work := t.TempDir()
	tree := filepath.Join(work, "src")
	git(t, s.Root, "worktree", "prune") // (one a killed run left)
	git(t, s.Root, "worktree", "add", "--detach", tree, base)
	defer git(t, s.Root, "worktree", "remove", "--force", tree)
	old := testserver.Setup{Root: tree, Bin: filepath.Join(work, "bin"), ImageDir: filepath.Join(work, "images")}
	for _, name := range []string{"hareboxd", "harebox-plugin-qemu", "harebox-image", "harebox-agent"} {
		cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", filepath.Join(old.Bin, name), "./cmd/"+name)
		cmd.Dir, cmd.Env = tree, append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building the old %s: %v\n%s", name, err, out)
		}
	}
	old.Hareboxd, old.Plugin = filepath.Join(old.Bin, "hareboxd"), filepath.Join(old.Bin, "harebox-plugin-qemu")
	if out, err := exec.Command(filepath.Join(old.Bin, "harebox-image"), "build", "--name", "minimal",
		"--agent", filepath.Join(old.Bin, "harebox-agent"), "--out", old.ImageDir).CombinedOutput(); err != nil {
		t.Fatalf("the old image: %v\n%s", err, out)
	}

	dataDir, err := os.MkdirTemp("", "hbup")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	args := func(s testserver.Setup) []string {
		// The old image, for both: a sandbox keeps its image's agent.
		return []string{"--image-dir", old.ImageDir, "--plugin", s.Plugin, "--network", "none"}
	}
	// The old release may leave its plugin's socket in the temporary
	// directory (releases before the socket had a directory of its own):
	// its servers get one of the test's.
	oldEnv := []string{"TMPDIR=" + t.TempDir()}
	srv := testserver.LaunchEnv(t, old, dataDir, oldEnv, args(old)...)
	code, box := srv.Call(t, "POST", "/v1/sandboxes", srv.Key, map[string]any{"image": "minimal", "ttl_seconds": 900})
	id, _ := box["id"].(string)
	if code != 201 || id == "" {
		t.Fatalf("create on the old server: %d %v\n%s", code, box, testserver.Tail(srv.Log.String()))
	}
	exec1 := func(srv *testserver.Server, cmd string) string {
		t.Helper()
		code, r := srv.Call(t, "POST", "/v1/sandboxes/"+id+"/exec", srv.Key, map[string]any{"cmd": cmd})
		if code != 200 || r["exit_code"] != float64(0) {
			t.Fatalf("exec %q: %d %v\n%s", cmd, code, r, testserver.Tail(srv.Log.String()))
		}
		return r["stdout"].(string)
	}
	exec1(srv, "echo before the upgrade > /tmp/mark")
	srv.Stop(t) // sandboxes keep running

	// The upgrade in place: the new server on the same data directory.
	srv = testserver.Launch(t, s, dataDir, args(s)...)
	if got := exec1(srv, "cat /tmp/mark"); got != "before the upgrade\n" {
		t.Fatalf("after the upgrade: %q", got)
	}
	if code, r := srv.Call(t, "GET", "/v1/sandboxes/"+id, srv.Key, nil); code != 200 || r["state"] != "running" {
		t.Fatalf("get after the upgrade: %d %v", code, r)
	}
	srv.Stop(t)

	// Back to the old server: refused, and it says why.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var log bytes.Buffer
	cmd := exec.CommandContext(ctx, old.Hareboxd, append([]string{"--data-dir", dataDir, "--listen", "127.0.0.1:0"}, args(old)...)...)
	cmd.Stdout, cmd.Stderr, cmd.Env = &log, &log, append(os.Environ(), oldEnv...)
	if err := cmd.Run(); err == nil || !strings.Contains(log.String(), "is newer than this binary") {
		t.Errorf("the old server on the upgraded database: %v\n%s", err, log.String())
	}

	// The new server still has it, and deletes it.
	srv = testserver.Launch(t, s, dataDir, args(s)...)
	if code, r := srv.Call(t, "DELETE", "/v1/sandboxes/"+id, srv.Key, nil); code != 200 {
		t.Errorf("delete: %d %v", code, r)
	}
	srv.Stop(t)
	testserver.NoLeftovers(t, dataDir)
}

// previousRelease is the commit before the one that added the newest
// database migration: the newest release an upgrade changes the database
// of. HAREBOX_UPGRADE_FROM names another.
func previousRelease(t *testing.T, root string) string {
	t.Helper()
	if c := os.Getenv("HAREBOX_UPGRADE_FROM"); c != "" {
		return c
	}
	src, err := os.ReadFile(filepath.Join(root, "store", "store.go"))
	if err != nil {
		t.Fatal(err)
	}
	_, list, ok := strings.Cut(string(src), "var migrations = []string{")
	list, _, _ = strings.Cut(list, "\n}\n")
	parts := strings.Split(list, "`")
	if !ok || len(parts) < 3 {
		t.Fatal("store/store.go: no migrations list")
	}
	// (The whole statement: a line of it could occur elsewhere.)
	newest := parts[len(parts)-2]
	added := strings.TrimSpace(git(t, root, "log", "-1", "--format=%H", "-S", newest, "--", "store/store.go"))
	if added == "" {
		t.Skipf("git history without the commit that added the migration %q (a shallow clone?)", newest)
	}
	cmd := exec.Command("git", "rev-parse", "--verify", added+"^")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Skipf("git history without the parent of %s (a shallow clone?)", added)
	}
	return strings.TrimSpace(string(out))
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
