package qemu_test

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/harebox/harebox/backends/qemu"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/hypervisortest"
	"github.com/harebox/harebox/hypervisor/plugin"
	"github.com/harebox/harebox/internal/testimage"
)

// needQEMU skips with one clear line where QEMU is not installed.
func needQEMU(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps installs it)")
	}
}

func minimalSpec(t *testing.T) hypervisor.Spec {
	img := testimage.Image(t, "minimal")
	return hypervisor.Spec{VCPUs: 1, MemoryMB: 256, Kernel: img.Kernel, Initrd: img.Initrd, Cmdline: img.Cmdline}
}

// TestConformance runs the suite on the driver in this process. make test
// runs it through the plugin only (TestConformancePlugin: the same driver,
// and the boundary besides); make reliability runs both.
func TestConformance(t *testing.T) {
	needQEMU(t)
	if os.Getenv("HAREBOX_TEST_IN_PROCESS") != "1" {
		t.Skip("the in-process run of the conformance suite repeats TestConformancePlugin's: set HAREBOX_TEST_IN_PROCESS=1 (make reliability does)")
	}
	hypervisortest.Run(t, hypervisortest.Harness{
		New: func(t *testing.T) hypervisor.Hypervisor {
			d, err := qemu.New(qemu.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return d
		},
		Spec: minimalSpec,
	})
}

// TestConformancePlugin runs the suite through the go-plugin boundary: every
// New starts a fresh plugin process, as a restarted engine would.
func TestConformancePlugin(t *testing.T) {
	needQEMU(t)
	bin := testimage.Binary(t, "harebox-plugin-qemu")
	hypervisortest.Run(t, hypervisortest.Harness{
		New: func(t *testing.T) hypervisor.Hypervisor {
			p, err := plugin.Launch(context.Background(), bin, nil, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			return p
		},
		Spec: minimalSpec,
	})
}
