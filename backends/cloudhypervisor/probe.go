package cloudhypervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ProbeResult says whether this backend can run on this host.
type ProbeResult struct {
	// Usable is true when every check passed.
	Usable bool `json:"usable"`
	// Reason explains, in one line, why the backend cannot run here.
	Reason  string `json:"reason,omitempty"`
	Binary  string `json:"binary,omitempty"`
	Version string `json:"version,omitempty"`
	// Landlock is true when the VMM will sandbox itself with Landlock.
	Landlock bool `json:"landlock"`
}

// hostPaths are the host files the probe reads; tests point them at fakes.
type hostPaths struct {
	devKVM      string
	sysModule   string
	procModules string
	lsm         string
}

var defaultHostPaths = hostPaths{
	devKVM:      "/dev/kvm",
	sysModule:   "/sys/module",
	procModules: "/proc/modules",
	lsm:         "/sys/kernel/security/lsm",
}

// Probe checks, for "doctor", that Cloud Hypervisor can run here: a binary
// (cfg.Binary or cloud-hypervisor on PATH) of at least MinVersion, and a
// usable /dev/kvm backed by hardware virtualisation (kvm_intel or kvm_amd),
// not PVM-only KVM, under which stock guest kernels hang.
func Probe(ctx context.Context, cfg Config) ProbeResult {
	return probe(ctx, cfg, defaultHostPaths)
}

func probe(ctx context.Context, cfg Config, hp hostPaths) ProbeResult {
	var r ProbeResult
	var why []string
	bin, err := resolveBinary(cfg.Binary)
	if err != nil {
		why = append(why, err.Error())
	} else {
		r.Binary = bin
		v, err := binaryVersion(ctx, bin)
		switch {
		case err != nil:
			why = append(why, err.Error())
		case v.Less(MinVersion):
			r.Version = v.String()
			why = append(why, fmt.Sprintf("cloud-hypervisor %s is older than the minimum %s", v, MinVersion))
		default:
			r.Version = v.String()
			r.Landlock = !cfg.DisableLandlock && !v.Less(LandlockVersion) && landlockEnabled(hp)
		}
	}
	if err := checkKVM(hp); err != nil {
		why = append(why, err.Error())
	}
	r.Usable = len(why) == 0
	r.Reason = strings.Join(why, "; ")
	return r
}

// checkKVM requires /dev/kvm to open read-write and to come from a
// hardware KVM module.
func checkKVM(hp hostPaths) error {
	f, err := os.OpenFile(hp.devKVM, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("no %s (KVM is not available on this host)", hp.devKVM)
		}
		return fmt.Errorf("cannot open %s: %w", hp.devKVM, err)
	}
	f.Close()
	mods := loadedModules(hp)
	hw := mods["kvm_intel"] || mods["kvm_amd"]
	if mods["kvm_pvm"] && !hw {
		return fmt.Errorf("%s is PVM-only (kvm_pvm loaded, no kvm_intel or kvm_amd): Cloud Hypervisor needs hardware KVM", hp.devKVM)
	}
	return nil
}

// loadedModules lists KVM modules from /sys/module (built-in modules with
// parameters show there too) and /proc/modules.
func loadedModules(hp hostPaths) map[string]bool {
	m := map[string]bool{}
	for _, name := range []string{"kvm_intel", "kvm_amd", "kvm_pvm"} {
		if _, err := os.Stat(filepath.Join(hp.sysModule, name)); err == nil {
			m[name] = true
		}
	}
	if b, err := os.ReadFile(hp.procModules); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if name, _, _ := strings.Cut(line, " "); strings.HasPrefix(name, "kvm_") {
				m[name] = true
			}
		}
	}
	return m
}

// landlockEnabled reports whether the kernel runs the Landlock LSM.
func landlockEnabled(hp hostPaths) bool {
	b, err := os.ReadFile(hp.lsm)
	if err != nil {
		return false
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), ",") {
		if l == "landlock" {
			return true
		}
	}
	return false
}
