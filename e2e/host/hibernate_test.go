package host

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/internal/testserver"
)

// TestHibernate, on a real Debian VM through the CLI: hibernate frees the
// VMM; then hareboxd is killed with -9 and every process that names the
// data directory with it, and the host firewall's table and taps are
// removed, as a host reboot would; a canary in the guest's memory and on
// its disk is in no file of the data directory in plain text; a new
// hareboxd resumes the sandbox with the files and a background process
// still counting.
func TestHibernate(t *testing.T) {
	s := testserver.Prepare(t)
	dataDir, err := os.MkdirTemp("", "hbh")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.Start(t, s, dataDir)
	defer func() { testserver.Finish(t, srv, dataDir) }()
	hb := func(args ...string) string {
		t.Helper()
		return testserver.Run(t, srv, s, s.Root, 3*time.Minute, "harebox", args...)
	}
	var box struct{ ID, State string }
	if err := json.Unmarshal([]byte(hb("new", "--label", "e2e=hibernate")), &box); err != nil || box.ID == "" {
		t.Fatalf("new: %v", err)
	}
	defer func() { srv.Call(t, "DELETE", "/v1/sandboxes/"+box.ID, srv.Key, nil) }()
	hb("exec", box.ID, "-c", "echo sleepy > /var/tmp/mark && sync")
	// A canary in the guest's memory (a tmpfs) and on its disk: in no
	// file of the host in plain text while the sandbox is hibernated.
	canary := make([]byte, 16)
	rand.Read(canary)
	mark := hex.EncodeToString(canary)
	hb("exec", box.ID, "-c", "echo "+mark+" > /dev/shm/canary; echo "+mark+" > /var/tmp/canary; sync")
	hb("exec", box.ID, "-c", "setsid sh -c 'n=0; while :; do n=$((n+1)); echo $n > /dev/shm/counter; sleep 0.2; done' >/dev/null 2>&1 &")
	counter := func() int {
		t.Helper()
		// (The loop may not have written its first line yet.)
		out := hb("exec", box.ID, "-c", "for i in $(seq 50); do [ -s /dev/shm/counter ] && break; sleep 0.2; done; cat /dev/shm/counter")
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n
	}
	before := counter()

	began := time.Now()
	if err := json.Unmarshal([]byte(hb("hibernate", box.ID)), &box); err != nil || box.State != "hibernated" {
		t.Fatalf("hibernate: %v %+v", err, box)
	}
	t.Logf("hibernate took %v", time.Since(began).Round(100*time.Millisecond))
	for _, p := range procs.Naming(dataDir + "/") {
		if p.IsVMM() {
			t.Errorf("a VMM runs after hibernate: %s", p)
		}
	}

	// As a host reboot would: hareboxd and everything of the data dir go,
	// and so do the host firewall's table and the taps.
	srv.Cmd.Process.Kill()
	srv.Cmd.Wait()
	for _, p := range procs.Naming(dataDir) {
		syscall.Kill(p.PID, syscall.SIGKILL)
	}
	srv.DropTable(t)
	filepath.Walk(dataDir, func(path string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if b, _ := os.ReadFile(path); bytes.Contains(b, []byte(mark)) {
				t.Errorf("the canary is in plain text in %s", path)
			}
		}
		return nil
	})
	srv = testserver.Start(t, s, dataDir)
	if out := hb("get", box.ID); !strings.Contains(out, `"state": "hibernated"`) {
		t.Fatalf("after the restart: %s", out)
	}
	began = time.Now()
	if err := json.Unmarshal([]byte(hb("resume", box.ID)), &box); err != nil || box.State != "running" {
		t.Fatalf("resume: %v %+v", err, box)
	}
	t.Logf("resume took %v", time.Since(began).Round(100*time.Millisecond))
	if got := hb("exec", box.ID, "--", "cat", "/var/tmp/mark"); got != "sleepy\n" {
		t.Errorf("the file after the resume: %q", got)
	}
	if got := hb("exec", box.ID, "--", "cat", "/dev/shm/canary", "/var/tmp/canary"); got != mark+"\n"+mark+"\n" {
		t.Errorf("the canaries after the resume: %q", got)
	}
	n1 := counter()
	time.Sleep(1500 * time.Millisecond)
	n2 := counter()
	if n1 < before || n2 <= n1 {
		t.Errorf("the counter: %d before, then %d and %d after the resume", before, n1, n2)
	}
	if ents, _ := os.ReadDir(dataDir + "/hibernated"); len(ents) != 0 {
		t.Errorf("hibernation files left after the resume: %v", ents)
	}
}
