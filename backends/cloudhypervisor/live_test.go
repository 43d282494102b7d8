package cloudhypervisor

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/hypervisortest"
	"github.com/harebox/harebox/internal/testimage"
)

// TestLive runs the shared conformance suite against the real
// cloud-hypervisor where it and hardware KVM are here; elsewhere it skips
// with one line saying why. Cloud Hypervisor boots a PVH-capable vmlinux
// (ELF), not a bzImage: the minimal image's kernel is one (images keep
// the ELF image), or HAREBOX_TEST_KERNEL names another.
func TestLive(t *testing.T) {
	if os.Getenv(stubEnv) != "" {
		t.Skip("cloud-hypervisor live test: the stub VMM is configured, not a real one")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if r := Probe(ctx, Config{}); !r.Usable {
		t.Skip("cloud-hypervisor live test: " + r.Reason)
	}
	hypervisortest.Run(t, hypervisortest.Harness{
		New: func(t *testing.T) hypervisor.Hypervisor { return New(Config{}) },
		Spec: func(t *testing.T) hypervisor.Spec {
			img := testimage.Image(t, "minimal")
			kernel := img.Kernel
			if k := os.Getenv("HAREBOX_TEST_KERNEL"); k != "" {
				kernel = k
			}
			return hypervisor.Spec{VCPUs: 1, MemoryMB: 512, Kernel: kernel, Initrd: img.Initrd, Cmdline: img.Cmdline}
		},
		NoSerials: true,
	})
}
