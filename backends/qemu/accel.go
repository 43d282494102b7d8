package qemu

import (
	"os"
	"path/filepath"
)

// Accelerator choice.
const (
	AccelAuto = "auto"
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

// accelProbe is what the choice depends on; sysRoot lets tests point it at
// a fake /sys tree.
type accelProbe struct {
	sysRoot string // "/" in production
	devKVM  string // "/dev/kvm"
}

// choose picks the accelerator for "auto": KVM only where a hardware KVM
// module (kvm_intel, kvm_amd) runs, because a PVM-only /dev/kvm (kvm_pvm)
// hangs a stock guest kernel. The notice explains a fallback in one line.
func (p accelProbe) choose() (accel, notice string) {
	f, err := os.OpenFile(p.devKVM, os.O_RDWR, 0)
	if err != nil {
		return AccelTCG, "no usable /dev/kvm (" + err.Error() + "): using TCG software emulation"
	}
	f.Close()
	has := func(mod string) bool {
		_, err := os.Stat(filepath.Join(p.sysRoot, "sys/module", mod))
		return err == nil
	}
	switch {
	case has("kvm_intel"), has("kvm_amd"):
		return AccelKVM, ""
	case has("kvm_pvm"):
		return AccelTCG, "/dev/kvm is PVM-only (kvm_pvm), which hangs a stock guest kernel: using TCG software emulation"
	default:
		return AccelTCG, "/dev/kvm has no hardware KVM module (kvm_intel/kvm_amd): using TCG software emulation"
	}
}
