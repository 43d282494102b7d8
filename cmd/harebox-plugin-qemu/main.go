// Command harebox-plugin-qemu serves the QEMU backend as a HareBox
// hypervisor plugin. The engine starts it; it is not meant to be run by hand.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/harebox/harebox/backends/qemu"
	"github.com/harebox/harebox/hypervisor/plugin"
)

func main() {
	var opts qemu.Options
	flag.StringVar(&opts.QEMU, "qemu", "", "qemu-system-x86_64 binary (default: from PATH)")
	flag.StringVar(&opts.QEMUImg, "qemu-img", "", "qemu-img binary (default: from PATH)")
	flag.StringVar(&opts.Accel, "accel", qemu.AccelAuto, "accelerator: auto, kvm or tcg")
	flag.BoolVar(&opts.GuestASLR, "tcg-guest-aslr", false, "keep address-space randomization in guests under TCG (off by default there: every process start translates its libraries anew, 3 to 4 times slower)")
	flag.Parse()
	// go-plugin forwards stderr to the engine's log.
	opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	d, err := qemu.New(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "harebox-plugin-qemu:", err)
		os.Exit(1)
	}
	plugin.Serve(d)
}
