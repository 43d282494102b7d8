package testimage

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	ocilayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/harebox/harebox/images"
)

// OCIBusybox is an OCI image made from this machine's busybox-static
// package, in two layers: the first has busybox and a few applets, root
// in /etc/passwd, /etc/hello ("layer one") and /etc/gone; the second
// deletes /etc/gone (a whiteout) and adds /etc/hello2 ("layer two"). It
// has no systemd. The same bytes every time, so its digest is stable.
func OCIBusybox(t testing.TB) v1.Image {
	t.Helper()
	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("busybox-static is not installed (make deps installs it)")
	}
	one := []tarEntry{
		{"bin/busybox", tar.TypeReg, string(busybox), "", 0o755},
		{"etc/passwd", tar.TypeReg, "root:x:0:0:root:/root:/bin/sh\n", "", 0o644},
		{"etc/group", tar.TypeReg, "root:x:0:\n", "", 0o644},
		{"etc/hello", tar.TypeReg, "layer one\n", "", 0o644},
		{"etc/gone", tar.TypeReg, "deleted by layer two\n", "", 0o644},
		{"root", tar.TypeDir, "", "", 0o700},
	}
	for _, applet := range []string{"sh", "id", "cat", "test", "echo", "tr", "ls", "sleep"} {
		one = append(one, tarEntry{"bin/" + applet, tar.TypeSymlink, "", "busybox", 0o777})
	}
	two := []tarEntry{
		{"etc/.wh.gone", tar.TypeReg, "", "", 0o644},
		{"etc/hello2", tar.TypeReg, "layer two\n", "", 0o644},
	}
	img, err := mutate.AppendLayers(empty.Image, layerOf(t, one), layerOf(t, two))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// OCILayout writes img as an OCI image layout in a new directory and
// returns it.
func OCILayout(t testing.TB, img v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "oci")
	p, err := ocilayout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, ocilayout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})); err != nil {
		t.Fatal(err)
	}
	return dir
}

// OCIBusyboxImage builds (or finds cached) the guest image "bbox" from
// OCIBusybox with a freshly built agent.
func OCIBusyboxImage(t testing.TB) images.Image {
	t.Helper()
	dir := OCILayout(t, OCIBusybox(t))
	agent := agentCopy(t)
	unlock := lock(t, imageLock("bbox"))
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var log buildLog
	img, err := images.Build(ctx, images.Options{Name: "bbox", From: "oci:" + dir, AgentPath: agent,
		OutDir: ImagesDir(t), Headroom: 64 << 20, Progress: &log})
	if err != nil {
		t.Fatalf("testimage: build the bbox image: %v\n%s", err, log.tail())
	}
	return img
}

type tarEntry struct {
	name string
	typ  byte
	body string
	link string
	mode int64
}

// layerOf is an uncompressed layer of the entries.
func layerOf(t testing.TB, entries []tarEntry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Size: int64(len(e.body))}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}
