// Package images builds HareBox guest images: a kernel, a gzip'd newc
// initramfs whose /init is the guest agent, and (for full images) a raw ext4
// root disk made with debootstrap.
//
// Two images exist. "minimal" is the host's Debian kernel plus an initramfs
// holding the agent as /init, a static busybox, a tiny /etc and the kernel
// modules the agent loads (virtio, vsock, ext4, ...); the agent stays PID 1.
// "default" reuses that kernel and initramfs and adds rootfs.ext4, a Debian
// (or Ubuntu) system with systemd, sudo and python3; its command line carries
// harebox.root=/dev/vda so the agent mounts the disk and hands over to
// systemd, which then runs the agent as a service.
//
// Builds are cached: each image goes to OUT/<name>-<short input hash>/, where
// the hash covers every input by content, never by path (agent, kernel,
// modules, busybox, suite, mirror, packages, builder version). GC removes
// the builds nothing uses (gc.go). A build happens in a temporary directory that is
// renamed into place only when complete, so a crashed build never looks done,
// and a second Build with the same inputs just loads manifest.json.
//
// The names the builder and the agent agree on (paths, command-line
// parameters) live in agent/layout.
package images

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/internal/fsync"
	"github.com/harebox/harebox/internal/mounts"
)

// BuilderVersion is part of every input hash: bump it whenever the builder
// changes what it produces, so old cached images are not reused.
const BuilderVersion = "harebox-images/3"

// Image names.
const (
	Minimal = "minimal"
	Default = "default"
	// CodeInterpreter is Default with Jupyter's Python kernel, NumPy,
	// pandas and Matplotlib, and the code interpreter's server
	// (images/interpreter) started at boot, its first kernel warm.
	CodeInterpreter = "code-interpreter"
)

// File names inside an image directory.
const (
	ManifestFile = "manifest.json"
	KernelFile   = "vmlinuz"
	InitrdFile   = "initramfs.img"
	RootDiskFile = "rootfs.ext4"
)

// BaseCmdline is the kernel command line of every image. It suits both QEMU
// microvm and Cloud Hypervisor on x86_64:
//
//   - console=ttyS0: both give the guest a legacy 8250 UART (microvm's
//     isa-serial, Cloud Hypervisor's --serial); the host captures it as the
//     boot log. There is no VGA console.
//   - reboot=t: reboot by triple fault. It needs no device model (microvm has
//     no i8042 by default and PCI/ACPI reset differ between VMMs), and a
//     triple fault ends the VM in both (QEMU runs with -no-reboot).
//   - panic=-1: on a kernel panic reboot at once instead of hanging, so a
//     crashed guest turns into an exited VMM the host notices.
//   - quiet: the serial console is slow under TCG; keep kernel chatter out.
//   - cryptomgr.notests: the known-answer tests the kernel runs on its
//     crypto algorithms at boot (a FIPS requirement) took 0.4 s of a boot
//     under TCG, the longest of its initcalls (initcall_debug). The
//     algorithms are all there; HareBox relies on none of the guest's
//     (the host encrypts the disks).
//   - initcall_blacklist=crypto_kdf108_init: the SP800-108 KDF's own
//     self-test, which Linux 6.1 runs at boot whatever cryptomgr says, took
//     0.45 s under TCG, now the longest initcall. Its init does nothing
//     else: the KDF stays usable.
const BaseCmdline = "console=ttyS0 reboot=t panic=-1 quiet cryptomgr.notests initcall_blacklist=crypto_kdf108_init"

// Image is an image manifest, stored as manifest.json in the image
// directory. Paths are absolute; Load rebases them onto the directory it
// reads from, so an image directory can be moved.
type Image struct {
	Name    string `json:"name"`
	Kernel  string `json:"kernel"`
	Initrd  string `json:"initrd"`
	Cmdline string `json:"cmdline"`
	// RootDisk is the read-only base root disk, empty for images without
	// one. Backends attach a copy-on-write layer over it (or a copy), never
	// the file itself read-write.
	RootDisk string `json:"root_disk"`
	// RootDiskFormat is "raw" when RootDisk is set, else empty.
	RootDiskFormat string    `json:"root_disk_format"`
	KernelVersion  string    `json:"kernel_version"`
	BuiltAt        time.Time `json:"built_at"`
	// InputHash is the hex SHA-256 over every build input.
	InputHash string `json:"input_hash"`
	// Modules are the module paths (as in layout.ModulesLoad) in load order.
	Modules []string `json:"modules,omitempty"`
	// ModulesOnDemand are those of layout.ModulesOnDemand, in load order.
	ModulesOnDemand []string `json:"modules_on_demand,omitempty"`
	// Suite and Mirror record where the root disk came from (default image).
	Suite  string `json:"suite,omitempty"`
	Mirror string `json:"mirror,omitempty"`
	// From and Digest record the OCI image it was built from (Options.From).
	From   string `json:"from,omitempty"`
	Digest string `json:"digest,omitempty"`
	// CodeInterpreter says the image runs the code interpreter's server
	// (layout.InterpreterPort).
	CodeInterpreter bool `json:"code_interpreter,omitempty"`

	// Dir is the image directory (not stored).
	Dir string `json:"-"`
}

// Options say what to build. Only Name, AgentPath and OutDir are required.
type Options struct {
	// Name is Minimal, Default or CodeInterpreter, or the name of an image
	// built From an OCI image (lower-case letters, digits and dashes).
	Name string
	// From, if set, builds the root disk from an OCI image instead:
	// "oci:DIR" (an OCI image layout), "oci-archive:FILE" (a tar of one),
	// "docker-archive:FILE" (a docker save tarball) or "registry:REF"
	// (pulled). See oci.go.
	From string
	// fromDigest is From's image digest, an input of the build.
	fromDigest string
	// AgentPath is the static harebox-agent binary.
	AgentPath string
	// OutDir is the cache directory; the image goes to OutDir/<name>-<hash>/.
	OutDir string

	// KernelVersion picks /boot/vmlinuz-<ver> and /lib/modules/<ver>. Empty
	// means the newest kernel in BootDir that has a modules directory.
	KernelVersion string
	// BootDir holds vmlinuz-<ver> (default /boot).
	BootDir string
	// ModulesDir holds <ver>/modules.dep (default /lib/modules).
	ModulesDir string
	// Modules are the module names to put in the initramfs and load at
	// boot; dependencies are added from modules.dep. Default
	// DefaultModules.
	Modules []string
	// OnDemandModules are put in the initramfs, with their dependencies
	// that Modules do not bring, for the agent to load when a feature
	// first needs them (layout.ModulesOnDemand). Default OnDemandModules.
	OnDemandModules []string
	// BusyboxPath is a statically linked busybox (default /bin/busybox from
	// the busybox-static package).
	BusyboxPath string
	// Hostname is the guest's host name (default "harebox").
	Hostname string
	// ExtraCmdline is appended to the kernel command line.
	ExtraCmdline string

	// Suite, Mirror, Components, Packages, Keyring and Script configure
	// debootstrap for the default image. Defaults: bookworm from
	// http://deb.debian.org/debian, component main, DefaultPackages. For
	// Ubuntu use e.g. Suite "noble", Mirror "http://archive.ubuntu.com/ubuntu":
	// components then default to main,universe, the keyring to the
	// ubuntu-keyring package's, and the debootstrap script to "gutsy" when
	// the host's debootstrap has no script for the suite.
	Suite      string
	Mirror     string
	Components []string
	Packages   []string
	// Extra packages are installed with apt-get once debootstrap is done
	// (apt resolves dependencies debootstrap's resolver cannot); default
	// CodeInterpreterPackages for the code-interpreter image, else none.
	Extra []string
	// Keyring is a keyring file passed to debootstrap --keyring.
	Keyring string
	// Script is the debootstrap script (name in /usr/share/debootstrap/scripts
	// or a path); empty means the suite's own.
	Script string
	// Headroom is the free space added to the root disk beyond its content
	// (default 512 MiB).
	Headroom int64

	// Progress receives one line per build step, and debootstrap's output
	// with a prefix. Nil discards it.
	Progress io.Writer
	// Force rebuilds even if a cached image with the same inputs exists.
	Force bool
}

// DefaultModules are the kernel modules every image's initramfs carries
// (their dependencies come from modules.dep). crc32c_generic is listed
// because ext4 and jbd2 need crc32c for metadata checksums but only name it
// as a soft dependency (crypto-crc32c), which modules.dep does not list.
var DefaultModules = []string{
	"virtio", "virtio_ring", "virtio_mmio", "virtio_pci",
	"virtio_console", "virtio_blk", "virtio_net", "virtio_rng",
	"vsock", "vmw_vsock_virtio_transport",
	"crc32c_generic", "ext4",
	"button", "evdev",
}

// OnDemandModules are the modules only volumes need (SCSI disks plugged
// in while the guest runs): with their dependencies, 0.16 s of every
// boot under software emulation when the init loaded them (measured
// here), for a sandbox that may never mount a volume.
var OnDemandModules = []string{"virtio_scsi", "sd_mod"}

// DefaultPackages are installed (debootstrap --include) into the default
// image on top of the minbase variant. udev is there so systemd sees devices
// (device units, /dev/virtio-ports); without it mounts wait for devices
// forever. The rest is what the code people run in a sandbox expects:
// pip and venv, curl, git and a C toolchain (for wheels built from
// source). debootstrap installs no Recommends, so each is named.
var DefaultPackages = []string{
	"systemd", "systemd-sysv", "udev", "dbus", "sudo", "python3",
	"ca-certificates", "iproute2",
	"python3-pip", "python3-venv", "python3-dev", "curl", "git", "build-essential",
}

// CodeInterpreterPackages are added (Options.Extra) in the
// code-interpreter image: IPython (the Python contexts' kernels are its
// shell), Node and TypeScript's compiler (the JavaScript and TypeScript
// contexts'), Jupyter's Python kernel and
// client (for the user's own notebooks and tools: the server does not
// use them), and what cells most often import.
var CodeInterpreterPackages = []string{
	"python3-ipython", "python3-ipykernel", "python3-jupyter-client",
	"python3-numpy", "python3-pandas", "python3-matplotlib", "nodejs", "node-typescript",
}

// debian reports whether o builds a root disk with debootstrap.
func (o *Options) debian() bool { return o.Name == Default || o.Name == CodeInterpreter }

// DefaultMirror and DefaultSuite are the default image's Debian source.
const (
	DefaultMirror   = "http://deb.debian.org/debian"
	DefaultSuite    = "bookworm"
	DefaultHostname = "harebox"
	DefaultHeadroom = 512 << 20
)

func (o *Options) setDefaults() error {
	switch {
	case o.From != "":
		if !imageName.MatchString(o.Name) || o.Name == Minimal || o.debian() {
			return fmt.Errorf("images: an image built from an OCI image needs a name of its own (lower-case letters, digits, dashes), not %q", o.Name)
		}
	case o.Name == Minimal, o.debian():
	case o.Name == "":
		return errors.New("images: Name is required (minimal, default or code-interpreter)")
	default:
		return fmt.Errorf("images: unknown image %q (want minimal, default or code-interpreter, or From an OCI image)", o.Name)
	}
	if o.AgentPath == "" {
		return errors.New("images: AgentPath is required")
	}
	if o.OutDir == "" {
		return errors.New("images: OutDir is required")
	}
	// The manifest stores absolute paths: backends need them.
	abs, err := filepath.Abs(o.OutDir)
	if err != nil {
		return fmt.Errorf("images: %w", err)
	}
	o.OutDir = abs
	if o.BootDir == "" {
		o.BootDir = "/boot"
	}
	if o.ModulesDir == "" {
		o.ModulesDir = "/lib/modules"
	}
	if len(o.Modules) == 0 {
		o.Modules = DefaultModules
	}
	if len(o.OnDemandModules) == 0 {
		o.OnDemandModules = OnDemandModules
	}
	if o.BusyboxPath == "" {
		o.BusyboxPath = "/bin/busybox"
	}
	if o.Hostname == "" {
		o.Hostname = DefaultHostname
	}
	if o.Headroom <= 0 {
		o.Headroom = DefaultHeadroom
	}
	if !o.debian() {
		return nil
	}
	if o.Suite == "" {
		o.Suite = DefaultSuite
	}
	if o.Mirror == "" {
		o.Mirror = DefaultMirror
	}
	ubuntu := strings.Contains(o.Mirror, "ubuntu")
	if len(o.Components) == 0 {
		o.Components = []string{"main"}
		if ubuntu {
			o.Components = []string{"main", "universe"}
		}
	}
	if len(o.Packages) == 0 {
		o.Packages = DefaultPackages
	}
	if len(o.Extra) == 0 && o.Name == CodeInterpreter {
		o.Extra = CodeInterpreterPackages
	}
	if o.Keyring == "" && ubuntu {
		if _, err := os.Stat(ubuntuKeyring); err == nil {
			o.Keyring = ubuntuKeyring
		}
	}
	if o.Script == "" && ubuntu {
		if _, err := os.Stat(filepath.Join(debootstrapScripts, o.Suite)); err != nil {
			o.Script = "gutsy" // every Ubuntu release since 7.10 uses it
		}
	}
	if o.Headroom <= 0 {
		o.Headroom = DefaultHeadroom
	}
	return nil
}

var imageName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

const (
	ubuntuKeyring      = "/usr/share/keyrings/ubuntu-archive-keyring.gpg"
	debootstrapScripts = "/usr/share/debootstrap/scripts"
)

// Build builds the image o describes, or returns the cached one with the
// same inputs.
func Build(ctx context.Context, o Options) (Image, error) {
	if err := o.setDefaults(); err != nil {
		return Image{}, err
	}
	lg := newLogger(o.Progress, o.Name)
	start := time.Now()

	kver, kernel, err := findKernel(o.BootDir, o.ModulesDir, o.KernelVersion)
	if err != nil {
		return Image{}, err
	}
	var from v1.Image
	if o.From != "" {
		var closeFrom func()
		if from, closeFrom, err = OpenOCI(ctx, o.From); err != nil {
			return Image{}, badImage(ctx, err)
		}
		defer closeFrom()
		d, err := from.Digest()
		if err != nil {
			return Image{}, badImage(ctx, fmt.Errorf("images: %s: %w", o.From, err))
		}
		o.fromDigest = d.String()
	}
	mods, err := resolveModuleSets(filepath.Join(o.ModulesDir, kver), o.Modules, o.OnDemandModules)
	if err != nil {
		return Image{}, err
	}
	hash, err := inputHash(ctx, &o, kver, kernel, mods)
	if err != nil {
		return Image{}, err
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return Image{}, err
	}
	final := filepath.Join(o.OutDir, o.Name+"-"+hash[:12])
	if !o.Force {
		if img, ok := cached(o.OutDir, final, hash); ok {
			lg.step("cached: %s", final)
			return img, nil
		}
	}
	lg.step("building %s (kernel %s, %d modules, %d more on demand) into %s", o.Name, kver, len(mods.boot), len(mods.onDemand), final)

	cleanStale(o.OutDir, lg)
	tmp, err := os.MkdirTemp(o.OutDir, ".tmp-"+o.Name+"-"+hash[:12]+"-")
	if err != nil {
		return Image{}, err
	}
	defer func() {
		if tmp != "" {
			if err := mounts.RemoveAll(tmp); err != nil {
				lg.step("warning: cleaning %s: %v", tmp, err)
			}
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Image{}, err
	}

	img := Image{
		Name:          o.Name,
		Kernel:        filepath.Join(final, KernelFile),
		Initrd:        filepath.Join(final, InitrdFile),
		Cmdline:       BaseCmdline,
		KernelVersion: kver,
		InputHash:     hash,
		Dir:           final,
	}
	for _, m := range mods.boot {
		img.Modules = append(img.Modules, m.guestPath(kver))
	}
	for _, m := range mods.onDemand {
		img.ModulesOnDemand = append(img.ModulesOnDemand, m.guestPath(kver))
	}

	if err := writeKernel(ctx, lg, kernel, tmp, final, &img); err != nil {
		return Image{}, err
	}
	lg.step("writing initramfs")
	if err := writeInitramfs(ctx, filepath.Join(tmp, InitrdFile), &o, kver, mods); err != nil {
		return Image{}, fmt.Errorf("images: initramfs: %w", err)
	}
	if from != nil {
		systemd, err := buildOCIRootDisk(ctx, lg, &o, from, tmp, filepath.Join(tmp, RootDiskFile))
		if err != nil {
			return Image{}, fmt.Errorf("images: root disk: %w", err)
		}
		img.RootDisk = filepath.Join(final, RootDiskFile)
		img.RootDiskFormat = "raw"
		img.Cmdline += " harebox.root=/dev/vda"
		if !systemd {
			img.Cmdline += " harebox.init=" + layout.AgentPath
		}
		img.From, img.Digest = o.From, o.fromDigest
	}
	if o.debian() {
		if err := buildRootDisk(ctx, lg, &o, tmp, filepath.Join(tmp, RootDiskFile)); err != nil {
			return Image{}, fmt.Errorf("images: root disk: %w", err)
		}
		img.RootDisk = filepath.Join(final, RootDiskFile)
		img.RootDiskFormat = "raw"
		img.Cmdline += " harebox.root=/dev/vda"
		img.Suite, img.Mirror = o.Suite, o.Mirror
		img.CodeInterpreter = o.Name == CodeInterpreter
	}
	if o.ExtraCmdline != "" {
		img.Cmdline += " " + strings.TrimSpace(o.ExtraCmdline)
	}
	img.BuiltAt = time.Now().UTC().Truncate(time.Second)
	b, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return Image{}, err
	}
	if err := writeFileSync(filepath.Join(tmp, ManifestFile), append(b, '\n'), 0o644); err != nil {
		return Image{}, err
	}
	if err := ctx.Err(); err != nil {
		return Image{}, err
	}

	// Move into place, under the cache's shared lock (GC holds it
	// exclusively while it picks and moves out unused builds). If an
	// identical build finished meanwhile, use it (it may be in use
	// already). Any other directory with that name is an incomplete or
	// forced-over build: move it aside first, then drop it.
	if unlock, err := lockCache(o.OutDir, syscall.LOCK_SH); err == nil {
		defer unlock()
	}
	if img2, err := Load(final); err == nil && img2.InputHash == hash && !o.Force {
		lg.step("an identical build finished first: %s", final)
		touch(final)
		return img2, nil
	}
	if _, err := os.Lstat(final); err == nil {
		old := fmt.Sprintf("%s/.old-%s-%s", o.OutDir, filepath.Base(final), randSuffix())
		if err := os.Rename(final, old); err != nil {
			return Image{}, err
		}
		defer mounts.RemoveAll(old)
	}
	if err := os.Rename(tmp, final); err != nil {
		// Lost a race with an identical concurrent build: use its result.
		if img2, lerr := Load(final); lerr == nil && img2.InputHash == hash {
			touch(final)
			return img2, nil
		}
		return Image{}, err
	}
	tmp = ""
	fsync.Dir(o.OutDir)
	lg.step("done in %s: %s", time.Since(start).Round(100*time.Millisecond), final)
	return img, nil
}

// cached returns the complete build in final if it has the input hash,
// marked as just used (see GC), under the cache's shared lock.
func cached(out, final, hash string) (Image, bool) {
	if unlock, err := lockCache(out, syscall.LOCK_SH); err == nil {
		defer unlock()
	} // (else a cache GC cannot write to either)
	img, err := Load(final)
	if err != nil || img.InputHash != hash {
		return Image{}, false
	}
	touch(final)
	return img, true
}

// Load reads the image manifest in dir. Paths in the result point into dir.
func Load(dir string) (Image, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return Image{}, err
	}
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return Image{}, err
	}
	var img Image
	if err := json.Unmarshal(b, &img); err != nil {
		return Image{}, fmt.Errorf("images: %s: %w", filepath.Join(dir, ManifestFile), err)
	}
	rebase := func(p string) string {
		if p == "" {
			return ""
		}
		return filepath.Join(dir, filepath.Base(p))
	}
	img.Kernel, img.Initrd, img.RootDisk = rebase(img.Kernel), rebase(img.Initrd), rebase(img.RootDisk)
	img.Dir = dir
	for _, p := range []string{img.Kernel, img.Initrd, img.RootDisk} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err != nil {
			return Image{}, fmt.Errorf("images: incomplete image %s: %w", dir, err)
		}
	}
	if img.Kernel == "" || img.Initrd == "" || img.InputHash == "" {
		return Image{}, fmt.Errorf("images: %s: manifest lacks kernel, initrd or input_hash", dir)
	}
	return img, nil
}

// inputHash hashes everything the image is made of, by content: no path
// is an input (the agent, kernel, modules, busybox or keyring at another
// place, or another OutDir, is the same image), so one agent built in two
// checkouts shares one build.
func inputHash(ctx context.Context, o *Options, kver, kernel string, mods moduleSets) (string, error) {
	h := sha256.New()
	field := func(k string, v ...string) {
		fmt.Fprintf(h, "%s=%q\n", k, v)
	}
	file := func(k, path string) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("images: %s: %w", k, err)
		}
		defer f.Close()
		fh := sha256.New()
		if _, err := io.Copy(fh, f); err != nil {
			return fmt.Errorf("images: %s: %w", k, err)
		}
		field(k, hex.EncodeToString(fh.Sum(nil)))
		return nil
	}
	field("builder", BuilderVersion)
	// The files the builder writes into the root filesystem: a change to
	// them is a new image without a version bump to forget.
	field("rootfs", append(append([]string{agentUnit, fstab, profileUID, profileUIDFast}, maskedUnits...), maskedGenerators...)...)
	field("name", o.Name)
	field("initramfs", initramfsFormat)
	field("kernel_version", kver)
	if err := file("kernel", kernel); err != nil {
		return "", err
	}
	if err := file("agent", o.AgentPath); err != nil {
		return "", err
	}
	if err := file("busybox", o.BusyboxPath); err != nil {
		return "", err
	}
	field("modules_requested", o.Modules...)
	field("modules_on_demand", o.OnDemandModules...)
	for _, set := range [][]module{mods.boot, mods.onDemand} {
		field("module_set")
		for _, m := range set {
			// Its place in the guest (relative to the kernel's modules
			// directory) and its bytes; not where the host keeps it.
			field("module_path", m.rel)
			if err := file("module", m.hostPath); err != nil {
				return "", err
			}
		}
	}
	field("hostname", o.Hostname)
	field("cmdline", BaseCmdline)
	field("extra_cmdline", o.ExtraCmdline)
	if o.From != "" {
		// By digest, not by path: the same image anywhere is the same build.
		field("from", o.fromDigest, fmt.Sprint(o.Headroom))
	}
	if o.Name == CodeInterpreter {
		files := interpreterFiles()
		names := slices.Sorted(maps.Keys(files))
		kernel := []string{string(interpreterServer), interpreterUnit}
		for _, n := range names {
			kernel = append(kernel, n, string(files[n]))
		}
		field("interpreter", kernel...)
	}
	if o.debian() {
		field("suite", o.Suite)
		field("mirror", o.Mirror)
		field("components", o.Components...)
		field("packages", o.Packages...)
		field("extra", o.Extra...)
		// A script by name is debootstrap's own (as the suite's is); one
		// given by path counts by its bytes.
		if strings.Contains(o.Script, "/") {
			if err := file("script", o.Script); err != nil {
				return "", err
			}
		} else {
			field("script", o.Script)
		}
		field("headroom", fmt.Sprint(o.Headroom))
		if o.Keyring != "" {
			if err := file("keyring", o.Keyring); err != nil {
				return "", err
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

type logger struct {
	w    io.Writer
	name string
}

func newLogger(w io.Writer, name string) *logger {
	if w == nil {
		w = io.Discard
	}
	return &logger{w: w, name: name}
}

func (l *logger) step(format string, args ...any) {
	fmt.Fprintf(l.w, "harebox-image[%s]: %s\n", l.name, fmt.Sprintf(format, args...))
}

// prefixWriter writes each line it receives to w behind prefix.
type prefixWriter struct {
	w      io.Writer
	prefix string
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := strings.IndexByte(string(p.buf), '\n')
		if i < 0 {
			break
		}
		fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf[:i])
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}

func (p *prefixWriter) flush() {
	if len(p.buf) > 0 {
		fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf)
		p.buf = nil
	}
}

func copyFile(ctx context.Context, src, dst string, mode os.FileMode) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}

func writeFileSync(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func randSuffix() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// cleanStale removes leftovers of builds that crashed more than a day ago
// (a running build's temp directory is younger).
func cleanStale(out string, lg *logger) {
	ents, err := os.ReadDir(out)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || !(strings.HasPrefix(e.Name(), ".tmp-") || strings.HasPrefix(e.Name(), ".old-")) {
			continue
		}
		fi, err := e.Info()
		if err != nil || time.Since(fi.ModTime()) < staleLeftover {
			continue
		}
		if err := mounts.RemoveAll(filepath.Join(out, e.Name())); err != nil {
			lg.step("warning: stale %s: %v", e.Name(), err)
		}
	}
}
