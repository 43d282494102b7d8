// Command harebox-plugin-cloud-hypervisor serves the Cloud Hypervisor
// backend as a HareBox hypervisor plugin. The engine starts it; it is not
// meant to be run by hand.
package main

import (
	"flag"

	"github.com/harebox/harebox/backends/cloudhypervisor"
	"github.com/harebox/harebox/hypervisor/plugin"
)

func main() {
	var cfg cloudhypervisor.Config
	flag.StringVar(&cfg.Binary, "cloud-hypervisor", "", "cloud-hypervisor binary (default: from PATH)")
	flag.StringVar(&cfg.QemuImg, "qemu-img", "", "qemu-img binary, for overlays (default: from PATH)")
	flag.BoolVar(&cfg.DisableLandlock, "no-landlock", false, "do not let the VMM sandbox itself with Landlock")
	flag.Parse()
	plugin.Serve(cloudhypervisor.New(cfg))
}
