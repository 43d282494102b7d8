package harebox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

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

// image finds a built image by name: Options.Images first, then the newest
// build of that name in ImageDir.
func (e *Engine) image(name string) (images.Image, error) {
	if img, ok := e.opts.Images[name]; ok {
		return img, nil
	}
	dirs, _ := filepath.Glob(filepath.Join(e.opts.ImageDir, name+"-*", "manifest.json"))
	var found []images.Image
	for _, m := range dirs {
		if img, err := images.Load(filepath.Dir(m)); err == nil && img.Name == name {
			found = append(found, img)
		}
	}
	if len(found) == 0 {
		return images.Image{}, sandbox.Errorf(sandbox.ErrInvalid, "image", "unknown image %q (the server's administrator builds it with harebox-image build --name %s)", name, name)
	}
	sort.Slice(found, func(i, j int) bool { return found[i].BuiltAt.After(found[j].BuiltAt) })
	return found[0], nil
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

// imageRefsInterval is how often the engine writes which image builds it
// uses into their cache directories (images.WriteRefs), for a GC run on
// its own (harebox-image gc). Between two writes the engine can only
// start using the newest build of a name, which GC keeps anyway.
const imageRefsInterval = time.Minute

// imageRefsLoop writes the engine's image references at start and every
// imageRefsInterval until Close.
func (e *Engine) imageRefsLoop() {
	defer e.wg.Done()
	t := time.NewTicker(imageRefsInterval)
	defer t.Stop()
	for {
		if err := e.writeImageRefs(e.ctx); err != nil && e.ctx.Err() == nil {
			e.log.Warn("image references: cannot write them; harebox-image gc may keep builds no one uses, or refuse", "err", err)
		}
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// writeImageRefs writes the builds in use (imagesInUse) into ImageDir's
// references, and into those of every other directory holding one of
// them, under the engine's data directory as owner.
func (e *Engine) writeImageRefs(ctx context.Context) error {
	now := time.Now() // (before reading: what starts to be used after is the newest)
	dirs, err := e.imagesInUse(ctx)
	if err != nil {
		return err
	}
	caches := map[string]bool{e.opts.ImageDir: true}
	for _, d := range dirs {
		caches[filepath.Dir(d)] = true
	}
	var errs []error
	for c := range caches {
		if fi, err := os.Stat(c); err != nil || !fi.IsDir() {
			continue // (another host's, or gone)
		}
		if err := images.WriteRefs(c, e.opts.DataDir, dirs, now); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// imagesInUse lists the image builds the engine uses: Options.Images',
// those under the sandboxes not deleted and under the snapshots (of every
// host sharing the store: a path of another host's may be the same
// here, which only keeps more), and those of its golden snapshots and
// pool members.
func (e *Engine) imagesInUse(ctx context.Context) ([]string, error) {
	set := map[string]bool{}
	for _, img := range e.opts.Images {
		set[img.Dir] = true
	}
	boxes, err := e.store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	for _, b := range boxes {
		if b.State != sandbox.StateDeleted {
			set[b.ImageDir] = true
		}
	}
	snaps, err := e.store.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	for _, s := range snaps {
		set[s.ImageDir] = true
	}
	e.mu.Lock()
	for id := range e.goldens {
		set[goldenImageDir(id)] = true
	}
	for _, ms := range e.pool {
		for _, m := range ms {
			set[m.img.Dir] = true
		}
	}
	e.mu.Unlock()
	delete(set, "")
	out := make([]string, 0, len(set))
	for d := range set {
		out = append(out, d)
	}
	sort.Strings(out)
	return out, nil
}

// goldenImageDir is the image build of a golden snapshot's ID (goldenID:
// the build's directory, then three numbers).
func goldenImageDir(id string) string {
	for range 3 {
		if i := strings.LastIndexByte(id, '|'); i >= 0 {
			id = id[:i]
		}
	}
	return id
}
