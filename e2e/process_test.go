package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// relaunch starts hareboxd again as srv was started, on the same address
// and data directory, and waits until it answers.
func relaunch(t *testing.T, srv *server) {
	t.Helper()
	env := srv.cmd.Env
	srv.cmd = exec.Command(srv.cmd.Path, srv.cmd.Args[1:]...)
	srv.cmd.Env = env
	srv.cmd.Stdout, srv.cmd.Stderr = srv.log, srv.log
	if err := srv.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := srv.http.Get(srv.url + "/health"); err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("hareboxd did not start again: %s", tail(srv.log.String()))
		}
	}
}

// TestProcessOutlivesServer: a background process started through the
// CLI runs on while hareboxd is killed with -9 and started again; a
// `harebox attach` that was following it reconnects by itself and prints
// every line once, in order, and exits with the process's exit code; a
// client killed with -9 while following changes nothing; the output is
// still there to read from the start afterwards.
func TestProcessOutlivesServer(t *testing.T) {
	s := prepare(t)
	dataDir, err := os.MkdirTemp("", "hbpo")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := launch(t, s, dataDir, "--image-dir", s.imageDir, "--plugin", s.plugin, "--network", "none")
	defer func() {
		srv.stop(t)
		noLeftovers(t, dataDir)
	}()
	cli := func(args ...string) string {
		t.Helper()
		return run(t, srv, s, s.root, 3*time.Minute, "harebox", args...)
	}
	var box struct{ ID string }
	if err := json.Unmarshal([]byte(cli("new", "--image", "minimal")), &box); err != nil || box.ID == "" {
		t.Fatalf("new: %v", err)
	}
	defer func() { cli("delete", box.ID) }()
	script := "for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i; sleep 1; done; echo done >&2; exit 7"
	var proc struct {
		ID      string
		Running bool
	}
	if err := json.Unmarshal([]byte(cli("exec", box.ID, "--background", "-c", script)), &proc); err != nil || proc.ID == "" || !proc.Running {
		t.Fatalf("exec --background: %+v %v", proc, err)
	}

	// A follower, started before the crash.
	attach := exec.Command(filepath.Join(s.bin, "harebox"), "attach", box.ID, proc.ID)
	attach.Env = srv.env(s)
	var out, errOut bytes.Buffer
	attach.Stdout, attach.Stderr = &out, &errOut
	if err := attach.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- attach.Wait() }()
	// A second client, killed with -9 while it follows: the process does
	// not notice, and a later attach reads everything (below).
	victim := exec.Command(filepath.Join(s.bin, "harebox"), "attach", box.ID, proc.ID)
	victim.Env = srv.env(s)
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	victim.Process.Kill()
	victim.Wait()
	time.Sleep(time.Second)
	srv.cmd.Process.Signal(syscall.SIGKILL)
	srv.cmd.Wait()
	time.Sleep(time.Second)
	relaunch(t, srv)

	select {
	case err := <-done:
		var want strings.Builder
		for i := 1; i <= 10; i++ {
			fmt.Fprintf(&want, "line %d\n", i)
		}
		wantOut := want.String()
		if attach.ProcessState.ExitCode() != 7 || out.String() != wantOut || errOut.String() != "done\n" {
			t.Fatalf("attach across the crash: %v (exit %d)\nstdout %q\nstderr %q\nserver log:\n%s",
				err, attach.ProcessState.ExitCode(), out.String(), errOut.String(), tail(srv.log.String()))
		}
	case <-time.After(2 * time.Minute):
		attach.Process.Kill()
		t.Fatalf("attach still waiting 2 min after the restart; so far %q\n%s", out.String(), tail(srv.log.String()))
	}

	// Afterwards: listed as exited, and its output is there from the start.
	var list struct {
		Processes []struct {
			ID     string
			Result *struct {
				ExitCode int `json:"exit_code"`
			}
		}
	}
	if err := json.Unmarshal([]byte(cli("ps", box.ID)), &list); err != nil || len(list.Processes) != 1 || list.Processes[0].Result == nil || list.Processes[0].Result.ExitCode != 7 {
		t.Fatalf("ps: %+v %v", list, err)
	}
	again := exec.Command(filepath.Join(s.bin, "harebox"), "attach", box.ID, proc.ID, "--no-follow", "--stdout-offset", "7")
	again.Env = srv.env(s)
	b, _ := again.Output()
	if again.ProcessState.ExitCode() != 7 || !strings.HasPrefix(string(b), "line 2\n") || !strings.HasSuffix(string(b), "line 10\n") {
		t.Fatalf("attach --no-follow from offset 7: exit %d, %q", again.ProcessState.ExitCode(), b)
	}
	// An unknown process is a clear 404 before any output.
	req, _ := http.NewRequest("GET", srv.url+"/v1/sandboxes/"+box.ID+"/processes/proc_nope/output", nil)
	req.Header.Set("Authorization", "Bearer "+srv.key)
	resp, err := srv.http.Do(req)
	if err != nil || resp.StatusCode != 404 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("output of no process: %v %+v", err, resp)
	}
	resp.Body.Close()
}
