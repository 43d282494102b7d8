// Command smokeinit is a stand-in /init for the images boot smoke test: it
// loads the modules in modules.load, mounts /dev/vda read-only if present,
// reports on the serial console and powers off.
package main

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

func main() {
	unix.Mount("proc", "/proc", "proc", 0, "")
	unix.Mount("sysfs", "/sys", "sysfs", 0, "")
	unix.Mount("devtmpfs", "/dev", "devtmpfs", 0, "")
	b, err := os.ReadFile("/etc/harebox/modules.load")
	if err != nil {
		fmt.Println("SMOKE FAIL modules.load:", err)
	}
	for _, p := range strings.Fields(string(b)) {
		f, err := os.Open(p)
		if err == nil {
			err = unix.FinitModule(int(f.Fd()), "", 0)
			f.Close()
		}
		if err == unix.EEXIST {
			err = nil
		}
		fmt.Printf("SMOKE load %s: %v\n", p, err)
	}
	if ents, err := os.ReadDir("/sys/class/virtio-ports"); err == nil {
		for _, e := range ents {
			name, _ := os.ReadFile("/sys/class/virtio-ports/" + e.Name() + "/name")
			fmt.Printf("SMOKE port %s %s\n", e.Name(), strings.TrimSpace(string(name)))
		}
	}
	if _, err := os.Stat("/dev/vda"); err == nil {
		err := unix.Mount("/dev/vda", "/newroot", "ext4", unix.MS_RDONLY, "")
		fmt.Printf("SMOKE mount /dev/vda: %v\n", err)
		if err == nil {
			ents, _ := os.ReadDir("/newroot")
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			fmt.Printf("SMOKE root %s\n", strings.Join(names, " "))
		}
	}
	fmt.Println("SMOKE DONE")
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
}
