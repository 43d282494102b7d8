package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/agent/kmod"
	"github.com/harebox/harebox/agent/layout"
)

// A volume is a disk the host plugs in while the guest runs (a SCSI disk
// whose serial is the volume's ID); the agent finds it by that serial
// and mounts it where the sandbox asked.

var serialRE = regexp.MustCompile(`^[a-z0-9-]{1,20}$`)

// volumeWait bounds how long MountVolume waits for a plugged disk to show.
const volumeWait = 15 * time.Second

func checkMountPath(p string) error {
	if err := CheckPath(p); err != nil {
		return err
	}
	if !layout.VolumeMountAllowed(p) {
		return status.Errorf(codes.InvalidArgument, "a volume cannot be mounted at %s (over the system's own files)", p)
	}
	return nil
}

// loadOnDemand loads, once, the modules volumes need, which the boot
// leaves out (layout.ModulesOnDemand: 0.16 s of a boot under software
// emulation): the copies staged on /run after a switch to a root disk,
// else the initramfs's own. Without either list (an image built before
// there were any) the boot loaded them.
func (s *Server) loadOnDemand() error {
	s.modMu.Lock()
	defer s.modMu.Unlock()
	if s.modsLoaded {
		return nil
	}
	for _, list := range []string{layout.ModulesStaged, layout.ModulesOnDemand} {
		loaded, total, err := kmod.LoadList(filepath.Join(s.opts.Root, list))
		if errors.Is(err, kmod.ErrNoList) {
			continue
		}
		if err != nil {
			return err
		}
		s.opts.Logf("loaded %d of %d on-demand modules (volumes)", loaded, total)
		break
	}
	s.modsLoaded = true
	return nil
}

// MountVolume implements agentpb.AgentServer.
func (s *Server) MountVolume(ctx context.Context, req *agentpb.MountVolumeRequest) (*agentpb.Empty, error) {
	if !serialRE.MatchString(req.GetSerial()) {
		return nil, status.Errorf(codes.InvalidArgument, "serial %q: want 1-20 of [a-z0-9-]", req.GetSerial())
	}
	path := req.GetPath()
	if err := checkMountPath(path); err != nil {
		return nil, err
	}
	var uid, gid int
	if !req.GetReadOnly() {
		var err error
		if uid, gid, err = s.owner(req.GetOwner()); err != nil {
			return nil, err
		}
	}
	if err := s.loadOnDemand(); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "the guest cannot load its disk drivers: %v", err)
	}
	dev, err := diskBySerial(ctx, req.GetSerial())
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		return nil, fsError("mkdir", err)
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if req.GetReadOnly() {
		flags |= unix.MS_RDONLY
	}
	if err := mountExt4(ctx, dev, path, flags, req.GetReadOnly()); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "mount %s at %s: %v", dev, path, err)
	}
	if req.GetReadOnly() {
		return &agentpb.Empty{}, nil
	}
	if _, err := GrowFS(dev, path); err != nil {
		s.opts.Logf("volume %s: grow: %v", req.GetSerial(), err)
	}
	if err := giveFresh(path, uid, gid); err != nil {
		unix.Unmount(path, unix.MNT_DETACH)
		return nil, fsError("chown", err)
	}
	return &agentpb.Empty{}, nil
}

// mountExt4 mounts dev at path. A disk just plugged in can show in sysfs
// a moment before it opens (ENXIO): that is tried again for a while.
func mountExt4(ctx context.Context, dev, path string, flags uintptr, readOnly bool) error {
	ctx, cancel := context.WithTimeout(ctx, volumeWait)
	defer cancel()
	for {
		err := unix.Mount(dev, path, "ext4", flags, "")
		if err != nil && readOnly && !errors.Is(err, unix.ENXIO) {
			// A journal left to replay (its writer stopped without
			// unmounting) cannot be replayed on a read-only disk: mount
			// without it.
			err = unix.Mount(dev, path, "ext4", flags, "noload")
		}
		if !errors.Is(err, unix.ENXIO) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// giveFresh gives a new filesystem's root (owned by root, with nothing in
// it but lost+found) to uid:gid: a volume is the sandbox user's, as its
// home is. A volume someone already wrote keeps its owners.
func giveFresh(path string, uid, gid int) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return err
	}
	if st.Uid != 0 || uid == 0 {
		return nil
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Name() != "lost+found" {
			return nil
		}
	}
	return os.Chown(path, uid, gid)
}

// diskBySerial waits for the disk whose SCSI serial (VPD page 0x80) is
// serial, or the virtio disk whose filesystem's UUID is the volume's
// (layout.VolumeUUID: a vhost-user disk has no serial of its own), and
// returns its device node.
func diskBySerial(ctx context.Context, serial string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, volumeWait)
	defer cancel()
	uuid := layout.VolumeUUID(serial)
	for {
		ents, _ := os.ReadDir("/sys/block")
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "device", "vpd_pg80"))
			// The page is a 4-byte header, then the serial.
			bySerial := err == nil && len(b) >= 4 && string(bytes.TrimRight(b[4:], " \x00")) == serial
			if !bySerial && !strings.HasPrefix(e.Name(), "vd") {
				continue
			}
			dev := "/dev/" + e.Name()
			if _, err := os.Stat(dev); err != nil {
				// No udev (the minimal image): make the node.
				if err := mknodBlock(dev, filepath.Join("/sys/block", e.Name(), "dev")); err != nil {
					return "", status.Errorf(codes.Internal, "%s: %v", dev, err)
				}
			}
			if bySerial || ext4UUID(dev) == uuid {
				return dev, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", status.Errorf(codes.NotFound, "no disk with serial %q appeared in %s", serial, volumeWait)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ext4UUID is the UUID of the ext4 filesystem on dev (its superblock,
// at 1024 bytes: the magic at 0x38, the UUID at 0x68), "" if it holds
// none.
func ext4UUID(dev string) string {
	f, err := os.Open(dev)
	if err != nil {
		return ""
	}
	defer f.Close()
	sb := make([]byte, 0x78)
	if _, err := f.ReadAt(sb, 1024); err != nil || sb[0x38] != 0x53 || sb[0x39] != 0xef {
		return ""
	}
	u := sb[0x68:0x78]
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

func mknodBlock(dev, sysDev string) error {
	b, err := os.ReadFile(sysDev)
	if err != nil {
		return err
	}
	maj, mnr, ok := strings.Cut(strings.TrimSpace(string(b)), ":")
	if !ok {
		return errors.New("bad " + sysDev)
	}
	var ma, mi uint32
	for _, c := range maj {
		ma = ma*10 + uint32(c-'0')
	}
	for _, c := range mnr {
		mi = mi*10 + uint32(c-'0')
	}
	return unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(ma, mi)))
}

// UnmountVolume implements agentpb.AgentServer.
func (s *Server) UnmountVolume(ctx context.Context, req *agentpb.PathRequest) (*agentpb.Empty, error) {
	if err := checkMountPath(req.GetPath()); err != nil {
		return nil, err
	}
	s.thaw(req.GetPath()) // (a frozen filesystem does not unmount)
	unix.Sync()
	err := unix.Unmount(req.GetPath(), 0)
	if errors.Is(err, unix.EBUSY) {
		// A process with a file open there cannot keep the disk, which
		// the host is about to take away.
		err = unix.Unmount(req.GetPath(), unix.MNT_DETACH)
	}
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return nil, status.Errorf(codes.NotFound, "nothing is mounted at %s", req.GetPath())
		}
		return nil, fsError("unmount", err)
	}
	return &agentpb.Empty{}, nil
}

// The ioctls that freeze and thaw a filesystem (linux/fs.h: _IOWR('X',
// 119, int) and _IOWR('X', 120, int)).
const (
	ioctlFreeze = 0xc0045877
	ioctlThaw   = 0xc0045878
)

// maxFreeze bounds how long a volume stays frozen without a thaw: a
// host that died between the two must not leave the guest's writes
// waiting for good.
const maxFreeze = 30 * time.Second

// FreezeVolume implements agentpb.AgentServer.
func (s *Server) FreezeVolume(ctx context.Context, req *agentpb.FreezeVolumeRequest) (*agentpb.Empty, error) {
	path := req.GetPath()
	if err := checkMountPath(path); err != nil {
		return nil, err
	}
	d := time.Duration(req.GetSeconds()) * time.Second
	if d <= 0 || d > maxFreeze {
		return nil, status.Errorf(codes.InvalidArgument, "seconds %d: want 1 to %d", req.GetSeconds(), int(maxFreeze.Seconds()))
	}
	// Only a mount point: freezing a directory would freeze the
	// filesystem it is on (the root's, say).
	if err := isMountPoint(path); err != nil {
		return nil, err
	}
	s.frozenMu.Lock()
	defer s.frozenMu.Unlock()
	if t, ok := s.frozen[path]; ok {
		t.Reset(d)
		return &agentpb.Empty{}, nil
	}
	if err := fsIoctl(path, ioctlFreeze); err != nil {
		return nil, fsError("freeze", err)
	}
	if s.frozen == nil {
		s.frozen = map[string]*time.Timer{}
	}
	s.frozen[path] = time.AfterFunc(d, func() {
		s.opts.Logf("volume at %s: thawed after %s without a thaw", path, d)
		s.thaw(path)
	})
	return &agentpb.Empty{}, nil
}

// ThawVolume implements agentpb.AgentServer.
func (s *Server) ThawVolume(ctx context.Context, req *agentpb.PathRequest) (*agentpb.Empty, error) {
	if err := checkMountPath(req.GetPath()); err != nil {
		return nil, err
	}
	if err := s.thaw(req.GetPath()); err != nil {
		return nil, fsError("thaw", err)
	}
	return &agentpb.Empty{}, nil
}

// thaw thaws the volume at path if FreezeVolume froze it.
func (s *Server) thaw(path string) error {
	s.frozenMu.Lock()
	defer s.frozenMu.Unlock()
	t, ok := s.frozen[path]
	if !ok {
		return nil
	}
	t.Stop()
	delete(s.frozen, path)
	err := fsIoctl(path, ioctlThaw)
	if errors.Is(err, unix.EINVAL) {
		err = nil // (not frozen: thawed by someone else)
	}
	return err
}

// fsIoctl runs a freeze or thaw ioctl on the filesystem mounted at path.
func fsIoctl(path string, req uint) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.IoctlSetInt(fd, req, 0)
}

// isMountPoint says whether path is where a filesystem is mounted (its
// device is not its parent's).
func isMountPoint(path string) error {
	var st, parent unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fsError("stat", err)
	}
	if err := unix.Stat(filepath.Dir(path), &parent); err != nil {
		return fsError("stat", err)
	}
	if st.Dev == parent.Dev {
		return status.Errorf(codes.NotFound, "nothing is mounted at %s", path)
	}
	return nil
}
