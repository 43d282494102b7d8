// Package cloudhypervisor is the HareBox backend for Cloud Hypervisor: it
// starts one detached VMM per machine and drives it through its REST API on
// a Unix socket; the guest agent is reached over hybrid vsock.
package cloudhypervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"filippo.io/age"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/overlay"
	"github.com/harebox/harebox/hypervisor/vhostblk"
)

// Name is the backend name in Capabilities and Handles.
const Name = "cloud-hypervisor"

// GuestCID is the guest's vsock context ID. Hybrid vsock is proxied
// through a per-machine Unix socket, so every guest can use the same CID.
const GuestCID = 3

// File names inside a machine's StateDir.
const (
	apiSocketName    = "api.sock"
	vsockSocketName  = "vsock.sock"
	vmmLogName       = "vmm.log"
	serialLogName    = "serial.log"
	serialSocketName = "serial.sock"
	restoreDirName   = "restore"
	// blockDirName holds the storage daemon's sockets and pid file.
	blockDirName = "blk"
)

// maxSocketPath is the longest usable Unix socket path (sun_path less NUL).
const maxSocketPath = 107

// defaultCmdline is used when a spec gives none: the console on the serial
// port Cloud Hypervisor logs to, and a panic that reboots.
const defaultCmdline = "console=ttyS0 reboot=k panic=1"

// Config configures the backend.
type Config struct {
	// Binary is the cloud-hypervisor executable: a path, or a name looked
	// up on PATH (DefaultBinary if empty).
	Binary string
	// QemuImg creates qcow2 overlays ("qemu-img" on PATH if empty).
	QemuImg string
	// StorageDaemon serves encrypted overlays to the VMM
	// ("qemu-storage-daemon" on PATH if empty).
	StorageDaemon string
	// DisableLandlock keeps the VMM from sandboxing itself with Landlock
	// even where the binary and kernel support it.
	DisableLandlock bool
	// StartTimeout bounds waiting for a new VMM's API when the caller's
	// context has no deadline (10s if 0).
	StartTimeout time.Duration
	// NewAPI returns the API client for a socket (NewClient if nil).
	NewAPI func(socket string) API
}

// Backend implements hypervisor.Hypervisor with Cloud Hypervisor.
type Backend struct {
	cfg Config
	hp  hostPaths

	mu       sync.Mutex
	versions map[string]Version // binary path -> version, run once
	drains   drains
}

var _ hypervisor.Hypervisor = (*Backend)(nil)

// New returns a Cloud Hypervisor backend.
func New(cfg Config) *Backend {
	return &Backend{cfg: cfg, hp: defaultHostPaths, versions: map[string]Version{}}
}

func (b *Backend) newAPI(socket string) API {
	if b.cfg.NewAPI != nil {
		return b.cfg.NewAPI(socket)
	}
	return NewClient(socket)
}

// Capabilities reports the backend. Where it cannot run here it returns
// the capabilities with Notice set and an error wrapping ErrUnavailable.
func (b *Backend) Capabilities(ctx context.Context) (hypervisor.Capabilities, error) {
	r := probe(ctx, b.cfg, b.hp)
	caps := hypervisor.Capabilities{
		Name:            Name,
		Accelerator:     "kvm",
		Snapshot:        true,
		Pause:           true,
		Reuse:           true,
		AgentTransports: []string{hypervisor.TransportHybridVsock},
		Version:         r.Version,
	}
	if !r.Usable {
		caps.Notice = r.Reason
		return caps, hypervisor.Errorf(hypervisor.ErrUnavailable, "cloud-hypervisor: %s", r.Reason)
	}
	caps.Encryption = b.canEncrypt()
	// Volumes are served by the storage daemon of an encrypted machine.
	caps.Volumes, caps.VolumesNeedDataKey = caps.Encryption, true
	return caps, nil
}

// canEncrypt: the tools that encrypt disks and snapshots are here
// (qemu-img makes the overlays, the storage daemon opens them), and this
// process is root, which mounts the tmpfs snapshots are staged on.
func (b *Backend) canEncrypt() bool {
	if os.Geteuid() != 0 {
		return false
	}
	daemon := b.cfg.StorageDaemon
	if daemon == "" {
		daemon = "qemu-storage-daemon"
	}
	for _, bin := range []string{daemon, b.qemuImg()} {
		if _, err := exec.LookPath(bin); err != nil {
			return false
		}
	}
	return true
}

// binary resolves the VMM binary and checks its version once.
func (b *Backend) binary(ctx context.Context) (string, Version, error) {
	bin, err := resolveBinary(b.cfg.Binary)
	if err != nil {
		return "", Version{}, err
	}
	b.mu.Lock()
	v, ok := b.versions[bin]
	b.mu.Unlock()
	if !ok {
		if v, err = binaryVersion(ctx, bin); err != nil {
			return "", Version{}, err
		}
		b.mu.Lock()
		b.versions[bin] = v
		b.mu.Unlock()
	}
	if v.Less(MinVersion) {
		return "", v, hypervisor.Errorf(hypervisor.ErrUnavailable, "cloud-hypervisor %s at %s is older than the minimum %s", v, bin, MinVersion)
	}
	return bin, v, nil
}

func (b *Backend) landlock(v Version) bool {
	return !b.cfg.DisableLandlock && !v.Less(LandlockVersion) && landlockEnabled(b.hp)
}

// machinePaths are the files of one machine.
type machinePaths struct {
	stateDir, apiSocket, vsockSocket, vmmLog, serialLog, serialSocket string
}

func newPaths(stateDir, serialLog string) (machinePaths, error) {
	p := machinePaths{
		stateDir:    stateDir,
		apiSocket:   filepath.Join(stateDir, apiSocketName),
		vsockSocket: filepath.Join(stateDir, vsockSocketName),
		vmmLog:      filepath.Join(stateDir, vmmLogName),
		serialLog:   serialLog,
		// (The encrypted console's: the VMM serves the serial port there.)
		serialSocket: filepath.Join(stateDir, serialSocketName),
	}
	if p.serialLog == "" {
		p.serialLog = filepath.Join(stateDir, serialLogName)
	}
	if !filepath.IsAbs(p.serialLog) {
		return p, hypervisor.Errorf(hypervisor.ErrInvalid, "serial log %q: want an absolute path", serialLog)
	}
	if len(p.vsockSocket) > maxSocketPath || len(p.apiSocket) > maxSocketPath {
		return p, hypervisor.Errorf(hypervisor.ErrInvalid, "state dir %q is too long for Unix socket paths (max %d bytes)", stateDir, maxSocketPath-len(vsockSocketName)-1)
	}
	return p, nil
}

// prepareStateDir creates the state dir and refuses one whose VMM is still
// answering; it reports whether it created the directory.
func (b *Backend) prepareStateDir(ctx context.Context, p machinePaths) (bool, error) {
	created := false
	if _, err := os.Stat(p.stateDir); errors.Is(err, os.ErrNotExist) {
		created = true
	}
	if err := os.MkdirAll(p.stateDir, 0o700); err != nil {
		return false, fmt.Errorf("create state dir: %w", err)
	}
	if _, err := os.Stat(p.apiSocket); err == nil {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, perr := b.newAPI(p.apiSocket).Ping(pctx)
		cancel()
		if perr == nil {
			return false, hypervisor.Errorf(hypervisor.ErrExists, "a VMM is already running on %s", p.apiSocket)
		}
	}
	// Stale sockets from a machine that died would make the VMM's bind fail.
	for _, s := range []string{p.apiSocket, p.vsockSocket} {
		if err := os.Remove(s); err != nil && !errors.Is(err, os.ErrNotExist) {
			return created, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	return created, nil
}

// begin is what Launch and Restore do first: validate the spec, find the
// binary and make the machine's state directory (created says whether it
// was made here, so a failure removes only what it made).
func (b *Backend) begin(ctx context.Context, spec hypervisor.Spec) (bin string, ver Version, p machinePaths, created bool, err error) {
	if err = spec.Validate(); err != nil {
		return
	}
	// Encrypted disks are served from qemu-storage-daemon (prepareDisks),
	// encrypted console logs drained from a socket (console.go), encrypted
	// snapshots sealed (snapshot.go).
	if len(spec.DataKey) > 0 {
		for i, d := range spec.Disks {
			if !d.Overlay && !d.ReadOnly {
				err = hypervisor.Errorf(hypervisor.ErrInvalid, "disk %d: a writable disk without an overlay cannot be encrypted", i)
				return
			}
		}
		// (The daemon's sockets: blk/diskN.sock.)
		if sock := filepath.Join(spec.StateDir, blockDirName, fmt.Sprintf("disk%d.sock", len(spec.Disks))); len(sock) > maxSocketPath {
			err = hypervisor.Errorf(hypervisor.ErrInvalid, "state dir %q is too long for the storage daemon's socket paths (max %d bytes)", spec.StateDir, maxSocketPath)
			return
		}
	}
	if r := spec.ConsoleRecipient; r != "" {
		if _, perr := age.ParseX25519Recipient(r); perr != nil {
			err = hypervisor.Errorf(hypervisor.ErrInvalid, "console recipient: %v", perr)
			return
		}
		if sock := filepath.Join(spec.StateDir, serialSocketName); len(sock) > maxSocketPath {
			err = hypervisor.Errorf(hypervisor.ErrInvalid, "state dir %q is too long for the serial socket's path (max %d bytes)", spec.StateDir, maxSocketPath)
			return
		}
	}
	if bin, ver, err = b.binary(ctx); err != nil {
		return
	}
	if p, err = newPaths(spec.StateDir, spec.SerialLog); err != nil {
		return
	}
	if created, err = b.prepareStateDir(ctx, p); err != nil {
		return
	}
	// (A snapshot or restore cut short by a crash left its tmpfs.)
	err = removeStages(p.stateDir)
	return
}

// Launch boots a new machine.
func (b *Backend) Launch(ctx context.Context, spec hypervisor.Spec) (_ hypervisor.Machine, err error) {
	if len(spec.SnapshotKey) > 0 {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "cloud-hypervisor: a snapshot key is for Restore; Launch boots no snapshot")
	}
	bin, ver, p, created, err := b.begin(ctx, spec)
	if err != nil {
		return nil, err
	}
	var m *machine
	defer func() {
		if err != nil {
			// (A launch again keeps the disks it came for.)
			b.abandon(m, p, created, spec.Reuse)
		}
	}()

	disks, bases, blk, served, err := b.prepareDisks(ctx, spec, p)
	if err != nil {
		return nil, err
	}
	cfg := buildVmConfig(spec, p, disks, b.landlockRules(ver, p, bases))

	if m, err = b.start(ctx, bin, ver, spec.ID, p); err != nil {
		return nil, err
	}
	if blk != nil {
		m.data.BlockDir, m.data.Served = blk.Dir, served
	}
	m.data.Encrypted = len(spec.DataKey) > 0
	if spec.ConsoleRecipient != "" {
		m.data.ConsoleRecipient, m.data.SerialSocket = spec.ConsoleRecipient, p.serialSocket
		// (Draining before the boot: it connects as soon as the VMM
		// serves the port.)
		if err := b.startDrain(m); err != nil {
			return nil, err
		}
	}
	if err := m.api.CreateVM(ctx, cfg); err != nil {
		return nil, fmt.Errorf("vm.create: %w%s", err, m.logHint())
	}
	if err := m.api.BootVM(ctx); err != nil {
		return nil, fmt.Errorf("vm.boot: %w%s", err, m.logHint())
	}
	return m, nil
}

// abandon undoes a failed Launch or Restore: stops the VMM and removes
// what was created for it (the disks too, unless keepDisks).
func (b *Backend) abandon(m *machine, p machinePaths, created, keepDisks bool) {
	if m != nil {
		m.endDrain()
		killAndWait(m.proc)
		m.proc.close()
	}
	stopBlock(filepath.Join(p.stateDir, blockDirName))
	// (A tmpfs left mounted would keep RemoveAll from the state dir.)
	removeStages(p.stateDir)
	if created {
		os.RemoveAll(p.stateDir)
		return
	}
	for _, f := range []string{p.apiSocket, p.vsockSocket} {
		os.RemoveAll(f)
	}
	if keepDisks {
		return
	}
	if matches, _ := filepath.Glob(filepath.Join(p.stateDir, "disk-*")); matches != nil {
		for _, f := range matches {
			os.Remove(f)
		}
	}
}

// prepareDisks turns spec disks into DiskConfigs, creating qcow2 overlays
// in the state dir where asked. It also returns the overlays' base images,
// which the VMM must be allowed to read. With a data key the overlays are
// LUKS-encrypted under it and served to the VMM as vhost-user-blk sockets
// by a storage daemon (returned), since the VMM cannot open them itself;
// disks given as they are stay the VMM's own (read-only: begin refuses
// others).
func (b *Backend) prepareDisks(ctx context.Context, spec hypervisor.Spec, p machinePaths) (_ []DiskConfig, _ []string, _ *vhostblk.Server, _ []servedDisk, err error) {
	var disks []DiskConfig
	var bases []string
	var served []vhostblk.Disk
	var info []servedDisk // info[j] is served[j]'s, at disks[info[j].Index]
	for i, d := range spec.Disks {
		format := d.Format
		if format == "" {
			format = "raw"
		}
		if !d.Overlay {
			disks = append(disks, DiskConfig{Path: d.Path, Readonly: d.ReadOnly, ImageType: imageType(format)})
			continue
		}
		ov := filepath.Join(p.stateDir, fmt.Sprintf("disk-%d.qcow2", i))
		if spec.Reuse {
			// The overlay an earlier launch left, opened as it is.
			if st, err := os.Stat(ov); err != nil || !st.Mode().IsRegular() {
				return nil, nil, nil, nil, hypervisor.Errorf(hypervisor.ErrNotFound, "disk %d: no overlay of an earlier launch at %s", i, ov)
			}
		} else if err := b.createOverlay(ctx, d.Path, format, ov, d.SizeMB<<20, spec.DataKey); err != nil {
			return nil, nil, nil, nil, err
		}
		if len(spec.DataKey) > 0 {
			served = append(served, vhostblk.Disk{Path: ov, Format: "qcow2", Encrypted: true, Backing: d.Path, BackingFormat: format, ReadOnly: d.ReadOnly})
			info = append(info, servedDisk{Index: len(disks), Base: d.Path, BaseFormat: format, SizeBytes: d.SizeMB << 20})
			disks = append(disks, DiskConfig{})
			continue
		}
		// The overlay's backing file is ours, so backing files are allowed
		// for it; images given as is keep them off.
		disks = append(disks, DiskConfig{Path: ov, Readonly: d.ReadOnly, ImageType: ImageTypeQcow2, BackingFiles: true})
		bases = append(bases, d.Path)
	}
	if len(served) == 0 {
		return disks, bases, nil, nil, nil
	}
	if spec.Reuse {
		// (A daemon of the last launch whose VMM died unwatched.)
		if err := stopBlock(filepath.Join(p.stateDir, blockDirName)); err != nil {
			return nil, nil, nil, nil, err
		}
	}
	srv, err := b.serve(ctx, p, served, spec.DataKey, nil)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	for j, d := range info {
		disks[d.Index] = DiskConfig{VhostUser: true, VhostSocket: srv.Sockets[j], Readonly: served[j].ReadOnly}
	}
	return disks, bases, srv, info, nil
}

// serve starts the machine's storage daemon.
func (b *Backend) serve(ctx context.Context, p machinePaths, disks []vhostblk.Disk, key, backingKey []byte) (*vhostblk.Server, error) {
	return vhostblk.Start(ctx, vhostblk.Options{Binary: b.cfg.StorageDaemon, Dir: filepath.Join(p.stateDir, blockDirName), Disks: disks, DataKey: key, BackingKey: backingKey})
}

// stopBlock stops the storage daemon serving dir, if one does.
func stopBlock(dir string) error {
	s, err := vhostblk.Find(dir)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return s.Stop(ctx)
}

func imageType(format string) ImageType {
	if format == "qcow2" {
		return ImageTypeQcow2
	}
	return ImageTypeRaw
}

func (b *Backend) qemuImg() string {
	if b.cfg.QemuImg == "" {
		return "qemu-img"
	}
	return b.cfg.QemuImg
}

func (b *Backend) createOverlay(ctx context.Context, base, format, path string, sizeBytes int64, key []byte) error {
	tool := b.qemuImg()
	if _, err := os.Stat(base); err != nil {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "disk %s: %v", base, err)
	}
	os.Remove(path)
	if len(key) > 0 {
		return overlay.CreateEncrypted(ctx, tool, base, format, path, sizeBytes, key)
	}
	return overlay.Create(ctx, tool, base, format, path, sizeBytes)
}

// landlockRules are the extra paths a Landlock-sandboxed VMM needs beyond
// those its VM config names: the state dir, where snapshots are staged,
// and overlay base images. Nil means Landlock stays off.
func (b *Backend) landlockRules(v Version, p machinePaths, bases []string) []LandlockConfig {
	if !b.landlock(v) {
		return nil
	}
	rules := []LandlockConfig{{Path: p.stateDir, Access: "rw"}}
	for _, base := range bases {
		rules = append(rules, LandlockConfig{Path: base, Access: "r"})
	}
	return rules
}

// buildVmConfig maps a spec onto the VMM's VM config.
func buildVmConfig(spec hypervisor.Spec, p machinePaths, disks []DiskConfig, landlock []LandlockConfig) VmConfig {
	nested := false
	// A vhost-user backend (the storage daemon) reads and writes the
	// guest's buffers itself: guest memory must be shared with it.
	shared := false
	for _, d := range disks {
		shared = shared || d.VhostUser
	}
	cmdline := spec.Cmdline
	if cmdline == "" {
		cmdline = defaultCmdline
	}
	serial := &SerialConfig{Mode: ConsoleModeFile, File: p.serialLog}
	if spec.ConsoleRecipient != "" {
		serial = &SerialConfig{Mode: ConsoleModeSocket, Socket: p.serialSocket}
	}
	cfg := VmConfig{
		Cpus:    &CpusConfig{BootVcpus: spec.VCPUs, MaxVcpus: spec.VCPUs, Nested: &nested},
		Memory:  &MemoryConfig{Size: int64(spec.MemoryMB) << 20, Shared: shared},
		Payload: PayloadConfig{Kernel: spec.Kernel, Initramfs: spec.Initrd, Cmdline: cmdline},
		Disks:   disks,
		Rng:     &RngConfig{Src: "/dev/urandom"},
		Serial:  serial,
		Console: &ConsoleConfig{Mode: ConsoleModeOff},
		Vsock:   &VsockConfig{Cid: GuestCID, Socket: p.vsockSocket},
	}
	if n := spec.Network; n != nil {
		cfg.Net = []NetConfig{{Tap: n.Tap, Mac: n.MAC}}
	}
	if len(landlock) > 0 {
		cfg.LandlockEnable = true
		cfg.LandlockRules = landlock
	}
	return cfg
}

// start runs a VMM for a machine and waits until its API answers.
func (b *Backend) start(ctx context.Context, bin string, ver Version, id string, p machinePaths) (*machine, error) {
	started := time.Now().UTC()
	proc, err := startVMM(bin, p.apiSocket, p.vmmLog)
	if err != nil {
		return nil, err
	}
	m := &machine{
		id:      id,
		api:     b.newAPI(p.apiSocket),
		proc:    proc.pidfd,
		qemuImg: b.qemuImg(),
		data: handleData{
			PID:         proc.pid,
			APISocket:   p.apiSocket,
			StateDir:    p.stateDir,
			VsockSocket: p.vsockSocket,
			SerialLog:   p.serialLog,
			VMMLog:      p.vmmLog,
			Started:     started,
			Version:     ver.String(),
		},
	}
	rctx := ctx
	if _, ok := ctx.Deadline(); !ok {
		t := b.cfg.StartTimeout
		if t <= 0 {
			t = 10 * time.Second
		}
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, t)
		defer cancel()
	}
	if _, err := waitReady(rctx, m.api, m.proc); err != nil {
		killAndWait(m.proc)
		m.proc.close()
		return nil, hypervisor.Errorf(hypervisor.ErrUnavailable, "cloud-hypervisor did not start: %v%s", err, m.logHint())
	}
	return m, nil
}

// Attach re-adopts a machine from its handle.
func (b *Backend) Attach(ctx context.Context, h hypervisor.Handle) (hypervisor.Machine, error) {
	if h.Backend != Name {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "handle is for backend %q, not %q", h.Backend, Name)
	}
	var d handleData
	if err := json.Unmarshal(h.Data, &d); err != nil {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "handle data: %v", err)
	}
	if !hypervisor.ValidID(h.ID) || !filepath.IsAbs(d.APISocket) || !filepath.IsAbs(d.StateDir) || !filepath.IsAbs(d.VsockSocket) {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "handle data for %q is incomplete", h.ID)
	}
	proc, err := adoptPid(d.PID, d.APISocket)
	if err != nil {
		// (The VMM died while nobody watched: its storage daemon, if
		// any, has no one left to serve.)
		if d.BlockDir != "" && filepath.IsAbs(d.BlockDir) {
			stopBlock(d.BlockDir)
		}
		// (Nor any tmpfs a snapshot it died in left: plain memory.)
		if filepath.IsAbs(d.StateDir) {
			removeStages(d.StateDir)
		}
		return nil, err
	}
	m := &machine{id: h.ID, data: d, api: b.newAPI(d.APISocket), proc: proc, qemuImg: b.qemuImg()}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := m.api.Ping(pctx); err != nil {
		proc.close()
		return nil, hypervisor.Errorf(hypervisor.ErrNotFound, "VMM for %s does not answer: %v", h.ID, err)
	}
	if d.ConsoleRecipient != "" && !filepath.IsAbs(d.SerialSocket) {
		proc.close()
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "handle data for %q: an encrypted console without its socket", h.ID)
	}
	if err := b.startDrain(m); err != nil {
		proc.close()
		return nil, err
	}
	// A snapshot or restore the last process was killed in left its tmpfs
	// (plain guest memory): nothing of this process uses it.
	if err := removeStages(d.StateDir); err != nil {
		m.endDrain()
		proc.close()
		return nil, err
	}
	return m, nil
}
