// Package procs finds host processes by a path on their command line: the
// VMMs of a machine directory, whoever launched them (a VMM outlives the
// engine that started it, so it is found by what it names, not by parentage).
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

func (p Proc) String() string { return strconv.Itoa(p.PID) + ": " + p.Cmdline }

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
		exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		out = append(out, Proc{PID: pid, Cmdline: string(bytes.TrimSpace(bytes.ReplaceAll(b, []byte{0}, []byte{' '}))), Exe: exe})
	}
	return out
}
