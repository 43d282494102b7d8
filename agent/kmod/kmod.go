// Package kmod loads the guest's kernel modules from the lists the image
// builder writes (layout.ModulesLoad, layout.ModulesOnDemand): the
// initramfs init loads the boot list, and the agent the on-demand list
// when a feature first needs it.
package kmod

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ParseList reads a modules list: one module path per line, blank lines
// and "#" comments skipped, order kept (dependencies first).
func ParseList(r io.Reader) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read modules list: %w", err)
	}
	return out, nil
}

// readList reads the list at path.
func readList(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseList(f)
}

// ErrNoList: there is no list at the path given.
var ErrNoList = errors.New("no modules list")

// LoadList loads each module the list at path names, in order, going on
// past failures. loaded counts those loaded (or already there); err joins
// every failure, and is ErrNoList if there is no list.
func LoadList(path string) (loaded, total int, err error) {
	paths, err := readList(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, 0, fmt.Errorf("%w at %s", ErrNoList, path)
	}
	if err != nil {
		return 0, 0, err
	}
	var errs []error
	for _, p := range paths {
		if err := Load(p); err != nil {
			errs = append(errs, fmt.Errorf("module %s: %w", p, err))
			continue
		}
		loaded++
	}
	return loaded, len(paths), errors.Join(errs...)
}

// Load loads one module; one already loaded counts as success. A relative
// path is under the running kernel's /lib/modules directory.
func Load(path string) error {
	if !filepath.IsAbs(path) {
		var u unix.Utsname
		unix.Uname(&u)
		path = filepath.Join("/lib/modules", unix.ByteSliceToString(u.Release[:]), path)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	flags := 0
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		if strings.HasSuffix(path, ext) {
			// The kernel decompresses (CONFIG_MODULE_DECOMPRESS).
			flags = unix.MODULE_INIT_COMPRESSED_FILE
		}
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var loadErr error
	if err := rc.Control(func(fd uintptr) { loadErr = unix.FinitModule(int(fd), "", flags) }); err != nil {
		return err
	}
	if errors.Is(loadErr, unix.EEXIST) {
		return nil
	}
	if loadErr != nil {
		return fmt.Errorf("finit_module: %w", loadErr)
	}
	return nil
}

// Stage copies the modules the list at path names into dir and writes a
// list of the copies to out, for after the files of the list are gone
// (the initramfs, freed when the init switches to the root disk; dir and
// out are then on /run, which moves with it). No list: nothing to do.
func Stage(path, dir, out string) error {
	paths, err := readList(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var list strings.Builder
	for i, p := range paths {
		// (Numbered: two modules of one base name in different
		// directories stay two files.)
		dst := filepath.Join(dir, fmt.Sprintf("%02d-%s", i, filepath.Base(p)))
		if err := copyFile(p, dst); err != nil {
			return err
		}
		list.WriteString(dst + "\n")
	}
	return os.WriteFile(out, []byte(list.String()), 0o600)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	o, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(o, in); err != nil {
		o.Close()
		return err
	}
	return o.Close()
}
