// Command memplugin serves the in-memory hypervisor (hypervisor/memhv) as a
// plugin, for the plugin package's own tests: a plugin process that starts
// in milliseconds and needs no VM. MEMPLUGIN_LAUNCH_DELAY slows Launch;
// MEMPLUGIN_PROTOCOL makes it speak another plugin protocol version.
package main

import (
	"os"
	"strconv"
	"time"

	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/hypervisor/plugin"
)

func main() {
	d, _ := time.ParseDuration(os.Getenv("MEMPLUGIN_LAUNCH_DELAY"))
	if v, err := strconv.Atoi(os.Getenv("MEMPLUGIN_PROTOCOL")); err == nil {
		plugin.Handshake.ProtocolVersion = uint(v)
	}
	plugin.Serve(memhv.New(memhv.Options{LaunchDelay: d}))
}
