// Package mounts removes a directory that may have something mounted in
// it: what an interrupted debootstrap left (/proc, /sys, a bound /dev), or
// a backend's staging tmpfs in a dead machine's directory. Removing
// through a bind mount would damage the host, and RemoveAll can neither
// remove a mount point nor free what a tmpfs holds.
package mounts

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// RemoveAll removes dir, first detaching everything mounted at or below
// it, deepest first. If a mount cannot be detached it removes nothing and
// says so.
func RemoveAll(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(abs); os.IsNotExist(err) {
		return nil
	}
	mounts, err := Under(abs)
	if err != nil {
		return err
	}
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && err != syscall.EINVAL && err != syscall.ENOENT {
			return fmt.Errorf("unmount %s: %w; not removing %s", m, err, abs)
		}
	}
	if left, err := Under(abs); err != nil {
		return err
	} else if len(left) > 0 {
		return fmt.Errorf("still mounted under %s: %v; not removing it", abs, left)
	}
	return os.RemoveAll(abs)
}

// Under lists the mount points at or below dir (an absolute path).
func Under(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescape(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out, sc.Err()
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
