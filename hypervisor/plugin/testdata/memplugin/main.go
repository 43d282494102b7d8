// Command memplugin serves the in-memory hypervisor (hypervisor/memhv) as a
// plugin, for the plugin package's own tests: a plugin process that starts
// in milliseconds and needs no VM. MEMPLUGIN_LAUNCH_DELAY slows Launch;
// MEMPLUGIN_PROTOCOL makes it speak another plugin protocol version;
// MEMPLUGIN_UNDO makes a Launch cut short take that long to undo itself,
// then write STATE_DIR.undone.
package main

import (
	"context"
	"os"
	"strconv"
	"time"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/hypervisor/plugin"
)

func main() {
	d, _ := time.ParseDuration(os.Getenv("MEMPLUGIN_LAUNCH_DELAY"))
	if v, err := strconv.Atoi(os.Getenv("MEMPLUGIN_PROTOCOL")); err == nil {
		plugin.Handshake.ProtocolVersion = uint(v)
	}
	undo, _ := time.ParseDuration(os.Getenv("MEMPLUGIN_UNDO"))
	plugin.Serve(undoing{memhv.New(memhv.Options{LaunchDelay: d}), undo})
}

// undoing stands for a backend whose launch, cut short, has work to undo.
type undoing struct {
	*memhv.Hypervisor
	undo time.Duration
}

func (u undoing) Launch(ctx context.Context, spec hypervisor.Spec) (hypervisor.Machine, error) {
	m, err := u.Hypervisor.Launch(ctx, spec)
	if err != nil && ctx.Err() != nil && u.undo > 0 {
		time.Sleep(u.undo)
		os.WriteFile(spec.StateDir+".undone", nil, 0o600)
	}
	return m, err
}
