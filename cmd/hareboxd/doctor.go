package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/backends/cloudhypervisor"
	"github.com/harebox/harebox/backends/qemu"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/network/linuxnet"
)

// errMissing is doctor's exit when something the settings need is missing.
var errMissing = errors.New("something hareboxd needs is missing")

// doctorCmd is "hareboxd doctor [flags]": with the settings the same flags
// (or --config FILE) give the server, one line per thing hareboxd needs
// on this host: ok, or what is missing and how to get it. It exits 1 if
// anything those settings need is missing.
func doctorCmd(args []string, stdout, stderr io.Writer) int {
	err := run(args, func(s settings) error { return doctor(stdout, s) })
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errMissing):
		return 1
	case errors.Is(err, flag.ErrHelp):
		return 0
	}
	fmt.Fprintln(stderr, "hareboxd doctor:", err)
	return 2
}

func doctor(w io.Writer, s settings) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	missing := false
	line := func(name string, err error, ok string, needed bool) {
		switch {
		case err == nil:
			fmt.Fprintf(w, "%s: ok: %s\n", name, ok)
		case needed:
			missing = true
			fmt.Fprintf(w, "%s: missing: %v\n", name, err)
		default:
			fmt.Fprintf(w, "%s: cannot run: %v\n", name, err)
		}
	}
	// The backends, each: the one the settings name is needed.
	caps, err := qemu.Probe(ctx, qemu.Options{})
	ok := ""
	if err == nil {
		ok = fmt.Sprintf("QEMU %s with %s", caps.Version, caps.Accelerator)
		if caps.Notice != "" {
			ok += " (" + caps.Notice + ")"
		}
	}
	line("qemu", err, ok, s.backend == "qemu")
	r := cloudhypervisor.Probe(ctx, cloudhypervisor.Config{})
	err = nil
	if !r.Usable {
		err = errors.New(r.Reason)
	}
	line("cloud-hypervisor", err, fmt.Sprintf("%s %s (landlock %v)", r.Binary, r.Version, r.Landlock), s.backend == "cloud-hypervisor")

	// Disks: overlays, encryption and snapshots are made with qemu-img.
	_, err = exec.LookPath("qemu-img")
	if err != nil {
		err = errors.New("qemu-img is not on PATH (Debian: apt-get install qemu-utils)")
	}
	line("qemu-img", err, "on PATH", true)

	// The data directory, and the images in it.
	line("data-dir", checkDataDir(s.dataDir), s.dataDir, true)
	imageDir := s.imageDir
	if imageDir == "" {
		imageDir = filepath.Join(s.dataDir, "images")
	}
	names, err := imageNames(imageDir)
	line("images", err, strings.Join(names, ", ")+" in "+imageDir, true)
	if fi, err := os.Stat(imageDir); err == nil && fi.IsDir() {
		imageCache(ctx, w, imageDir)
	}

	// The host firewall and the sandboxes' links (--network linux).
	if s.network == "linux" {
		_, err = os.Stat("/dev/net/tun")
		if err != nil {
			err = errors.New("/dev/net/tun is missing (the tun module: modprobe tun)")
		}
		line("tun", err, "/dev/net/tun", true)
		line("nftables", checkNftables(), "the kernel's nftables answers", true)
		err = unix.Access("/proc/sys/net/ipv4/ip_forward", unix.W_OK)
		if err != nil {
			err = fmt.Errorf("cannot turn on IPv4 forwarding (/proc/sys/net/ipv4/ip_forward: %v): run as root", err)
		}
		line("forwarding", err, "IPv4 forwarding can be turned on", true)
		o, err := linuxnet.RouteOverlaps(s.addressPool, s.meshPool)
		if err == nil && len(o) > 0 {
			err = fmt.Errorf("the host routes networks inside the sandboxes' address pools (%s): its traffic to the addresses a sandbox is given would go to the sandbox; pick --address-pool and --mesh-pool apart from them", strings.Join(o, "; "))
		}
		line("address-pools", err, fmt.Sprintf("no host route inside --address-pool %s or --mesh-pool %s", s.addressPool, s.meshPool), true)
	}
	if missing {
		return errMissing
	}
	return nil
}

// checkDataDir: the directory can be used (made if absent) and its path is
// short enough for the Unix sockets under it.
func checkDataDir(dir string) error {
	if abs, err := filepath.Abs(dir); err == nil && len(abs) > 60 {
		return fmt.Errorf("%s is longer than 60 bytes: Unix socket paths under it would not fit", abs)
	}
	d := dir
	for {
		if _, err := os.Stat(d); err == nil {
			break
		}
		if p := filepath.Dir(d); p != d {
			d = p
			continue
		}
		break
	}
	if err := unix.Access(d, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("%s is not writable: %v", d, err)
	}
	return nil
}

// imageCache reports what the image cache's builds take on disk, by
// name, and which of them harebox-image gc would remove (a dry run).
func imageCache(ctx context.Context, w io.Writer, dir string) {
	r, err := images.GC(ctx, dir, images.GCOptions{DryRun: true})
	if err != nil {
		fmt.Fprintf(w, "image-cache: cannot run: %v\n", err)
		return
	}
	var builds, unused int
	for _, u := range r.ByName() {
		builds += u.Builds
		unused += u.Unused
		name := u.Name
		if name == "" {
			name = "(left by crashed builds)"
		}
		fmt.Fprintf(w, "image-cache: %s: builds %d, %s; unused %d, %s reclaimable\n",
			name, u.Builds, gib(u.Bytes), u.Unused, gib(u.ReclaimableBytes))
	}
	msg := fmt.Sprintf("builds %d, %s in %s; unused %d, %s reclaimable", builds, gib(r.KeptBytes+r.FreedBytes), dir, unused, gib(r.FreedBytes))
	if unused > 0 {
		msg += ": harebox-image gc --out " + dir
		if len(r.References) == 0 {
			msg += " --no-engine (no hareboxd wrote which builds it uses here: with none using them)"
		}
	}
	fmt.Fprintf(w, "image-cache: ok: %s\n", msg)
}

// gib is n bytes in GiB with one decimal, or in MiB (rounded) below one GiB.
func gib(n int64) string {
	if n < 1<<30 {
		return fmt.Sprintf("%d MiB", (n+1<<19)>>20)
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

// imageNames lists the images built into dir.
func imageNames(dir string) ([]string, error) {
	manifests, _ := filepath.Glob(filepath.Join(dir, "*", "manifest.json"))
	seen := map[string]bool{}
	for _, m := range manifests {
		if img, err := images.Load(filepath.Dir(m)); err == nil {
			seen[img.Name] = true
		}
	}
	if len(seen) == 0 {
		return nil, fmt.Errorf("no image in %s: build one with harebox-image build --name default --agent PATH --out %s", dir, dir)
	}
	var names []string
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

func checkNftables() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	defer c.CloseLasting()
	if _, err := c.ListTables(); err != nil {
		return fmt.Errorf("nftables: %w (the nf_tables module, and root)", err)
	}
	return nil
}
