// Command harebox-image builds HareBox guest images and prints the image
// manifest as JSON on stdout (progress goes to stderr when it is a
// terminal, or with --progress):
//
//	harebox-image build --name minimal|default|code-interpreter --agent PATH --out DIR \
//	    [--suite bookworm --mirror URL --components main --kernel-version VER]
//	harebox-image build --name myimg --from oci:DIR|oci-archive:FILE|docker-archive:FILE|registry:REF \
//	    --agent PATH --out DIR
//	harebox-image gc --out DIR [--dry-run] [--in-use DIR,...] [--no-engine]
//
// A build with the same inputs as an earlier one returns the cached image;
// the inputs count by content, not by path. gc removes the builds in DIR
// that nothing uses and prints what it removed and kept as JSON: it keeps
// the newest build of each name, those an engine (hareboxd) using DIR
// lists in DIR/.refs/ or --in-use names, and any built, used or superseded
// lately (see package images, GC). In a cache no engine ever wrote its
// references to it removes no build unless --no-engine says none uses it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/term"

	"github.com/harebox/harebox/images"
)

func main() {
	cmds := map[string]func(context.Context, []string, io.Writer, io.Writer) error{"build": build, "gc": gc}
	if len(os.Args) < 2 || cmds[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: harebox-image build --name minimal|default|code-interpreter --agent PATH --out DIR [flags]\n       harebox-image gc --out DIR [--dry-run]\n       harebox-image build|gc -h for the flags")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmds[os.Args[1]](ctx, os.Args[2:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "harebox-image:", err)
		os.Exit(1)
	}
}

func build(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("harebox-image build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o images.Options
	var components, packages, modules string
	var headroomMiB int64
	var quiet bool
	fs.StringVar(&o.Name, "name", images.Minimal, "image: minimal, default or code-interpreter, or the name of an image built --from an OCI image")
	fs.StringVar(&o.From, "from", "", "build the root disk from an OCI image: oci:DIR (an OCI image layout), oci-archive:FILE (a tar of one), docker-archive:FILE (docker save) or registry:REF (pulled)")
	fs.StringVar(&o.AgentPath, "agent", "", "static harebox-agent binary (required)")
	fs.StringVar(&o.OutDir, "out", "", "output (cache) directory (required)")
	fs.StringVar(&o.KernelVersion, "kernel-version", "", "kernel version (default: newest in /boot with /lib/modules)")
	fs.StringVar(&o.BusyboxPath, "busybox", "", "static busybox (default /bin/busybox)")
	fs.StringVar(&modules, "modules", "", "comma-separated kernel modules (default: the builtin set)")
	fs.StringVar(&o.Hostname, "hostname", "", "guest host name (default harebox)")
	fs.StringVar(&o.ExtraCmdline, "cmdline", "", "extra kernel command-line arguments")
	fs.StringVar(&o.Suite, "suite", "", "default image: distribution suite (default bookworm; e.g. noble)")
	fs.StringVar(&o.Mirror, "mirror", "", "default image: package mirror (default "+images.DefaultMirror+")")
	fs.StringVar(&components, "components", "", "default image: comma-separated archive components (default main; main,universe for Ubuntu)")
	fs.StringVar(&packages, "packages", "", "default image: comma-separated packages (default: "+strings.Join(images.DefaultPackages, ",")+")")
	fs.StringVar(&o.Keyring, "keyring", "", "default image: debootstrap keyring")
	fs.StringVar(&o.Script, "script", "", "default image: debootstrap script (e.g. gutsy)")
	fs.Int64Var(&headroomMiB, "headroom-mib", 0, "default image: free space in the root disk, MiB (default 512)")
	fs.BoolVar(&o.Force, "force", false, "rebuild even if cached")
	var progress bool
	fs.BoolVar(&quiet, "quiet", false, "no progress output")
	fs.BoolVar(&progress, "progress", false, "progress output even when stderr is not a terminal (by default a CI log or a pipe gets none)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	split := func(s string) []string {
		var out []string
		for _, f := range strings.Split(s, ",") {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, f)
			}
		}
		return out
	}
	o.Components, o.Packages, o.Modules = split(components), split(packages), split(modules)
	o.Headroom = headroomMiB << 20
	// Progress (build steps, layers and bytes, debootstrap's stages) is
	// for a person at a terminal; the manifest on stdout is the output.
	if !quiet && (progress || isTerminal(stderr)) {
		o.Progress = stderr
	}
	img, err := images.Build(ctx, o)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(img)
}

// gc is "harebox-image gc": images.GC on --out, its report on stdout.
func gc(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("harebox-image gc", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o images.GCOptions
	var out, inUse string
	fs.StringVar(&out, "out", "", "the cache directory (required): what harebox-image build --out and hareboxd --image-dir name")
	fs.BoolVar(&o.DryRun, "dry-run", false, "say what would be removed, remove nothing")
	fs.StringVar(&inUse, "in-use", "", "comma-separated builds to keep besides those the engines' reference files name")
	fs.BoolVar(&o.NoEngine, "no-engine", false, "no hareboxd uses this cache: remove builds even though no engine wrote its references in DIR/.refs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if out == "" {
		return errors.New("--out is required")
	}
	for _, d := range strings.Split(inUse, ",") {
		if d = strings.TrimSpace(d); d != "" {
			o.InUse = append(o.InUse, d)
		}
	}
	r, err := images.GC(ctx, out, o)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
