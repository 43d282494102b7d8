package procs

import (
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

func TestNaming(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "marker")
	// read is a shell builtin, so sh never forks a child that would
	// briefly carry the same command line; the open stdin keeps it waiting.
	cmd := exec.Command("sh", "-c", "read x", marker) // the marker is $0
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() }()
	// Start returns once the child has switched to its new image, which
	// is a moment before the kernel records where its arguments are: until
	// then its cmdline reads empty. Naming is a snapshot, so wait for it.
	var ps []Proc
	for deadline := time.Now().Add(10 * time.Second); len(ps) == 0 && time.Now().Before(deadline); {
		if ps = Naming(marker); len(ps) == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if len(ps) != 1 || ps[0].PID != cmd.Process.Pid || ps[0].Cmdline != "sh -c read x "+marker {
		t.Fatalf("got %v", ps)
	}
	if ps[0].IsVMM() {
		t.Fatal("sh is not a VMM")
	}
	if got := Naming(marker + "-nobody"); len(got) != 0 {
		t.Fatalf("matched %v", got)
	}
}
