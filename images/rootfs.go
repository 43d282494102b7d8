package images

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/internal/mounts"
)

// agentUnit is layout.AgentUnit. The agent starts early (no default
// dependencies, only after the journal's socket) so the host reaches it
// before multi-user is fully up. Not after local-fs.target either: the
// initramfs mounted / read-write and /dev, /proc, /sys and /run before
// systemd started, and waiting for the target (device nodes from
// tmpfiles, a remount of / with the same options) started the agent
// 0.7 to 0.9 s later in a cold boot under software emulation, of about
// 5 s to its first answer (measured here). KillMode=process keeps
// commands it started alive across an agent restart; it is the last thing
// the OOM killer should pick, and a command of its the OOM killer picks
// does not stop the service (OOMPolicy's default, stop, would restart the
// agent and cut every session). It runs raised (Nice) until it starts its
// first command (agent/guest's unboost): a boot's units then do not hold
// up its start. Its few lines (serving, a host connected, a session ended)
// go to the console too, as the minimal image's do: the host keeps the
// serial log, so an agent that does not answer can be told from one that
// never started.
const agentUnit = `[Unit]
Description=HareBox guest agent
DefaultDependencies=no
After=systemd-journald.socket
Conflicts=shutdown.target
Before=shutdown.target
StartLimitIntervalSec=0

[Service]
Type=simple
ExecStart=` + layout.AgentPath + ` serve
Restart=always
RestartSec=1
KillMode=process
OOMScoreAdjust=-900
OOMPolicy=continue
Nice=-15
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
`

// fstab: the agent (as the initramfs init) mounts harebox.root on / before
// systemd starts; this line only gives systemd-remount-fs the options.
const fstab = `# HareBox: / is mounted by the harebox agent in the initramfs (harebox.root).
/dev/vda	/	ext4	rw,relatime,errors=remount-ro	0	0
`

// profileUID is how Debian's /etc/profile asks whether the shell is
// root's, and profileUIDFast how the image asks it: a login shell
// (bash -l, which E2B's SDK runs every command under) then forks no id(1),
// about 60 ms a shell under software emulation. bash sets EUID; dash and
// other shells do not, and ask id as before.
const profileUID, profileUIDFast = `"$(id -u)"`, `"${EUID:-$(id -u)}"`

// masked units: gettys (the host talks to the agent, not a login prompt;
// the serial console is only a log) and timers that would compete with the
// tenant's work for the CPU right after boot. Under software emulation
// each unit a boot starts costs a process or two, and they all share the
// guest's one CPU with the agent's start: so also the loading of kernel
// modules the image does not have (the guest's modules are in its
// initramfs), and the debug, tracing and huge-page file systems and
// binfmt_misc, which root can mount when it needs them; and sysusers, which
// finds at every boot the system users the build made (0.3 s before the
// agent could start).
var maskedUnits = []string{
	"serial-getty@.service",
	"getty@.service",
	"apt-daily.timer",
	"apt-daily-upgrade.timer",
	"e2scrub_all.timer",
	"e2scrub_reap.service",
	"fstrim.timer",
	"modprobe@configfs.service",
	"modprobe@dm_mod.service",
	"modprobe@drm.service",
	"modprobe@efi_pstore.service",
	"modprobe@fuse.service",
	"modprobe@loop.service",
	"systemd-modules-load.service",
	"systemd-pstore.service",
	"systemd-sysusers.service", // (the image's users exist; a package adds its own at install)
	"sys-kernel-debug.mount",
	"sys-kernel-tracing.mount",
	"sys-kernel-config.mount",
	"sys-fs-fuse-connections.mount",
	"dev-hugepages.mount",
	"proc-sys-fs-binfmt_misc.automount",
}

// maskedGenerators are systemd's generators that find nothing to do in a
// sandbox (no encrypted, verity or GPT-discovered disks, no rc.local, no
// getty, no hibernation, no boot counting) but each cost an exec at every
// boot before any unit starts. The fstab generator stays, and so does the
// SysV one: a package a tenant installs may ship only an init script.
var maskedGenerators = []string{
	"systemd-bless-boot-generator",
	"systemd-cryptsetup-generator",
	"systemd-debug-generator",
	"systemd-getty-generator",
	"systemd-gpt-auto-generator",
	"systemd-hibernate-resume-generator",
	"systemd-integritysetup-generator",
	"systemd-rc-local-generator",
	"systemd-run-generator",
	"systemd-system-update-generator",
	"systemd-veritysetup-generator",
}

// buildRootDisk debootstraps a root file system under work and packs it
// into the raw ext4 image dst.
func buildRootDisk(ctx context.Context, lg *logger, o *Options, work, dst string) error {
	root := filepath.Join(work, "rootfs")
	defer func() {
		if err := mounts.RemoveAll(root); err != nil {
			lg.step("warning: cleaning %s: %v", root, err)
		}
	}()
	t := time.Now()
	if err := baseTree(ctx, lg, o, root); err != nil {
		return err
	}
	lg.step("debootstrap finished in %s", time.Since(t).Round(time.Second))
	if len(o.Extra) > 0 {
		t = time.Now()
		if err := aptInstall(ctx, lg, root, o.Extra); err != nil {
			return err
		}
		lg.step("apt-get install finished in %s", time.Since(t).Round(time.Second))
	}
	lg.step("configuring root file system")
	if err := configureRoot(ctx, lg, o, root); err != nil {
		return err
	}
	lg.step("cleaning apt caches and logs")
	if err := cleanRoot(root); err != nil {
		return err
	}
	return makeExt4(ctx, lg, o, root, dst)
}

func debootstrap(ctx context.Context, lg *logger, o *Options, root string) error {
	bin, err := exec.LookPath("debootstrap")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/debootstrap"); serr != nil {
			return errors.New("debootstrap not found (apt-get install debootstrap)")
		}
		bin = "/usr/sbin/debootstrap"
	}
	if os.Geteuid() != 0 {
		return errors.New("building the default image needs root (debootstrap, chroot)")
	}
	args := []string{
		"--variant=minbase",
		"--include=" + strings.Join(o.Packages, ","),
		"--components=" + strings.Join(o.Components, ","),
	}
	if o.Keyring != "" {
		args = append(args, "--keyring="+o.Keyring)
	}
	args = append(args, o.Suite, root, o.Mirror)
	if o.Script != "" {
		args = append(args, scriptPath(o.Script))
	}
	lg.step("debootstrap %s", strings.Join(args, " "))
	return run(ctx, lg, "debootstrap: ", bin, args...)
}

// aptInstall installs pkgs (and what they depend on, no more) in root
// with its own apt, /proc mounted for their scripts.
func aptInstall(ctx context.Context, lg *logger, root string, pkgs []string) error {
	proc := filepath.Join(root, "proc")
	if err := unix.Mount("proc", proc, "proc", 0, ""); err != nil {
		return fmt.Errorf("mount %s: %w", proc, err)
	}
	defer unix.Unmount(proc, unix.MNT_DETACH)
	if err := run(ctx, lg, "apt-get: ", "/usr/sbin/chroot", root, "apt-get", "update", "-qq"); err != nil {
		return err
	}
	args := append([]string{root, "apt-get", "install", "-y", "-qq", "--no-install-recommends"}, pkgs...)
	return run(ctx, lg, "apt-get: ", "/usr/sbin/chroot", args...)
}

// scriptPath is the file of a debootstrap script given by name or path.
func scriptPath(s string) string {
	if !strings.Contains(s, "/") {
		return filepath.Join(debootstrapScripts, s)
	}
	return s
}

// run runs a command in its own process group (killed whole on cancel),
// streaming its output to the progress writer behind prefix.
func run(ctx context.Context, lg *logger, prefix, bin string, args ...string) error {
	cmd := exec.CommandContext(ctx, bin, args...)
	pw := &prefixWriter{w: lg.w, prefix: "harebox-image[" + lg.name + "]: " + prefix}
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LANG=C.UTF-8", "LC_ALL=C.UTF-8", "DEBIAN_FRONTEND=noninteractive",
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	pw.flush()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%s: %w", filepath.Base(bin), err)
	}
	return nil
}

func configureRoot(ctx context.Context, lg *logger, o *Options, root string) error {
	p := func(rel string) string { return filepath.Join(root, rel) }
	write := func(rel, content string, mode os.FileMode) error {
		if err := os.MkdirAll(filepath.Dir(p(rel)), 0o755); err != nil {
			return err
		}
		os.Remove(p(rel)) // may be a symlink (resolv.conf): never write through it
		if err := os.WriteFile(p(rel), []byte(content), mode); err != nil {
			return err
		}
		return os.Chmod(p(rel), mode)
	}
	symlink := func(target, rel string) error {
		if err := os.MkdirAll(filepath.Dir(p(rel)), 0o755); err != nil {
			return err
		}
		os.Remove(p(rel))
		return os.Symlink(target, p(rel))
	}

	// The unprivileged user, uid/gid 1000, passwordless sudo.
	if err := run(ctx, lg, "useradd: ", "/usr/sbin/chroot", root, "useradd",
		"--uid", fmt.Sprint(layout.DefaultUID), "--user-group", "--create-home",
		"--home-dir", layout.DefaultHome, "--shell", "/bin/bash", "--comment", "HareBox user",
		layout.DefaultUser); err != nil {
		return err
	}
	steps := []func() error{
		func() error {
			return write("etc/sudoers.d/harebox", layout.DefaultUser+" ALL=(ALL:ALL) NOPASSWD: ALL\n", 0o440)
		},
		// The agent and its unit, enabled.
		func() error {
			if err := os.MkdirAll(filepath.Dir(p(layout.AgentPath)), 0o755); err != nil {
				return err
			}
			return copyFile(ctx, o.AgentPath, p(layout.AgentPath), 0o755)
		},
		func() error { return write("etc/systemd/system/"+layout.AgentUnit, agentUnit, 0o644) },
		func() error {
			return symlink("/etc/systemd/system/"+layout.AgentUnit,
				"etc/systemd/system/multi-user.target.wants/"+layout.AgentUnit)
		},
		// Boot to multi-user (no display anyway).
		func() error {
			return symlink("/lib/systemd/system/multi-user.target", "etc/systemd/system/default.target")
		},
		func() error {
			for _, u := range maskedUnits {
				if err := symlink("/dev/null", "etc/systemd/system/"+u); err != nil {
					return err
				}
			}
			for _, g := range maskedGenerators {
				if err := symlink("/dev/null", "etc/systemd/system-generators/"+g); err != nil {
					return err
				}
			}
			return nil
		},
		// Identity: hostname; an empty machine-id so systemd makes a fresh
		// one each boot (forks never share it).
		func() error { return write("etc/hostname", o.Hostname+"\n", 0o644) },
		func() error { return write("etc/hosts", hostsFile(o.Hostname), 0o644) },
		func() error { return write("etc/machine-id", "", 0o444) },
		func() error { return symlink("/etc/machine-id", "var/lib/dbus/machine-id") },
		// debootstrap copied the build host's resolver; the agent's network
		// setup writes the guest's.
		func() error {
			return write("etc/resolv.conf", "# written by the harebox agent at network setup\n", 0o644)
		},
		func() error { return write("etc/fstab", fstab, 0o644) },
		func() error {
			b, err := os.ReadFile(p("etc/profile"))
			if err != nil {
				return err
			}
			if !strings.Contains(string(b), profileUID) {
				return fmt.Errorf("etc/profile no longer asks %s: update the image builder", profileUID)
			}
			return write("etc/profile", strings.ReplaceAll(string(b), profileUID, profileUIDFast), 0o644)
		},
		func() error { return write("etc/apt/sources.list", sourcesList(o), 0o644) },
		func() error {
			if o.Name != CodeInterpreter {
				return nil
			}
			return installInterpreter(ctx, lg, root)
		},
	}
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// sourcesList adds the suite's updates (and security, where its location is
// known) to debootstrap's single line.
func sourcesList(o *Options) string {
	comp := strings.Join(o.Components, " ")
	s := fmt.Sprintf("deb %s %s %s\ndeb %s %s-updates %s\n", o.Mirror, o.Suite, comp, o.Mirror, o.Suite, comp)
	switch {
	case strings.Contains(o.Mirror, "ubuntu"):
		s += fmt.Sprintf("deb %s %s-security %s\n", o.Mirror, o.Suite, comp)
	case strings.TrimSuffix(o.Mirror, "/") == DefaultMirror:
		s += fmt.Sprintf("deb http://deb.debian.org/debian-security %s-security %s\n", o.Suite, comp)
	}
	return s
}

// cleanRoot drops apt caches and lists, logs and per-machine state.
func cleanRoot(root string) error {
	globs := []string{
		"var/cache/apt/archives/*.deb",
		"var/cache/apt/archives/partial/*",
		"var/cache/apt/*.bin",
		"var/lib/apt/lists/*_*",
		"var/lib/apt/lists/partial/*",
		"var/log/*.log",
		"var/log/apt/*",
		"var/lib/systemd/random-seed",
		"var/lib/systemd/credential.secret",
		"etc/ssh/ssh_host_*",
		"tmp/*",
		"var/tmp/*",
	}
	for _, g := range globs {
		ms, err := filepath.Glob(filepath.Join(root, g))
		if err != nil {
			return err
		}
		for _, m := range ms {
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	return nil
}

// makeExt4 sizes an image to the tree's content plus headroom and fills it
// with mkfs.ext4 -d.
func makeExt4(ctx context.Context, lg *logger, o *Options, root, dst string) error {
	content, inodes, err := treeSize(root)
	if err != nil {
		return err
	}
	// ext4 metadata (inode tables, bitmaps, journal) on top of the data.
	size := content + content/10 + 64<<20 + o.Headroom
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)
	nInodes := inodes + inodes/2 + o.Headroom/(16<<10)
	lg.step("mkfs.ext4: %d MiB content, %d inodes, image %d MiB", content>>20, inodes, size>>20)
	f, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	f.Close()
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		mkfs = "/usr/sbin/mkfs.ext4"
	}
	if err := run(ctx, lg, "mkfs.ext4: ", mkfs, "-q", "-F", "-L", "harebox-root",
		"-m", "0", "-N", fmt.Sprint(nInodes), "-E", "nodiscard", "-d", root, dst); err != nil {
		return err
	}
	f, err = os.Open(dst)
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	f.Close()
	// A read-only base: backends layer copy-on-write over it.
	return os.Chmod(dst, 0o444)
}

// treeSize sums the space the files under root need in 4 KiB blocks
// (hard links once) and counts inodes.
func treeSize(root string) (bytes, inodes int64, err error) {
	const blk = 4096
	seen := map[uint64]bool{}
	err = filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 && !fi.IsDir() {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		inodes++
		switch {
		case fi.Mode().IsRegular():
			bytes += (fi.Size() + blk - 1) / blk * blk
		case fi.IsDir():
			bytes += blk
		case fi.Mode()&fs.ModeSymlink != 0 && fi.Size() >= 60:
			bytes += blk
		}
		return nil
	})
	return bytes, inodes, err
}
