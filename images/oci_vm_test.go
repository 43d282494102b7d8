package images_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/backends/qemu"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/testimage"
)

// TestOCIImageBoots builds an OCI image from a Debian package of this
// machine (busybox-static) in two layers, the second deleting a file of
// the first (a whiteout); builds a guest image from its OCI layout; boots
// it on a real VM (no systemd in it: the agent is its init) and runs
// commands as the default user the build added.
func TestOCIImageBoots(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (the image's files are owned by root; mkfs.ext4 -d keeps owners)")
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps installs it)")
	}
	agent := testimage.Binary(t, "harebox-agent")
	dir := t.TempDir()
	img := testimage.OCIBusybox(t)
	oci := testimage.OCILayout(t, img)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	built, err := images.Build(ctx, images.Options{Name: "bbox", From: "oci:" + oci, AgentPath: agent, OutDir: filepath.Join(dir, "out"),
		Headroom: 64 << 20, Progress: &progress})
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	want, _ := img.Digest()
	if built.Digest != want.String() || !strings.Contains(built.Cmdline, "harebox.init=/usr/local/bin/harebox-agent") {
		t.Fatalf("manifest: digest %s (want %s), cmdline %q", built.Digest, want, built.Cmdline)
	}
	// The same image again is the cached build.
	again, err := images.Build(ctx, images.Options{Name: "bbox", From: "oci:" + oci, AgentPath: agent, OutDir: filepath.Join(dir, "out"), Headroom: 64 << 20})
	if err != nil || again.Dir != built.Dir || !again.BuiltAt.Equal(built.BuiltAt) {
		t.Fatalf("rebuilt instead of the cached image: %v", err)
	}

	hv, err := qemu.New(qemu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := hv.Launch(ctx, hypervisor.Spec{
		ID: "sbx_oci", VCPUs: 1, MemoryMB: 256, Kernel: built.Kernel, Initrd: built.Initrd, Cmdline: built.Cmdline,
		StateDir: filepath.Join(dir, "vm"),
		Disks:    []hypervisor.Disk{{Path: built.RootDisk, Format: built.RootDiskFormat, Overlay: true}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Kill(context.Background())
		m.Cleanup(context.Background())
	})
	c, _, err := client.DialReady(ctx, m.AgentEndpoint(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.Exec(ctx, client.ExecRequest{Shell: `id -un; id -u; echo $HOME; cat /etc/hello /etc/hello2
test -e /etc/gone && echo present || echo gone
tr '\0' ' ' < /proc/1/cmdline; echo`, User: "user", Timeout: 30 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := string(r.Stdout)
	wantOut := "user\n1000\n/home/user\nlayer one\nlayer two\ngone\n/usr/local/bin/harebox-agent \n"
	if r.ExitCode != 0 || got != wantOut {
		t.Fatalf("in the guest (exit %d): %q, stderr %q; want %q", r.ExitCode, got, r.Stderr, wantOut)
	}
	// Root and the files the build added.
	r, err = c.Exec(ctx, client.ExecRequest{Shell: "id -u; cat /etc/hostname", User: "root", Timeout: 30 * time.Second}, nil)
	if err != nil || r.ExitCode != 0 || string(r.Stdout) != "0\nharebox\n" {
		t.Fatalf("as root: %+v %v", r, err)
	}
}
