package images

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// findKernel returns the kernel version and vmlinuz path: version want if
// set, else the newest BootDir/vmlinuz-<ver> whose ModulesDir/<ver> has a
// modules.dep.
func findKernel(bootDir, modulesDir, want string) (string, string, error) {
	ok := func(ver string) bool {
		if _, err := os.Stat(filepath.Join(bootDir, "vmlinuz-"+ver)); err != nil {
			return false
		}
		_, err := os.Stat(filepath.Join(modulesDir, ver, "modules.dep"))
		return err == nil
	}
	if want != "" {
		if !ok(want) {
			return "", "", fmt.Errorf("images: kernel %s: need %s and %s", want,
				filepath.Join(bootDir, "vmlinuz-"+want), filepath.Join(modulesDir, want, "modules.dep"))
		}
		return want, filepath.Join(bootDir, "vmlinuz-"+want), nil
	}
	matches, err := filepath.Glob(filepath.Join(bootDir, "vmlinuz-*"))
	if err != nil {
		return "", "", err
	}
	var vers []string
	for _, m := range matches {
		v := strings.TrimPrefix(filepath.Base(m), "vmlinuz-")
		if ok(v) {
			vers = append(vers, v)
		}
	}
	if len(vers) == 0 {
		return "", "", fmt.Errorf("images: no kernel in %s with modules in %s (apt-get install linux-image-amd64)", bootDir, modulesDir)
	}
	sort.Slice(vers, func(i, j int) bool { return versionLess(vers[i], vers[j]) })
	v := vers[len(vers)-1]
	return v, filepath.Join(bootDir, "vmlinuz-"+v), nil
}

// versionLess compares kernel versions piecewise: digit runs as numbers,
// everything else as strings ("6.1.0-9" < "6.1.0-10").
func versionLess(a, b string) bool {
	pa, pb := versionParts(a), versionParts(b)
	for i := 0; i < len(pa) && i < len(pb); i++ {
		x, y := pa[i], pb[i]
		nx, ex := strconv.Atoi(x)
		ny, ey := strconv.Atoi(y)
		switch {
		case ex == nil && ey == nil:
			if nx != ny {
				return nx < ny
			}
		case x != y:
			return x < y
		}
	}
	return len(pa) < len(pb)
}

func versionParts(s string) []string {
	var parts []string
	cur := ""
	digit := false
	for i, r := range s {
		d := r >= '0' && r <= '9'
		if i > 0 && d != digit {
			parts = append(parts, cur)
			cur = ""
		}
		cur += string(r)
		digit = d
	}
	return append(parts, cur)
}

// module is one loadable kernel module.
type module struct {
	name     string // normalized: '-' → '_'
	rel      string // path relative to /lib/modules/<ver>, e.g. kernel/fs/ext4/ext4.ko
	hostPath string
}

// moduleSets are the modules loaded at boot and those loaded on demand
// (without any the boot set has).
type moduleSets struct{ boot, onDemand []module }

// resolveModuleSets resolves boot and onDemand as resolveModules does,
// then leaves out of the on-demand set what the boot set loads.
func resolveModuleSets(kdir string, boot, onDemand []string) (moduleSets, error) {
	b, err := resolveModules(kdir, boot)
	if err != nil {
		return moduleSets{}, err
	}
	d, err := resolveModules(kdir, onDemand)
	if err != nil {
		return moduleSets{}, err
	}
	have := map[string]bool{}
	for _, m := range b {
		have[m.rel] = true
	}
	sets := moduleSets{boot: b}
	for _, m := range d {
		if !have[m.rel] {
			sets.onDemand = append(sets.onDemand, m)
		}
	}
	return sets, nil
}

// guestPath is the module's absolute path in the initramfs.
func (m module) guestPath(kver string) string {
	return path.Join("/lib/modules", kver, m.rel)
}

// moduleName turns "kernel/drivers/char/hw_random/virtio-rng.ko.xz" into
// "virtio_rng".
func moduleName(p string) string {
	b := path.Base(p)
	if i := strings.Index(b, ".ko"); i >= 0 {
		b = b[:i]
	}
	return strings.ReplaceAll(b, "-", "_")
}

// resolveModules returns the modules named (and their dependencies, from
// modules.dep) in load order: every module after all of its dependencies.
// A module listed in modules.builtin is skipped without error.
func resolveModules(kdir string, names []string) ([]module, error) {
	deps, rels, err := readModulesDep(filepath.Join(kdir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	builtin := map[string]bool{}
	if f, err := os.Open(filepath.Join(kdir, "modules.builtin")); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if l := strings.TrimSpace(sc.Text()); l != "" {
				builtin[moduleName(l)] = true
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}

	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var out []module
	var visit func(name string, chain []string) error
	visit = func(name string, chain []string) error {
		switch state[name] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("images: module dependency cycle: %s", strings.Join(append(chain, name), " -> "))
		}
		rel, ok := rels[name]
		if !ok {
			return fmt.Errorf("images: module %s not in %s/modules.dep", name, kdir)
		}
		state[name] = visiting
		for _, d := range deps[name] {
			if err := visit(d, append(chain, name)); err != nil {
				return err
			}
		}
		state[name] = done
		hp := filepath.Join(kdir, filepath.FromSlash(rel))
		if _, err := os.Stat(hp); err != nil {
			return fmt.Errorf("images: module %s: %w", name, err)
		}
		out = append(out, module{name: name, rel: rel, hostPath: hp})
		return nil
	}
	for _, n := range names {
		n = moduleName(n)
		if _, ok := rels[n]; !ok && builtin[n] {
			continue
		}
		if err := visit(n, nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readModulesDep parses modules.dep: "rel/path.ko: dep1.ko dep2.ko".
func readModulesDep(p string) (deps map[string][]string, rels map[string]string, err error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, nil, fmt.Errorf("images: %w (is the kernel's modules directory complete?)", err)
	}
	defer f.Close()
	deps = map[string][]string{}
	rels = map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.IndexByte(line, ':')
		if i < 0 {
			continue
		}
		rel := strings.TrimSpace(line[:i])
		if rel == "" || strings.Contains(rel, "..") || path.IsAbs(rel) {
			continue
		}
		name := moduleName(rel)
		rels[name] = rel
		for _, d := range strings.Fields(line[i+1:]) {
			deps[name] = append(deps[name], moduleName(d))
		}
	}
	return deps, rels, sc.Err()
}
