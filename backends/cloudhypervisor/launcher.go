package cloudhypervisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/harebox/harebox/hypervisor"
)

// DefaultBinary is looked up on PATH when Config.Binary is empty.
const DefaultBinary = "cloud-hypervisor"

// MinVersion is the oldest Cloud Hypervisor this backend drives: v51 is the
// first release that opens qcow2 overlays on raw backing files and has the
// disk fields backing_files and image_type we send.
var MinVersion = Version{Major: 51}

// LandlockVersion is the first release with Landlock sandboxing.
var LandlockVersion = Version{Major: 41}

// Version is a Cloud Hypervisor release number.
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("v%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Less reports whether v is older than w.
func (v Version) Less(w Version) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	return v.Patch < w.Patch
}

var versionRE = regexp.MustCompile(`\bv?(\d+)\.(\d+)(?:\.(\d+))?`)

// ParseVersion reads the output of `cloud-hypervisor --version`, for
// example "cloud-hypervisor v53.0" or "cloud-hypervisor v52.1-12-gdeadbeef".
func ParseVersion(out string) (Version, error) {
	m := versionRE.FindStringSubmatch(out)
	if m == nil {
		return Version{}, fmt.Errorf("no version number in %q", firstLine(out))
	}
	var v Version
	v.Major, _ = strconv.Atoi(m[1])
	v.Minor, _ = strconv.Atoi(m[2])
	if m[3] != "" {
		v.Patch, _ = strconv.Atoi(m[3])
	}
	return v, nil
}

// resolveBinary finds the VMM binary: a path is used as is, a bare name is
// looked up on PATH.
func resolveBinary(name string) (string, error) {
	if name == "" {
		name = DefaultBinary
	}
	p, err := exec.LookPath(name)
	if err != nil {
		if !strings.Contains(name, "/") {
			return "", hypervisor.Errorf(hypervisor.ErrUnavailable, "no %s binary on PATH", name)
		}
		return "", hypervisor.Errorf(hypervisor.ErrUnavailable, "cloud-hypervisor binary %s not found or not executable", name)
	}
	return p, nil
}

// binaryVersion runs `bin --version`.
func binaryVersion(ctx context.Context, bin string) (Version, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "--version")
	cmd.Stdout = &limitedBuffer{buf: &out, max: 4096}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		return Version{}, hypervisor.Errorf(hypervisor.ErrUnavailable, "%s --version: %v: %s", bin, err, firstLine(out.String()))
	}
	v, err := ParseVersion(out.String())
	if err != nil {
		return Version{}, hypervisor.Errorf(hypervisor.ErrUnavailable, "%s --version: %v", bin, err)
	}
	return v, nil
}

// vmmArgs are the VMM's command-line arguments. The VM itself is described
// over the API; Landlock is requested there too (VmConfig.landlock_enable),
// because the --landlock flag belongs to the CLI's VM-config group and is
// only accepted together with --kernel.
func vmmArgs(apiSocket string) []string {
	return []string{"--api-socket", "path=" + apiSocket, "--seccomp", "true"}
}

// vmmProcess is a started VMM.
type vmmProcess struct {
	pid   int
	pidfd *pidFD
}

// startVMM starts the VMM detached in its own session, so it survives the
// engine, with stdout and stderr appended to logPath.
func startVMM(bin, apiSocket, logPath string) (*vmmProcess, error) {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open VMM log: %w", err)
	}
	defer logf.Close()

	cmd := exec.Command(bin, vmmArgs(apiSocket)...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, hypervisor.Errorf(hypervisor.ErrUnavailable, "start %s: %v", bin, err)
	}
	pid := cmd.Process.Pid
	// Open the pidfd before anything can reap the child, so it names this
	// process even after the pid is reused.
	fd, err := openPidFD(pid)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	// Reap our child when it exits; after an engine restart the VMM is
	// re-parented and reaped by init instead.
	go cmd.Wait()
	return &vmmProcess{pid: pid, pidfd: fd}, nil
}

// waitReady polls vmm.ping until the VMM answers, the process exits, or
// ctx is done.
func waitReady(ctx context.Context, api API, p *pidFD) (VmmPingResponse, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 5 * time.Millisecond
	b.MaxInterval = 200 * time.Millisecond
	b.MaxElapsedTime = 0 // ctx bounds the wait
	var ping VmmPingResponse
	op := func() error {
		if p != nil && p.exited() {
			return backoff.Permanent(errors.New("VMM exited before its API socket answered"))
		}
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		r, err := api.Ping(tctx)
		if err != nil {
			return err
		}
		ping = r
		return nil
	}
	if err := backoff.Retry(op, backoff.WithContext(b, ctx)); err != nil {
		if ctx.Err() != nil {
			return ping, fmt.Errorf("VMM API not ready: %w (last: %w)", ctx.Err(), err)
		}
		return ping, err
	}
	return ping, nil
}

// logTail returns the last lines of a log, for error messages.
func logTail(path string, max int) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return strings.TrimSpace(cleanMessage(b))
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	buf *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.buf.Len(); room > 0 {
		l.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
