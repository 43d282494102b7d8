// Package guest implements the guest agent's gRPC service (agentpb.AgentServer):
// exec, files, health, time, reseed and shutdown, inside the VM.
package guest

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/internal/fsync"
)

// Version is the agent's version, set at build time with
// -ldflags "-X github.com/harebox/harebox/agent/guest.Version=...".
var Version = "0.1.0"

// ModeEnv is set to "init" by the agent's PID 1 when it starts the service,
// so the service knows a Shutdown must go through its parent.
const ModeEnv = "HAREBOX_AGENT_MODE"

// Options configure a Server. The zero value serves the real machine.
type Options struct {
	// Mode is "init" or "service"; empty reads ModeEnv.
	Mode string
	// Root is the directory holding etc/passwd, etc/group and
	// etc/machine-id; empty means "/". Tests point it at a temporary tree.
	Root string
	// Logf logs one line; nil logs with the standard logger.
	Logf func(format string, args ...any)

	// The hooks below change machine-wide state. Nil means the real system
	// call; tests replace them so they never touch the host.
	SetHostname func(name string) error
	SetClock    func(t time.Time) error
	AddEntropy  func(b []byte) error
	PowerOff    func(reboot bool) error
	// SetNetwork moves the interface to cfg (a clone's network).
	SetNetwork func(ctx context.Context, cfg *NetworkConfig) error
}

// Server implements agentpb.AgentServer.
type Server struct {
	agentpb.UnimplementedAgentServer
	opts  Options
	start time.Time

	// etcMu serialises writes under /etc (machine-id) so concurrent Reseed
	// calls cannot interleave their temp files.
	etcMu sync.Mutex

	// cmds are the commands the agent owns (Start).
	cmds *Commands
	// watches counts the Watch calls running.
	watches atomic.Int32
	// conns counts the Connect calls running.
	conns atomic.Int32
	// modMu guards modsLoaded: the on-demand modules are loaded (volumes).
	modMu      sync.Mutex
	modsLoaded bool
	// frozenMu guards frozen: the volumes frozen (FreezeVolume), by
	// mount path, each with the timer that thaws it.
	frozenMu sync.Mutex
	frozen   map[string]*time.Timer
}

// New returns a Server with opts' defaults filled in.
func New(opts Options) *Server {
	if opts.Mode == "" {
		opts.Mode = "service"
		if os.Getenv(ModeEnv) == "init" {
			opts.Mode = "init"
		}
	}
	if opts.Root == "" {
		opts.Root = "/"
	}
	if opts.Logf == nil {
		opts.Logf = log.Printf
	}
	if opts.SetHostname == nil {
		opts.SetHostname = func(name string) error { return unix.Sethostname([]byte(name)) }
	}
	if opts.SetClock == nil {
		opts.SetClock = setClock
	}
	if opts.AddEntropy == nil {
		opts.AddEntropy = addEntropy
	}
	if opts.SetNetwork == nil {
		root := opts.Root
		opts.SetNetwork = func(ctx context.Context, cfg *NetworkConfig) error { return MoveNetwork(ctx, cfg, root) }
	}
	if opts.PowerOff == nil {
		mode := opts.Mode
		opts.PowerOff = func(reboot bool) error { return powerOff(mode, reboot) }
	}
	s := &Server{opts: opts, start: time.Now()}
	s.cmds = NewCommands(s.Exec, validateStart)
	return s
}

func (s *Server) etcPath(name string) string {
	return filepath.Join(s.opts.Root, "etc", name)
}

// Health reports version, uptime, mode and kernel release.
func (s *Server) Health(context.Context, *agentpb.HealthRequest) (*agentpb.HealthResponse, error) {
	var u unix.Utsname
	kernel := ""
	if err := unix.Uname(&u); err == nil {
		kernel = unix.ByteSliceToString(u.Release[:])
	}
	return &agentpb.HealthResponse{
		Version:       Version,
		Protocol:      layout.Protocol,
		UptimeSeconds: time.Since(s.start).Seconds(),
		Mode:          s.opts.Mode,
		Kernel:        kernel,
	}, nil
}

// SyncTime sets the wall clock.
func (s *Server) SyncTime(_ context.Context, req *agentpb.SyncTimeRequest) (*agentpb.Empty, error) {
	if req.GetUnixNano() <= 0 {
		return nil, status.Error(codes.InvalidArgument, "unix_nano must be positive")
	}
	if err := s.opts.SetClock(time.Unix(0, req.GetUnixNano())); err != nil {
		return nil, fsError("set clock", err)
	}
	return &agentpb.Empty{}, nil
}

func setClock(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("clock_settime: %w", err)
	}
	return nil
}

var (
	machineIDRe = regexp.MustCompile(`^[0-9a-f]{32}$`)
	hostnameRe  = regexp.MustCompile(`^[a-z0-9-]{1,63}$`)
)

const (
	minEntropy = 32
	maxEntropy = 512
)

// Reseed mixes host entropy into the kernel CRNG, forces a reseed and writes
// a new machine-id (and hostname), so a clone shares no randomness with its
// parent.
func (s *Server) Reseed(_ context.Context, req *agentpb.ReseedRequest) (*agentpb.ReseedResponse, error) {
	if n := len(req.GetEntropy()); n < minEntropy || n > maxEntropy {
		return nil, status.Errorf(codes.InvalidArgument, "entropy must be %d-%d bytes, got %d", minEntropy, maxEntropy, n)
	}
	if !machineIDRe.MatchString(req.GetMachineId()) {
		return nil, status.Error(codes.InvalidArgument, "machine_id must be 32 lower-case hex characters")
	}
	if h := req.GetHostname(); h != "" && !hostnameRe.MatchString(h) {
		return nil, status.Error(codes.InvalidArgument, "hostname must match [a-z0-9-]{1,63}")
	}
	if err := s.opts.AddEntropy(req.GetEntropy()); err != nil {
		return nil, status.Errorf(codes.Internal, "add entropy: %v", err)
	}
	if err := s.writeMachineID(req.GetMachineId()); err != nil {
		return nil, fsError("write machine-id", err)
	}
	if h := req.GetHostname(); h != "" {
		if err := s.opts.SetHostname(h); err != nil {
			return nil, fsError("set hostname", err)
		}
	}
	return &agentpb.ReseedResponse{MachineId: req.GetMachineId()}, nil
}

// maxNetworkCmdline bounds SetNetwork's parameters.
const maxNetworkCmdline = 1024

// SetNetwork gives the interface a clone's own address, gateway, DNS
// server and MAC.
func (s *Server) SetNetwork(ctx context.Context, req *agentpb.SetNetworkRequest) (*agentpb.Empty, error) {
	if len(req.GetCmdline()) > maxNetworkCmdline {
		return nil, status.Errorf(codes.InvalidArgument, "cmdline longer than %d bytes", maxNetworkCmdline)
	}
	cfg, err := ParseNetworkConfig(req.GetCmdline())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	if cfg == nil {
		return nil, status.Error(codes.InvalidArgument, "cmdline names no network")
	}
	if err := s.opts.SetNetwork(ctx, cfg); err != nil {
		return nil, status.Errorf(codes.Internal, "set network: %v", err)
	}
	return &agentpb.Empty{}, nil
}

func (s *Server) writeMachineID(id string) error {
	s.etcMu.Lock()
	defer s.etcMu.Unlock()
	etc := filepath.Dir(s.etcPath("machine-id"))
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", etc, err)
	}
	// systemd keeps machine-id read-only; match it.
	return writeFileAtomic(s.etcPath("machine-id"), []byte(id+"\n"), 0o444)
}

// writeFileAtomic writes data to a temp file beside path, syncs it and
// renames it into place, so readers see the old or the new file, never half.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create temp for %s: %w", path, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("chmod %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename to %s: %w", path, err)
	}
	ok = true
	fsync.Dir(filepath.Dir(path)) // (best effort: a failure costs only durability)
	return nil
}

// addEntropy credits b to the kernel pool and forces the CRNG to reseed.
func addEntropy(b []byte) error {
	f, err := os.OpenFile("/dev/random", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open /dev/random: %w", err)
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(b)+3)
	putInt32(info[0:], int32(8*len(b)))
	putInt32(info[4:], int32(len(b)))
	copy(info[8:], b)
	return control(f, func(fd int) error {
		if err := ioctlPtr(fd, unix.RNDADDENTROPY, &info[0]); err != nil {
			return fmt.Errorf("RNDADDENTROPY: %w", err)
		}
		// Kernels before 5.x lack RNDRESEEDCRNG; the entropy was still added.
		if err := ioctlPtr(fd, unix.RNDRESEEDCRNG, nil); err != nil &&
			!errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("RNDRESEEDCRNG: %w", err)
		}
		return nil
	})
}

// Shutdown answers first, then powers off (or reboots) in the background.
func (s *Server) Shutdown(_ context.Context, req *agentpb.ShutdownRequest) (*agentpb.Empty, error) {
	reboot := req.GetReboot()
	go func() {
		// Give gRPC a moment to flush the response to the host.
		time.Sleep(200 * time.Millisecond)
		if err := s.opts.PowerOff(reboot); err != nil {
			s.opts.Logf("shutdown: %v", err)
		}
	}()
	return &agentpb.Empty{}, nil
}

// powerOff hands the job to whoever owns the machine: our PID 1 in init
// mode (SIGUSR2 power off, SIGUSR1 reboot), else systemd, else the kernel.
func powerOff(mode string, reboot bool) error {
	if mode == "init" {
		sig := syscall.SIGUSR2
		if reboot {
			sig = syscall.SIGUSR1
		}
		return syscall.Kill(os.Getppid(), sig)
	}
	verb := "poweroff"
	if reboot {
		verb = "reboot"
	}
	if path, err := exec.LookPath("systemctl"); err == nil {
		if out, err := exec.Command(path, verb).CombinedOutput(); err == nil {
			return nil
		} else {
			log.Printf("systemctl %s: %v: %s", verb, err, strings.TrimSpace(string(out)))
		}
	}
	unix.Sync()
	cmd := unix.LINUX_REBOOT_CMD_POWER_OFF
	if reboot {
		cmd = unix.LINUX_REBOOT_CMD_RESTART
	}
	return unix.Reboot(cmd)
}
