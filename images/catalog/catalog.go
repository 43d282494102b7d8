// Package catalog is the image catalog: the images sandboxes are created
// from (the engine's built-in ones and the builds in its image directory),
// which the operator adds to from a registry (Build) and removes unused
// ones from (Delete), and the references to the builds in use that
// harebox-image gc keeps. Building is package images'; this is who may,
// and what is in use.
package catalog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Store is what the catalog needs of the store: the sandboxes and
// snapshots, which name the images they use (of every host sharing it).
type Store interface {
	ListSandboxes(ctx context.Context) ([]*store.Sandbox, error)
	ListSnapshots(ctx context.Context) ([]*store.Snapshot, error)
}

// Auditor records a call, and how it ended, in the audit log.
type Auditor interface {
	Record(ctx context.Context, action, accountID, target string, err error)
}

// Options are a Catalog's parts.
type Options struct {
	// Images maps built-in image names to built images; names not here
	// are looked up in Dir, as built by harebox-image.
	Images map[string]images.Image
	Dir    string
	// AgentPath is the static harebox-agent binary images are built with;
	// empty means Build is refused.
	AgentPath string
	// Owner names the engine in the builds' references (its data
	// directory).
	Owner string
	// Pool, if set, returns what the engine's warm pool keeps now
	// ("IMAGE:PRESET" -> count): an image it names is not deleted.
	Pool  func() map[string]int
	Store Store
	// Held returns the image builds (directories) the engine holds outside
	// the store: its golden snapshots' and its idle pool members'.
	Held func() (goldens, pooled []string)
	// DropGoldens, if set, removes the golden snapshots of the image
	// build in imageDir (kept across restarts; one being made is stopped)
	// before a delete removes the build.
	DropGoldens func(imageDir string)
	// Warm, if set, tells an image build's golden snapshots and idle pool
	// members (its directory), for List.
	Warm  func(imageDir string) (goldens []sandbox.GoldenSnapshot, idle int)
	Audit Auditor
	Log   *slog.Logger
}

// Catalog is the image catalog of an engine. It is safe for concurrent use.
type Catalog struct {
	o Options
	// mu serialises builds and deletes (a build takes the host's disk and
	// CPU for minutes; one at a time is enough).
	mu sync.Mutex
}

// New returns a Catalog over o.
func New(o Options) *Catalog { return &Catalog{o: o} }

// view is an image as the API shows it, under name (Options.Images may
// name an image other than its manifest does).
func view(name string, img images.Image) sandbox.Image {
	return sandbox.Image{Name: name, From: img.From, Digest: img.Digest, KernelVersion: img.KernelVersion,
		BuiltAt: img.BuiltAt, RootDisk: img.RootDisk != ""}
}

// Lookup finds a built image by name: Options.Images first, then the
// newest build of that name in Dir. An unknown name is ErrInvalid on
// field "image" (a create names it).
func (c *Catalog) Lookup(name string) (images.Image, error) {
	if img, ok := c.o.Images[name]; ok {
		return img, nil
	}
	dirs, _ := filepath.Glob(filepath.Join(c.o.Dir, name+"-*", images.ManifestFile))
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

// List returns the images sandboxes can be created from, each name once
// (its newest build), by name.
func (c *Catalog) List(ctx context.Context) ([]sandbox.Image, error) {
	if err := authz.Allowed(authz.From(ctx), "listImages"); err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for n := range c.o.Images {
		names[n] = true
	}
	dirs, _ := filepath.Glob(filepath.Join(c.o.Dir, "*", images.ManifestFile))
	for _, m := range dirs {
		if img, err := images.Load(filepath.Dir(m)); err == nil {
			names[img.Name] = true
		}
	}
	out := []sandbox.Image{}
	for n := range names {
		if img, err := c.Lookup(n); err == nil {
			v := view(n, img)
			if c.o.Warm != nil {
				v.Golden, v.PoolIdle = c.o.Warm(img.Dir)
			}
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// builtIn says whether name is an image the operator cannot build or
// delete.
func (c *Catalog) builtIn(name string) bool {
	_, ok := c.o.Images[name]
	return ok || name == images.Minimal || name == images.Default
}

// Build builds an image from an OCI image in a registry into Dir
// (operator only). A name in use by a built-in image is refused; building
// a name again makes its newest build the image new sandboxes get, and
// leaves the old build to the sandboxes that use it.
func (c *Catalog) Build(ctx context.Context, req sandbox.ImageBuildRequest) (_ *sandbox.Image, err error) {
	defer func() { c.o.Audit.Record(ctx, "buildImage", "", req.Name, err) }()
	if err := authz.Allowed(authz.From(ctx), "buildImage"); err != nil {
		return nil, err
	}
	if err := sandbox.Validate(&req); err != nil {
		return nil, err
	}
	if !strings.HasPrefix(req.From, "registry:") {
		return nil, sandbox.Errorf(sandbox.ErrInvalid, "from", "the API builds from a registry (registry:REF); build a local layout or archive with harebox-image build --from into the server's image directory")
	}
	if c.builtIn(req.Name) {
		return nil, sandbox.Errorf(sandbox.ErrExists, "name", "%q is a built-in image", req.Name)
	}
	if c.o.AgentPath == "" {
		return nil, sandbox.Errorf(sandbox.ErrUnavailable, "", "this server builds no images: it has no agent binary (hareboxd --agent)")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	img, err := images.Build(ctx, images.Options{Name: req.Name, From: req.From, AgentPath: c.o.AgentPath, OutDir: c.o.Dir})
	if errors.Is(err, images.ErrBadImage) {
		return nil, &sandbox.Error{Kind: sandbox.ErrInvalid, Field: "from", Msg: err.Error(), Err: err}
	}
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", req.Name, err)
	}
	c.o.Log.Info("image built", "name", img.Name, "from", img.From, "digest", img.Digest)
	v := view(img.Name, img)
	return &v, nil
}

// Delete removes every build of an image from Dir (operator only), unless
// a sandbox or a snapshot that is not deleted, a warm pool or a golden
// snapshot uses it: a running sandbox keeps its image.
func (c *Catalog) Delete(ctx context.Context, name string) (err error) {
	defer func() { c.o.Audit.Record(ctx, "deleteImage", "", name, err) }()
	if err := authz.Allowed(authz.From(ctx), "deleteImage"); err != nil {
		return err
	}
	if c.builtIn(name) {
		return sandbox.Errorf(sandbox.ErrState, "name", "%q is a built-in image", name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.Lookup(name); err != nil {
		return sandbox.Errorf(sandbox.ErrNotFound, "name", "no image %q", name)
	}
	boxes, err := c.o.Store.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	for _, b := range boxes {
		if b.Image == name && b.State != sandbox.StateDeleted {
			return sandbox.Errorf(sandbox.ErrState, "", "image %q is in use by sandbox %s (%s)", name, b.ID, b.State)
		}
	}
	snaps, err := c.o.Store.ListSnapshots(ctx)
	if err != nil {
		return err
	}
	for _, s := range snaps {
		if s.Image == name {
			return sandbox.Errorf(sandbox.ErrState, "", "image %q is in use by snapshot %s", name, s.ID)
		}
	}
	var pool map[string]int
	if c.o.Pool != nil {
		pool = c.o.Pool()
	}
	for spec := range pool {
		if img, _, _ := strings.Cut(spec, ":"); img == name {
			return sandbox.Errorf(sandbox.ErrState, "", "image %q has a warm pool (%s: harebox pool)", name, spec)
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(c.o.Dir, name+"-*", images.ManifestFile))
	for _, m := range dirs {
		if img, err := images.Load(filepath.Dir(m)); err == nil && img.Name == name {
			if d, err := filepath.Abs(filepath.Dir(m)); err == nil && c.o.DropGoldens != nil {
				c.o.DropGoldens(d)
			}
			if err := os.RemoveAll(filepath.Dir(m)); err != nil {
				return fmt.Errorf("delete image %s: %w", name, err)
			}
		}
	}
	return nil
}

// RefsInterval is how often Run writes which image builds the engine
// uses into their cache directories (images.WriteRefs), for a GC run on
// its own (harebox-image gc). Between two writes the engine can only
// start using the newest build of a name, which GC keeps anyway.
const RefsInterval = time.Minute

// Run writes the engine's image references now and every RefsInterval
// until ctx is done.
func (c *Catalog) Run(ctx context.Context) {
	t := time.NewTicker(RefsInterval)
	defer t.Stop()
	for {
		if err := c.WriteRefs(ctx); err != nil && ctx.Err() == nil {
			c.o.Log.Warn("image references: cannot write them; harebox-image gc may keep builds no one uses, or refuse", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// WriteRefs writes the builds in use (InUse) into Dir's references, and
// into those of every other directory holding one of them, under Owner.
func (c *Catalog) WriteRefs(ctx context.Context) error {
	now := time.Now() // (before reading: what starts to be used after is the newest)
	dirs, err := c.InUse(ctx)
	if err != nil {
		return err
	}
	caches := map[string]bool{c.o.Dir: true}
	for _, d := range dirs {
		caches[filepath.Dir(d)] = true
	}
	var errs []error
	for cache := range caches {
		if fi, err := os.Stat(cache); err != nil || !fi.IsDir() {
			continue // (another host's, or gone)
		}
		if err := images.WriteRefs(cache, c.o.Owner, dirs, now); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// InUse lists the image builds the engine uses, sorted: Options.Images',
// those under the sandboxes not deleted and under the snapshots (of every
// host sharing the store: a path of another host's may be the same here,
// which only keeps more), and those Held.
func (c *Catalog) InUse(ctx context.Context) ([]string, error) {
	set := map[string]bool{}
	for _, img := range c.o.Images {
		set[img.Dir] = true
	}
	boxes, err := c.o.Store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	for _, b := range boxes {
		if b.State != sandbox.StateDeleted {
			set[b.ImageDir] = true
		}
	}
	snaps, err := c.o.Store.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	for _, s := range snaps {
		set[s.ImageDir] = true
	}
	goldens, pooled := c.o.Held()
	for _, d := range append(goldens, pooled...) {
		set[d] = true
	}
	delete(set, "")
	out := make([]string, 0, len(set))
	for d := range set {
		out = append(out, d)
	}
	sort.Strings(out)
	return out, nil
}
