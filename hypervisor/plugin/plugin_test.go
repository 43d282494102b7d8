package plugin_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/hypervisor/plugin"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/internal/testimage"
)

// These tests run a real plugin process that serves the in-memory
// hypervisor: the process boundary is real, no VM is needed.

func memplugin(t testing.TB) string {
	return testimage.Package(t, "./hypervisor/plugin/testdata/memplugin", "harebox-plugin-memtest")
}

// TestMain doubles as a stand-in engine: with PLUGIN_TEST_ENGINE set, the
// test binary launches the plugin, prints its pid and waits to be killed.
func TestMain(m *testing.M) {
	if bin := os.Getenv("PLUGIN_TEST_ENGINE"); bin != "" {
		// (Its owner is the test's directory: the killed plugin's socket
		// goes with it.)
		p, err := plugin.Launch(context.Background(), bin, nil, os.Getenv("PLUGIN_TEST_OWNER"), nil)
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(p.Pid())
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func alive(pid int) bool {
	// A zombie has exited; its parent has not reaped it yet.
	st, err := procs.ReadStat(pid)
	return err == nil && !st.Exited()
}

// A plugin that dies mid-call fails that call at once with ErrUnavailable;
// the next call starts it again.
func TestPluginCrashAndRestart(t *testing.T) {
	t.Setenv("MEMPLUGIN_LAUNCH_DELAY", "5s") // the plugin inherits it
	dir, err := os.MkdirTemp("", "hbp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	p, err := plugin.Launch(context.Background(), memplugin(t), nil, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	img := memhv.Image(dir)
	spec := hypervisor.Spec{ID: "m1", VCPUs: 1, MemoryMB: 128, Kernel: img.Kernel, Initrd: img.Initrd, StateDir: dir + "/m1"}
	first := p.Pid()
	errc := make(chan error, 1)
	go func() {
		_, err := p.Launch(context.Background(), spec)
		errc <- err
	}()
	time.Sleep(300 * time.Millisecond)
	syscall.Kill(first, syscall.SIGKILL)
	select {
	case err := <-errc:
		if !errors.Is(err, hypervisor.ErrUnavailable) {
			t.Fatalf("the launch in flight: %v, want ErrUnavailable", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the launch in flight was still waiting 3 s after the plugin died")
	}
	waitExited(t, p)
	caps, err := p.Capabilities(context.Background())
	if err != nil || caps.Name != memhv.Name {
		t.Fatalf("the first call after the crash: %+v %v", caps, err)
	}
	if second := p.Pid(); second == 0 || second == first {
		t.Fatalf("plugin pid %d after the restart (was %d)", second, first)
	}
	// The plugin's socket is in the data directory, and the killed one's
	// is gone (go-plugin's default, a file in /tmp, stays after a kill).
	if socks, err := os.ReadDir(filepath.Join(dir, "plugin")); err != nil || len(socks) != 1 {
		t.Fatalf("the data directory's plugin sockets: %v %v, want the live plugin's alone", socks, err)
	}
	// A plugin that cannot start again is retried with backoff, each call
	// failing at once in between.
	os.Chmod(memplugin(t), 0o644)
	defer os.Chmod(memplugin(t), 0o755)
	syscall.Kill(p.Pid(), syscall.SIGKILL)
	waitExited(t, p)
	for range 3 {
		start := time.Now()
		if _, err := p.Capabilities(context.Background()); !errors.Is(err, hypervisor.ErrUnavailable) || time.Since(start) > 2*time.Second {
			t.Fatalf("a call while the plugin cannot start: %v after %v", err, time.Since(start))
		}
	}
	os.Chmod(memplugin(t), 0o755)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err = p.Capabilities(context.Background()); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("the plugin did not come back once it could start: %v", err)
	}
}

// A plugin that the engine closes lets its calls in flight undo what they
// made before it exits.
func TestPluginClosedMidCall(t *testing.T) {
	t.Setenv("MEMPLUGIN_LAUNCH_DELAY", "5s")
	t.Setenv("MEMPLUGIN_UNDO", "300ms")
	dir := t.TempDir()
	p, err := plugin.Launch(context.Background(), memplugin(t), nil, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	img := memhv.Image(dir)
	spec := hypervisor.Spec{ID: "m1", VCPUs: 1, MemoryMB: 128, Kernel: img.Kernel, Initrd: img.Initrd, StateDir: dir + "/m1"}
	errc := make(chan error, 1)
	go func() {
		_, err := p.Launch(context.Background(), spec)
		errc <- err
	}()
	time.Sleep(300 * time.Millisecond)
	p.Close()
	if err := <-errc; err == nil {
		t.Fatal("the launch in flight succeeded")
	}
	if _, err := os.Stat(spec.StateDir + ".undone"); err != nil {
		t.Fatalf("the plugin exited before its launch was undone: %v", err)
	}
}

// waitExited waits until the process has noticed its plugin's death.
func waitExited(t *testing.T, p *plugin.Process) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for !p.Exited() {
		if time.Now().After(deadline) {
			t.Fatal("the plugin's death went unnoticed for 2 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A plugin dies with the engine that started it, even a killed one.
func TestPluginDiesWithEngine(t *testing.T) {
	bin := memplugin(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	engine := exec.Command(self, "-test.run=^$")
	engine.Env = append(os.Environ(), "PLUGIN_TEST_ENGINE="+bin, "PLUGIN_TEST_OWNER="+t.TempDir())
	out, err := engine.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := engine.Start(); err != nil {
		t.Fatal(err)
	}
	defer engine.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	pid, perr := strconv.Atoi(line[:max(len(line)-1, 0)])
	if err != nil || perr != nil || !alive(pid) {
		t.Fatalf("the stand-in engine said %q (%v)", line, err)
	}
	engine.Process.Signal(syscall.SIGKILL)
	engine.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("plugin %d outlived its engine by 5 s", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A plugin started for an engine that is already gone exits at once.
func TestPluginWithoutItsEngineExits(t *testing.T) {
	cmd := exec.Command(memplugin(t))
	cmd.Env = append(os.Environ(), plugin.Handshake.MagicCookieKey+"="+plugin.Handshake.MagicCookieValue,
		plugin.ParentEnv+"=1") // not our pid: its engine is "gone"
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the plugin exited 0")
		}
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		t.Fatal("a plugin whose engine is gone kept running")
	}
}

// A plugin of another protocol version (an install whose plugin and engine
// do not match) is refused at launch with an error that says so, before a
// call could garble anything.
func TestPluginProtocolMismatch(t *testing.T) {
	t.Setenv("MEMPLUGIN_PROTOCOL", strconv.Itoa(int(plugin.Handshake.ProtocolVersion)+1))
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	p, err := plugin.Launch(context.Background(), memplugin(t), nil, "", nil)
	if err == nil {
		p.Close()
		t.Fatal("a plugin of another protocol version was accepted")
	}
	if !errors.Is(err, hypervisor.ErrUnavailable) || !strings.Contains(err.Error(), "incompatible API version") {
		t.Errorf("the refusal: %v", err)
	}
	// The refused plugin was killed: its socket is gone all the same.
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in the temporary directory: %v", left)
	}
}

// Where the data directory cannot take the socket's directory (a full
// disk; here a file stands in its place), the socket goes to a directory
// of its own in the temporary directory, gone once the plugin is closed:
// go-plugin's default would leave a file in /tmp.
func TestPluginSocketWhereDataDirFails(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	owner := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(owner, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := plugin.Launch(context.Background(), memplugin(t), nil, owner, nil)
	if err != nil {
		t.Fatal(err)
	}
	if caps, err := p.Capabilities(context.Background()); err != nil || caps.Name != memhv.Name {
		p.Close()
		t.Fatalf("capabilities: %+v %v", caps, err)
	}
	dirs, _ := filepath.Glob(filepath.Join(tmp, "harebox-plugin-*"))
	p.Close()
	if len(dirs) != 1 {
		t.Errorf("socket directories in TMPDIR while the plugin ran: %v, want one", dirs)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in the temporary directory: %v", left)
	}
}
