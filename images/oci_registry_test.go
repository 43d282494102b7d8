package images_test

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/testimage"
)

// TestOCIFromRegistry: "registry:REF" pulls the image from a registry (one
// on loopback, in this process) by tag and by digest, the same image the
// layout gives; an unknown tag is a clear error.
func TestOCIFromRegistry(t *testing.T) {
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	img := testimage.OCIBusybox(t)
	ref, err := name.ParseReference(host + "/harebox/bbox:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	ctx := context.Background()
	for _, r := range []string{host + "/harebox/bbox:1", host + "/harebox/bbox@" + want.String()} {
		got, done, err := images.OpenOCI(ctx, "registry:"+r)
		if err != nil {
			t.Fatal(err)
		}
		if d, _ := got.Digest(); d != want {
			t.Errorf("%s: digest %s, want %s", r, d, want)
		}
		done()
	}
	if _, _, err := images.OpenOCI(ctx, "registry:"+host+"/harebox/bbox:nope"); err == nil || !strings.Contains(err.Error(), "pull") {
		t.Errorf("an unknown tag: %v", err)
	}
}

// TestOCIArchives: a docker save tarball and a tar of an OCI layout open
// as the same image (its config), and the archive's unpacked copy is gone
// once released.
func TestOCIArchives(t *testing.T) {
	img := testimage.OCIBusybox(t)
	want, _ := img.ConfigName()
	dir := t.TempDir()
	docker := filepath.Join(dir, "docker.tar")
	tag, _ := name.NewTag("harebox/bbox:1")
	if err := tarball.WriteToFile(docker, tag, img); err != nil {
		t.Fatal(err)
	}
	layout := testimage.OCILayout(t, img)
	ociTar := filepath.Join(dir, "oci.tar")
	if out, err := exec.Command("tar", "-C", layout, "-cf", ociTar, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
	left := func() int {
		m, _ := filepath.Glob(filepath.Join(os.TempDir(), "hb-oci-archive-*"))
		return len(m)
	}
	before := left()
	for _, from := range []string{"docker-archive:" + docker, "oci-archive:" + ociTar} {
		got, release, err := images.OpenOCI(context.Background(), from)
		if err != nil {
			t.Fatalf("%s: %v", from, err)
		}
		if c, _ := got.ConfigName(); c != want {
			t.Errorf("%s: config %s, want %s", from, c, want)
		}
		release()
	}
	if n := left(); n != before {
		t.Errorf("%d unpacked archives left in %s", n-before, os.TempDir())
	}
}
