package procs

import (
	"os/exec"
	"path/filepath"
	"testing"
)

func TestNaming(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "marker")
	cmd := exec.Command("sh", "-c", "sleep 30", marker) // the marker is $0
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	ps := Naming(marker)
	if len(ps) != 1 || ps[0].PID != cmd.Process.Pid || ps[0].Cmdline != "sh -c sleep 30 "+marker {
		t.Fatalf("got %v", ps)
	}
	if ps[0].IsVMM() {
		t.Fatal("sh is not a VMM")
	}
	if got := Naming(marker + "-nobody"); len(got) != 0 {
		t.Fatalf("matched %v", got)
	}
}
