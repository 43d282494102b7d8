package harebox

import (
	"log/slog"
	"net/netip"
	"net/url"
	"path/filepath"
	"time"

	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/capacity"
	"github.com/harebox/harebox/clone"
	"github.com/harebox/harebox/files"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/stall"
	"github.com/harebox/harebox/mesh"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// Options configure an Engine. The zero value works on one Linux host.
type Options struct {
	// DataDir holds the database, images, machine state and keys.
	// Default /var/lib/harebox. Keep it short: Unix socket paths under it
	// are limited to 107 bytes.
	DataDir string

	// Hypervisor is an in-process backend. If nil, the engine starts the
	// Backend plugin binary.
	Hypervisor hypervisor.Hypervisor
	// Backend names the plugin: "qemu" (default) or "cloud-hypervisor".
	Backend string
	// PluginPath is the plugin binary; default harebox-plugin-<Backend>
	// beside the executable, else on PATH.
	PluginPath string
	// PluginArgs are passed to the plugin binary.
	PluginArgs []string

	Network network.Network // default network.None
	// MeshPool is the address space of the projects' private meshes (a
	// /22 each), the same on every host of a deployment; default
	// mesh.DefaultPool. The mesh needs a Network that implements
	// network.Mesher.
	MeshPool netip.Prefix
	// MeshTunnel is this host's end of the mesh's tunnels to the other
	// hosts of a deployment (network/wgtunnel), reached at MeshEndpoint
	// (an underlay address of this host and the tunnel's UDP port): the
	// engine publishes both and keeps the tunnel's peers in step with the
	// store (mesh.Tunnels). Nil: the mesh stays on this host. The
	// Network must send the mesh's traffic for other hosts into it
	// (linuxnet.Options.MeshTunnel).
	MeshTunnel   mesh.Tunnel
	MeshEndpoint netip.AddrPort
	// MaxVolumeGB bounds one volume's size; default 100.
	// ProjectVolumeGB bounds a project's volumes together; default 1000.
	MaxVolumeGB, ProjectVolumeGB int
	// Ingress is the public base URL (https://HOST[:PORT]) of the ingress
	// that serves published ports (URLs(), served by the caller); nil:
	// ports cannot be published. The Network must implement
	// network.Ingress.
	Ingress *url.URL
	// DefaultFirewall is the policy of sandboxes created without one;
	// default firewall.Default() (the public internet only).
	DefaultFirewall *firewall.Policy
	Secrets         secrets.Store  // default sealed rows in the database
	Billing         budget.Billing // optional copy of every metered interval
	Store           store.Store    // default SQLite in DataDir/harebox.db

	// Images maps image names to built images. Names not here are looked
	// up in ImageDir (default DataDir/images), as built by harebox-image.
	Images   map[string]images.Image
	ImageDir string
	// AgentPath is the static harebox-agent binary images are built with
	// (Images().Build); empty means this engine builds no images.
	AgentPath string

	// Site is where this host runs, reported on every sandbox.
	Site sandbox.Site
	// Capacity bounds what Create admits.
	Capacity Capacity
	// Host names this host among those that share the Store.
	Host HostOptions
	// BootTimeout bounds create-to-ready; default 3 minutes (TCG is slow).
	BootTimeout time.Duration
	// Now is the engine's clock for command history, its retention and
	// metering; default time.Now (tests move it).
	Now func() time.Time
	// Prices turn usage into money; default budget.DefaultPrices.
	Prices *budget.Prices
	// MeterInterval is how often every sandbox's usage is settled against
	// its budgets, and what a reservation covers; default 5 s. Negative:
	// reservations cover 5 s but nothing settles on its own (tests call
	// Meter().Settle).
	MeterInterval time.Duration
	// GoldenSnapshots makes creates restore from a golden snapshot of
	// their image and size (booted once, in the background, on the first
	// create of each) instead of booting, once there is one (package
	// clone).
	GoldenSnapshots bool
	// GoldenSharedMemory has the sandboxes restored from a golden
	// snapshot (warm-pool members too) share its memory copy-on-write
	// where the backend can (QEMU; hypervisor.Spec.SharedMemory): an
	// idle sandbox holds a small part of the memory it would, and its
	// guest runs slower while it first writes its pages (measured in
	// docs/hypervisors.md).
	GoldenSharedMemory bool
	// GoldenDir holds the golden snapshots (default DataDir/golden). They
	// are kept there across restarts, each one's key sealed under
	// GoldenKey; engines on one machine that share GoldenDir, GoldenKey
	// and their image builds share them (each is made once, by one of
	// them, under a lock).
	GoldenDir string
	// GoldenKey is the file of the 32-byte key that seals the golden
	// snapshots' keys (default the host's master key, DataDir/master.key;
	// made if missing).
	GoldenKey string
	// Pool keeps that many sandboxes restored from the golden snapshot
	// idle and ready for each "IMAGE:PRESET" (package clone): a create of
	// that image and size claims one. A pool implies GoldenSnapshots.
	// The deployment's pool, once set (Engine.Pool().Set, harebox pool
	// set), replaces it until it is reset.
	Pool map[string]int
	// MetricsInterval is how often every sandbox created with monitoring
	// on is sampled (CPU, memory, disk, network, from the host side);
	// default 15 s, negative never (tests call Monitor().Sample).
	MetricsInterval time.Duration
	// HealthInterval is how often the agent of every running sandbox is
	// asked for its health; default 15 s, negative never. A sandbox whose
	// agent misses two checks in a row reports agent "unresponsive".
	HealthInterval time.Duration
	// MaxFileBytes bounds one file written or read; default 256 MiB.
	MaxFileBytes int64
	// MaxOutputBytes bounds collected stdout and stderr, each; default 8 MiB.
	MaxOutputBytes int
	// PlaintextDisks turns crypto-erase off: sandboxes get no data key,
	// their disks and snapshots are plain files and delete only removes
	// them. A backend that cannot encrypt (Cloud Hypervisor without root,
	// qemu-img or qemu-storage-daemon) needs it: New refuses such a
	// backend without it.
	PlaintextDisks bool

	// AuditAnchor also keeps every checkpoint of the audit log, outside
	// the database (audit.Anchor); default audit.None. The caller closes
	// it after the engine.
	AuditAnchor audit.Anchor
	// AuditCheckpointInterval is how long an audit entry waits for its
	// signed checkpoint at most; default audit.CheckpointInterval.
	AuditCheckpointInterval time.Duration

	Logger *slog.Logger

	// bootStall says when a cold boot has stalled; the zero Rule is the
	// defaults (tests set it: SetBootStall).
	bootStall stall.Rule
}

// Capacity bounds the resources sandboxes may reserve on this host.
type Capacity = capacity.Options

func (o *Options) defaults() error {
	if _, err := clone.ParsePool(o.Pool); err != nil {
		return err
	}
	if len(o.Pool) > 0 {
		o.GoldenSnapshots = true
	}
	if o.DataDir == "" {
		o.DataDir = "/var/lib/harebox"
	}
	abs, err := filepath.Abs(o.DataDir)
	if err != nil {
		return err
	}
	o.DataDir = abs
	// DataDir/m/<sandbox id>/agent.sock must fit a Unix socket path.
	if len(o.DataDir) > 60 {
		return sandbox.Errorf(sandbox.ErrInvalid, "data_dir", "%q is longer than 60 bytes; Unix socket paths under it would not fit", o.DataDir)
	}
	if o.Backend == "" {
		o.Backend = "qemu"
	}
	if o.ImageDir == "" {
		o.ImageDir = filepath.Join(o.DataDir, "images")
	}
	if o.GoldenDir == "" {
		o.GoldenDir = filepath.Join(o.DataDir, "golden")
	}
	if o.GoldenDir, err = filepath.Abs(o.GoldenDir); err != nil {
		return err
	}
	// (Its golden machines' sockets live under it too, 41 bytes deeper.)
	if len(o.GoldenDir) > 67 && o.GoldenSnapshots {
		return sandbox.Errorf(sandbox.ErrInvalid, "golden_dir", "%q is longer than 67 bytes; Unix socket paths under it would not fit", o.GoldenDir)
	}
	if o.GoldenKey == "" {
		o.GoldenKey = filepath.Join(o.DataDir, "master.key")
	}
	if o.Network == nil {
		o.Network = network.None{}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Prices == nil {
		p := budget.DefaultPrices
		o.Prices = &p
	}
	if o.MeterInterval == 0 {
		o.MeterInterval = 5 * time.Second
	}
	if o.MetricsInterval == 0 {
		o.MetricsInterval = 15 * time.Second
	}
	if o.HealthInterval == 0 {
		o.HealthInterval = 15 * time.Second
	}
	if o.BootTimeout == 0 {
		o.BootTimeout = 3 * time.Minute
	}
	if o.MaxFileBytes == 0 {
		o.MaxFileBytes = files.DefaultMaxFileBytes
	}
	if o.MaxOutputBytes == 0 {
		o.MaxOutputBytes = 8 << 20
	}
	if o.Site.Name == "" {
		o.Site = sandbox.Site{Name: "local", Country: ""}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// limits computes admission limits from the host's size.
