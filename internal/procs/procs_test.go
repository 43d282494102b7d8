package procs

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func TestNaming(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "marker")
	cmd := waiting(t, "sh", marker)
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

// TestKillVMMsForking: a VMM that forks while it is swept (as QEMU's
// -daemonize does) leaves none of its forks behind.
func TestKillVMMsForking(t *testing.T) {
	dir := t.TempDir()
	// A shell under a VMM's name: its subshells are forks of it, with its
	// executable and command line, made every few milliseconds.
	vmm := fakeVMM(t, dir)
	marker := filepath.Join(dir, "m")
	cmd := exec.Command(vmm, "-c", "while :; do ( while :; do sleep 1; done ) & sleep 0.002; done", marker+"/x")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); len(vmms(marker)) < 5; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the fake VMM did not fork: %v", Naming(marker+"/"))
		}
	}
	if n := KillVMMs(marker); n == 0 {
		t.Fatalf("KillVMMs stopped %d", n)
	}
	// (A fork caught between fork and exec becomes a sleep at once.)
	time.Sleep(200 * time.Millisecond)
	if left := vmms(marker); len(left) > 0 {
		t.Fatalf("left running: %v", left)
	}
}

func vmms(marker string) (out []Proc) {
	for _, p := range Naming(marker + "/") {
		if p.IsVMM() {
			out = append(out, p)
		}
	}
	return out
}

// TestKillVMMsForkAfterScan: QEMU's middle fork of -daemonize exits as
// soon as it has forked the VMM proper, so a scan can list it (gone by its
// kill) or read it as gone (no command line), and miss the VMM, forked
// after the scan's snapshot. Neither ends the sweep: the VMM is stopped.
func TestKillVMMsForkAfterScan(t *testing.T) {
	for _, c := range []struct {
		name  string
		first func(mid Proc) []Proc // what the first scan sees
	}{
		{"the middle process listed", func(mid Proc) []Proc { return []Proc{mid} }},
		{"nothing listed", func(Proc) []Proc { return nil }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			vmm := fakeVMM(t, dir)
			marker := filepath.Join(dir, "m")
			// The middle process: run to its end before the sweep.
			mid := exec.Command(vmm, "-c", "true", marker+"/x")
			if err := mid.Run(); err != nil {
				t.Fatal(err)
			}
			waiting(t, vmm, marker+"/x") // the VMM proper
			for deadline := time.Now().Add(10 * time.Second); len(vmms(marker)) == 0; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the fake VMM did not start")
				}
			}
			scans := 0
			scan := func(s string) []Proc {
				if scans++; scans == 1 {
					return c.first(Proc{PID: mid.Process.Pid, Exe: vmm, Cmdline: vmm + " -c true " + marker + "/x"})
				}
				return Naming(s)
			}
			if n := killVMMs(marker, scan); n != 1 {
				t.Errorf("killVMMs stopped %d, want 1", n)
			}
			if left := vmms(marker); len(left) > 0 {
				t.Fatalf("left running: %v", left)
			}
			if scans != 4 {
				t.Errorf("%d scans: want 4 (the first, the one that found the VMM, and two that found nothing)", scans)
			}
		})
	}
}

// waiting starts a shell (bin, a copy of sh) that waits, with arg0 as its
// $0, and stops it when the test ends. read is a shell builtin, so the
// shell never forks a child that would briefly carry the same command
// line; the open stdin keeps it waiting.
func waiting(t *testing.T, bin, arg0 string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, "-c", "read x", arg0)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// fakeVMM copies /bin/sh under a VMM's name into dir.
func fakeVMM(t *testing.T, dir string) string {
	t.Helper()
	vmm := filepath.Join(dir, "qemu-system-fake")
	b, err := os.ReadFile("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(vmm, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return vmm
}

// TestStat: a command with spaces and parentheses in its name is parsed
// from its last ')'; this process's own stat reads back not exited, with a
// start time that stays and CPU time that grows; a zombie has exited.
func TestStat(t *testing.T) {
	s, err := ParseStat([]byte("42 (a b) c)) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 12345 1000 10 18446744073709551615"))
	if err != nil || s.State != 'S' || s.CPU != 3*time.Second || s.StartTime != 12345 || s.Exited() {
		t.Errorf("parsed %+v, %v", s, err)
	}
	for _, bad := range []string{"", "42 (x", "42 (x) S 1 2", "42 (x) S 1 42 42 0 -1 4194560 100 0 0 0 u 50 0 0 20 0 1 0 12345"} {
		if _, err := ParseStat([]byte(bad)); err == nil {
			t.Errorf("ParseStat(%q): no error", bad)
		}
	}
	me, err := ReadStat(os.Getpid())
	if err != nil || me.Exited() || me.StartTime == 0 {
		t.Fatalf("this process: %+v, %v", me, err)
	}
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	again, err := ReadStat(os.Getpid())
	if err != nil || again.StartTime != me.StartTime || again.CPU <= me.CPU {
		t.Errorf("this process after 50 ms busy: %+v, before %+v (%v)", again, me, err)
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if s, err := ReadStat(cmd.Process.Pid); err == nil && s.Exited() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("an exited child never reads as exited")
		}
	}
}
