package api_test

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/api"
	"github.com/harebox/harebox/internal/testimage"
)

// TestImages: the operator builds an image from a registry (one on
// loopback, in this process), it is listed, sandboxes are made from it,
// and it cannot be deleted while one uses it; bad builds are refused
// clearly. (The fake hypervisor runs the sandboxes; images/
// TestOCIImageBoots boots such an image on a real VM.)
func TestImages(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("building an image needs root (mkfs.ext4 -d keeps the image's owners)")
	}
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	ref, _ := name.ParseReference(host + "/harebox/bbox:1")
	img := testimage.OCIBusybox(t)
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	agent := testimage.Binary(t, "harebox-agent")
	f := newFastAPIWith(t, api.Options{}, func(o *harebox.Options) { o.AgentPath = agent })

	for _, bad := range []struct {
		body       map[string]any
		status     int
		code, what string
	}{
		{map[string]any{"name": "mine", "from": "oci:/etc"}, 400, "invalid", "registry:REF"},
		{map[string]any{"name": "mine"}, 400, "invalid", "from"},
		{map[string]any{"name": "default", "from": "registry:" + host + "/harebox/bbox:1"}, 409, "conflict", "built-in"},
		{map[string]any{"name": "mine", "from": "registry:" + host + "/harebox/bbox:nope"}, 400, "invalid", "pull"},
	} {
		r := f.do(t, "POST", "/v1/images", f.root, bad.body)
		code, _, msg := errField(r)
		if r.status != bad.status || code != bad.code || !strings.Contains(msg, bad.what) {
			t.Errorf("build %v: %d %s", bad.body, r.status, r.raw)
		}
	}
	// A hostile layer is the image's fault: 400, naming the entry.
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	tw.WriteHeader(&tar.Header{Name: "dev/kmem", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 2, Mode: 0o600})
	tw.Close()
	bad, err := mutate.AppendLayers(empty.Image, static.NewLayer(layer.Bytes(), types.DockerLayer))
	if err != nil {
		t.Fatal(err)
	}
	badRef, _ := name.ParseReference(host + "/harebox/bad:1")
	if err := remote.Write(badRef, bad); err != nil {
		t.Fatal(err)
	}
	r := f.do(t, "POST", "/v1/images", f.root, map[string]any{"name": "bad", "from": "registry:" + host + "/harebox/bad:1"})
	if code, field, msg := errField(r); r.status != 400 || code != "invalid" || field != "from" || !strings.Contains(msg, "dev/kmem") {
		t.Errorf("a hostile layer: %d %s", r.status, r.raw)
	}

	built := f.must(t, 201, "POST", "/v1/images", f.root, map[string]any{"name": "mine", "from": "registry:" + host + "/harebox/bbox:1"})
	digest, _ := img.Digest()
	if str(built, "name") != "mine" || str(built, "digest") != digest.String() || built.body["root_disk"] != true {
		t.Fatalf("built: %s", built.raw)
	}
	if l := f.must(t, 200, "GET", "/v1/images", f.root, nil); !strings.Contains(string(l.raw), `"name":"mine"`) || !strings.Contains(string(l.raw), `"name":"default"`) {
		t.Fatalf("list: %s", l.raw)
	}
	box := str(f.must(t, 201, "POST", "/v1/sandboxes", f.root, map[string]any{"image": "mine"}), "id")
	r = f.do(t, "DELETE", "/v1/images/mine", f.root, nil)
	if code, _, msg := errField(r); r.status != 409 || code != "conflict" || !strings.Contains(msg, box) {
		t.Fatalf("delete while in use: %d %s", r.status, r.raw)
	}
	f.must(t, 409, "DELETE", "/v1/images/default", f.root, nil)
	f.must(t, 200, "DELETE", "/v1/sandboxes/"+box, f.root, nil)
	f.must(t, 204, "DELETE", "/v1/images/mine", f.root, nil)
	f.must(t, 404, "DELETE", "/v1/images/mine", f.root, nil)
	if l := f.must(t, 200, "GET", "/v1/images", f.root, nil); strings.Contains(string(l.raw), `"name":"mine"`) {
		t.Fatalf("listed after its delete: %s", l.raw)
	}
	f.must(t, 400, "POST", "/v1/sandboxes", f.root, map[string]any{"image": "mine"})

	// With golden snapshots, an image is deleted with its golden
	// snapshot (one being made is stopped); one with a warm pool is kept.
	h := newFastAPIWith(t, api.Options{}, func(o *harebox.Options) {
		o.AgentPath, o.GoldenSnapshots, o.Pool = agent, true, map[string]int{"pooled:small": 0}
	})
	h.must(t, 201, "POST", "/v1/images", h.root, map[string]any{"name": "mine", "from": "registry:" + host + "/harebox/bbox:1"})
	h.must(t, 201, "POST", "/v1/images", h.root, map[string]any{"name": "pooled", "from": "registry:" + host + "/harebox/bbox:1"})
	box = str(h.must(t, 201, "POST", "/v1/sandboxes", h.root, map[string]any{"image": "mine"}), "id")
	h.must(t, 200, "DELETE", "/v1/sandboxes/"+box, h.root, nil)
	h.must(t, 204, "DELETE", "/v1/images/mine", h.root, nil)
	h.must(t, 400, "POST", "/v1/sandboxes", h.root, map[string]any{"image": "mine"})
	r = h.do(t, "DELETE", "/v1/images/pooled", h.root, nil)
	if code, _, msg := errField(r); r.status != 409 || code != "conflict" || !strings.Contains(msg, "pool") {
		t.Fatalf("delete of an image with a warm pool: %d %s", r.status, r.raw)
	}
	// The deployment's pool (harebox pool set) replaces the host's
	// --pool: an image it does not name may go. A pool of an image the
	// host does not have is refused, and changes nothing.
	if p := h.must(t, 200, "GET", "/v1/pool", h.root, nil); str(p, "source") != "host" || !strings.Contains(string(p.raw), `"pooled:small":0`) {
		t.Fatalf("the host's own pool: %s", p.raw)
	}
	r = h.do(t, "PUT", "/v1/pool", h.root, map[string]any{"pool": map[string]int{"nope:small": 1}})
	if code, field, msg := errField(r); r.status != 400 || code != "invalid" || field != "pool" || !strings.Contains(msg, `"nope"`) {
		t.Fatalf("a pool of an image the host does not have: %d %s", r.status, r.raw)
	}
	h.must(t, 400, "PUT", "/v1/pool", h.root, map[string]any{"pool": map[string]any{"pooled:small": "two"}})
	h.must(t, 400, "PUT", "/v1/pool", h.root, map[string]any{}) // (no pool: not every host's cleared)
	h.must(t, 409, "DELETE", "/v1/images/pooled", h.root, nil)
	if p := h.must(t, 200, "PUT", "/v1/pool", h.root, map[string]any{"pool": map[string]int{}}); str(p, "source") != "deployment" || str(p, "set_at") == "" {
		t.Fatalf("the deployment's pool: %s", p.raw)
	}
	h.must(t, 204, "DELETE", "/v1/images/pooled", h.root, nil)

	// A server with no agent binary builds nothing, and says why.
	g := newFastAPI(t, api.Options{})
	r = g.do(t, "POST", "/v1/images", g.root, map[string]any{"name": "mine", "from": "registry:" + host + "/harebox/bbox:1"})
	if code, _, msg := errField(r); r.status != 503 || code != "unavailable" || !strings.Contains(msg, "--agent") {
		t.Fatalf("build without an agent: %d %s", r.status, r.raw)
	}
}
