package images

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	ocilayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/internal/mounts"
)

// An image built From an OCI image: the image's layers flattened (later
// layers win, whiteouts honoured) into the root disk, with the agent, the
// default user and the guest's identity files added. Images with systemd
// hand over to it, the agent a unit of it, as the default image does;
// others boot with the agent as init. The image's layers are untrusted:
// every write goes through an os.Root of the tree (nothing is written
// outside it, symlinks included), and device nodes, FIFOs and oversized
// files are refused with an error that names the entry.

// ErrBadImage marks a build that failed because of the OCI image itself
// (it cannot be opened or pulled, or a layer or its tree is refused), not
// because of the host.
var ErrBadImage = errors.New("the OCI image cannot be used")

// badImage marks err as the image's fault, unless the host ran out of
// space or the build was cancelled.
func badImage(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil || errors.Is(err, syscall.ENOSPC) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrBadImage, err)
}

// MaxOCIFileBytes and MaxOCIBytes bound what an OCI image may unpack: one
// file, and all of them.
const (
	MaxOCIFileBytes = 8 << 30
	MaxOCIBytes     = 32 << 30
)

// OpenOCI opens the image an Options.From names: "oci:DIR" (an OCI image layout, the
// only or the linux/amd64 image of its index), "oci-archive:FILE" (a tar
// of one), "docker-archive:FILE" (a docker save tarball) or "registry:REF" (pulled from a registry the host
// reaches, with the credentials of the docker config if any; plain HTTP
// only for localhost).
//
// release frees what opening took (an unpacked archive's directory); call
// it once the image has been read. It is never nil.
func OpenOCI(ctx context.Context, from string) (img v1.Image, release func(), err error) {
	release = func() {}
	kind, p, ok := strings.Cut(from, ":")
	if !ok || p == "" {
		return nil, release, fmt.Errorf("images: From %q: want oci:DIR, oci-archive:FILE, docker-archive:FILE or registry:REF", from)
	}
	switch kind {
	case "registry":
		ref, err := name.ParseReference(p)
		if err != nil {
			return nil, release, fmt.Errorf("images: registry reference %q: %w", p, err)
		}
		img, err := remote.Image(ref, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain),
			remote.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"}))
		if err != nil {
			return nil, release, fmt.Errorf("images: pull %s: %w", ref, err)
		}
		return img, release, nil
	case "oci":
		idx, err := ocilayout.ImageIndexFromPath(p)
		if err != nil {
			return nil, release, fmt.Errorf("images: OCI layout %s: %w", p, err)
		}
		m, err := idx.IndexManifest()
		if err != nil {
			return nil, release, fmt.Errorf("images: OCI layout %s: %w", p, err)
		}
		var pick *v1.Descriptor
		for i, d := range m.Manifests {
			if d.Platform == nil || (d.Platform.OS == "linux" && d.Platform.Architecture == "amd64") {
				if pick != nil {
					return nil, release, fmt.Errorf("images: OCI layout %s holds more than one linux/amd64 image", p)
				}
				pick = &m.Manifests[i]
			}
		}
		if pick == nil {
			return nil, release, fmt.Errorf("images: OCI layout %s has no linux/amd64 image", p)
		}
		img, err := idx.Image(pick.Digest)
		if err != nil {
			return nil, release, fmt.Errorf("images: OCI layout %s: %w", p, err)
		}
		return img, release, nil
	case "oci-archive":
		// A tar of an OCI image layout: unpacked (with the same care as a
		// layer) into a directory of its own, read as a layout from there.
		f, err := os.Open(p)
		if err != nil {
			return nil, release, fmt.Errorf("images: OCI archive %s: %w", p, err)
		}
		defer f.Close()
		dir, err := os.MkdirTemp("", "hb-oci-archive-")
		if err != nil {
			return nil, release, err
		}
		// (The layout's blobs are read lazily: the directory stays until
		// close.)
		remove := func() { mounts.RemoveAll(dir) }
		if _, err := unpack(ctx, f, dir, MaxOCIFileBytes, MaxOCIBytes, nil); err != nil {
			remove()
			return nil, release, fmt.Errorf("images: OCI archive %s: %w", p, err)
		}
		img, _, err := OpenOCI(ctx, "oci:"+dir)
		if err != nil {
			remove()
			return nil, release, err
		}
		return img, remove, nil
	case "docker-archive":
		img, err := tarball.ImageFromPath(p, nil)
		if err != nil {
			return nil, release, fmt.Errorf("images: docker archive %s: %w", p, err)
		}
		return img, release, nil
	}
	return nil, release, fmt.Errorf("images: From %q: want oci:DIR, oci-archive:FILE, docker-archive:FILE or registry:REF", from)
}

// buildOCIRootDisk unpacks img under work, adds what the guest needs and
// packs it into the raw ext4 image dst. It reports whether the image
// boots systemd.
func buildOCIRootDisk(ctx context.Context, lg *logger, o *Options, img v1.Image, work, dst string) (systemd bool, err error) {
	root := filepath.Join(work, "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		return false, err
	}
	defer func() {
		if err := mounts.RemoveAll(root); err != nil {
			lg.step("warning: cleaning %s: %v", root, err)
		}
	}()
	layers, _ := img.Layers()
	lg.step("unpacking %d layers", len(layers))
	rd := mutate.Extract(img)
	defer rd.Close()
	n, err := unpack(ctx, rd, root, MaxOCIFileBytes, MaxOCIBytes, func(n int64) { lg.step("unpacked %d MiB", n>>20) })
	if err != nil {
		return false, badImage(ctx, err)
	}
	lg.step("unpacked %d MiB", n>>20)
	if systemd, err = configureOCIRoot(ctx, o, root); err != nil {
		return false, badImage(ctx, err)
	}
	return systemd, makeExt4(ctx, lg, o, root, dst)
}

// unpack writes the tar stream into dir, confined to it, and returns the
// bytes of file content written; progress (if not nil) hears of every
// 256 MiB.
func unpack(ctx context.Context, r io.Reader, dir string, maxFile, maxTotal int64, progress func(int64)) (int64, error) {
	rt, err := os.OpenRoot(dir)
	if err != nil {
		return 0, err
	}
	defer rt.Close()
	tr := tar.NewReader(r)
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		h, err := tr.Next()
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, fmt.Errorf("images: reading the image's layers: %w", err)
		}
		name, err := entryName(h.Name)
		if err != nil {
			return total, err
		}
		if name == "." {
			continue
		}
		fail := func(err error) error { return fmt.Errorf("images: layer entry %q: %w", h.Name, err) }
		if parent := path.Dir(name); parent != "." {
			if err := rt.MkdirAll(parent, 0o755); err != nil {
				return total, fail(err)
			}
		}
		mode := h.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := rt.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return total, fail(err)
			}
		case tar.TypeReg:
			if h.Size > maxFile {
				return total, fail(fmt.Errorf("%d bytes, over the %d-byte limit of one file", h.Size, maxFile))
			}
			if total+h.Size > maxTotal {
				return total, fail(fmt.Errorf("the image unpacks to more than %d bytes", maxTotal))
			}
			rt.Remove(name) // a later layer's file replaces; never write through a link
			f, err := rt.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return total, fail(err)
			}
			n, err := io.Copy(f, io.LimitReader(tr, h.Size))
			if progress != nil && (total+n)>>28 > total>>28 {
				progress(total + n)
			}
			total += n
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err == nil && n != h.Size {
				err = io.ErrUnexpectedEOF
			}
			if err != nil {
				return total, fail(err)
			}
		case tar.TypeSymlink:
			rt.Remove(name)
			if err := rt.Symlink(h.Linkname, name); err != nil {
				return total, fail(err)
			}
		case tar.TypeLink:
			target, err := entryName(h.Linkname)
			if err != nil {
				return total, fail(err)
			}
			rt.Remove(name)
			if err := rt.Link(target, name); err != nil {
				return total, fail(err)
			}
			continue // (a hard link shares its target's owner and mode)
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			return total, fail(errors.New("device nodes and FIFOs are not allowed in an image (the guest's /dev is made at boot)"))
		default:
			return total, fail(fmt.Errorf("unsupported entry type %q", h.Typeflag))
		}
		if err := rt.Lchown(name, h.Uid, h.Gid); err != nil {
			return total, fail(err)
		}
		if h.Typeflag != tar.TypeSymlink {
			if err := rt.Chmod(name, mode); err != nil {
				return total, fail(err)
			}
		}
	}
}

// entryName cleans a layer entry's name to a path relative to the root,
// refusing one that climbs out of it.
func entryName(n string) (string, error) {
	clean := path.Clean("/" + n)
	rel := strings.TrimPrefix(clean, "/")
	if rel == "" {
		rel = "."
	}
	for _, part := range strings.Split(n, "/") {
		if part == ".." {
			return "", fmt.Errorf("images: layer entry %q climbs out of the image (..)", n)
		}
	}
	return rel, nil
}

// configureOCIRoot adds the agent, the default user and identity files to
// an unpacked image, through an os.Root: the tree is untrusted.
func configureOCIRoot(ctx context.Context, o *Options, root string) (systemd bool, err error) {
	rt, err := os.OpenRoot(root)
	if err != nil {
		return false, err
	}
	defer rt.Close()
	write := func(rel, content string, mode os.FileMode) error {
		if err := rt.MkdirAll(path.Dir(rel), 0o755); err != nil {
			return fmt.Errorf("images: %s: %w", rel, err)
		}
		rt.Remove(rel) // may be a link: never write through it
		if err := rt.WriteFile(rel, []byte(content), mode); err != nil {
			return fmt.Errorf("images: %s: %w", rel, err)
		}
		return rt.Chmod(rel, mode)
	}
	agent, err := os.ReadFile(o.AgentPath)
	if err != nil {
		return false, err
	}
	agentRel := strings.TrimPrefix(layout.AgentPath, "/")
	if err := write(agentRel, string(agent), 0o755); err != nil {
		return false, err
	}
	if err := addUser(rt, write); err != nil {
		return false, err
	}
	for rel, content := range map[string]string{
		"etc/hostname":    o.Hostname + "\n",
		"etc/hosts":       hostsFile(o.Hostname),
		"etc/resolv.conf": "# written by the harebox agent at network setup\n",
	} {
		if err := write(rel, content, 0o644); err != nil {
			return false, err
		}
	}
	if err := write("etc/machine-id", "", 0o444); err != nil {
		return false, err
	}
	for _, d := range []string{"dev", "proc", "sys", "run", "tmp"} {
		if fi, err := rt.Lstat(d); err == nil && !fi.IsDir() {
			return false, fmt.Errorf("images: /%s in the image is not a directory", d)
		}
		if err := rt.MkdirAll(d, 0o755); err != nil {
			return false, fmt.Errorf("images: /%s: %w", d, err)
		}
	}
	rt.Chmod("tmp", fs.ModeSticky|0o777)
	for _, p := range []string{"lib/systemd/systemd", "usr/lib/systemd/systemd"} {
		if fi, err := rt.Stat(p); err == nil && fi.Mode().IsRegular() {
			systemd = true
		}
	}
	if !systemd {
		return false, ctx.Err()
	}
	// As the default image: the agent a unit of systemd, enabled.
	if err := write("etc/systemd/system/"+layout.AgentUnit, agentUnit, 0o644); err != nil {
		return false, err
	}
	wants := "etc/systemd/system/multi-user.target.wants/"
	if err := rt.MkdirAll(wants, 0o755); err != nil {
		return false, err
	}
	rt.Remove(wants + layout.AgentUnit)
	if err := rt.Symlink("/etc/systemd/system/"+layout.AgentUnit, wants+layout.AgentUnit); err != nil {
		return false, err
	}
	return true, ctx.Err()
}

// addUser adds the unprivileged user (layout.DefaultUser, uid and gid
// layout.DefaultUID, home layout.DefaultHome) unless the image has one of
// that name.
func addUser(rt *os.Root, write func(rel, content string, mode os.FileMode) error) error {
	passwd, _ := rt.ReadFile("etc/passwd")
	for _, line := range strings.Split(string(passwd), "\n") {
		if strings.HasPrefix(line, layout.DefaultUser+":") {
			return nil
		}
	}
	shell := "/bin/sh"
	if fi, err := rt.Stat("bin/bash"); err == nil && fi.Mode().IsRegular() {
		shell = "/bin/bash"
	}
	uid := fmt.Sprint(layout.DefaultUID)
	add := func(rel, line string, mode os.FileMode) error {
		old, _ := rt.ReadFile(rel)
		s := string(old)
		if s != "" && !strings.HasSuffix(s, "\n") {
			s += "\n"
		}
		return write(rel, s+line+"\n", mode)
	}
	if err := add("etc/passwd", fmt.Sprintf("%s:x:%s:%s:HareBox user:%s:%s", layout.DefaultUser, uid, uid, layout.DefaultHome, shell), 0o644); err != nil {
		return err
	}
	if err := add("etc/group", fmt.Sprintf("%s:x:%s:", layout.DefaultUser, uid), 0o644); err != nil {
		return err
	}
	home := strings.TrimPrefix(layout.DefaultHome, "/")
	if err := rt.MkdirAll(home, 0o755); err != nil {
		return fmt.Errorf("images: %s: %w", layout.DefaultHome, err)
	}
	return rt.Lchown(home, layout.DefaultUID, layout.DefaultUID)
}
