// Package qemu is the QEMU backend: microvm machines controlled over QMP,
// with KVM where the host has hardware KVM and TCG software emulation
// everywhere else. The guest agent is reached over a virtio-serial port
// exposed as a Unix socket.
package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/consolelog"
	"github.com/harebox/harebox/hypervisor/overlay"
	"github.com/harebox/harebox/internal/procs"
)

// Name is the backend name in capabilities and handles.
const Name = "qemu"

// Options configures the backend.
type Options struct {
	// QEMU is the qemu-system-x86_64 binary; default from PATH.
	QEMU string
	// QEMUImg is the qemu-img binary; default from PATH.
	QEMUImg string
	// Accel is "auto" (default), "kvm" or "tcg".
	Accel string
	// GuestASLR keeps address-space layout randomization in guests under
	// TCG, where the backend turns it off by default (the kernel's
	// norandmaps; root in a guest can turn it on again with the sysctl
	// kernel.randomize_va_space). TCG keeps translated code per virtual
	// address, so a process whose libraries load at random addresses
	// translates them anew at every start: a process starts 3 to 4 times
	// slower with it. Under KVM guests always keep it.
	GuestASLR bool
	Logger    *slog.Logger
}

// Driver implements hypervisor.Hypervisor with QEMU.
type Driver struct {
	opts   Options
	accel  string
	notice string

	versionOnce sync.Once
	version     string

	drains drains
	bases  bases
}

var _ hypervisor.Hypervisor = (*Driver)(nil)

// New returns a QEMU driver. It fails with hypervisor.ErrUnavailable when
// QEMU is not installed.
func New(opts Options) (*Driver, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	for _, b := range []struct {
		p    *string
		name string
	}{{&opts.QEMU, "qemu-system-x86_64"}, {&opts.QEMUImg, "qemu-img"}} {
		if *b.p == "" {
			*b.p = b.name
		}
		p, err := exec.LookPath(*b.p)
		if err != nil {
			return nil, hypervisor.Errorf(hypervisor.ErrUnavailable, "qemu: %s not found: %v", b.name, err)
		}
		*b.p = p
	}
	d := &Driver{opts: opts}
	switch opts.Accel {
	case "", AccelAuto:
		d.accel, d.notice = accelProbe{sysRoot: "/", devKVM: "/dev/kvm"}.choose()
		if d.notice != "" {
			opts.Logger.Info("qemu: " + d.notice)
		}
	case AccelKVM, AccelTCG:
		d.accel = opts.Accel
	default:
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: accel %q: want auto, kvm or tcg", opts.Accel)
	}
	return d, nil
}

// Capabilities implements hypervisor.Hypervisor.
func (d *Driver) Capabilities(ctx context.Context) (hypervisor.Capabilities, error) {
	d.versionOnce.Do(func() {
		out, err := exec.CommandContext(ctx, d.opts.QEMU, "--version").Output()
		if err == nil {
			d.version = strings.TrimPrefix(strings.SplitN(string(out), "\n", 2)[0], "QEMU emulator version ")
		}
	})
	return hypervisor.Capabilities{
		Name:            Name,
		Accelerator:     d.accel,
		Notice:          d.notice,
		Snapshot:        true,
		Pause:           true,
		Encryption:      true,
		Reuse:           true,
		Volumes:         true,
		AgentTransports: []string{hypervisor.TransportSerial},
		Version:         d.version,
	}, nil
}

// Launch implements hypervisor.Hypervisor.
func (d *Driver) Launch(ctx context.Context, spec hypervisor.Spec) (hypervisor.Machine, error) {
	d.bases.sweep() // (the memory of golden snapshots that are gone)
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	for _, p := range append([]string{spec.Kernel, spec.Initrd}, diskPaths(spec.Disks)...) {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err != nil {
			return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: %v", err)
		}
	}
	keyed := len(spec.DataKey) > 0
	for i, dk := range spec.Disks {
		if keyed && !dk.ReadOnly && !dk.Overlay {
			return nil, hypervisor.Errorf(hypervisor.ErrUnsupported, "qemu: disk %d is writable without an overlay and cannot be encrypted under the data key", i)
		}
	}
	st, err := d.prepare(ctx, spec)
	if err != nil {
		return nil, err
	}
	// A failed launch removes what it made: never the disks an earlier
	// launch left (Reuse).
	cleanup := func() {
		if !spec.Reuse {
			os.RemoveAll(spec.StateDir)
		}
	}
	st.Encrypted = keyed
	st.SCSI = true
	st.TSCKHz = guestTSCKHz(cmdline(spec.Cmdline, st.Accel, d.opts.GuestASLR))
	disks := make([]hypervisor.Disk, len(spec.Disks))
	for i, dk := range spec.Disks {
		disks[i] = dk
		if dk.Overlay {
			ov := filepath.Join(spec.StateDir, fmt.Sprintf("disk%d.qcow2", i))
			if spec.Reuse {
				if _, err := os.Stat(ov); err != nil {
					return nil, hypervisor.Errorf(hypervisor.ErrNotFound, "qemu: reuse: disk %d of an earlier launch: %v", i, err)
				}
				disks[i] = hypervisor.Disk{Path: ov, Format: "qcow2", ReadOnly: dk.ReadOnly}
				continue
			}
			if keyed {
				err = overlay.CreateEncrypted(ctx, d.opts.QEMUImg, dk.Path, formatOf(dk), ov, dk.SizeMB<<20, spec.DataKey)
			} else {
				err = overlay.Create(ctx, d.opts.QEMUImg, dk.Path, formatOf(dk), ov, dk.SizeMB<<20)
			}
			if err != nil {
				cleanup()
				return nil, err
			}
			disks[i] = hypervisor.Disk{Path: ov, Format: "qcow2", ReadOnly: dk.ReadOnly}
		}
	}
	st.Disks = disks
	m, err := d.start(ctx, st, spec.DataKey, nil, nil)
	if err != nil {
		cleanup()
		return nil, err
	}
	return m, nil
}

// prepare makes the machine's state directory and its state record.
func (d *Driver) prepare(ctx context.Context, spec hypervisor.Spec) (*state, error) {
	if spec.ConsoleRecipient != "" {
		if _, err := consolelog.NewAppender(spec.SerialLog, spec.ConsoleRecipient, 0); err != nil {
			return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: %v", err)
		}
	}
	if strings.ContainsAny(spec.StateDir+spec.SerialLog, ",'\n") {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: state dir and serial log paths must not contain commas, quotes or newlines")
	}
	if _, err := os.Stat(spec.StateDir); err == nil && !spec.Reuse {
		if ents, _ := os.ReadDir(spec.StateDir); len(ents) > 0 {
			return nil, hypervisor.Errorf(hypervisor.ErrExists, "qemu: state dir %s is not empty", spec.StateDir)
		}
	}
	if spec.Reuse {
		// The earlier VMM must be gone: two on one disk would corrupt it.
		if b, err := os.ReadFile(filepath.Join(spec.StateDir, "qemu.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				if _, err := identify(pid, filepath.Join(spec.StateDir, "qmp.sock")); err == nil {
					return nil, hypervisor.Errorf(hypervisor.ErrExists, "qemu: reuse: the earlier VMM of %s (pid %d) still runs", spec.ID, pid)
				}
			}
		}
		removeSockets(spec.StateDir)
	}
	if err := os.MkdirAll(spec.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	serial := spec.SerialLog
	if serial == "" {
		serial = filepath.Join(spec.StateDir, "serial.log")
	}
	// Unix socket paths are limited to 107 bytes.
	st := &state{
		Spec:      spec.WithoutKeys(),
		QMP:       filepath.Join(spec.StateDir, "qmp.sock"),
		Agent:     filepath.Join(spec.StateDir, "agent.sock"),
		PIDFile:   filepath.Join(spec.StateDir, "qemu.pid"),
		Serial:    serial,
		Accel:     d.accel,
		StartedAt: time.Now().UTC(),
	}
	if len(st.QMP) > 100 || len(st.Agent) > 100 {
		os.RemoveAll(spec.StateDir)
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: state dir %s is too long for Unix socket paths", spec.StateDir)
	}
	return st, nil
}

// start runs QEMU daemonized for st and connects to its QMP socket. The
// keys reach QEMU through inherited pipes. With in (a restore), QEMU
// loads its stream before it runs; snapKey opens that stream's file and
// the disks' encrypted backing files.
func (d *Driver) start(ctx context.Context, st *state, dataKey, snapKey []byte, in *incoming) (*machine, error) {
	m, err := d.launch(ctx, st, dataKey, snapKey, in != nil)
	if err != nil {
		return nil, err
	}
	if in != nil {
		if err := m.incoming(ctx, *in); err != nil {
			m.st.Proc.kill(context.Background())
			return nil, err
		}
	}
	if err := st.save(); err != nil {
		m.st.Proc.kill(context.Background())
		return nil, err
	}
	if err := d.startDrain(m); err != nil {
		m.st.Proc.kill(context.Background())
		return nil, err
	}
	return m, nil
}

// launch runs QEMU daemonized for st (waiting for an incoming stream when
// incoming is set) and waits until it answers on its QMP socket.
func (d *Driver) launch(ctx context.Context, st *state, dataKey, snapKey []byte, incoming bool) (*machine, error) {
	var sec overlay.Secrets
	defer sec.Close()
	if st.Encrypted {
		if err := sec.Add(secretData, dataKey); err != nil {
			return nil, err
		}
	}
	if st.BackingEncrypted {
		if err := sec.Add(secretSnapshot, snapKey); err != nil {
			return nil, err
		}
	}
	args := append(d.args(st), sec.Args()...)
	if incoming {
		args = append(args, "-incoming", "defer")
	}
	cmd := exec.CommandContext(ctx, d.opts.QEMU, args...)
	sec.Apply(cmd)
	if st.mem != nil {
		cmd.Args = append(cmd.Args, memoryArgs(st, 3+len(cmd.ExtraFiles))...)
		cmd.ExtraFiles = append(cmd.ExtraFiles, st.mem)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Stdout = &stderr
	// -daemonize forks the VMM into its own session; the parent we wait
	// for exits once the machine is set up, so startup errors surface here.
	d.opts.Logger.Debug("qemu: launch", "id", st.Spec.ID, "args", cmd.Args)
	if err := cmd.Run(); err != nil {
		// A launch cut short (ctx) kills the parent, which may already
		// have forked the VMM: that one lives on, set up or not
		// (TestLaunchCutShort saw one in a run of the suite).
		procs.KillVMMs(st.Spec.StateDir)
		return nil, fmt.Errorf("qemu: start %s: %w: %s", st.Spec.ID, err, lastLines(stderr.String(), 5))
	}
	pidb, err := os.ReadFile(st.PIDFile)
	if err != nil {
		return nil, fmt.Errorf("qemu: read pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(pidb)))
	if err != nil {
		return nil, fmt.Errorf("qemu: bad pid file: %w", err)
	}
	p, err := identify(pid, st.QMP)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	st.Proc = p
	m := &machine{d: d, st: st}
	if err := m.waitQMP(ctx); err != nil {
		p.kill(context.Background())
		return nil, err
	}
	return m, nil
}

// args builds the QEMU command line. Launch and Restore must produce the
// same device set, or the migration stream will not load.
func (d *Driver) args(st *state) []string {
	s := st.Spec
	// Under TCG, without ERMS and FSRM: with them the guest's kernel
	// zeroes and copies pages with rep stosb/movsb, which TCG runs a
	// byte at a time (a boot took 15-20% longer; reading /dev/zero,
	// three to five times as long).
	cpu := "max,-erms,-fsrm"
	if st.Accel == AccelKVM {
		cpu = "host"
	}
	a := []string{
		"-name", "harebox-" + s.ID,
		"-M", "microvm,isa-serial=on,rtc=on",
		"-accel", st.Accel,
		"-cpu", cpu,
		"-smp", strconv.Itoa(s.VCPUs),
		"-m", strconv.Itoa(s.MemoryMB),
		"-nodefaults", "-no-user-config", "-display", "none",
		"-no-reboot",
		"-kernel", s.Kernel,
		"-append", cmdline(s.Cmdline, st.Accel, d.opts.GuestASLR),
		"-chardev", serialChardev(st),
		"-serial", "chardev:serial0",
		"-qmp", "unix:" + st.QMP + ",server=on,wait=off",
		"-pidfile", st.PIDFile,
		"-daemonize",
		"-object", "rng-random,id=rng0,filename=/dev/urandom",
		"-device", "virtio-rng-device,rng=rng0",
		"-device", "virtio-serial-device,max_ports=2",
		"-chardev", "socket,id=agent,path=" + st.Agent + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=" + hypervisor.AgentSerialName,
	}
	if s.ConsoleRecipient != "" {
		// A guest that powers off (or reboots: -no-reboot) leaves QEMU
		// stopped, not gone, until the drainer has taken the console's
		// last lines (a panic's, say) out of the ring and quits it.
		a = append(a, "-action", "shutdown=pause")
	}
	if s.Initrd != "" {
		a = append(a, "-initrd", s.Initrd)
	}
	for i, dk := range st.Disks {
		opt := fmt.Sprintf("file=%s,if=none,id=disk%d,format=%s,cache=unsafe", qemuEscape(dk.Path), i, formatOf(dk))
		if dk.ReadOnly {
			opt += ",readonly=on"
		} else {
			if st.Encrypted {
				opt += ",encrypt.key-secret=" + secretData
			}
			if b := st.Backing[i]; b != "" {
				opt += ",backing.driver=qcow2,backing.file.filename=" + qemuEscape(b)
			}
			if st.BackingEncrypted {
				opt += ",backing.encrypt.key-secret=" + secretSnapshot
			}
		}
		a = append(a, "-drive", opt, "-device", fmt.Sprintf("virtio-blk-device,drive=disk%d", i))
	}
	if st.SCSI {
		a = append(a, "-device", "virtio-scsi-device,id=scsi0")
	}
	if n := s.Network; n != nil {
		a = append(a,
			"-netdev", "tap,id=net0,ifname="+n.Tap+",script=no,downscript=no",
			"-device", "virtio-net-device,netdev=net0,mac="+n.MAC)
	}
	return a
}

// serialChardev is where the console goes: a ring in QEMU's memory that
// this process drains to an encrypted log (console.go), or a plain file.
func serialChardev(st *state) string {
	if st.Spec.ConsoleRecipient != "" {
		return "ringbuf,id=serial0,size=" + strconv.Itoa(ringSize)
	}
	// append=on: the engine truncates a log that grows too large, and
	// QEMU's writes must then land at the new end, not past a hole.
	return "file,id=serial0,append=on,path=" + st.Serial
}

// cmdline adds what the guest kernel needs under TCG: the TSC rate, which
// it cannot calibrate reliably against emulated timers on a busy host;
// the TSC trusted as its clock (tsc=reliable: TCG's TSC is the host's, a
// steady clock, but the kernel's watchdog, judging it by emulated timer
// ticks that run late on a busy host, would mark it unstable and keep
// time by ticks instead, 250 of them a second even when the guest is
// idle, each emulated: an idle guest cost 1.5 to 3% of a host core so,
// about 1% without); and, unless aslr, fixed addresses for its processes
// (Options.GuestASLR).
func cmdline(base, accel string, aslr bool) string {
	if accel != AccelTCG {
		return base
	}
	args := strings.Fields(base)
	if khz := hostTSCKHz(); khz > 0 {
		if !strings.Contains(base, "tsc_early_khz=") {
			args = append(args, "tsc_early_khz="+strconv.FormatInt(khz, 10))
		}
		if !strings.Contains(base, "tsc=") {
			args = append(args, "tsc=reliable")
		}
	}
	if !aslr && !slices.Contains(args, "norandmaps") {
		args = append(args, "norandmaps")
	}
	return strings.Join(args, " ")
}

// Attach implements hypervisor.Hypervisor.
func (d *Driver) Attach(ctx context.Context, h hypervisor.Handle) (hypervisor.Machine, error) {
	if h.Backend != Name {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: handle is for backend %q", h.Backend)
	}
	var st state
	if err := json.Unmarshal(h.Data, &st); err != nil {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: bad handle: %v", err)
	}
	if st.Spec.ID != h.ID || st.Proc.PID <= 0 || st.QMP == "" {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: bad handle for %q", h.ID)
	}
	if !st.Proc.alive() {
		return nil, hypervisor.Errorf(hypervisor.ErrNotFound, "qemu: machine %s is not running", h.ID)
	}
	m := &machine{d: d, st: &st}
	if _, err := m.exec(ctx, "query-status", nil); err != nil {
		return nil, fmt.Errorf("qemu: attach %s: %w", h.ID, err)
	}
	if err := d.startDrain(m); err != nil {
		return nil, fmt.Errorf("qemu: attach %s: %w", h.ID, err)
	}
	return m, nil
}

// Restore implements hypervisor.Hypervisor.
func (d *Driver) Restore(ctx context.Context, dir string, spec hypervisor.Spec) (hypervisor.Machine, error) {
	d.bases.sweep() // (the memory of golden snapshots that are gone)
	snap, err := loadSnapshot(dir)
	if err != nil {
		return nil, err
	}
	if err := spec.ValidKeys(); err != nil {
		return nil, err
	}
	switch {
	case snap.Encrypted && len(spec.SnapshotKey) == 0:
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: restore: the snapshot is encrypted and no snapshot key was given")
	case snap.Encrypted && len(spec.DataKey) == 0:
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: restore: a clone of an encrypted snapshot needs its own data key")
	case !snap.Encrypted && len(spec.SnapshotKey) > 0:
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: restore: the snapshot is not encrypted but a snapshot key was given")
	}
	if snap.Encrypted {
		// A wrong key is refused before anything starts.
		if err := checkMemoryKey(filepath.Join(dir, memoryFile), spec.SnapshotKey); err != nil {
			return nil, err
		}
	}
	if err := tscMatches(snap); err != nil {
		return nil, err
	}
	// The clone keeps the snapshot's hardware (it must match the stream)
	// and takes its identity from spec.
	clone := snap.Spec
	clone.ID, clone.StateDir, clone.SerialLog, clone.Labels = spec.ID, spec.StateDir, spec.SerialLog, spec.Labels
	clone.Network, clone.ConsoleRecipient = spec.Network, spec.ConsoleRecipient
	if (clone.Network == nil) != (snap.Spec.Network == nil) {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "qemu: restore: the clone must have a network exactly when the snapshot has one")
	}
	if err := clone.Validate(); err != nil {
		return nil, err
	}
	st, err := d.prepare(ctx, clone)
	if err != nil {
		return nil, err
	}
	st.Encrypted = len(spec.DataKey) > 0
	st.BackingEncrypted = snap.Encrypted
	st.SCSI = snap.SCSI
	st.TSCKHz = snap.TSCKHz
	st.Disks = make([]hypervisor.Disk, len(snap.Disks))
	for i, dk := range snap.Disks {
		st.Disks[i] = dk
		if !dk.ReadOnly {
			// Each clone writes to its own overlay, under its own key; the
			// snapshot stays intact.
			ov := filepath.Join(clone.StateDir, fmt.Sprintf("disk%d.qcow2", i))
			base := filepath.Join(dir, dk.Path)
			if src := sourceDisk(snap, i); st.Encrypted && src != nil {
				// Made over the plain base, and opened over the
				// snapshot's disk in its place until detach has
				// streamed that disk into it.
				err = overlay.CreateEncrypted(ctx, d.opts.QEMUImg, src.Path, formatOf(*src), ov, src.SizeMB<<20, spec.DataKey)
				if st.Backing == nil {
					st.Backing = map[int]string{}
				}
				st.Backing[i] = base
			} else if st.Encrypted {
				err = overlay.CreateEncrypted(ctx, d.opts.QEMUImg, base, "qcow2", ov, 0, spec.DataKey)
			} else {
				err = overlay.Create(ctx, d.opts.QEMUImg, base, "qcow2", ov, 0)
			}
			if err != nil {
				os.RemoveAll(clone.StateDir)
				return nil, err
			}
			st.Disks[i] = hypervisor.Disk{Path: ov, Format: "qcow2"}
		}
	}
	memPath := filepath.Join(dir, memoryFile)
	in := &incoming{path: memPath, key: spec.SnapshotKey}
	if spec.SharedMemory {
		d.shareBase(ctx, st, spec, in)
	}
	m, err := d.start(ctx, st, spec.DataKey, spec.SnapshotKey, in)
	if err != nil && st.SharedBase && ctx.Err() == nil {
		// x-ignore-shared is experimental in QEMU: a base whose device
		// state does not load is given up, and the restore loads it all.
		d.opts.Logger.Warn("qemu: a restore over the snapshot's shared memory failed: it loads all of it", "id", spec.ID, "snapshot", dir, "err", err)
		d.bases.fail(memPath, err)
		removeSockets(st.Spec.StateDir)
		st.mem, st.SharedBase = nil, false
		m, err = d.start(ctx, st, spec.DataKey, spec.SnapshotKey, &incoming{path: memPath, key: spec.SnapshotKey})
	}
	if err != nil {
		os.RemoveAll(clone.StateDir)
		return nil, err
	}
	st.mem = nil // (the VMM has its own map of the base; the driver keeps the file)
	if err := m.detach(ctx); err != nil {
		m.Kill(context.Background())
		m.Cleanup(context.Background())
		return nil, fmt.Errorf("qemu: restore: %w", err)
	}
	return m, nil
}

// shareBase turns the restore in into one over the snapshot's base
// (base.go), made now if this is its first shared restore. A base that
// cannot be made leaves the restore as it was: it loads all the memory.
func (d *Driver) shareBase(ctx context.Context, st *state, spec hypervisor.Spec, in *incoming) {
	b, err := d.bases.get(ctx, in.path, func() (*base, error) {
		return d.makeBase(ctx, st, spec.DataKey, spec.SnapshotKey, in.path)
	})
	if err != nil {
		d.opts.Logger.Warn("qemu: the snapshot's memory is not shared: this restore loads all of it", "id", spec.ID, "snapshot", filepath.Dir(in.path), "err", err)
		return
	}
	st.mem, st.SharedBase = b.mem, true
	*in = incoming{stream: b.device, ignoreShared: true}
}

// removeSockets removes what a VMM that is gone left in its state
// directory for the next to make anew.
func removeSockets(dir string) {
	for _, f := range []string{"qmp.sock", "agent.sock", "qemu.pid", "mig.sock"} {
		os.Remove(filepath.Join(dir, f))
	}
}

// sourceDisk is the disk spec a snapshot's writable disk i was made from
// as an overlay (its plain base and size), or nil.
func sourceDisk(snap *snapshot, i int) *hypervisor.Disk {
	if i >= len(snap.Spec.Disks) || !snap.Spec.Disks[i].Overlay || snap.Spec.Disks[i].ReadOnly {
		return nil
	}
	return &snap.Spec.Disks[i]
}

// Secret object IDs on the VMM's command line (the values come through
// pipes).
const (
	secretData     = "sec-data"
	secretSnapshot = "sec-snapshot"
)

func diskPaths(ds []hypervisor.Disk) []string {
	var p []string
	for _, d := range ds {
		p = append(p, d.Path)
	}
	return p
}

func formatOf(d hypervisor.Disk) string {
	if d.Format == "" {
		return "raw"
	}
	return d.Format
}

// qemuEscape doubles commas, QEMU's option separator.
func qemuEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "; ")
}

var errStopped = errors.New("machine has stopped")

// Probe says whether this backend can run here, with which accelerator,
// and why not where it cannot (for hareboxd doctor).
func Probe(ctx context.Context, opts Options) (caps hypervisor.Capabilities, err error) {
	d, err := New(opts)
	if err != nil {
		return hypervisor.Capabilities{Name: Name}, err
	}
	return d.Capabilities(ctx)
}

// guestTSCKHz is the TSC rate a kernel command line tells the guest
// (tsc_early_khz), or 0.
func guestTSCKHz(cmdline string) int64 {
	for _, a := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(a, "tsc_early_khz="); ok {
			khz, _ := strconv.ParseInt(v, 10, 64)
			return khz
		}
	}
	return 0
}

// tscMatches refuses to restore, under TCG, a guest that keeps time by
// a TSC rate this host's TSC does not run at (within 0.5%): its clock
// would run that much fast or slow for good, as TCG's TSC is the host's
// (a sandbox moved between hosts of different processors).
func tscMatches(snap *snapshot) error {
	host := hostTSCKHz()
	if snap.Accel != AccelTCG || snap.TSCKHz <= 0 || host <= 0 {
		return nil
	}
	if diff := host - snap.TSCKHz; diff*200 > snap.TSCKHz || -diff*200 > snap.TSCKHz {
		return hypervisor.Errorf(hypervisor.ErrUnsupported, "qemu: restore: the guest keeps time by a TSC of %d kHz (its boot host's), and this host's runs at %d kHz: its clock would run %.1f%% off here",
			snap.TSCKHz, host, float64(diff)*100/float64(snap.TSCKHz))
	}
	return nil
}
