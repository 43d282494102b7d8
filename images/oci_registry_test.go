package images_test

import (
	"context"
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

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
		got, err := images.OpenOCI(ctx, "registry:"+r)
		if err != nil {
			t.Fatal(err)
		}
		if d, _ := got.Digest(); d != want {
			t.Errorf("%s: digest %s, want %s", r, d, want)
		}
	}
	if _, err := images.OpenOCI(ctx, "registry:"+host+"/harebox/bbox:nope"); err == nil || !strings.Contains(err.Error(), "pull") {
		t.Errorf("an unknown tag: %v", err)
	}
}
