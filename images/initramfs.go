package images

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"

	"github.com/harebox/harebox/agent/layout"
	"github.com/u-root/u-root/pkg/cpio"
)

// Linux mode bits for cpio records.
const (
	sIFDIR = 0o040000
	sIFREG = 0o100000
	sIFLNK = 0o120000
	sIFCHR = 0o020000
)

// initramfsWriter writes newc records, creating every parent directory
// before its entries (the kernel's unpacker does not create parents).
type initramfsWriter struct {
	w    cpio.RecordWriter
	dirs map[string]bool
	ino  uint64
}

func (iw *initramfsWriter) info(name string, mode uint64, uid, gid uint64) cpio.Info {
	iw.ino++
	return cpio.Info{Ino: iw.ino, Mode: mode, UID: uid, GID: gid, NLink: 1, Name: strings.TrimPrefix(name, "/")}
}

func (iw *initramfsWriter) parents(name string) error {
	d := path.Dir(path.Clean("/" + name))
	if d == "/" || iw.dirs[d] {
		return nil
	}
	return iw.dir(d, 0o755, 0, 0)
}

func (iw *initramfsWriter) dir(name string, perm, uid, gid uint64) error {
	name = path.Clean("/" + name)
	if iw.dirs[name] {
		return nil
	}
	if err := iw.parents(name); err != nil {
		return err
	}
	iw.dirs[name] = true
	i := iw.info(name, sIFDIR|perm, uid, gid)
	i.NLink = 2
	return iw.w.WriteRecord(cpio.Record{Info: i})
}

func (iw *initramfsWriter) file(name string, content []byte, perm uint64) error {
	if err := iw.parents(name); err != nil {
		return err
	}
	i := iw.info(name, sIFREG|perm, 0, 0)
	i.FileSize = uint64(len(content))
	return iw.w.WriteRecord(cpio.Record{ReaderAt: bytes.NewReader(content), Info: i})
}

// modules writes mods' files and their list, in order, to list.
func (iw *initramfsWriter) modules(ctx context.Context, list, kver string, mods []module) error {
	var load strings.Builder
	for _, m := range mods {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := iw.hostFile(m.guestPath(kver), m.hostPath, 0o644); err != nil {
			return err
		}
		load.WriteString(m.guestPath(kver) + "\n")
	}
	return iw.file(list, []byte(load.String()), 0o644)
}

func (iw *initramfsWriter) hostFile(name, src string, perm uint64) error {
	if err := iw.parents(name); err != nil {
		return err
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", src)
	}
	i := iw.info(name, sIFREG|perm, 0, 0)
	i.FileSize = uint64(st.Size())
	return iw.w.WriteRecord(cpio.Record{ReaderAt: f, Info: i})
}

func (iw *initramfsWriter) symlink(name, target string) error {
	if err := iw.parents(name); err != nil {
		return err
	}
	i := iw.info(name, sIFLNK|0o777, 0, 0)
	i.FileSize = uint64(len(target))
	return iw.w.WriteRecord(cpio.Record{ReaderAt: strings.NewReader(target), Info: i})
}

func (iw *initramfsWriter) chardev(name string, perm, major, minor uint64) error {
	if err := iw.parents(name); err != nil {
		return err
	}
	i := iw.info(name, sIFCHR|perm, 0, 0)
	i.Rmajor, i.Rminor = major, minor
	return iw.w.WriteRecord(cpio.Record{Info: i})
}

// busyboxApplets asks the (static) busybox binary for its applet names.
func busyboxApplets(ctx context.Context, busybox string) ([]string, error) {
	out, err := exec.CommandContext(ctx, busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w (apt-get install busybox-static)", busybox, err)
	}
	var apps []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		a := strings.TrimSpace(sc.Text())
		if a == "" || a == "busybox" || strings.ContainsAny(a, "/ ") || a == "." || a == ".." {
			continue
		}
		apps = append(apps, a)
	}
	sort.Strings(apps)
	if len(apps) == 0 {
		return nil, fmt.Errorf("%s --list printed no applets", busybox)
	}
	return apps, nil
}

// PasswdMinimal, GroupMinimal are the initramfs account files.
const (
	passwdMinimal = "root:x:0:0:root:/root:/bin/sh\n" +
		"user:x:1000:1000:user:/home/user:/bin/sh\n"
	groupMinimal = "root:x:0:\n" +
		"user:x:1000:\n"
)

// initramfsFormat is in every image's input hash: builds of another
// format are other builds.
const initramfsFormat = "newc"

// writeInitramfs writes the newc initramfs to dst, uncompressed: under
// software emulation the kernel's gunzip of the archive (6.7 MB of 18)
// took 0.40 to 0.45 s of every boot, the copy out of an uncompressed one
// 0.12 to 0.19 s (lz4: 0.28, zstd: 0.35 to 0.53; measured here). The
// host reads the larger file from its page cache, and the guest frees
// the archive's memory once unpacked, as before.
func writeInitramfs(ctx context.Context, dst string, o *Options, kver string, mods moduleSets) error {
	for _, b := range []string{o.AgentPath, o.BusyboxPath} {
		if err := isStatic(b); err != nil {
			return err
		}
	}
	apps, err := busyboxApplets(ctx, o.BusyboxPath)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	iw := &initramfsWriter{w: cpio.Newc.Writer(bw), dirs: map[string]bool{"/": true}}

	steps := []func() error{
		func() error { return iw.dir("/dev", 0o755, 0, 0) },
		func() error { return iw.chardev("/dev/console", 0o600, 5, 1) },
		func() error { return iw.chardev("/dev/null", 0o666, 1, 3) },
		func() error { return iw.hostFile(layout.InitPath, o.AgentPath, 0o755) },
		func() error { return iw.dir("/bin", 0o755, 0, 0) },
		func() error { return iw.hostFile("/bin/busybox", o.BusyboxPath, 0o755) },
		func() error {
			for _, a := range apps {
				if err := iw.symlink("/bin/"+a, "busybox"); err != nil {
					return err
				}
			}
			return nil
		},
		func() error { return iw.symlink("/sbin", "bin") },
		func() error { return iw.dir("/usr", 0o755, 0, 0) },
		func() error { return iw.symlink("/usr/bin", "../bin") },
		func() error { return iw.symlink("/usr/sbin", "../bin") },
		func() error { return iw.dir("/etc", 0o755, 0, 0) },
		func() error { return iw.file("/etc/passwd", []byte(passwdMinimal), 0o644) },
		func() error { return iw.file("/etc/group", []byte(groupMinimal), 0o644) },
		func() error { return iw.file("/etc/hostname", []byte(o.Hostname+"\n"), 0o644) },
		func() error { return iw.file("/etc/hosts", []byte(hostsFile(o.Hostname)), 0o644) },
		func() error { return iw.dir("/root", 0o700, 0, 0) },
		func() error { return iw.dir("/home", 0o755, 0, 0) },
		func() error {
			return iw.dir(layout.DefaultHome, 0o755, layout.DefaultUID, layout.DefaultUID)
		},
		func() error { return iw.dir("/tmp", 0o1777, 0, 0) },
		func() error { return iw.dir("/proc", 0o555, 0, 0) },
		func() error { return iw.dir("/sys", 0o555, 0, 0) },
		func() error { return iw.dir("/run", 0o755, 0, 0) },
		func() error { return iw.dir("/newroot", 0o755, 0, 0) },
		func() error { return iw.modules(ctx, layout.ModulesLoad, kver, mods.boot) },
		func() error { return iw.modules(ctx, layout.ModulesOnDemand, kver, mods.onDemand) },
	}
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s(); err != nil {
			return err
		}
	}
	if err := cpio.WriteTrailer(iw.w); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}

func hostsFile(hostname string) string {
	return "127.0.0.1\tlocalhost\n127.0.1.1\t" + hostname + "\n" +
		"::1\tlocalhost ip6-localhost ip6-loopback\n"
}

// isStatic reports an error unless p is an ELF executable without a
// program interpreter (a dynamically linked busybox would not run in the
// initramfs).
func isStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; use a static build (busybox-static)", p)
		}
	}
	return nil
}
