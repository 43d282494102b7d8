// Package testapi serves hareboxd's API on the fake hypervisor for the
// tests of its clients (its guest agent runs echo, sleep, exit and files;
// real VMs are the e2e suite's).
package testapi

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/api"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/sandbox"
)

// Server starts the API on an engine of its own and returns its URL and
// root key; both go when the test ends.
func Server(t testing.TB) (url, rootKey string) {
	t.Helper()
	dir := t.TempDir()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	eng, err := harebox.New(context.Background(), harebox.Options{DataDir: dir, Hypervisor: hv,
		Images: map[string]images.Image{sandbox.DefaultImage: memhv.Image(dir)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	key, _, _, err := api.LoadOrCreateRootKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Options{Engine: eng, Auth: key})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	b, err := os.ReadFile(filepath.Join(dir, "root.key"))
	if err != nil {
		t.Fatal(err)
	}
	return hs.URL, strings.TrimSpace(string(b))
}
