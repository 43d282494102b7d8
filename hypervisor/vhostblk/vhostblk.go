// Package vhostblk serves a machine's disks to its VMM as vhost-user-blk
// sockets from qemu-storage-daemon, for VMMs that cannot open an
// encrypted qcow2 overlay themselves (Cloud Hypervisor): the daemon opens
// the overlay with the machine's key and the VMM sees a plain block
// device. The disks' keys reach the daemon through inherited pipes
// (overlay Secrets), never argv, the environment or a file; a snapshot's
// key reaches it over its QMP socket (0700 directory) for one copy only.
//
// The daemon outlives the process that started it, like the VMM it serves:
// Find re-attaches to it by its directory after a restart. Its QMP monitor
// (a socket in the same directory) lets Backup copy a disk's writes under
// another key, for a snapshot.
package vhostblk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/overlay"
	"github.com/harebox/harebox/hypervisor/qmp"
	"github.com/harebox/harebox/internal/procs"
)

// Disk is one disk to serve.
type Disk struct {
	// Path is the image the guest reads and writes; Format is "qcow2" or
	// "raw".
	Path   string
	Format string
	// Encrypted: Path is a LUKS-encrypted qcow2, opened with
	// Options.DataKey.
	Encrypted bool
	// Backing is Path's backing file (a qcow2 overlay's base), opened
	// read-only, in BackingFormat; BackingEncrypted: it is an encrypted
	// qcow2 opened with Options.BackingKey (a snapshot's disk).
	Backing          string
	BackingFormat    string
	BackingEncrypted bool
	// BackingBase, in BackingBaseFormat, is Backing's own backing file,
	// named here rather than taken from Backing's header (an encrypted
	// qcow2's header is not covered by its key).
	BackingBase       string
	BackingBaseFormat string
	ReadOnly          bool
}

// Options says what one daemon serves.
type Options struct {
	// Binary is qemu-storage-daemon's path (default: on PATH).
	Binary string
	// Dir holds the daemon's pid file and sockets; it is created (0700).
	// A socket path must fit in 107 bytes, so keep it short.
	Dir   string
	Disks []Disk
	// DataKey opens the encrypted disks, BackingKey their encrypted
	// backing files.
	DataKey, BackingKey []byte
}

// Server is a running qemu-storage-daemon.
type Server struct {
	PID int
	Dir string
	// Sockets are the vhost-user-blk sockets, one per disk, in order.
	Sockets []string
}

const (
	pidFile      = "qsd.pid"
	qmpSocket    = "qmp.sock"
	secretData   = "sec-data"
	secretBackup = "sec-backing"
	// maxSocketPath is sun_path's size less the terminating NUL.
	maxSocketPath = 107
)

// Start starts a daemon serving o.Disks and returns once every socket
// accepts a VMM: qemu-storage-daemon --daemonize exits only then.
func Start(ctx context.Context, o Options) (*Server, error) {
	if len(o.Disks) == 0 {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: no disks")
	}
	bin := o.Binary
	if bin == "" {
		bin = "qemu-storage-daemon"
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("vhostblk: %w", err)
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	if s, err := Find(dir); err == nil {
		return nil, hypervisor.Errorf(hypervisor.ErrExists, "vhostblk: a daemon (pid %d) already serves %s", s.PID, dir)
	}
	var sec overlay.Secrets
	defer sec.Close()
	needData, needBacking := false, false
	for _, d := range o.Disks {
		needData = needData || d.Encrypted
		needBacking = needBacking || d.BackingEncrypted
	}
	if needData {
		if len(o.DataKey) != hypervisor.KeySize {
			return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: encrypted disks need a %d-byte data key", hypervisor.KeySize)
		}
		if err := sec.Add(secretData, o.DataKey); err != nil {
			return nil, err
		}
	}
	if needBacking {
		if len(o.BackingKey) != hypervisor.KeySize {
			return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: encrypted backing files need a %d-byte key", hypervisor.KeySize)
		}
		if err := sec.Add(secretBackup, o.BackingKey); err != nil {
			return nil, err
		}
	}
	s := &Server{Dir: dir}
	monitor := filepath.Join(dir, qmpSocket)
	if len(monitor) > maxSocketPath {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: socket path %s is longer than %d bytes", monitor, maxSocketPath)
	}
	os.Remove(monitor)
	args := []string{"--daemonize", "--pidfile", filepath.Join(dir, pidFile),
		// (A comma in the key=value form is written twice.)
		"--chardev", "socket,id=qmp,server=on,wait=off,path=" + strings.ReplaceAll(monitor, ",", ",,"),
		"--monitor", "chardev=qmp"}
	args = append(args, sec.Args()...)
	for i, d := range o.Disks {
		sock := filepath.Join(dir, fmt.Sprintf("disk%d.sock", i))
		if len(sock) > maxSocketPath {
			return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: socket path %s is longer than %d bytes", sock, maxSocketPath)
		}
		os.Remove(sock) // (a stale one from a daemon that died)
		node, err := blockdev(d, fmt.Sprintf("disk%d", i))
		if err != nil {
			return nil, err
		}
		export, _ := json.Marshal(map[string]any{
			"type": "vhost-user-blk", "id": fmt.Sprintf("exp%d", i), "node-name": fmt.Sprintf("disk%d", i),
			"addr":     map[string]any{"type": "unix", "path": sock},
			"writable": !d.ReadOnly,
		})
		args = append(args, "--blockdev", node, "--export", string(export))
		s.Sockets = append(s.Sockets, sock)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	sec.Apply(cmd)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// (A daemon that hangs before it is ready holds the output open.)
	cmd.WaitDelay = 5 * time.Second
	// (Its own session: a signal to the starter's group does not reach it.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return nil, hypervisor.Errorf(hypervisor.ErrUnavailable, "vhostblk: %s not found (Debian: apt-get install qemu-system-common)", bin)
		}
		// A daemon whose starter was killed (the timeout) may still
		// come up: it is stopped, not left holding the key.
		for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if s, ferr := Find(dir); ferr == nil {
				s.Stop(context.Background())
				break
			}
		}
		// (A daemon that failed on a disk has made its monitor's socket.)
		os.Remove(monitor)
		for _, sock := range s.Sockets {
			os.Remove(sock)
		}
		return nil, fmt.Errorf("vhostblk: %s: %w: %s", bin, err, lastLine(out.String()))
	}
	found, err := Find(dir)
	if err != nil {
		return nil, fmt.Errorf("vhostblk: the daemon started but %w", err)
	}
	s.PID = found.PID
	return s, nil
}

// blockdev is the daemon's --blockdev for d, in JSON (a path may hold a
// comma, which the key=value form would split on).
func blockdev(d Disk, node string) (string, error) {
	file := func(path string, ro bool) map[string]any {
		return map[string]any{"driver": "file", "filename": path, "read-only": ro}
	}
	format := func(f string) (string, error) {
		switch f {
		case "", "raw":
			return "raw", nil
		case "qcow2":
			return "qcow2", nil
		}
		return "", hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: format %q: want raw or qcow2", f)
	}
	f, err := format(d.Format)
	if err != nil {
		return "", err
	}
	n := map[string]any{"driver": f, "node-name": node, "file": file(d.Path, d.ReadOnly), "read-only": d.ReadOnly}
	if d.Encrypted {
		if f != "qcow2" {
			return "", hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: %s: only a qcow2 can be encrypted", d.Path)
		}
		n["encrypt"] = map[string]any{"format": "luks", "key-secret": secretData}
	}
	if d.Backing != "" {
		if f != "qcow2" {
			return "", hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: %s: only a qcow2 has a backing file", d.Path)
		}
		bf, err := format(d.BackingFormat)
		if err != nil {
			return "", err
		}
		b := map[string]any{"driver": bf, "file": file(d.Backing, true), "read-only": true}
		if d.BackingEncrypted {
			if bf != "qcow2" {
				return "", hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: %s: only a qcow2 can be encrypted", d.Backing)
			}
			b["encrypt"] = map[string]any{"format": "luks", "key-secret": secretBackup}
		}
		if d.BackingBase != "" {
			if bf != "qcow2" {
				return "", hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: %s: only a qcow2 has a backing file", d.Backing)
			}
			bbf, err := format(d.BackingBaseFormat)
			if err != nil {
				return "", err
			}
			b["backing"] = map[string]any{"driver": bbf, "file": file(d.BackingBase, true), "read-only": true}
		}
		n["backing"] = b
	} else if d.BackingEncrypted {
		return "", hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: %s: an encrypted backing file needs Backing", d.Path)
	}
	j, err := json.Marshal(n)
	return string(j), err
}

// ErrNotRunning is Find's answer when no daemon serves the directory.
var ErrNotRunning = errors.New("no qemu-storage-daemon serves this directory")

// Find returns the daemon serving dir (its pid file names it, and that
// process is a qemu-storage-daemon whose pid file is there: a recycled
// pid is not taken for it), or ErrNotRunning.
func Find(dir string) (*Server, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotRunning, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return nil, fmt.Errorf("%w: bad pid file", ErrNotRunning)
	}
	if !serves(pid, dir) {
		return nil, fmt.Errorf("%w: pid %d is not its daemon", ErrNotRunning, pid)
	}
	s := &Server{PID: pid, Dir: dir}
	socks, _ := filepath.Glob(filepath.Join(dir, "disk*.sock"))
	for i := range socks {
		s.Sockets = append(s.Sockets, filepath.Join(dir, fmt.Sprintf("disk%d.sock", i)))
	}
	return s, nil
}

// serves reports whether pid is a live (not zombie) process with dir's
// pid file on its command line: the daemon, whatever its binary is
// called.
func serves(pid int, dir string) bool {
	if st, err := procs.ReadStat(pid); err != nil || st.Exited() {
		return false
	}
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	argv := strings.Split(string(cmd), "\x00")
	for i, a := range argv {
		if a == "--pidfile" && i+1 < len(argv) && argv[i+1] == filepath.Join(dir, pidFile) {
			return true
		}
	}
	return false
}

// Stop ends the daemon: SIGTERM (it flushes its images and exits), then
// SIGKILL after 10 s or when ctx ends; it returns once the process is
// gone (a zombie has closed its files) and its sockets and pid file are
// removed. Stopping a daemon that is gone is not an error.
func (s *Server) Stop(ctx context.Context) error {
	// A pidfd taken before the check: the signals reach this process
	// even if the pid is recycled after it (and a recycled pid that is
	// not this directory's daemon is left alone).
	fd, err := unix.PidfdOpen(s.PID, 0)
	if err == nil {
		defer unix.Close(fd)
		if serves(s.PID, s.Dir) {
			unix.PidfdSendSignal(fd, unix.SIGTERM, nil, 0)
			kill := time.Now().Add(10 * time.Second)
			killed := false
			for end := kill.Add(5 * time.Second); !exited(fd); {
				if !killed && (time.Now().After(kill) || ctx.Err() != nil) {
					unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
					killed = true
				}
				if time.Now().After(end) {
					return fmt.Errorf("vhostblk: daemon %d did not exit", s.PID)
				}
			}
		}
	}
	for _, sock := range s.Sockets {
		os.Remove(sock)
	}
	vols, _ := filepath.Glob(filepath.Join(s.Dir, "vol-*.sock"))
	for _, sock := range vols {
		os.Remove(sock)
	}
	os.Remove(filepath.Join(s.Dir, qmpSocket))
	os.Remove(filepath.Join(s.Dir, pidFile))
	return nil
}

// Backup copies what the guest wrote to disk i (the top layer of its
// overlay) into dst, under key: dst is an encrypted qcow2 made for it over
// the same base (overlay.CreateEncrypted), so that it reads as the whole
// disk did when the copy started. Disk i must be an overlay over a plain
// base (not yet a restored snapshot's disk, whose backing is encrypted).
// The daemon does the copy with the disk's own key, which it holds; key
// reaches it over QMP for the copy only, and Backup removes it, the
// target and the job again, also after a failure (an error says if it
// could not). Pause the guest first for a copy that matches its memory.
func (s *Server) Backup(ctx context.Context, i int, dst string, key []byte) error {
	if i < 0 || i >= len(s.Sockets) {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: backup of disk %d: the daemon serves %d", i, len(s.Sockets))
	}
	if len(key) != hypervisor.KeySize {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: backup needs a %d-byte key", hypervisor.KeySize)
	}
	if err := qmp.CopyTop(ctx, s.exec, fmt.Sprintf("disk%d", i), dst, overlay.Passphrase(key), fmt.Sprintf("copy%d", i)); err != nil {
		return fmt.Errorf("vhostblk: backup of disk %d: %w", i, err)
	}
	return nil
}

// Detach makes disks served over an encrypted backing file (a restored
// snapshot's disk, Disk.BackingEncrypted) self-contained: for each index
// in bases, the daemon streams into the disk what it still reads from that
// backing file, keeping the plain base below it (bases[i], the backing
// file's own backing file, which the disk was made over); then it forgets
// the backing key. After that the disks need neither the snapshot's files
// nor its key.
func (s *Server) Detach(ctx context.Context, bases map[int]string) error {
	for i, base := range bases {
		if i < 0 || i >= len(s.Sockets) {
			return hypervisor.Errorf(hypervisor.ErrInvalid, "vhostblk: detach disk %d: the daemon serves %d", i, len(s.Sockets))
		}
		if err := qmp.Stream(ctx, s.exec, fmt.Sprintf("disk%d", i), base, fmt.Sprintf("stream%d", i)); err != nil {
			return fmt.Errorf("vhostblk: detach disk %d: %w", i, err)
		}
	}
	if _, err := s.exec(ctx, "object-del", map[string]any{"id": secretBackup}); err != nil && !qmp.IsNotFound(err) {
		return fmt.Errorf("vhostblk: forget the backing key: %w", err)
	}
	return nil
}

// exec runs one command on the daemon's monitor (qmp.Run).
func (s *Server) exec(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	return qmp.Run(ctx, filepath.Join(s.Dir, qmpSocket), cmd, args)
}

// exited waits up to 10 ms for the process of fd to exit (a pidfd is
// readable once it has: a zombie has closed its files).
func exited(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p, 10)
	return err == nil && n > 0
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
