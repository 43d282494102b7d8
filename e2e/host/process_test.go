package host

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

	"github.com/harebox/harebox/internal/testserver"
)

// TestProcessOutlivesServer: a background process started through the
// CLI runs on while hareboxd is killed with -9 and started again; a
// `harebox attach` that was following it reconnects by itself and prints
// every line once, in order, and exits with the process's exit code; a
// client killed with -9 while following changes nothing; the output is
// still there to read from the start afterwards.
func TestProcessOutlivesServer(t *testing.T) {
	t.Parallel() // (it waits on its process most of its time)
	s := testserver.Prepare(t)
	dataDir, err := os.MkdirTemp("", "hbpo")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.Launch(t, s, dataDir, "--image-dir", s.ImageDir, "--plugin", s.Plugin, "--network", "none")
	defer func() {
		srv.Stop(t)
		testserver.NoLeftovers(t, dataDir)
	}()
	cli := func(args ...string) string {
		t.Helper()
		return testserver.Run(t, srv, s, s.Root, 3*time.Minute, "harebox", args...)
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
	attach := exec.Command(filepath.Join(s.Bin, "harebox"), "attach", box.ID, proc.ID)
	attach.Env = srv.Env(s)
	var out, errOut bytes.Buffer
	attach.Stdout, attach.Stderr = &out, &errOut
	if err := attach.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- attach.Wait() }()
	// A second client, killed with -9 while it follows: the process does
	// not notice, and a later attach reads everything (below).
	victim := exec.Command(filepath.Join(s.Bin, "harebox"), "attach", box.ID, proc.ID)
	victim.Env = srv.Env(s)
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	victim.Process.Kill()
	victim.Wait()
	time.Sleep(time.Second)
	srv.Cmd.Process.Signal(syscall.SIGKILL)
	srv.Cmd.Wait()
	time.Sleep(time.Second)
	testserver.Relaunch(t, srv)

	select {
	case err := <-done:
		var want strings.Builder
		for i := 1; i <= 10; i++ {
			fmt.Fprintf(&want, "line %d\n", i)
		}
		wantOut := want.String()
		if attach.ProcessState.ExitCode() != 7 || out.String() != wantOut || errOut.String() != "done\n" {
			t.Fatalf("attach across the crash: %v (exit %d)\nstdout %q\nstderr %q\nserver log:\n%s",
				err, attach.ProcessState.ExitCode(), out.String(), errOut.String(), testserver.Tail(srv.Log.String()))
		}
	case <-time.After(2 * time.Minute):
		attach.Process.Kill()
		t.Fatalf("attach still waiting 2 min after the restart; so far %q\n%s", out.String(), testserver.Tail(srv.Log.String()))
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
	again := exec.Command(filepath.Join(s.Bin, "harebox"), "attach", box.ID, proc.ID, "--no-follow", "--stdout-offset", "7")
	again.Env = srv.Env(s)
	b, _ := again.Output()
	if again.ProcessState.ExitCode() != 7 || !strings.HasPrefix(string(b), "line 2\n") || !strings.HasSuffix(string(b), "line 10\n") {
		t.Fatalf("attach --no-follow from offset 7: exit %d, %q", again.ProcessState.ExitCode(), b)
	}
	// An unknown process is a clear 404 before any output.
	req, _ := http.NewRequest("GET", srv.URL+"/v1/sandboxes/"+box.ID+"/processes/proc_nope/output", nil)
	req.Header.Set("Authorization", "Bearer "+srv.Key)
	resp, err := srv.HTTP.Do(req)
	if err != nil || resp.StatusCode != 404 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("output of no process: %v %+v", err, resp)
	}
	resp.Body.Close()
}
