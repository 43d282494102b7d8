package linuxnet

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RouteOverlaps lists the host's IPv4 routes (its main table) that
// overlap one of pools, other than HareBox's own: those of its links
// (taps and the mesh's device, named "hb..."), and unreachable routes
// (the mesh's project ranges). Each is a network the host reaches whose
// addresses sandboxes could be given: the host's traffic to such an
// address would go to a sandbox (its tap's route is narrower), and
// sandboxes could not reach the network. A default route overlaps
// nothing.
func RouteOverlaps(pools ...netip.Prefix) ([]string, error) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("linuxnet: list the host's routes: %w", err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("linuxnet: list the host's links: %w", err)
	}
	names := make(map[int]string, len(links)) // (one call, not one a route: a host has a route per tap)
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	var out []string
	for _, r := range routes {
		if r.Dst == nil || r.Type == unix.RTN_UNREACHABLE {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		addr, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		if !ok || ones == 0 {
			continue
		}
		dst := netip.PrefixFrom(addr, ones).Masked()
		dev, ok := names[r.LinkIndex]
		if !ok {
			dev = "?"
		}
		if strings.HasPrefix(dev, "hb") {
			continue
		}
		for _, p := range pools {
			if p.IsValid() && p.Overlaps(dst) {
				out = append(out, fmt.Sprintf("%s dev %s overlaps %s", dst, dev, p))
			}
		}
	}
	return out, nil
}
