package cloudhypervisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseVersion(t *testing.T) {
	cases := map[string]Version{
		"cloud-hypervisor v53.0":                   {53, 0, 0},
		"cloud-hypervisor v52.1-12-gdeadbeef":      {52, 1, 0},
		"cloud-hypervisor v41.0.3-dirty\n":         {41, 0, 3},
		"cloud-hypervisor 48.0":                    {48, 0, 0},
		"cloud-hypervisor v0.14.1 (some build id)": {0, 14, 1},
	}
	for in, want := range cases {
		got, err := ParseVersion(in)
		if err != nil || got != want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseVersion("cloud-hypervisor unknown"); err == nil {
		t.Error("ParseVersion accepted no version")
	}
	if !(Version{50, 9, 9}).Less(MinVersion) || (Version{51, 0, 0}).Less(MinVersion) || !(Version{40, 0, 0}).Less(LandlockVersion) {
		t.Error("Version.Less is wrong")
	}
}

// fakeHost lays out /dev/kvm, /sys/module and /proc/modules stand-ins.
func fakeHost(t *testing.T, kvm bool, sysMods []string, procModules string) hostPaths {
	dir := shortTempDir(t)
	hp := hostPaths{
		devKVM:      filepath.Join(dir, "kvm"),
		sysModule:   filepath.Join(dir, "module"),
		procModules: filepath.Join(dir, "modules"),
		lsm:         filepath.Join(dir, "lsm"),
	}
	if kvm {
		os.WriteFile(hp.devKVM, nil, 0o600)
	}
	for _, m := range sysMods {
		os.MkdirAll(filepath.Join(hp.sysModule, m), 0o700)
	}
	if procModules != "" {
		os.WriteFile(hp.procModules, []byte(procModules), 0o600)
	}
	os.WriteFile(hp.lsm, []byte("lockdown,capability,landlock,yama"), 0o600)
	return hp
}

func TestProbe(t *testing.T) {
	b := stubBackend(t) // the stub answers --version
	cfg := b.cfg
	ctx := testCtx(t)

	r := probe(ctx, cfg, fakeHost(t, true, []string{"kvm", "kvm_intel"}, ""))
	if !r.Usable || r.Reason != "" || r.Version != "v53.0.0" || r.Binary != cfg.Binary || !r.Landlock {
		t.Fatalf("hardware KVM: %+v", r)
	}
	r = probe(ctx, cfg, fakeHost(t, true, nil, "kvm_amd 200704 0 - Live 0x0\nkvm 1388544 1 kvm_amd, Live 0x0\n"))
	if !r.Usable {
		t.Fatalf("kvm_amd in /proc/modules: %+v", r)
	}
	r = probe(ctx, cfg, fakeHost(t, true, []string{"kvm", "kvm_pvm"}, ""))
	if r.Usable || !strings.Contains(r.Reason, "PVM-only") {
		t.Fatalf("PVM-only KVM: %+v", r)
	}
	r = probe(ctx, cfg, fakeHost(t, true, nil, "kvm_pvm 4096 0 - Live 0x0\n"))
	if r.Usable || !strings.Contains(r.Reason, "PVM-only") {
		t.Fatalf("PVM-only KVM from /proc/modules: %+v", r)
	}
	r = probe(ctx, cfg, fakeHost(t, false, nil, ""))
	if r.Usable || !strings.Contains(r.Reason, "no ") || !strings.Contains(r.Reason, "kvm") {
		t.Fatalf("no /dev/kvm: %+v", r)
	}

	noLandlock := cfg
	noLandlock.DisableLandlock = true
	if r := probe(ctx, noLandlock, fakeHost(t, true, []string{"kvm_intel"}, "")); !r.Usable || r.Landlock {
		t.Fatalf("DisableLandlock: %+v", r)
	}

	t.Setenv(stubVersionEnv, "v50.1")
	r = probe(ctx, cfg, fakeHost(t, true, []string{"kvm_intel"}, ""))
	if r.Usable || !strings.Contains(r.Reason, "older than the minimum v51.0.0") {
		t.Fatalf("old binary: %+v", r)
	}

	missing := Config{Binary: filepath.Join(shortTempDir(t), "cloud-hypervisor")}
	r = probe(ctx, missing, fakeHost(t, true, []string{"kvm_pvm"}, ""))
	if r.Usable || !strings.Contains(r.Reason, "not found") || !strings.Contains(r.Reason, "PVM-only") || strings.Contains(r.Reason, "\n") {
		t.Fatalf("no binary on a PVM host: %+v", r)
	}
}
