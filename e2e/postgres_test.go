package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testpg"
)

// TestPostgresStore: hareboxd keeps its state in a real PostgreSQL server
// (--store): the CLI creates a sandbox on a real VM, runs a command in it
// and publishes nothing else; hareboxd killed with -9 and started again
// finds the sandbox in the database and runs commands in it again; a
// second hareboxd on the same database is refused while the first holds
// it.
func TestPostgresStore(t *testing.T) {
	s := prepare(t)
	dsn := testpg.ForTest(t)
	dataDir, err := os.MkdirTemp("", "hbpgd")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := start(t, s, dataDir, "--store", dsn)
	defer finish(t, srv, dataDir)
	hb := func(args ...string) string {
		t.Helper()
		return run(t, srv, s, s.root, 3*time.Minute, "harebox", args...)
	}
	var box struct {
		ID    string
		State string
	}
	if err := json.Unmarshal([]byte(hb("new", "--image", "minimal", "--label", "e2e=postgres")), &box); err != nil || box.ID == "" {
		t.Fatalf("new: %v", err)
	}
	defer hb("delete", box.ID)
	if out := hb("exec", box.ID, "--", "sh", "-c", "echo from-the-guest"); !strings.Contains(out, "from-the-guest") {
		t.Fatalf("exec: %s", out)
	}

	// Another hareboxd on the same database: refused.
	other, err := os.MkdirTemp("", "hbpgd")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(other)
	out, err := exec.Command(s.hareboxd, "--data-dir", other, "--listen", "127.0.0.1:0", "--network", "none",
		"--image-dir", s.imageDir, "--plugin", s.plugin, "--store", dsn).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "another hareboxd runs as this host") {
		t.Errorf("a second hareboxd on the database: %v\n%s", err, out)
	}

	// Killed and started again: the sandbox is re-adopted from the
	// database.
	srv.cmd.Process.Signal(syscall.SIGKILL)
	srv.cmd.Wait()
	relaunch(t, srv)
	var got struct{ ID, State string }
	if err := json.Unmarshal([]byte(hb("get", box.ID)), &got); err != nil || got.State != "running" {
		t.Fatalf("after a restart: %+v %v", got, err)
	}
	if out := hb("exec", box.ID, "--", "sh", "-c", "echo still-here"); !strings.Contains(out, "still-here") {
		t.Fatalf("exec after a restart: %s", out)
	}
	if l := hb("list"); !strings.Contains(l, box.ID) {
		t.Errorf("list after a restart: %s", l)
	}
}
