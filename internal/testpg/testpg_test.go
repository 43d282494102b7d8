package testpg

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A server whose test process was killed (a timeout) is stopped, and its
// directory removed, by the next Start.
func TestStaleServerReaped(t *testing.T) {
	if os.Getenv("TESTPG_CHILD") == "1" {
		s, err := Start()
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(s.dir)
		time.Sleep(time.Minute) // (killed before it ends)
		return
	}
	if _, err := binDir(); err != nil {
		t.Skip(err)
	}
	child := exec.Command(os.Args[0], "-test.run", "^TestStaleServerReaped$")
	child.Env = append(os.Environ(), "TESTPG_CHILD=1")
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	dir := strings.TrimSpace(line)
	if err != nil || !strings.Contains(dir, "hbpg") {
		child.Process.Kill()
		t.Fatalf("the child's server: %q %v", line, err)
	}
	child.Process.Kill()
	child.Wait()
	running := func() bool { return exec.Command("pgrep", "-f", "postgres -D "+dir+"/data").Run() == nil }
	if !running() {
		t.Fatal("the killed child's server is not running: nothing to reap")
	}
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if running() {
		t.Fatal("the killed child's server still runs after Start")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the killed child's directory: %v", err)
	}
}
