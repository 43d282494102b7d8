package e2e

import (
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/harebox/harebox/internal/testimage"
	"github.com/harebox/harebox/internal/testserver"
)

// TestImageFromRegistry: the operator builds an image from an OCI image in
// a registry (one this test serves on loopback) through the CLI; a
// sandbox made from it boots on a real VM with the agent as its init and
// the image's files; the image cannot be deleted while the sandbox uses
// it, and can after.
func TestImageFromRegistry(t *testing.T) {
	s := testserver.Prepare(t)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref := strings.TrimPrefix(reg.URL, "http://") + "/harebox/bbox:1"
	r, _ := name.ParseReference(ref)
	if err := remote.Write(r, testimage.OCIBusybox(t)); err != nil {
		t.Fatal(err)
	}
	dataDir, err := os.MkdirTemp("", "hbim")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	// Its own image directory: the build lands there (hareboxd finds the
	// agent binary beside itself).
	srv := testserver.Launch(t, s, dataDir, "--image-dir", filepath.Join(dataDir, "images"), "--plugin", s.Plugin, "--network", "none")
	defer func() {
		srv.Stop(t)
		testserver.NoLeftovers(t, dataDir)
	}()
	hb := func(args ...string) string {
		t.Helper()
		return testserver.Run(t, srv, s, s.Root, 5*time.Minute, "harebox", args...)
	}
	var img struct{ Name, Digest, From string }
	if err := json.Unmarshal([]byte(hb("image", "build", "bbox", "--from", "registry:"+ref)), &img); err != nil || img.Name != "bbox" || !strings.HasPrefix(img.Digest, "sha256:") {
		t.Fatalf("image build: %+v %v", img, err)
	}
	if out := hb("--output", "table", "image", "list"); !strings.Contains(out, "bbox") || !strings.Contains(out, img.Digest) {
		t.Fatalf("image list:\n%s", out)
	}
	var box struct{ ID string }
	if err := json.Unmarshal([]byte(hb("new", "--image", "bbox")), &box); err != nil || box.ID == "" {
		t.Fatalf("new: %v", err)
	}
	if out := hb("exec", box.ID, "-c", "id -un; cat /etc/hello /etc/hello2; test -e /etc/gone || echo gone"); out != "user\nlayer one\nlayer two\ngone\n" {
		t.Fatalf("in the sandbox: %q", out)
	}
	cmd := exec.Command(filepath.Join(s.Bin, "harebox"), "image", "delete", "bbox")
	cmd.Env = srv.Env(s)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), box.ID) {
		t.Fatalf("delete of an image in use: %v %s", err, out)
	}
	hb("delete", box.ID)
	hb("image", "delete", "bbox")
	if out := hb("image", "list"); strings.Contains(out, "bbox") {
		t.Fatalf("listed after its delete: %s", out)
	}
}
