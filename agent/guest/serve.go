package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/agent/transport"
)

// MaxMsgSize bounds one gRPC message each way.
const MaxMsgSize = 4 << 20

// NewGRPCServer returns a gRPC server serving srv.
func NewGRPCServer(srv agentpb.AgentServer) *grpc.Server {
	gs := grpc.NewServer(
		grpc.MaxRecvMsgSize(MaxMsgSize),
		grpc.MaxSendMsgSize(MaxMsgSize),
		// The host may ping an idle session to spot a dead link; allow it
		// rather than answering with GOAWAY "too many pings".
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             5 * time.Second,
			PermitWithoutStream: true,
		}),
	)
	agentpb.RegisterAgentServer(gs, srv)
	return gs
}

// ServeConn runs one yamux session over conn and serves srv on it until the
// session dies or ctx ends. It closes conn. In-flight calls are cancelled,
// which kills the process groups of running execs: their client is gone.
func ServeConn(ctx context.Context, conn io.ReadWriteCloser, srv agentpb.AgentServer) error {
	sess, err := transport.Server(conn)
	if err != nil {
		conn.Close()
		return fmt.Errorf("start session: %w", err)
	}
	// Announce this session, so a host still talking to a previous agent
	// session on this channel notices at once and reconnects; Health
	// names it, so a host knows the session that answers is the one that
	// announced itself to it.
	nonce := transport.NewNonce()
	go transport.SendHello(sess, nonce)
	gs := NewGRPCServer(sessionServer{AgentServer: srv, nonce: nonce})
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	// A session that died of an error gRPC takes for temporary (a read
	// deadline) would keep Serve retrying Accept forever: stop it.
	go func() { <-sess.CloseChan(); gs.Stop() }()
	err = gs.Serve(sess)
	gs.Stop()
	sess.Close()
	conn.Close()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// sessionServer is srv on one session: its Health names the session.
type sessionServer struct {
	agentpb.AgentServer
	nonce []byte
}

func (s sessionServer) Health(ctx context.Context, r *agentpb.HealthRequest) (*agentpb.HealthResponse, error) {
	h, err := s.AgentServer.Health(ctx, r)
	if h != nil {
		h.Session = s.nonce
	}
	return h, err
}

// ServeOptions configure the long-running serve loops.
type ServeOptions struct {
	// SerialName is the virtio-serial port name (layout.SerialName).
	SerialName string
	// SysDir and DevDir default to /sys and /dev.
	SysDir, DevDir string
	Logf           func(format string, args ...any)
	// NoNetwork skips configuring the network from /proc/cmdline.
	NoNetwork bool
}

func (o *ServeOptions) defaults() {
	if o.SysDir == "" {
		o.SysDir = "/sys"
	}
	if o.DevDir == "" {
		o.DevDir = "/dev"
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
}

// FindSerialPort returns the device path of the virtio-serial port named
// name: the udev symlink when present, else the vportNpM whose sysfs name
// matches, created from its sysfs dev numbers if devtmpfs lacks it.
func FindSerialPort(opts ServeOptions, name string) (string, error) {
	opts.defaults()
	if link := filepath.Join(opts.DevDir, "virtio-ports", name); exists(link) {
		return link, nil
	}
	matches, _ := filepath.Glob(filepath.Join(opts.SysDir, "class/virtio-ports/vport*"))
	for _, dir := range matches {
		b, err := os.ReadFile(filepath.Join(dir, "name"))
		if err != nil || strings.TrimSpace(string(b)) != name {
			continue
		}
		dev := filepath.Join(opts.DevDir, filepath.Base(dir))
		if exists(dev) {
			return dev, nil
		}
		if err := mknodFromSysfs(dev, filepath.Join(dir, "dev")); err != nil {
			return "", err
		}
		return dev, nil
	}
	return "", fmt.Errorf("virtio-serial port %q: %w", name, os.ErrNotExist)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// mknodFromSysfs creates the character device dev from a sysfs "dev" file
// ("MAJOR:MINOR").
func mknodFromSysfs(dev, sysDevFile string) error {
	b, err := os.ReadFile(sysDevFile)
	if err != nil {
		return fmt.Errorf("read %s: %w", sysDevFile, err)
	}
	maj, min, err := ParseDevNumbers(string(b))
	if err != nil {
		return fmt.Errorf("%s: %w", sysDevFile, err)
	}
	if err := unix.Mknod(dev, unix.S_IFCHR|0o600, int(unix.Mkdev(maj, min))); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("mknod %s: %w", dev, err)
	}
	return nil
}

// ParseDevNumbers parses a sysfs dev file's "MAJOR:MINOR".
func ParseDevNumbers(s string) (major, minor uint32, err error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), ":")
	ma, err1 := strconv.ParseUint(a, 10, 32)
	mi, err2 := strconv.ParseUint(b, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("bad device numbers %q", s)
	}
	return uint32(ma), uint32(mi), nil
}

// ServeSerial serves srv on the virtio-serial port forever (until ctx
// ends). Each host connection gets a fresh session: when the host side
// closes (or a snapshot is restored and the host reconnects) the port reads
// EOF, the session dies, and the port is reopened.
func ServeSerial(ctx context.Context, srv agentpb.AgentServer, opts ServeOptions) {
	opts.defaults()
	// Every guest that serves the host (init-supervised or under systemd)
	// passes here first, so this is where the host's network parameters
	// are applied; a no-op without them.
	if !opts.NoNetwork {
		SetupNetworkFromCmdline(ctx, opts.Logf)
	}
	var lastErr string
	logOnce := func(err error) {
		if s := err.Error(); s != lastErr {
			opts.Logf("serial: %v", err)
			lastErr = s
		}
	}
	for ctx.Err() == nil {
		f, err := openSerial(opts)
		if err != nil {
			logOnce(err)
			sleep(ctx, time.Second)
			continue
		}
		if err := waitForHost(ctx, f); err != nil {
			f.Close()
			if !errors.Is(err, errNoHost) && !errors.Is(err, context.Canceled) {
				logOnce(err)
			}
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		opts.Logf("serial: host connected on %s", f.Name())
		lastErr = ""
		err = ServeConn(ctx, f, srv)
		opts.Logf("serial: session ended: %v", err)
		sleep(ctx, 100*time.Millisecond)
	}
}

func openSerial(opts ServeOptions) (*os.File, error) {
	dev, err := FindSerialPort(opts, opts.SerialName)
	if err != nil {
		return nil, err
	}
	// O_NONBLOCK makes the runtime poller drive the port, so Close can
	// interrupt a pending read.
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dev, err)
	}
	return f, nil
}

// errNoHost: the host side of the port is not connected.
var errNoHost = errors.New("no host connected")

// waitForHost waits until a host is connected, or reports errNoHost. While
// no host is connected the port polls hung up (and readable: a read returns
// EOF at once), so a session started then would die at once. Once one is,
// the port polls writable: the session starts without waiting for the host
// to speak, so its hello reaches a host that is still attached to a previous
// agent session at once. The caller reopens the port after errNoHost:
// closing it discards bytes a previous host connection left unread, which
// would otherwise corrupt the next session's framing.
func waitForHost(ctx context.Context, f *os.File) error {
	for ctx.Err() == nil {
		var revents int16
		err := control(f, func(fd int) error {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLOUT}}
			_, err := unix.Poll(fds, 500)
			revents = fds[0].Revents
			return err
		})
		switch {
		case err != nil && !errors.Is(err, unix.EINTR):
			return fmt.Errorf("poll %s: %w", f.Name(), err)
		case revents&(unix.POLLHUP|unix.POLLERR) != 0:
			return errNoHost
		case revents&(unix.POLLIN|unix.POLLOUT) != 0:
			return nil
		}
	}
	return ctx.Err()
}

// ServeListener serves srv on every connection l accepts (vsock), each with
// its own session, until ctx ends.
func ServeListener(ctx context.Context, l net.Listener, srv agentpb.AgentServer, logf func(string, ...any)) {
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			logf("accept on %s: %v", l.Addr(), err)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		go func() {
			err := ServeConn(ctx, c, srv)
			logf("session from %s ended: %v", c.RemoteAddr(), err)
		}()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
