package harebox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/sandbox"
)

// The image catalog: the images of Options.Images and ImageDir, which the
// operator adds to from a registry (BuildImage) and removes unused ones
// from (DeleteImage). Building is package images'; this is who may, and
// what is in use.

// imageView is image name as the API shows it (Options.Images may name
// an image other than its manifest does).
func imageView(name string, img images.Image) sandbox.Image {
	return sandbox.Image{Name: name, From: img.From, Digest: img.Digest, KernelVersion: img.KernelVersion,
		BuiltAt: img.BuiltAt, RootDisk: img.RootDisk != ""}
}

// ListImages returns the images sandboxes can be created from, each name
// once (its newest build), by name.
func (e *Engine) ListImages(ctx context.Context) ([]sandbox.Image, error) {
	if err := authz.Allowed(authz.From(ctx), "listImages"); err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for n := range e.opts.Images {
		names[n] = true
	}
	dirs, _ := filepath.Glob(filepath.Join(e.opts.ImageDir, "*", images.ManifestFile))
	for _, m := range dirs {
		if img, err := images.Load(filepath.Dir(m)); err == nil {
			names[img.Name] = true
		}
	}
	out := []sandbox.Image{}
	for n := range names {
		if img, err := e.image(n); err == nil {
			out = append(out, imageView(n, img))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// BuildImage builds an image from an OCI image in a registry into
// ImageDir (operator only). A name in use by a built-in image is refused;
// building a name again makes its newest build the image new sandboxes
// get, and leaves the old build to the sandboxes that use it.
func (e *Engine) BuildImage(ctx context.Context, req sandbox.ImageBuildRequest) (_ *sandbox.Image, err error) {
	defer func() { e.audit.Record(ctx, "buildImage", "", req.Name, err) }()
	if err := authz.Allowed(authz.From(ctx), "buildImage"); err != nil {
		return nil, err
	}
	if err := sandbox.Validate(&req); err != nil {
		return nil, err
	}
	if !strings.HasPrefix(req.From, "registry:") {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "from", "the API builds from a registry (registry:REF); build a local layout or archive with harebox-image build --from into the server's image directory")
	}
	if _, ok := e.opts.Images[req.Name]; ok || req.Name == images.Minimal || req.Name == images.Default {
		return nil, sandbox.Errorf(sandbox.ErrExists, "name", "%q is a built-in image", req.Name)
	}
	if e.opts.AgentPath == "" {
		return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "this server builds no images: it has no agent binary (hareboxd --agent)")
	}
	e.imageMu.Lock()
	defer e.imageMu.Unlock()
	img, err := images.Build(ctx, images.Options{Name: req.Name, From: req.From, AgentPath: e.opts.AgentPath, OutDir: e.opts.ImageDir})
	if errors.Is(err, images.ErrBadImage) {
		return nil, &sandbox.Error{Kind: sandbox.ErrInvalid, Field: "from", Msg: err.Error(), Err: err}
	}
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", req.Name, err)
	}
	e.log.Info("image built", "name", img.Name, "from", img.From, "digest", img.Digest)
	v := imageView(img.Name, img)
	return &v, nil
}

// DeleteImage removes every build of an image from ImageDir (operator
// only), unless a sandbox or a snapshot that is not deleted, the warm
// pool or a golden snapshot uses it: a running sandbox keeps its image.
func (e *Engine) DeleteImage(ctx context.Context, name string) (err error) {
	defer func() { e.audit.Record(ctx, "deleteImage", "", name, err) }()
	if err := authz.Allowed(authz.From(ctx), "deleteImage"); err != nil {
		return err
	}
	if _, ok := e.opts.Images[name]; ok || name == images.Minimal || name == images.Default {
		return sandbox.Errorf(sandbox.ErrState, "name", "%q is a built-in image", name)
	}
	e.imageMu.Lock()
	defer e.imageMu.Unlock()
	if _, err := e.image(name); err != nil {
		return sandbox.Errorf(sandbox.ErrNotFound, "name", "no image %q", name)
	}
	boxes, err := e.store.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	for _, b := range boxes {
		if b.Image == name && b.State != sandbox.StateDeleted {
			return sandbox.Errorf(sandbox.ErrState, "", "image %q is in use by sandbox %s (%s)", name, b.ID, b.State)
		}
	}
	snaps, err := e.store.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	for _, s := range snaps {
		if s.Image == name {
			return sandbox.Errorf(sandbox.ErrState, "", "image %q is in use by snapshot %s", name, s.ID)
		}
	}
	for spec := range e.opts.Pool {
		if img, _, _ := strings.Cut(spec, ":"); img == name {
			return sandbox.Errorf(sandbox.ErrState, "", "image %q has a warm pool (hareboxd --pool %s)", name, spec)
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(e.opts.ImageDir, name+"-*", images.ManifestFile))
	e.mu.Lock()
	for id := range e.goldens {
		for _, m := range dirs {
			if d, err := filepath.Abs(filepath.Dir(m)); err == nil && strings.HasPrefix(id, d+"|") {
				e.mu.Unlock()
				return sandbox.Errorf(sandbox.ErrState, "", "image %q has a golden snapshot in this server (golden snapshots live until hareboxd restarts)", name)
			}
		}
	}
	e.mu.Unlock()
	for _, m := range dirs {
		if img, err := images.Load(filepath.Dir(m)); err == nil && img.Name == name {
			if err := os.RemoveAll(filepath.Dir(m)); err != nil {
				return fmt.Errorf("delete image %s: %w", name, err)
			}
		}
	}
	return nil
}
