// Command memplugin serves the in-memory hypervisor (hypervisor/memhv) as a
// plugin, for the plugin package's own tests: a plugin process that starts
// in milliseconds and needs no VM. MEMPLUGIN_LAUNCH_DELAY slows Launch.
package main

import (
	"os"
	"time"

	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/hypervisor/plugin"
)

func main() {
	d, _ := time.ParseDuration(os.Getenv("MEMPLUGIN_LAUNCH_DELAY"))
	plugin.Serve(memhv.New(memhv.Options{LaunchDelay: d}))
}
