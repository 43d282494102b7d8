package host

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/internal/testserver"
)

// TestDeploy installs HareBox into a staging root the way an operator
// would (scripts/install.sh, twice: it is idempotent and keeps an edited
// config), checks the unit with systemd-analyze verify (no systemd runs
// as PID 1 here to start it), checks the installed config, and runs the
// installed hareboxd with it as systemd would for Type=notify: READY=1
// once it answers, STOPPING=1 on SIGTERM.
func TestDeploy(t *testing.T) {
	s := testserver.PrepareNoVM(t)
	for _, name := range []string{"harebox-plugin-cloud-hypervisor", "harebox-image", "harebox-agent"} {
		testimage.Binary(t, name)
	}
	root := t.TempDir()
	install := func() {
		t.Helper()
		cmd := exec.Command(filepath.Join(s.Root, "scripts", "install.sh"))
		cmd.Env = append(os.Environ(), "DESTDIR="+root, "PREFIX=/usr/local", "BIN="+s.Bin)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("install.sh: %v\n%s", err, out)
		}
	}
	install()
	for path, mode := range map[string]os.FileMode{
		"usr/local/bin/hareboxd": 0o755, "usr/local/bin/harebox": 0o755, "usr/local/bin/harebox-plugin-qemu": 0o755,
		"usr/local/bin/harebox-image": 0o755, "usr/local/lib/harebox/harebox-agent": 0o755,
		"etc/systemd/system/hareboxd.service": 0o644, "etc/harebox/hareboxd.yaml": 0o644,
	} {
		if fi, err := os.Stat(filepath.Join(root, path)); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v %v, want mode %v", path, fi, err, mode)
		}
	}
	config := filepath.Join(root, "etc/harebox/hareboxd.yaml")
	edited := append(testserver.ReadFile(t, config), []byte("debug: true\n")...)
	os.WriteFile(config, edited, 0o644)
	install()
	if !bytes.Equal(testserver.ReadFile(t, config), edited) {
		t.Error("a second install overwrote the operator's config")
	}
	unit := string(testserver.ReadFile(t, filepath.Join(root, "etc/systemd/system/hareboxd.service")))
	for _, want := range []string{"Type=notify", "KillMode=process", "ExecStart=/usr/local/bin/hareboxd --config /etc/harebox/hareboxd.yaml", "ExecReload=/bin/kill -HUP $MAINPID", "StateDirectory=harebox"} {
		if !strings.Contains(unit, want+"\n") {
			t.Errorf("the unit lacks %q", want)
		}
	}
	if _, err := exec.LookPath("systemd-analyze"); err == nil {
		// (verify needs ExecStart's binary where the unit names it.)
		staged := filepath.Join(t.TempDir(), "hareboxd.service")
		os.WriteFile(staged, []byte(strings.ReplaceAll(unit, "/usr/local/bin/", filepath.Join(root, "usr/local/bin")+"/")), 0o644)
		out, err := exec.Command("systemd-analyze", "verify", staged).CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) != 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	} else {
		t.Log("systemd-analyze is not installed: the unit is not verified")
	}
	hareboxd := filepath.Join(root, "usr/local/bin/hareboxd")
	if out, err := exec.Command(hareboxd, "config", "check", config).CombinedOutput(); err != nil || !strings.Contains(string(out), ": ok") {
		t.Errorf("config check of the installed config: %v %s", err, out)
	}

	// Type=notify, as systemd runs it: a datagram socket in NOTIFY_SOCKET.
	dataDir, err := os.MkdirTemp("", "hbdp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	sock := filepath.Join(dataDir, "notify")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	addr := testserver.FreeAddr(t)
	// The flags win over the config's data directory, address and network.
	cmd := exec.Command(hareboxd, "--config", config, "--data-dir", dataDir, "--listen", addr, "--network", "none", "--image-dir", filepath.Join(dataDir, "no-images"))
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	message := func() string {
		t.Helper()
		notify.SetReadDeadline(time.Now().Add(30 * time.Second))
		b := make([]byte, 512)
		n, err := notify.Read(b)
		if err != nil {
			t.Fatalf("no notification from hareboxd: %v\n%s", err, log.String())
		}
		return string(b[:n])
	}
	if m := message(); m != "READY=1" {
		t.Fatalf("first notification %q", m)
	}
	resp, err := http.Get("http://" + addr + "/ready")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/ready after READY=1: %v %v", resp, err)
	}
	resp.Body.Close()
	cmd.Process.Signal(syscall.SIGTERM)
	if m := message(); m != "STOPPING=1" {
		t.Errorf("on SIGTERM: %q", m)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("hareboxd: %v\n%s", err, log.String())
	}
	// (Read once it has exited: a request's line is written after its
	// answer.)
	if !strings.Contains(log.String(), "level=DEBUG") {
		t.Errorf("the config's debug: true was not applied:\n%s", log.String())
	}
}
