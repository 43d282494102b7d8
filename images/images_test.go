package images

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/agent/layout"
	"github.com/u-root/u-root/pkg/cpio"
)

// testWriter sends progress lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// needHost skips the test where the host lacks a kernel or busybox-static.
func needHost(t *testing.T) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("images are built on Linux")
	}
	kver, _, err := findKernel("/boot", "/lib/modules", "")
	if err != nil {
		t.Skipf("no host kernel to build from: %v", err)
	}
	if err := isStatic("/bin/busybox"); err != nil {
		t.Skipf("no static busybox (apt-get install busybox-static): %v", err)
	}
	return kver
}

// testAgent returns an agent binary: $HAREBOX_TEST_AGENT, else
// cmd/harebox-agent built static, else a copy of busybox as a stand-in
// (the layout checks only need some static executable).
func testAgent(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("HAREBOX_TEST_AGENT"); p != "" {
		return p
	}
	dst := filepath.Join(t.TempDir(), "harebox-agent")
	if _, err := os.Stat("../cmd/harebox-agent"); err == nil {
		cmd := exec.Command("go", "build", "-o", dst, "../cmd/harebox-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err == nil {
			return dst
		}
		t.Logf("cmd/harebox-agent does not build (%v), using busybox as a stand-in:\n%s", err, out)
	}
	if err := copyFile(context.Background(), "/bin/busybox", dst, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

type archive struct {
	order []string
	recs  map[string]cpio.Record
	data  map[string][]byte
}

func readInitramfs(t *testing.T, p string) archive {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(bytes.NewReader(raw)))
	if err != nil {
		t.Fatal(err)
	}
	a := archive{recs: map[string]cpio.Record{}, data: map[string][]byte{}}
	for _, r := range recs {
		if _, dup := a.recs[r.Name]; dup {
			t.Errorf("initramfs: %s twice", r.Name)
		}
		a.order = append(a.order, r.Name)
		a.recs[r.Name] = r
		if r.FileSize > 0 {
			b, err := io.ReadAll(io.NewSectionReader(r.ReaderAt, 0, int64(r.FileSize)))
			if err != nil {
				t.Fatal(err)
			}
			a.data[r.Name] = b
		}
	}
	return a
}

func TestMinimalImage(t *testing.T) {
	kver := needHost(t)
	agent := testAgent(t)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	start := time.Now()
	img, err := Build(ctx, Options{Name: Minimal, AgentPath: agent, OutDir: out, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("minimal build: %s", time.Since(start))
	if want := filepath.Join(out, "minimal-"+img.InputHash[:12]); img.Dir != want {
		t.Errorf("dir %s, want %s", img.Dir, want)
	}
	if img.KernelVersion != kver || img.RootDisk != "" || !strings.Contains(img.Cmdline, "console=ttyS0") ||
		strings.Contains(img.Cmdline, layout.ParamRoot) {
		t.Errorf("manifest: %+v", img)
	}
	loaded, err := Load(img.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if loaded.InputHash != img.InputHash || loaded.Kernel != img.Kernel || loaded.Initrd != img.Initrd {
		t.Errorf("Load = %+v, Build = %+v", loaded, img)
	}
	if ents, _ := filepath.Glob(filepath.Join(out, ".tmp-*")); len(ents) > 0 {
		t.Errorf("temp dirs left: %v", ents)
	}

	a := readInitramfs(t, img.Initrd)

	// Parents before children: the kernel's unpacker does not create them.
	seen := map[string]bool{".": true}
	for _, n := range a.order {
		if !seen[filepath.Dir(n)] {
			t.Errorf("%s comes before its directory", n)
		}
		seen[n] = true
	}

	agentBytes, err := os.ReadFile(agent)
	if err != nil {
		t.Fatal(err)
	}
	init := a.recs[strings.TrimPrefix(layout.InitPath, "/")]
	if init.Mode&sIFREG == 0 || init.Mode&0o111 != 0o111 || !bytes.Equal(a.data["init"], agentBytes) {
		t.Errorf("/init: mode %#o, %d bytes; want the agent (%d bytes), executable", init.Mode, len(a.data["init"]), len(agentBytes))
	}
	if bb := a.recs["bin/busybox"]; bb.Mode&0o170000 != sIFREG || bb.Mode&0o111 == 0 {
		t.Errorf("bin/busybox: mode %#o", bb.Mode)
	}
	for _, app := range []string{"sh", "ls", "cat", "sleep", "id", "stty", "tty", "mount"} {
		r, ok := a.recs["bin/"+app]
		if !ok || r.Mode&0o170000 != sIFLNK || string(a.data["bin/"+app]) != "busybox" {
			t.Errorf("bin/%s: not a link to busybox (%v, %#o, %q)", app, ok, r.Mode, a.data["bin/"+app])
		}
	}
	if !strings.Contains(string(a.data["etc/passwd"]), "\nuser:x:1000:1000:user:/home/user:/bin/sh\n") ||
		!strings.HasPrefix(string(a.data["etc/passwd"]), "root:x:0:0:") {
		t.Errorf("etc/passwd:\n%s", a.data["etc/passwd"])
	}
	if !strings.Contains(string(a.data["etc/group"]), "user:x:1000:") {
		t.Errorf("etc/group:\n%s", a.data["etc/group"])
	}
	if h := a.recs["home/user"]; h.UID != 1000 || h.GID != 1000 || h.Mode != sIFDIR|0o755 {
		t.Errorf("home/user: %v", h.Info)
	}
	if r := a.recs["tmp"]; r.Mode != sIFDIR|0o1777 {
		t.Errorf("tmp: mode %#o", r.Mode)
	}
	if r := a.recs["dev/console"]; r.Mode&0o170000 != sIFCHR || r.Rmajor != 5 || r.Rminor != 1 {
		t.Errorf("dev/console: %v", r.Info)
	}
	for _, d := range []string{"proc", "sys", "dev", "run", "newroot", "root", "etc/hostname"} {
		if _, ok := a.recs[d]; !ok {
			t.Errorf("%s missing", d)
		}
	}

	// Modules: all present, dependencies first, per modules.dep.
	deps, _, err := readModulesDep(filepath.Join("/lib/modules", kver, "modules.dep"))
	if err != nil {
		t.Fatal(err)
	}
	load := strings.Fields(string(a.data[strings.TrimPrefix(layout.ModulesLoad, "/")]))
	if len(load) == 0 {
		t.Fatalf("%s empty", layout.ModulesLoad)
	}
	if !slices.Equal(load, img.Modules) {
		t.Errorf("modules.load %v != manifest %v", load, img.Modules)
	}
	pos := map[string]int{}
	for i, p := range load {
		if !strings.HasPrefix(p, "/lib/modules/"+kver+"/") {
			t.Errorf("module path %s", p)
		}
		if r, ok := a.recs[strings.TrimPrefix(p, "/")]; !ok || r.FileSize == 0 {
			t.Errorf("module %s not in the initramfs", p)
		}
		pos[moduleName(p)] = i
	}
	for name, i := range pos {
		for _, d := range deps[name] {
			if j, ok := pos[d]; !ok || j > i {
				t.Errorf("module %s (at %d) needs %s (at %d, present %v)", name, i, d, j, ok)
			}
		}
	}
	for _, m := range []string{"virtio_console", "ext4", "jbd2", "virtio_mmio", "virtio_pci", "virtio_blk",
		"virtio_net", "virtio_rng", "vsock", "vmw_vsock_virtio_transport", "crc32c_generic"} {
		if _, ok := pos[m]; !ok {
			t.Errorf("module %s missing from modules.load", m)
		}
	}
	// On demand (volumes): in the initramfs, not loaded at boot, after
	// their dependencies, none of them twice.
	later := strings.Fields(string(a.data[strings.TrimPrefix(layout.ModulesOnDemand, "/")]))
	if !slices.Equal(later, img.ModulesOnDemand) {
		t.Errorf("modules.ondemand %v != manifest %v", later, img.ModulesOnDemand)
	}
	lpos := map[string]int{}
	for i, p := range later {
		if r, ok := a.recs[strings.TrimPrefix(p, "/")]; !ok || r.FileSize == 0 {
			t.Errorf("on-demand module %s not in the initramfs", p)
		}
		if _, ok := pos[moduleName(p)]; ok {
			t.Errorf("%s is both loaded at boot and on demand", p)
		}
		lpos[moduleName(p)] = i
	}
	for name, i := range lpos {
		for _, d := range deps[name] {
			_, atBoot := pos[d]
			if j, ok := lpos[d]; !atBoot && (!ok || j > i) {
				t.Errorf("on-demand module %s (at %d) needs %s (at %d, present %v)", name, i, d, j, ok)
			}
		}
	}
	for _, m := range []string{"virtio_scsi", "sd_mod", "scsi_mod"} {
		if _, ok := lpos[m]; !ok {
			t.Errorf("module %s missing from modules.ondemand", m)
		}
	}

	// Same inputs: a cache hit, same directory, fast.
	start = time.Now()
	img2, err := Build(ctx, Options{Name: Minimal, AgentPath: agent, OutDir: out})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("cached build took %s", d)
	} else {
		t.Logf("cached build: %s", d)
	}
	if img2.Dir != img.Dir || !img2.BuiltAt.Equal(img.BuiltAt) {
		t.Errorf("second build not a cache hit: %s %v vs %s %v", img2.Dir, img2.BuiltAt, img.Dir, img.BuiltAt)
	}

	// A different agent: a different hash and directory.
	agent2 := filepath.Join(t.TempDir(), "agent2")
	if err := os.WriteFile(agent2, append(agentBytes, 0), 0o755); err != nil {
		t.Fatal(err)
	}
	img3, err := Build(ctx, Options{Name: Minimal, AgentPath: agent2, OutDir: out})
	if err != nil {
		t.Fatal(err)
	}
	if img3.InputHash == img.InputHash || img3.Dir == img.Dir {
		t.Errorf("changing the agent kept hash %s", img.InputHash)
	}

	// An incomplete directory (no manifest) is not an image: rebuilt.
	if err := os.Remove(filepath.Join(img.Dir, ManifestFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(img.Dir); err == nil {
		t.Error("Load of a directory without manifest succeeded")
	}
	img4, err := Build(ctx, Options{Name: Minimal, AgentPath: agent, OutDir: out})
	if err != nil {
		t.Fatal(err)
	}
	if img4.Dir != img.Dir || img4.BuiltAt.Before(img.BuiltAt) {
		t.Errorf("rebuild: %+v", img4)
	}

	// A moved image still loads, with paths in its new place.
	moved := filepath.Join(out, "moved")
	if err := os.Rename(img.Dir, moved); err != nil {
		t.Fatal(err)
	}
	m, err := Load(moved)
	if err != nil {
		t.Fatal(err)
	}
	if m.Initrd != filepath.Join(moved, InitrdFile) {
		t.Errorf("moved image initrd %s", m.Initrd)
	}
}

func TestResolveModules(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("modules.dep", `kernel/a.ko: kernel/b-x.ko kernel/c.ko
kernel/b-x.ko: kernel/c.ko
kernel/c.ko:
kernel/loop1.ko: kernel/loop2.ko
kernel/loop2.ko: kernel/loop1.ko
`)
	write("modules.builtin", "kernel/fs/builtin_fs.ko\n")
	for _, f := range []string{"a.ko", "b-x.ko", "c.ko", "loop1.ko", "loop2.ko"} {
		os.MkdirAll(filepath.Join(dir, "kernel"), 0o755)
		write(filepath.Join("kernel", f), "mod")
	}
	mods, err := resolveModules(dir, []string{"a", "builtin_fs", "c", "b_x"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range mods {
		names = append(names, m.name)
	}
	if want := []string{"c", "b_x", "a"}; !slices.Equal(names, want) {
		t.Errorf("order %v, want %v", names, want)
	}
	if _, err := resolveModules(dir, []string{"loop1"}); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Errorf("cycle: %v", err)
	}
	if _, err := resolveModules(dir, []string{"nosuch"}); err == nil {
		t.Error("unknown module accepted")
	}
}

func TestVersionLess(t *testing.T) {
	for _, c := range [][2]string{{"6.1.0-9-amd64", "6.1.0-10-amd64"}, {"5.10.0-30-amd64", "6.1.0-1-amd64"}, {"6.1.0", "6.1.0-1"}} {
		if !versionLess(c[0], c[1]) || versionLess(c[1], c[0]) {
			t.Errorf("versionLess(%s, %s) wrong", c[0], c[1])
		}
	}
}

// TestMinimalBootSmoke boots the minimal image under QEMU microvm with a
// stand-in /init (testdata/smokeinit) that loads every module in
// modules.load and mounts an ext4 disk; set HAREBOX_TEST_BOOT=1 to run it.
func TestMinimalBootSmoke(t *testing.T) {
	if os.Getenv("HAREBOX_TEST_BOOT") != "1" {
		t.Skip("set HAREBOX_TEST_BOOT=1 to boot the minimal image under QEMU")
	}
	needHost(t)
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed")
	}
	tmp := t.TempDir()
	initBin := filepath.Join(tmp, "smokeinit")
	cmd := exec.Command("go", "build", "-o", initBin, "./testdata/smokeinit")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build smokeinit: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	img, err := Build(ctx, Options{Name: Minimal, AgentPath: initBin, OutDir: filepath.Join(tmp, "out")})
	if err != nil {
		t.Fatal(err)
	}
	// A small ext4 disk with mkfs.ext4's default features (metadata_csum
	// needs crc32c).
	src := filepath.Join(tmp, "src")
	os.MkdirAll(filepath.Join(src, "hello"), 0o755)
	disk := filepath.Join(tmp, "disk.ext4")
	if out, err := exec.Command("mkfs.ext4", "-q", "-d", src, disk, "16M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	// Under TCG the guest's TSC is the host's; telling the kernel its rate
	// skips the PIT calibration, which fails (and the boot hangs) when the
	// host is busy. A backend should do the same.
	cmdline := img.Cmdline
	if khz := hostTSCkHz(); khz > 0 {
		cmdline += fmt.Sprintf(" tsc_early_khz=%d", khz)
	}
	start := time.Now()
	out, err := exec.CommandContext(ctx, qemu,
		"-M", "microvm", "-accel", "tcg", "-cpu", "max", "-m", "512", "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", "stdio", "-monitor", "none",
		"-kernel", img.Kernel, "-initrd", img.Initrd, "-append", cmdline,
		"-device", "virtio-serial-device", "-chardev", "null,id=agent",
		"-device", "virtserialport,chardev=agent,name="+layout.SerialName,
		"-drive", "file="+disk+",if=none,id=vda,format=raw,readonly=on",
		"-device", "virtio-blk-device,drive=vda",
	).CombinedOutput()
	t.Logf("qemu ran %s, err %v", time.Since(start).Round(100*time.Millisecond), err)
	s := string(out)
	if !strings.Contains(s, "SMOKE DONE") {
		t.Fatalf("no SMOKE DONE:\n%s", s)
	}
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "SMOKE") {
			t.Log(strings.TrimSpace(l))
		}
		if strings.HasPrefix(l, "SMOKE load") && !strings.HasSuffix(strings.TrimSpace(l), ": <nil>") {
			t.Errorf("module failed: %s", l)
		}
	}
	for _, want := range []string{"SMOKE port vport", " " + layout.SerialName, "SMOKE mount /dev/vda: <nil>", "SMOKE root ", "hello"} {
		if !strings.Contains(s, want) {
			t.Errorf("console lacks %q", want)
		}
	}
}

// hostTSCkHz reads the host CPU's rate from /proc/cpuinfo (0 if unknown).
func hostTSCkHz() int64 {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil || !strings.Contains(string(b), "constant_tsc") {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0
			}
			return int64(mhz * 1000)
		}
	}
	return 0
}
