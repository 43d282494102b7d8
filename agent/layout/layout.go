// Package layout holds the names the guest agent and the image builder
// agree on: where things sit in the initramfs and root disk, and which
// kernel command-line parameters the agent's init reads.
package layout

import (
	"crypto/sha256"
	"fmt"
	"strings"
)

// Levels of the host-agent protocol (agentpb). The agent reports its level
// in Health. A host talks to agents of MinProtocol or later (a sandbox
// keeps the agent of the image it was made from, across host upgrades) and
// refuses an older one with an error that says so; a call an older agent
// lacks fails with an error that says that. Raise Protocol with every
// change to agentpb's calls; raise MinProtocol only for a change an older
// agent cannot be talked around.
//
//	0: agents from before the level was reported
//	1: Health reports the level
//	2: commands the agent owns (Start, Attach, Signal, Commands)
//	3: every agent session starts with a hello (agent/transport)
//	4: Input to a command started with keep_stdin (its stdin, its end, a
//	   terminal size), Rename, Watch, ListDir with a depth
//	5: MountVolume, UnmountVolume
//	6: Connect (a TCP connection to a port on the guest's loopback)
//	7: FreezeVolume, ThawVolume
const (
	Protocol    = 7
	MinProtocol = 0
	// HelloProtocol is the first level whose sessions all start with a
	// hello: the host drops one that answers without.
	HelloProtocol = 3
)

const (
	// InitPath is the agent binary inside the initramfs; it runs as PID 1.
	InitPath = "/init"
	// AgentPath is the agent binary inside a full root filesystem, where
	// systemd runs it as AgentUnit with the "serve" subcommand.
	AgentPath = "/usr/local/bin/harebox-agent"
	AgentUnit = "harebox-agent.service"

	// ModulesLoad lists, one absolute path per line, the kernel modules the
	// init loads with finit_module, in dependency order (dependencies first).
	// A module that is already loaded or built in is skipped.
	ModulesLoad = "/etc/harebox/modules.load"
	// ModulesOnDemand lists, as ModulesLoad does, the modules only a
	// feature needs (volumes: the SCSI disks plugged in while the guest
	// runs), which the agent loads when that feature is first used.
	// Before the init switches to a root disk it copies them into
	// ModulesStagedDir and their list to ModulesStaged, on /run: the
	// initramfs is freed, /run moves to the new root.
	ModulesOnDemand  = "/etc/harebox/modules.ondemand"
	ModulesStaged    = "/run/harebox/modules.ondemand"
	ModulesStagedDir = "/run/harebox/modules"

	// ParamRoot on the kernel command line (harebox.root=/dev/vda) makes the
	// init mount that ext4 device and hand over to ParamInit (default
	// /sbin/init, that is systemd). Without it the agent stays init.
	ParamRoot   = "harebox.root"
	ParamInit   = "harebox.init"
	DefaultInit = "/sbin/init"

	// Network parameters the host's network puts on the kernel command
	// line; the agent configures the first Ethernet interface (or the one
	// with ParamMAC) from them at boot, and writes /etc/resolv.conf:
	//   harebox.ip=10.231.0.2/30 harebox.gw=10.231.0.1 harebox.dns=10.231.0.1
	ParamIP      = "harebox.ip"  // the guest's address with prefix length
	ParamGateway = "harebox.gw"  // the default route
	ParamDNS     = "harebox.dns" // the only nameserver (the host resolver)
	ParamMAC     = "harebox.mac" // optional: which interface to configure
	// ParamMesh is the guest's address on its project's mesh, with its
	// project's range (harebox.mesh=10.240.4.5/22): the agent adds the
	// address and a route to the range through the gateway.
	ParamMesh = "harebox.mesh"

	// DefaultUser is the unprivileged account commands run as by default.
	DefaultUser = "user"
	DefaultUID  = 1000
	DefaultHome = "/home/user"

	// SerialName is the virtio-serial port the agent serves on; under udev
	// it appears as /dev/virtio-ports/SerialName, without udev the agent
	// finds it through /sys/class/virtio-ports/*/name.
	SerialName = "org.harebox.agent"
	// VsockPort is the vsock port the agent listens on (Cloud Hypervisor).
	VsockPort = 1024

	// The code-interpreter image's server (images/interpreter), run by
	// systemd as InterpreterUnit, listens on the guest's loopback at
	// InterpreterPort; the host reaches it through the agent (Connect).
	// It runs each Python context's kernel from InterpreterKernelPath.
	InterpreterPath       = "/usr/lib/harebox/interpreter.py"
	InterpreterKernelPath = "/usr/lib/harebox/interpreter_kernel.py"
	InterpreterUnit       = "harebox-interpreter.service"
	InterpreterPort       = 49999
)

// VolumeMountAllowed reports whether a volume may be mounted at path (a
// clean absolute one): not at / nor over the system's own trees, which
// would hide what the guest runs on. The host checks it at create, the
// agent again at mount.
func VolumeMountAllowed(path string) bool {
	if path == "/" {
		return false
	}
	for _, f := range []string{"/proc", "/sys", "/dev", "/run", "/boot", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/usr"} {
		if path == f || strings.HasPrefix(path, f+"/") {
			return false
		}
	}
	return true
}

// VolumeUUID is the UUID of the filesystem the host makes on the volume
// whose serial is serial: the guest finds a volume's disk by it where the
// disk has no serial of its own (a vhost-user disk, whose serial its
// storage daemon answers alike for every disk).
func VolumeUUID(serial string) string {
	b := sha256.Sum256([]byte("harebox volume " + serial))
	b[6] = b[6]&0x0f | 0x80 // version 8: made up by its user
	b[8] = b[8]&0x3f | 0x80 // the RFC 9562 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
