package cloudhypervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/overlay"
	"github.com/harebox/harebox/hypervisor/vhostblk"
)

// Files in a snapshot directory besides the VMM's own (config.json,
// state.json, memory-ranges).
const (
	snapshotMetaName = "harebox-snapshot.json"
	vmConfigName     = "config.json"
	snapshotFormat   = 1
	// stagePrefix names the staging dirs of snapshots in a state dir.
	stagePrefix = "snapshot-"
	// maxConfigBytes caps config.json and the metadata when read back: a
	// snapshot directory may come from elsewhere.
	maxConfigBytes = 4 << 20
)

// snapshotMeta is HareBox's record of a snapshot.
type snapshotMeta struct {
	Format     int            `json:"format"`
	Backend    string         `json:"backend"`
	SourceID   string         `json:"source_id"`
	Created    time.Time      `json:"created"`
	VMMVersion string         `json:"vmm_version,omitempty"`
	StateDir   string         `json:"state_dir"` // the source's, rewritten on restore
	Disks      []snapshotDisk `json:"disks"`
	// Encrypted: the VMM's files are sealed (name.sealed) under the
	// snapshot's key, and so are the disk copies.
	Encrypted bool `json:"encrypted,omitempty"`
}

// snapshotDisk is one disk of the snapshotted VM, by config.json index.
type snapshotDisk struct {
	// File is the copy inside the snapshot dir of a writable disk.
	File string `json:"file,omitempty"`
	// Path is the disk the VM used; read-only disks are used from there.
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only"`
	// Encrypted: File is an overlay under the snapshot's key over the
	// plain Base (a disk the storage daemon served); a clone's overlay is
	// made over Base too, with SizeBytes.
	Encrypted  bool   `json:"encrypted,omitempty"`
	Base       string `json:"base,omitempty"`
	BaseFormat string `json:"base_format,omitempty"`
	SizeBytes  int64  `json:"size_bytes,omitempty"`
}

// configDisk is what we read of a disk in the VMM's config.json.
type configDisk struct {
	Path      string `json:"path"`
	Readonly  bool   `json:"readonly"`
	VhostUser bool   `json:"vhost_user"`
}

// Snapshot pauses the VM and writes memory, device state, a copy of each
// writable disk and metadata into dir, which must not exist. The VMM
// writes into a staging directory inside the state dir (the one place a
// Landlock-sandboxed VMM may write).
//
// An encrypted machine (launched with a data key) needs key: the staging
// directory is then a tmpfs, its files and the metadata are sealed into
// dir under key (sealed.go), and the storage daemon copies each disk's
// writes into a new overlay under key. What reaches the disk in plain
// text is only a metadata stub saying what the snapshot is (and whatever
// the host swaps out of the tmpfs). A plain machine's snapshot is the
// VMM's files as they are, moved into dir, with plain copies of its
// writable disks.
func (m *machine) Snapshot(ctx context.Context, dir string, key []byte) (err error) {
	// (Handles from before the flag: a served disk means a data key.)
	encrypted := m.data.Encrypted || m.data.BlockDir != ""
	switch {
	case len(key) != 0 && len(key) != hypervisor.KeySize:
		return hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot key of %d bytes, want %d", len(key), hypervisor.KeySize)
	case encrypted && len(key) == 0:
		return hypervisor.Errorf(hypervisor.ErrInvalid, "machine %s is encrypted: a snapshot needs its key", m.id)
	case !encrypted && len(key) != 0:
		return hypervisor.Errorf(hypervisor.ErrInvalid, "machine %s is not encrypted: it cannot be snapshotted under a key", m.id)
	case m.data.BlockDir != "" && len(m.data.Served) == 0:
		return hypervisor.Errorf(hypervisor.ErrUnsupported, "machine %s was launched by an earlier version that did not record its disks: it cannot be snapshotted", m.id)
	}
	if !filepath.IsAbs(dir) {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot dir %q: want an absolute path", dir)
	}
	if vols := m.pluggedVolumes(); len(vols) > 0 {
		return hypervisor.Errorf(hypervisor.ErrState, "machine %s has volumes plugged in (%s): unplug them before a snapshot", m.id, strings.Join(vols, ", "))
	}
	if _, err := os.Lstat(dir); err == nil {
		return hypervisor.Errorf(hypervisor.ErrExists, "snapshot dir %s already exists", dir)
	}
	if st, err := os.Stat(filepath.Dir(dir)); err != nil || !st.IsDir() {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot dir %s: parent is not a directory", dir)
	}
	vi, err := m.api.Info(ctx)
	if err != nil {
		return fmt.Errorf("machine %s: snapshot: %w", m.id, err)
	}
	var memory int64
	if vi.Config.Memory != nil {
		memory = vi.Config.Memory.Size
	}
	switch state := vi.State; state {
	case VmStateRunning:
		if err := m.Pause(ctx); err != nil {
			return err
		}
	case VmStatePaused:
	default:
		return hypervisor.Errorf(hypervisor.ErrState, "machine %s: snapshot: VM is %s", m.id, state)
	}

	stage, err := os.MkdirTemp(m.data.StateDir, stagePrefix)
	if err != nil {
		return fmt.Errorf("machine %s: snapshot: %w", m.id, err)
	}
	// out receives the snapshot: the stage itself, moved to dir at the
	// end, or dir, for sealed files and encrypted disk copies.
	out, made := stage, false
	defer func() {
		if err != nil || encrypted {
			if rerr := removeStage(stage); rerr != nil {
				err = errors.Join(err, fmt.Errorf("machine %s: snapshot: %w", m.id, rerr))
			}
		}
		if err != nil && made {
			os.RemoveAll(dir)
		}
	}()
	if encrypted {
		if err := mountStage(stage, memory); err != nil {
			return fmt.Errorf("machine %s: snapshot: %w", m.id, err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("machine %s: snapshot: %w", m.id, err)
		}
		out, made = dir, true
	}
	if err := m.api.Snapshot(ctx, VmSnapshotConfig{DestinationURL: "file://" + stage}); err != nil {
		return fmt.Errorf("machine %s: snapshot: %w%s", m.id, err, m.logHint())
	}

	var cfg struct {
		Disks []configDisk `json:"disks"`
	}
	if err := readJSON(filepath.Join(stage, vmConfigName), &cfg); err != nil {
		return fmt.Errorf("machine %s: snapshot: %w", m.id, err)
	}
	meta := snapshotMeta{
		Format:     snapshotFormat,
		Backend:    Name,
		SourceID:   m.id,
		Created:    time.Now().UTC(),
		VMMVersion: m.data.Version,
		StateDir:   m.data.StateDir,
		Encrypted:  encrypted,
	}
	for i, d := range cfg.Disks {
		sd, err := m.snapshotDisk(ctx, i, d, out, key)
		if err != nil {
			return fmt.Errorf("machine %s: snapshot disk %d: %w", m.id, i, err)
		}
		meta.Disks = append(meta.Disks, sd)
	}
	if encrypted {
		// The metadata names the files a restore opens (bases, disks): it
		// is sealed with the rest, so only what this backend wrote under
		// the key is believed; the plain copy says only what it is.
		b, err := json.Marshal(meta)
		if err == nil {
			err = os.WriteFile(filepath.Join(stage, snapshotMetaName), b, 0o600)
		}
		if err == nil {
			err = sealFiles(ctx, stage, dir, key)
		}
		if err != nil {
			return fmt.Errorf("machine %s: snapshot: %w", m.id, err)
		}
		meta = snapshotMeta{Format: meta.Format, Backend: meta.Backend, Encrypted: true, Created: meta.Created}
	}
	if err := writeJSON(filepath.Join(out, snapshotMetaName), meta); err != nil {
		return fmt.Errorf("machine %s: snapshot: %w", m.id, err)
	}
	if !encrypted {
		if err := moveDir(ctx, stage, dir); err != nil {
			return fmt.Errorf("machine %s: snapshot: %w", m.id, err)
		}
	}
	return nil
}

// snapshotDisk copies disk i (as the VM config has it) into out, if it is
// writable: the VM is paused, so the copy matches the memory image. A
// disk the storage daemon serves is copied by the daemon, under key, into
// a new overlay over the same plain base.
func (m *machine) snapshotDisk(ctx context.Context, i int, d configDisk, out string, key []byte) (snapshotDisk, error) {
	if d.VhostUser {
		for j, s := range m.data.Served {
			if s.Index != i {
				continue
			}
			sd := snapshotDisk{File: fmt.Sprintf("disk-%d.qcow2", i), Encrypted: true, Base: s.Base, BaseFormat: s.BaseFormat, SizeBytes: s.SizeBytes}
			dst := filepath.Join(out, sd.File)
			if err := overlay.CreateEncrypted(ctx, m.qemuImg, s.Base, s.BaseFormat, dst, s.SizeBytes, key); err != nil {
				return sd, err
			}
			srv, err := vhostblk.Find(m.data.BlockDir)
			if err != nil {
				return sd, fmt.Errorf("the storage daemon: %w", err)
			}
			return sd, srv.Backup(ctx, j, dst, key)
		}
		return snapshotDisk{}, fmt.Errorf("a vhost-user disk the storage daemon does not serve")
	}
	sd := snapshotDisk{Path: d.Path, ReadOnly: d.Readonly}
	if d.Readonly {
		return sd, nil
	}
	if len(key) > 0 {
		// (begin refuses writable disks it cannot encrypt.)
		return sd, fmt.Errorf("a writable disk the storage daemon does not serve in an encrypted machine")
	}
	sd.File = fmt.Sprintf("disk-%d%s", i, diskExt(d.Path))
	return sd, copyFile(ctx, d.Path, filepath.Join(out, sd.File))
}

// Restore boots a clone from a snapshot: a new VMM restores the snapshot's
// memory and device state, with its own copies of the writable disks and
// its own sockets. The v53 RestoreConfig has no field for new device
// paths, so they are rewritten in a copy of config.json.
//
// An encrypted snapshot needs its key (SnapshotKey) and a data key for
// the clone: the VMM's files are unsealed into a tmpfs, and each disk the
// source's storage daemon served becomes the clone's own overlay over the
// plain base, under the clone's key, served by the clone's own daemon over
// the snapshot's copy until the daemon has streamed that copy in
// (vhostblk Detach). Then the clone needs neither the snapshot nor its key.
func (b *Backend) Restore(ctx context.Context, snapshotDir string, spec hypervisor.Spec) (_ hypervisor.Machine, err error) {
	var meta snapshotMeta
	if err := readJSON(filepath.Join(snapshotDir, snapshotMetaName), &meta); err != nil {
		return nil, hypervisor.Errorf(hypervisor.ErrNotFound, "snapshot %s: %v", snapshotDir, err)
	}
	if meta.Format != snapshotFormat || meta.Backend != Name {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot %s: format %d of %q, want %d of %q", snapshotDir, meta.Format, meta.Backend, snapshotFormat, Name)
	}
	if err := spec.ValidKeys(); err != nil {
		return nil, err
	}
	switch {
	case meta.Encrypted && len(spec.SnapshotKey) == 0:
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "restore: the snapshot is encrypted and no snapshot key was given")
	case meta.Encrypted && len(spec.DataKey) == 0:
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "restore: a clone of an encrypted snapshot needs its own data key")
	case !meta.Encrypted && len(spec.SnapshotKey) > 0:
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "restore: the snapshot is not encrypted but a snapshot key was given")
	case !meta.Encrypted && len(spec.DataKey) > 0:
		return nil, hypervisor.Errorf(hypervisor.ErrUnsupported, "restore: this backend does not encrypt a clone of a plain snapshot")
	}
	if meta.Encrypted {
		// What the sealed metadata says, not the plain copy. (A wrong key
		// is refused here, before anything starts.)
		b, err := readSealed(filepath.Join(snapshotDir, snapshotMetaName+sealedExt), spec.SnapshotKey, maxConfigBytes)
		if err != nil {
			return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot %s does not open under the snapshot key: metadata: %v", snapshotDir, err)
		}
		meta = snapshotMeta{}
		if err := json.Unmarshal(b, &meta); err != nil || !meta.Encrypted || meta.Format != snapshotFormat || meta.Backend != Name {
			return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot %s: sealed metadata: %v", snapshotDir, err)
		}
	}
	for i, d := range meta.Disks {
		if d.File != "" && (filepath.Base(d.File) != d.File || !strings.HasPrefix(d.File, "disk-")) {
			return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot %s: disk %d file %q", snapshotDir, i, d.File)
		}
		if d.Encrypted && (d.File == "" || !filepath.IsAbs(d.Base) || !meta.Encrypted) {
			return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot %s: encrypted disk %d without its file or base", snapshotDir, i)
		}
		if meta.Encrypted && d.File != "" && !d.Encrypted {
			return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot %s: disk %d of an encrypted snapshot is not encrypted", snapshotDir, i)
		}
	}
	var cfg map[string]any
	if meta.Encrypted {
		cfg, err = readSealedConfig(filepath.Join(snapshotDir, vmConfigName+sealedExt), spec.SnapshotKey)
	} else {
		cfg, err = readConfig(filepath.Join(snapshotDir, vmConfigName))
	}
	if err != nil {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot %s: %v", snapshotDir, err)
	}
	if err := fillSpecFromConfig(&spec, cfg); err != nil {
		return nil, hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot %s: %v", snapshotDir, err)
	}
	bin, ver, p, created, err := b.begin(ctx, spec)
	if err != nil {
		return nil, err
	}
	var m *machine
	defer func() {
		if err != nil {
			b.abandon(m, p, created, false)
		}
	}()

	stage := filepath.Join(p.stateDir, restoreDirName)
	if err := removeStage(stage); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := os.Mkdir(stage, 0o700); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if meta.Encrypted {
		if err := mountStage(stage, int64(spec.MemoryMB)<<20); err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		err = unsealFiles(ctx, snapshotDir, stage, spec.SnapshotKey)
	} else {
		err = stageSnapshotFiles(ctx, snapshotDir, stage)
	}
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	diskPaths := make([]string, len(meta.Disks))
	sockets := make([]string, len(meta.Disks))
	var served []vhostblk.Disk
	var info []servedDisk
	for i, d := range meta.Disks {
		diskPaths[i] = d.Path
		switch {
		case d.Encrypted:
			ov := filepath.Join(p.stateDir, fmt.Sprintf("disk-%d.qcow2", i))
			if err := b.createOverlay(ctx, d.Base, d.BaseFormat, ov, d.SizeBytes, spec.DataKey); err != nil {
				return nil, fmt.Errorf("restore disk %d: %w", i, err)
			}
			// (The copy's own backing file is named here, not taken from
			// its header, which its key does not cover.)
			served = append(served, vhostblk.Disk{Path: ov, Format: "qcow2", Encrypted: true,
				Backing: filepath.Join(snapshotDir, d.File), BackingFormat: "qcow2", BackingEncrypted: true,
				BackingBase: d.Base, BackingBaseFormat: d.BaseFormat})
			info = append(info, servedDisk{Index: i, Base: d.Base, BaseFormat: d.BaseFormat, SizeBytes: d.SizeBytes})
		case d.File != "":
			diskPaths[i] = filepath.Join(p.stateDir, d.File)
			if err := copyFile(ctx, filepath.Join(snapshotDir, d.File), diskPaths[i]); err != nil {
				return nil, fmt.Errorf("restore disk %d: %w", i, err)
			}
		}
	}
	var blk *vhostblk.Server
	if len(served) > 0 {
		if blk, err = b.serve(ctx, p, served, spec.DataKey, spec.SnapshotKey); err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		for j, d := range info {
			sockets[d.Index] = blk.Sockets[j]
		}
	}
	if err := rewriteConfig(cfg, rewrite{
		oldStateDir: meta.StateDir,
		paths:       p,
		disks:       diskPaths,
		sockets:     sockets,
		network:     spec.Network,
		console:     spec.ConsoleRecipient != "",
		landlock:    b.landlock(ver),
	}); err != nil {
		return nil, err
	}
	if err := writeJSON(filepath.Join(stage, vmConfigName), cfg); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}

	if m, err = b.start(ctx, bin, ver, spec.ID, p); err != nil {
		return nil, err
	}
	if blk != nil {
		m.data.BlockDir, m.data.Served = blk.Dir, info
	}
	m.data.Encrypted = meta.Encrypted
	if spec.ConsoleRecipient != "" {
		m.data.ConsoleRecipient, m.data.SerialSocket = spec.ConsoleRecipient, p.serialSocket
		if err := b.startDrain(m); err != nil {
			return nil, err
		}
	}
	if err := m.api.Restore(ctx, RestoreConfig{SourceURL: "file://" + stage}); err != nil {
		return nil, fmt.Errorf("vm.restore: %w%s", err, m.logHint())
	}
	// Memory was copied into the guest (the default Copy restore mode), so
	// the staged files are no longer needed.
	if err := removeStage(stage); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := m.api.ResumeVM(ctx); err != nil {
		return nil, fmt.Errorf("vm.resume after restore: %w%s", err, m.logHint())
	}
	if blk != nil {
		bases := map[int]string{}
		for j, d := range info {
			bases[j] = d.Base
		}
		if err := blk.Detach(ctx, bases); err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
	}
	return m, nil
}

// fillSpecFromConfig takes sizes and payload from the snapshot.
func fillSpecFromConfig(spec *hypervisor.Spec, cfg map[string]any) error {
	var c VmConfig
	b, _ := json.Marshal(cfg)
	if err := json.Unmarshal(b, &c); err != nil {
		return fmt.Errorf("config.json: %w", err)
	}
	if c.Cpus == nil || c.Memory == nil {
		return errors.New("config.json has no cpus or memory")
	}
	spec.VCPUs = c.Cpus.BootVcpus
	spec.MemoryMB = int(c.Memory.Size >> 20)
	spec.Kernel = c.Payload.Kernel
	spec.Initrd = c.Payload.Initramfs
	spec.Cmdline = c.Payload.Cmdline
	spec.Disks = nil // the snapshot's disks are used, see meta
	return nil
}

// rewrite is what changes between a snapshot's config and its clone's.
type rewrite struct {
	oldStateDir string
	paths       machinePaths
	// disks are the clone's disk paths, or for a vhost-user disk its
	// socket in sockets (same index; empty where not).
	disks, sockets []string
	network        *hypervisor.Network
	// console: the clone's console is encrypted (the VMM serves it on
	// paths.serialSocket), else a file.
	console  bool
	landlock bool
}

// rewriteConfig edits a config.json decoded with UseNumber, keeping every
// field it does not know about as it was.
func rewriteConfig(cfg map[string]any, rw rewrite) error {
	if v, ok := cfg["vsock"].(map[string]any); ok {
		v["socket"] = rw.paths.vsockSocket
	} else {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot config has no vsock device")
	}
	// The clone's console is its own: a socket drained into its
	// encrypted log, or a plain file, whatever the source's was (the
	// serial device's state does not depend on where its output goes).
	if serial, ok := cfg["serial"].(map[string]any); ok {
		switch mode := serial["mode"]; {
		case mode != string(ConsoleModeFile) && mode != string(ConsoleModeSocket):
			// (Off, Null, Tty: nothing to move.)
		case rw.console:
			delete(serial, "file")
			serial["mode"], serial["socket"] = string(ConsoleModeSocket), rw.paths.serialSocket
		default:
			delete(serial, "socket")
			serial["mode"], serial["file"] = string(ConsoleModeFile), rw.paths.serialLog
		}
	}
	disks, _ := cfg["disks"].([]any)
	if len(disks) != len(rw.disks) {
		return hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot config has %d disks, metadata %d", len(disks), len(rw.disks))
	}
	for i, d := range disks {
		dm, ok := d.(map[string]any)
		if !ok {
			return hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot config disk %d is not an object", i)
		}
		if dm["vhost_user"] == true {
			if i >= len(rw.sockets) || rw.sockets[i] == "" {
				return hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot config disk %d is a vhost-user disk the snapshot has no copy of", i)
			}
			dm["vhost_socket"] = rw.sockets[i]
			continue
		}
		dm["path"] = rw.disks[i]
	}
	nets, _ := cfg["net"].([]any)
	switch {
	case len(nets) == 0 && rw.network != nil:
		return hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot has no network device to attach tap %s to", rw.network.Tap)
	case len(nets) > 0 && rw.network == nil:
		return hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot has a network device: the clone's spec needs a network")
	case len(nets) > 1:
		return hypervisor.Errorf(hypervisor.ErrUnsupported, "snapshot has %d network devices", len(nets))
	case len(nets) == 1:
		nm, ok := nets[0].(map[string]any)
		if !ok {
			return hypervisor.Errorf(hypervisor.ErrInvalid, "snapshot config net 0 is not an object")
		}
		nm["tap"] = rw.network.Tap
		// The guest keeps the MAC in its restored device state; this only
		// keeps the config consistent with the clone's spec.
		nm["mac"] = rw.network.MAC
	}
	// Landlock follows this host, not the snapshot's: rules naming the old
	// state dir move to the new one.
	delete(cfg, "landlock_enable")
	var rules []any
	if old, _ := cfg["landlock_rules"].([]any); rw.landlock {
		rules = append(rules, map[string]any{"path": rw.paths.stateDir, "access": "rw"})
		for _, r := range old {
			if rm, ok := r.(map[string]any); ok && rm["path"] != rw.oldStateDir {
				rules = append(rules, rm)
			}
		}
		cfg["landlock_enable"] = true
	}
	delete(cfg, "landlock_rules")
	if rules != nil {
		cfg["landlock_rules"] = rules
	}
	return nil
}

// stageSnapshotFiles links (or copies) the VMM's snapshot files into the
// restore staging dir, leaving out what Restore writes itself.
func stageSnapshotFiles(ctx context.Context, src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || name == vmConfigName || name == snapshotMetaName || strings.HasPrefix(name, "disk-") {
			continue
		}
		s, d := filepath.Join(src, name), filepath.Join(dst, name)
		// A hard link costs nothing for a multi-GiB memory image; the VMM
		// only reads it.
		if err := os.Link(s, d); err == nil {
			continue
		}
		if err := copyFile(ctx, s, d); err != nil {
			return err
		}
	}
	return nil
}

func diskExt(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ".img"
	}
	defer f.Close()
	magic := make([]byte, 4)
	if _, err := io.ReadFull(f, magic); err == nil && bytes.Equal(magic, []byte("QFI\xfb")) {
		return ".qcow2"
	}
	return ".raw"
}

// copyFile copies a (possibly large, sparse) file with cp, which keeps
// holes and uses reflinks where the filesystem has them.
func copyFile(ctx context.Context, src, dst string) error {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "cp", "--sparse=always", "--reflink=auto", "--", src, dst)
	cmd.Stdout = &limitedBuffer{buf: &out, max: 2048}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("copy %s: %w: %s", src, err, cleanMessage(out.Bytes()))
	}
	return os.Chmod(dst, 0o600)
}

// moveDir renames src to dst, copying across filesystems.
func moveDir(ctx context.Context, src, dst string) error {
	err := os.Rename(src, dst)
	if err == nil || !errors.Is(err, syscall.EXDEV) {
		return err
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "cp", "-a", "--sparse=always", "--reflink=auto", "--", src, dst)
	cmd.Stdout = &limitedBuffer{buf: &out, max: 2048}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		os.RemoveAll(dst)
		return fmt.Errorf("copy %s to %s: %w: %s", src, dst, err, cleanMessage(out.Bytes()))
	}
	return os.RemoveAll(src)
}

func readJSON(path string, v any) error {
	b, err := readLimited(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// readConfig decodes config.json keeping numbers exact.
func readConfig(path string) (map[string]any, error) {
	b, err := readLimited(path)
	if err != nil {
		return nil, err
	}
	return decodeConfig(path, b)
}

// readSealedConfig reads a config.json sealed under key.
func readSealedConfig(path string, key []byte) (map[string]any, error) {
	b, err := readSealed(path, key, maxConfigBytes)
	if err != nil {
		return nil, err
	}
	return decodeConfig(path, b)
}

func decodeConfig(path string, b []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var cfg map[string]any
	if err := dec.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxConfigBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxConfigBytes)
	}
	return b, nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o600)
}
