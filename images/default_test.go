package images_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/testimage"
)

// TestDefaultImage checks the Debian image every test package boots: the
// one in the test images' cache (testimage.ImagesDir, shared by the
// machine's clones), which whichever package asks first builds with
// debootstrap against the Debian mirror (about three minutes), so a fresh
// machine (CI) runs debootstrap once, not once more here. The cache is keyed by the image's inputs (the package list and
// script, the files written into it, kernel, modules, agent) and by
// images.BuilderVersion: a change to the builder's own steps must bump
// BuilderVersion, or a machine with a warm cache goes on checking the
// old build (a fresh machine, as in CI, always builds).
// Set HAREBOX_TEST_DEFAULT_IMAGE=1 to run it.
func TestDefaultImage(t *testing.T) {
	if os.Getenv("HAREBOX_TEST_DEFAULT_IMAGE") != "1" {
		t.Skip("set HAREBOX_TEST_DEFAULT_IMAGE=1 to debootstrap the default image (needs root and the Debian mirror)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, tool := range []string{"debootstrap", "mkfs.ext4", "debugfs", "e2fsck"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	start := time.Now()
	img := testimage.Image(t, images.Default)
	took := time.Since(start)
	agent := testimage.Binary(t, "harebox-agent") // (the same, reproducible build)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if img.RootDisk == "" || img.RootDiskFormat != "raw" || !strings.Contains(img.Cmdline, layout.ParamRoot+"=/dev/vda") {
		t.Fatalf("manifest: %+v", img)
	}
	st, err := os.Stat(img.RootDisk)
	if err != nil {
		t.Fatal(err)
	}
	var used int64
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		used = sys.Blocks * 512
	}
	t.Logf("default image (built or found in the cache) in %s; rootfs.ext4 %d MiB (%d MiB allocated), mode %v", took.Round(time.Second), st.Size()>>20, used>>20, st.Mode())
	if st.Mode().Perm()&0o222 != 0 {
		t.Errorf("root disk is writable: %v", st.Mode())
	}
	if out, err := exec.Command("e2fsck", "-fn", img.RootDisk).CombinedOutput(); err != nil {
		t.Errorf("e2fsck: %v\n%s", err, out)
	}

	debugfs := func(req string) string {
		t.Helper()
		out, err := exec.Command("debugfs", "-R", req, img.RootDisk).Output()
		if err != nil {
			t.Errorf("debugfs %q: %v", req, err)
		}
		return string(out)
	}
	agentBytes, _ := os.ReadFile(agent)
	if got := debugfs("cat " + layout.AgentPath); got != string(agentBytes) {
		t.Errorf("%s: %d bytes, want the agent (%d bytes)", layout.AgentPath, len(got), len(agentBytes))
	}
	if s := debugfs("stat " + layout.AgentPath); !strings.Contains(s, "Mode:  0755") {
		t.Errorf("agent mode:\n%s", s)
	}
	unit := debugfs("cat /etc/systemd/system/" + layout.AgentUnit)
	for _, want := range []string{"Type=simple", "ExecStart=" + layout.AgentPath + " serve", "Restart=always", "OOMPolicy=continue", "Nice=-15", "StandardOutput=journal+console", "WantedBy=multi-user.target"} {
		if !strings.Contains(unit, want) {
			t.Errorf("unit lacks %q:\n%s", want, unit)
		}
	}
	links := map[string]string{
		"/etc/systemd/system/multi-user.target.wants/" + layout.AgentUnit: "/etc/systemd/system/" + layout.AgentUnit,
		"/etc/systemd/system/serial-getty@.service":                       "/dev/null",
		"/etc/systemd/system/systemd-sysusers.service":                    "/dev/null",
		"/etc/systemd/system/default.target":                              "/lib/systemd/system/multi-user.target",
	}
	for l, target := range links {
		if s := debugfs("stat " + l); !strings.Contains(s, `Fast link dest: "`+target+`"`) {
			t.Errorf("%s is not a link to %s:\n%s", l, target, s)
		}
	}
	if s := debugfs("stat /sbin/init"); !strings.Contains(s, "systemd") {
		t.Errorf("/sbin/init is not systemd:\n%s", s)
	}
	passwd := debugfs("cat /etc/passwd")
	if !strings.Contains(passwd, "\nuser:x:1000:1000:") {
		t.Errorf("/etc/passwd:\n%s", passwd)
	}
	if s := debugfs("cat /etc/sudoers.d/harebox"); !strings.Contains(s, "user ALL=(ALL:ALL) NOPASSWD: ALL") {
		t.Errorf("sudoers: %q", s)
	}
	if s := debugfs("stat /home/user"); !strings.Contains(s, "User:  1000") {
		t.Errorf("/home/user:\n%s", s)
	}
	// A login shell of bash asks $EUID, not id(1) (see profileUIDFast).
	if s := debugfs("cat /etc/profile"); strings.Contains(s, `"$(id -u)"`) || !strings.Contains(s, `if [ "${EUID:-$(id -u)}" -eq 0 ]; then`) {
		t.Errorf("/etc/profile:\n%s", s)
	}
	if s := debugfs("cat /etc/machine-id"); s != "" {
		t.Errorf("machine-id not empty: %q", s)
	}
	if s := debugfs("cat /etc/hostname"); s != "harebox\n" {
		t.Errorf("hostname %q", s)
	}
	if s := debugfs("ls /var/cache/apt/archives"); strings.Contains(s, ".deb") {
		t.Errorf("apt cache not cleaned:\n%s", s)
	}
	for _, bin := range []string{"/usr/bin/sudo", "/usr/bin/python3", "/usr/sbin/ip", "/usr/bin/dbus-daemon",
		"/usr/bin/pip3", "/usr/lib/python3.11/ensurepip/__init__.py", "/usr/include/python3.11/Python.h",
		"/usr/bin/curl", "/usr/bin/git", "/usr/bin/gcc", "/usr/bin/make", "/etc/ssl/certs/ca-certificates.crt"} {
		if s := debugfs("stat " + bin); !strings.Contains(s, "Inode:") {
			t.Errorf("%s missing", bin)
		}
	}
	sc := bufio.NewScanner(strings.NewReader(debugfs("cat /etc/fstab")))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 1 && !strings.HasPrefix(f[0], "#") && f[1] != "/" {
			t.Errorf("fstab mounts more than /: %q", sc.Text())
		}
	}

	// Cached.
	start = time.Now()
	img2, err := images.Build(ctx, images.Options{Name: images.Default, AgentPath: agent, OutDir: filepath.Dir(img.Dir)})
	if err != nil {
		t.Fatal(err)
	}
	if img2.Dir != img.Dir || time.Since(start) > 2*time.Second {
		t.Errorf("second default build not cached (%s, %s)", img2.Dir, time.Since(start))
	}
}
