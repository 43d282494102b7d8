package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testserver"
)

// TestShellInTmux drives `harebox shell` in a real terminal: tmux runs it,
// types into it and reads the screen. The login shell answers, a window
// resize reaches the guest's terminal, ^C interrupts the guest's command
// (not the local client), UTF-8 passes, and `exit 3` ends the client with
// code 3 and the local terminal back in cooked mode.
func TestShellInTmux(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux is not installed (make deps installs it)")
	}
	s := testserver.Prepare(t)
	dataDir, err := os.MkdirTemp("", "hbsh")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.Launch(t, s, dataDir, "--image-dir", s.ImageDir, "--plugin", s.Plugin, "--network", "none")
	defer func() {
		srv.Stop(t)
		testserver.NoLeftovers(t, dataDir)
	}()
	var box struct{ ID string }
	if err := json.Unmarshal([]byte(testserver.Run(t, srv, s, s.Root, 3*time.Minute, "harebox", "new", "--image", "minimal")), &box); err != nil || box.ID == "" {
		t.Fatalf("new: %v", err)
	}
	defer testserver.Run(t, srv, s, s.Root, time.Minute, "harebox", "delete", box.ID)

	sock := fmt.Sprintf("hbtest%d", os.Getpid())
	tmux := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("tmux", append([]string{"-u", "-L", sock, "-f", "/dev/null"}, args...)...)
		cmd.Env = append(srv.Env(s), "LANG=C.UTF-8")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	session := filepath.Join(s.Bin, "harebox") + " shell " + box.ID +
		"; echo EXIT=$?; stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e -icanon; sleep 120"
	tmux("new-session", "-d", "-s", "t", "-x", "100", "-y", "30", session)
	defer exec.Command("tmux", "-L", sock, "kill-server").Run()
	tmux("set", "-g", "status", "off")
	screen := func() string { return tmux("capture-pane", "-p", "-t", "t") }
	waitFor := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			if strings.Contains(screen(), want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%q not on the screen after 30 s:\n%s\nserver log:\n%s", want, screen(), testserver.Tail(srv.Log.String()))
			}
		}
	}
	typeLine := func(line string) {
		t.Helper()
		tmux("send-keys", "-t", "t", "-l", line)
		tmux("send-keys", "-t", "t", "Enter")
	}

	typeLine("echo hello-$((6*7))")
	waitFor("hello-42")
	// The guest's terminal has the window's size, and follows it.
	typeLine("stty size")
	waitFor("30 100")
	tmux("resize-window", "-t", "t", "-x", "120", "-y", "40")
	time.Sleep(500 * time.Millisecond)
	typeLine("stty size")
	waitFor("40 120")
	// ^C reaches the guest's foreground command, and the session goes on.
	typeLine("sleep 100; echo NOT-$((1+1))")
	time.Sleep(time.Second)
	tmux("send-keys", "-t", "t", "C-c")
	typeLine("echo after-interrupt")
	waitFor("after-interrupt")
	if strings.Contains(screen(), "NOT-2") {
		t.Fatal("^C did not interrupt the guest's sleep")
	}
	typeLine("echo 'héllo → wörld'")
	waitFor("héllo → wörld")
	typeLine("exit 3")
	waitFor("EXIT=3")
	// Cooked mode again: the client restored the local terminal. (stty
	// prints after EXIT=3: wait for its line, either way.)
	var last string
	for deadline := time.Now().Add(30 * time.Second); last != "icanon" && last != "-icanon" && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if f := strings.Fields(screen()); len(f) > 0 {
			last = f[len(f)-1]
		}
	}
	if last != "icanon" {
		t.Fatalf("the local terminal after the session:\n%s", screen())
	}
}

// TestExecStreamsStdin: `harebox exec` with piped stdin sends it as it
// comes. A command that does not read stdin ends at once although the
// pipe stays open and idle (it waited for the pipe's end before); `cat`
// echoes a line before the pipe ends, and the end closes its stdin; stdout
// and stderr stay apart.
func TestExecStreamsStdin(t *testing.T) {
	s := testserver.Prepare(t)
	dataDir, err := os.MkdirTemp("", "hbsi")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.Launch(t, s, dataDir, "--image-dir", s.ImageDir, "--plugin", s.Plugin, "--network", "none", "--tls-self-signed")
	defer func() {
		srv.Stop(t)
		testserver.NoLeftovers(t, dataDir)
	}()
	var box struct{ ID string }
	if err := json.Unmarshal([]byte(testserver.Run(t, srv, s, s.Root, 3*time.Minute, "harebox", "new", "--image", "minimal")), &box); err != nil || box.ID == "" {
		t.Fatalf("new: %v", err)
	}
	defer testserver.Run(t, srv, s, s.Root, time.Minute, "harebox", "delete", box.ID)
	exe := func(args ...string) (*exec.Cmd, io.WriteCloser, *syncBuffer, *syncBuffer) {
		cmd := exec.Command(filepath.Join(s.Bin, "harebox"), append([]string{"exec", box.ID}, args...)...)
		cmd.Env = srv.Env(s)
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out, errOut := &syncBuffer{}, &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, errOut
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, in, out, errOut
	}
	wait := func(cmd *exec.Cmd, within time.Duration) error {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			return err
		case <-time.After(within):
			cmd.Process.Kill()
			return fmt.Errorf("still running after %v", within)
		}
	}

	// The pipe stays open and idle; the command does not read it.
	cmd, in, out, errOut := exe("-c", "echo out; echo err >&2; exit 5")
	defer in.Close()
	if err := wait(cmd, 30*time.Second); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 5 || out.String() != "out\n" || errOut.String() != "err\n" {
		t.Fatalf("with an idle open stdin: %v, stdout %q, stderr %q", err, out.String(), errOut.String())
	}
	// cat: a line is echoed before the pipe ends; the end ends cat.
	cmd, in, out, _ = exe("--", "cat")
	io.WriteString(in, "first line\n")
	for deadline := time.Now().Add(20 * time.Second); out.String() != "first line\n"; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the first line did not come back before the input ended: %q", out.String())
		}
	}
	io.WriteString(in, "second\n")
	in.Close()
	if err := wait(cmd, 30*time.Second); err != nil || out.String() != "first line\nsecond\n" {
		t.Fatalf("cat after the end of its input: %v %q", err, out.String())
	}
}

// syncBuffer is a bytes.Buffer safe to read while a command writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
