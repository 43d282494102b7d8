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

// IsVMM reports whether p runs a virtual machine monitor.
func (p Proc) IsVMM() bool {
	base := filepath.Base(p.Exe)
	return strings.HasPrefix(base, "qemu-system") || base == "cloud-hypervisor"
}

// IsPlugin reports whether p runs a HareBox hypervisor plugin.
func (p Proc) IsPlugin() bool {
	return strings.HasPrefix(filepath.Base(p.Exe), "harebox-plugin-")
}

func (p Proc) String() string { return strconv.Itoa(p.PID) + ": " + p.Cmdline }

// WithEnv lists the processes, other than this one, whose environment has
// the entry kv ("KEY=VALUE") exactly.
func WithEnv(kv string) []Proc {
	ents, _ := os.ReadDir("/proc")
	var out []Proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		for _, v := range bytes.Split(env, []byte{0}) {
			if string(v) == kv {
				out = append(out, proc(pid, e.Name()))
				break
			}
		}
	}
	return out
}

func proc(pid int, dir string) Proc {
	b, _ := os.ReadFile(filepath.Join("/proc", dir, "cmdline"))
	exe, _ := os.Readlink(filepath.Join("/proc", dir, "exe"))
	return Proc{PID: pid, Cmdline: string(bytes.TrimSpace(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))), Exe: exe}
}

// Naming lists the processes, other than this one, whose command line
// contains s.
func Naming(s string) []Proc {
	ents, _ := os.ReadDir("/proc")
	var out []Proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(b, []byte(s)) {
			continue
		}
		out = append(out, proc(pid, e.Name()))
	}
	return out
}
