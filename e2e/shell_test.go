package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	s := prepare(t)
	dataDir, err := os.MkdirTemp("", "hbsh")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := launch(t, s, dataDir, "--image-dir", s.imageDir, "--plugin", s.plugin, "--network", "none")
	defer func() {
		srv.stop(t)
		noLeftovers(t, dataDir)
	}()
	var box struct{ ID string }
	if err := json.Unmarshal([]byte(run(t, srv, s, s.root, 3*time.Minute, "harebox", "new", "--image", "minimal")), &box); err != nil || box.ID == "" {
		t.Fatalf("new: %v", err)
	}
	defer run(t, srv, s, s.root, time.Minute, "harebox", "delete", box.ID)

	sock := fmt.Sprintf("hbtest%d", os.Getpid())
	tmux := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("tmux", append([]string{"-u", "-L", sock, "-f", "/dev/null"}, args...)...)
		cmd.Env = append(srv.env(s), "LANG=C.UTF-8")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	session := filepath.Join(s.bin, "harebox") + " shell " + box.ID +
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
				t.Fatalf("%q not on the screen after 30 s:\n%s\nserver log:\n%s", want, screen(), tail(srv.log.String()))
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
	// Cooked mode again: the client restored the local terminal.
	lines := strings.Fields(screen())
	if lines[len(lines)-1] != "icanon" {
		t.Fatalf("the local terminal after the session:\n%s", screen())
	}
}
