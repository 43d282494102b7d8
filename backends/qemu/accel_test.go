package qemu

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/harebox/harebox/hypervisor"
)

func TestAccelChoice(t *testing.T) {
	cases := []struct {
		name    string
		modules []string
		devKVM  bool
		want    string
		notice  string
	}{
		{"intel", []string{"kvm", "kvm_intel"}, true, AccelKVM, ""},
		{"amd", []string{"kvm", "kvm_amd"}, true, AccelKVM, ""},
		{"pvm only", []string{"kvm", "kvm_pvm"}, true, AccelTCG, "PVM-only"},
		{"no module", []string{"kvm"}, true, AccelTCG, "no hardware KVM"},
		{"no /dev/kvm", []string{"kvm_intel"}, false, AccelTCG, "no usable /dev/kvm"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			for _, m := range c.modules {
				os.MkdirAll(filepath.Join(root, "sys/module", m), 0o755)
			}
			dev := filepath.Join(root, "kvm")
			if c.devKVM {
				os.WriteFile(dev, nil, 0o600)
			}
			got, notice := accelProbe{sysRoot: root, devKVM: dev}.choose()
			if got != c.want || !strings.Contains(notice, c.notice) || (c.notice == "") != (notice == "") {
				t.Fatalf("got %s %q, want %s with %q", got, notice, c.want, c.notice)
			}
			if strings.Contains(notice, "\n") {
				t.Fatalf("notice must be one line: %q", notice)
			}
		})
	}
}

func TestTSCHint(t *testing.T) {
	khz := hostTSCKHz()
	t.Logf("the host's TSC: %d kHz", khz)
	if khz < 100_000 || khz > 10_000_000 {
		t.Fatalf("measured TSC %d kHz: implausible", khz)
	}
	tsc := "tsc_early_khz=" + strconv.FormatInt(khz, 10)
	for _, c := range []struct {
		base, accel string
		aslr        bool
		want        string
	}{
		{"console=ttyS0", AccelTCG, false, "console=ttyS0 " + tsc + " tsc=reliable norandmaps"},
		{"console=ttyS0", AccelTCG, true, "console=ttyS0 " + tsc + " tsc=reliable"},
		{"console=ttyS0 tsc_early_khz=1 tsc=unstable norandmaps", AccelTCG, false, "console=ttyS0 tsc_early_khz=1 tsc=unstable norandmaps"},
		{"console=ttyS0", AccelKVM, false, "console=ttyS0"},
	} {
		if got := cmdline(c.base, c.accel, c.aslr); got != c.want {
			t.Errorf("cmdline(%q, %s, aslr %v) = %q, want %q", c.base, c.accel, c.aslr, got, c.want)
		}
	}
}

// TestTSCRestore: a guest that keeps time by its boot host's TSC rate is
// restored only where the TSC runs at that rate (within 0.5%).
func TestTSCRestore(t *testing.T) {
	host := hostTSCKHz()
	if got := guestTSCKHz(cmdline("console=ttyS0", AccelTCG, false)); got != host {
		t.Fatalf("the rate told the guest: %d, want the host's %d", got, host)
	}
	for _, c := range []struct {
		snap snapshot
		ok   bool
	}{
		{snapshot{Accel: AccelTCG, TSCKHz: host}, true},
		{snapshot{Accel: AccelTCG, TSCKHz: host + host/400}, true}, // 0.25%
		{snapshot{Accel: AccelTCG, TSCKHz: host + host/100}, false},
		{snapshot{Accel: AccelTCG, TSCKHz: host - host/10}, false},
		{snapshot{Accel: AccelTCG}, true},                   // (a snapshot from before the rate was kept)
		{snapshot{Accel: AccelKVM, TSCKHz: host * 2}, true}, // (KVM scales the TSC itself)
	} {
		err := tscMatches(&c.snap)
		if (err == nil) != c.ok || err != nil && !errors.Is(err, hypervisor.ErrUnsupported) {
			t.Errorf("restore of %+v here (%d kHz): %v", c.snap, host, err)
		}
	}
}
