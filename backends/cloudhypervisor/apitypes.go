package cloudhypervisor

// Request and response shapes of the Cloud Hypervisor REST API, limited to
// what HareBox sends or reads. Field names, JSON names and types follow
// components/schemas in the v53.0 OpenAPI document (testdata/ holds a copy):
// "integer" with format int64 is int64, "integer" without a format is int.
// Optional fields are omitempty (or pointers where the spec's default is
// true and we need to send false), so we never send a value the VMM would
// otherwise have defaulted differently.

// VmmPingResponse is the body of GET /vmm.ping.
type VmmPingResponse struct {
	BuildVersion string   `json:"build_version,omitempty"`
	Version      string   `json:"version"`
	Pid          int64    `json:"pid,omitempty"`
	Features     []string `json:"features,omitempty"`
}

// VmState is the spec's VmState enum.
type VmState string

const (
	VmStateCreated  VmState = "Created"
	VmStateRunning  VmState = "Running"
	VmStateShutdown VmState = "Shutdown"
	VmStatePaused   VmState = "Paused"
)

// VmInfo is the body of GET /vm.info.
type VmInfo struct {
	Config           VmConfig              `json:"config"`
	State            VmState               `json:"state"`
	MemoryActualSize *int64                `json:"memory_actual_size,omitempty"`
	DeviceTree       map[string]DeviceNode `json:"device_tree,omitempty"`
}

// DeviceNode is one entry of VmInfo.device_tree.
type DeviceNode struct {
	ID        string           `json:"id,omitempty"`
	Resources []map[string]any `json:"resources,omitempty"`
	Children  []string         `json:"children,omitempty"`
	PciBdf    string           `json:"pci_bdf,omitempty"`
}

// VmCounters is the body of GET /vm.counters: device id -> counter -> value.
type VmCounters map[string]map[string]int64

// VmConfig is the body of PUT /vm.create (payload is the only required field).
type VmConfig struct {
	Cpus           *CpusConfig      `json:"cpus,omitempty"`
	Memory         *MemoryConfig    `json:"memory,omitempty"`
	Payload        PayloadConfig    `json:"payload"`
	Disks          []DiskConfig     `json:"disks,omitempty"`
	Net            []NetConfig      `json:"net,omitempty"`
	Rng            *RngConfig       `json:"rng,omitempty"`
	Serial         *SerialConfig    `json:"serial,omitempty"`
	Console        *ConsoleConfig   `json:"console,omitempty"`
	Vsock          *VsockConfig     `json:"vsock,omitempty"`
	Iommu          bool             `json:"iommu,omitempty"`
	Watchdog       bool             `json:"watchdog,omitempty"`
	Pvpanic        bool             `json:"pvpanic,omitempty"`
	LandlockEnable bool             `json:"landlock_enable,omitempty"`
	LandlockRules  []LandlockConfig `json:"landlock_rules,omitempty"`
}

// PayloadConfig says what the guest boots.
type PayloadConfig struct {
	Firmware  string `json:"firmware,omitempty"`
	Kernel    string `json:"kernel,omitempty"`
	Cmdline   string `json:"cmdline,omitempty"`
	Initramfs string `json:"initramfs,omitempty"`
}

// CpusConfig sizes the vCPUs; boot_vcpus and max_vcpus are required.
type CpusConfig struct {
	BootVcpus int `json:"boot_vcpus"`
	MaxVcpus  int `json:"max_vcpus"`
	// Nested defaults to true in the spec; untrusted guests get false.
	Nested *bool `json:"nested,omitempty"`
}

// MemoryConfig sizes guest RAM in bytes.
type MemoryConfig struct {
	Size      int64 `json:"size"`
	Mergeable bool  `json:"mergeable,omitempty"`
	Shared    bool  `json:"shared,omitempty"`
	Hugepages bool  `json:"hugepages,omitempty"`
	Prefault  bool  `json:"prefault,omitempty"`
}

// ImageType is the spec's ImageType enum.
type ImageType string

const (
	ImageTypeRaw   ImageType = "Raw"
	ImageTypeQcow2 ImageType = "Qcow2"
)

// DiskConfig is one virtio-blk device.
type DiskConfig struct {
	Path      string `json:"path,omitempty"`
	Readonly  bool   `json:"readonly,omitempty"`
	Direct    bool   `json:"direct,omitempty"`
	NumQueues int    `json:"num_queues,omitempty"`
	QueueSize int    `json:"queue_size,omitempty"`
	ID        string `json:"id,omitempty"`
	Serial    string `json:"serial,omitempty"`
	// BackingFiles lets a qcow2 image open its backing file (off by default
	// since v51, so a guest-written header cannot point at host files).
	BackingFiles bool      `json:"backing_files,omitempty"`
	ImageType    ImageType `json:"image_type,omitempty"`
	// VhostUser: the disk is served on VhostSocket by a vhost-user-blk
	// backend (then Path is empty and guest memory must be shared).
	VhostUser   bool   `json:"vhost_user,omitempty"`
	VhostSocket string `json:"vhost_socket,omitempty"`
}

// PciDeviceInfo is a device added to a running VM.
type PciDeviceInfo struct {
	ID  string `json:"id"`
	BDF string `json:"bdf"`
}

// VmRemoveDevice names a device to remove from a running VM.
type VmRemoveDevice struct {
	ID string `json:"id,omitempty"`
}

// NetConfig is one virtio-net device on a host tap.
type NetConfig struct {
	Tap       string `json:"tap,omitempty"`
	Mac       string `json:"mac,omitempty"`
	HostMac   string `json:"host_mac,omitempty"`
	Mtu       int    `json:"mtu,omitempty"`
	NumQueues int    `json:"num_queues,omitempty"`
	QueueSize int    `json:"queue_size,omitempty"`
	ID        string `json:"id,omitempty"`
}

// RngConfig is the virtio-rng device; src is required.
type RngConfig struct {
	Src   string `json:"src"`
	ID    string `json:"id,omitempty"`
	Iommu bool   `json:"iommu,omitempty"`
}

// ConsoleMode is the spec's ConsoleMode enum.
type ConsoleMode string

const (
	ConsoleModeOff    ConsoleMode = "Off"
	ConsoleModePty    ConsoleMode = "Pty"
	ConsoleModeTty    ConsoleMode = "Tty"
	ConsoleModeFile   ConsoleMode = "File"
	ConsoleModeSocket ConsoleMode = "Socket"
	ConsoleModeNull   ConsoleMode = "Null"
)

// SerialConfig is the legacy serial port (ttyS0 in the guest).
type SerialConfig struct {
	File   string      `json:"file,omitempty"`
	Socket string      `json:"socket,omitempty"`
	Mode   ConsoleMode `json:"mode"`
}

// ConsoleConfig is the virtio console (hvc0 in the guest).
type ConsoleConfig struct {
	File   string      `json:"file,omitempty"`
	Socket string      `json:"socket,omitempty"`
	Mode   ConsoleMode `json:"mode"`
	Iommu  bool        `json:"iommu,omitempty"`
	ID     string      `json:"id,omitempty"`
}

// VsockConfig is the virtio-vsock device, proxied to a host Unix socket
// (hybrid vsock); cid (>= 3) and socket are required.
type VsockConfig struct {
	Cid    int64  `json:"cid"`
	Socket string `json:"socket"`
	Iommu  bool   `json:"iommu,omitempty"`
	ID     string `json:"id,omitempty"`
}

// LandlockConfig grants the VMM access to a path once Landlock is applied;
// access is "r", "w" or "rw".
type LandlockConfig struct {
	Path   string `json:"path"`
	Access string `json:"access"`
}

// VmSnapshotConfig is the body of PUT /vm.snapshot.
type VmSnapshotConfig struct {
	DestinationURL string `json:"destination_url,omitempty"`
}

// MemoryRestoreMode is the spec's MemoryRestoreMode enum.
type MemoryRestoreMode string

const (
	MemoryRestoreCopy     MemoryRestoreMode = "Copy"
	MemoryRestoreOnDemand MemoryRestoreMode = "OnDemand"
)

// RestoreConfig is the body of PUT /vm.restore. The v53 spec has no field to
// rename devices, so identity changes go into the snapshot's config.json.
type RestoreConfig struct {
	SourceURL         string            `json:"source_url"`
	Prefault          bool              `json:"prefault,omitempty"`
	MemoryRestoreMode MemoryRestoreMode `json:"memory_restore_mode,omitempty"`
	Resume            bool              `json:"resume,omitempty"`
}
