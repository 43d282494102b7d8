// Package procs finds host processes by a path on their command line (the
// VMMs of a machine directory, whoever launched them: a VMM outlives the
// engine that started it, so it is found by what it names, not by
// parentage) or by an entry of their environment (the hypervisor plugins
// of a data directory).
package procs

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Proc is one process.
type Proc struct {
	PID     int
	Cmdline string // arguments joined by spaces
	Exe     string // the executable's path, if readable
}

// IsVMM reports whether p runs a virtual machine monitor, or the storage
// daemon that serves one's encrypted disks (both hold a machine's data
// and outlive the engine).
func (p Proc) IsVMM() bool {
	base := filepath.Base(p.Exe)
	return strings.HasPrefix(base, "qemu-system") || base == "cloud-hypervisor" || base == "qemu-storage-daemon"
}

// IsPlugin reports whether p runs a HareBox hypervisor plugin.
func (p Proc) IsPlugin() bool {
	return strings.HasPrefix(filepath.Base(p.Exe), "harebox-plugin-")
}

func (p Proc) String() string { return strconv.Itoa(p.PID) + ": " + p.Cmdline }

// Naming lists the processes, other than this one, whose command line
// contains s.
func Naming(s string) []Proc {
	return scan(func(dir string) bool {
		b, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		return err == nil && bytes.Contains(b, []byte(s))
	})
}

// WithEnv lists the processes, other than this one, whose environment has
// the entry kv ("KEY=VALUE") exactly.
func WithEnv(kv string) []Proc {
	return scan(func(dir string) bool {
		env, err := os.ReadFile(filepath.Join(dir, "environ"))
		if err != nil {
			return false
		}
		for _, v := range bytes.Split(env, []byte{0}) {
			if string(v) == kv {
				return true
			}
		}
		return false
	})
}

// scan lists the processes, other than this one, whose /proc directory
// match accepts.
func scan(match func(dir string) bool) []Proc {
	ents, _ := os.ReadDir("/proc")
	var out []Proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		dir := filepath.Join("/proc", e.Name())
		if err != nil || pid == os.Getpid() || !match(dir) {
			continue
		}
		b, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
		exe, _ := os.Readlink(filepath.Join(dir, "exe"))
		out = append(out, Proc{PID: pid, Cmdline: string(bytes.TrimSpace(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))), Exe: exe})
	}
	return out
}
