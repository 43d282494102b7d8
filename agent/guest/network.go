package guest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/harebox/harebox/agent/layout"
)

// NetworkConfig is the guest's network as the host put it on the kernel
// command line (layout.ParamIP and friends). The host enforces the
// firewall; this only makes the guest's interface usable.
type NetworkConfig struct {
	Addr    netip.Prefix // e.g. 10.231.0.2/30
	Gateway netip.Addr
	DNS     netip.Addr
	MAC     net.HardwareAddr // optional: which interface
	// Mesh, if valid, is the guest's address on its project's mesh with
	// the project's range (e.g. 10.240.4.5/22), reached through Gateway.
	Mesh netip.Prefix
}

// ParseNetworkConfig reads the network parameters from a kernel command
// line. It returns nil, nil when there are none (no network).
func ParseNetworkConfig(cmdline string) (*NetworkConfig, error) {
	params := map[string]string{}
	for _, w := range strings.Fields(cmdline) {
		if w == "--" {
			break
		}
		if k, v, ok := strings.Cut(w, "="); ok {
			params[k] = v
		}
	}
	ip, ok := params[layout.ParamIP]
	if !ok {
		return nil, nil
	}
	var c NetworkConfig
	var err error
	if c.Addr, err = netip.ParsePrefix(ip); err != nil || !c.Addr.Addr().Is4() {
		return nil, fmt.Errorf("%s=%q: not an IPv4 address/prefix", layout.ParamIP, ip)
	}
	if c.Gateway, err = netip.ParseAddr(params[layout.ParamGateway]); err != nil || !c.Addr.Contains(c.Gateway) {
		return nil, fmt.Errorf("%s=%q: not an address in %s", layout.ParamGateway, params[layout.ParamGateway], c.Addr)
	}
	if d := params[layout.ParamDNS]; d != "" {
		if c.DNS, err = netip.ParseAddr(d); err != nil {
			return nil, fmt.Errorf("%s=%q: %v", layout.ParamDNS, d, err)
		}
	}
	if m := params[layout.ParamMAC]; m != "" {
		if c.MAC, err = net.ParseMAC(m); err != nil {
			return nil, fmt.Errorf("%s=%q: %v", layout.ParamMAC, m, err)
		}
	}
	if m := params[layout.ParamMesh]; m != "" {
		if c.Mesh, err = netip.ParsePrefix(m); err != nil || !c.Mesh.Addr().Is4() || c.Mesh.Bits() < 8 || c.Mesh.Overlaps(c.Addr) {
			return nil, fmt.Errorf("%s=%q: not an IPv4 address/prefix apart from %s", layout.ParamMesh, m, c.Addr)
		}
	}
	return &c, nil
}

// SetupNetworkFromCmdline configures the network /proc/cmdline names, if
// any. It is idempotent, so both the init and the service may call it.
func SetupNetworkFromCmdline(ctx context.Context, logf func(string, ...any)) {
	data, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return
	}
	cfg, err := ParseNetworkConfig(string(data))
	if err != nil {
		logf("network: %v", err)
		return
	}
	if cfg == nil {
		return
	}
	if err := SetupNetwork(ctx, cfg, "/"); err != nil {
		logf("network: %v", err)
		return
	}
	logf("network: %s via %s, dns %s", cfg.Addr, cfg.Gateway, cfg.DNS)
}

// SetupNetwork brings the interface up with cfg's address and default
// route, and writes root/etc/resolv.conf naming only cfg.DNS. It waits a
// few seconds for the interface to appear (the driver may still probe).
func SetupNetwork(ctx context.Context, cfg *NetworkConfig, root string) error {
	var link netlink.Link
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		if link, err = findLink(cfg.MAC); err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
	name := link.Attrs().Name
	// The host drops IPv6; not configuring it avoids pointless traffic.
	os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0o644)
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("up %s: %w", name, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: cfg.Addr.Addr().AsSlice(), Mask: net.CIDRMask(cfg.Addr.Bits(), 32)}}
	if err := netlink.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("address on %s: %w", name, err)
	}
	route := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: cfg.Gateway.AsSlice(), Dst: nil}
	if err := netlink.RouteReplace(route); err != nil {
		return fmt.Errorf("default route via %s: %w", cfg.Gateway, err)
	}
	if m := cfg.Mesh; m.IsValid() {
		// The mesh address alone (/32), and its project's range through
		// the gateway, from that address.
		mesh := &netlink.Addr{IPNet: &net.IPNet{IP: m.Addr().AsSlice(), Mask: net.CIDRMask(32, 32)}}
		if err := netlink.AddrReplace(link, mesh); err != nil {
			return fmt.Errorf("mesh address on %s: %w", name, err)
		}
		p := m.Masked()
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: cfg.Gateway.AsSlice(), Src: m.Addr().AsSlice(),
			Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("mesh route to %s via %s: %w", p, cfg.Gateway, err)
		}
	}
	if cfg.DNS.IsValid() {
		path := filepath.Join(root, "etc/resolv.conf")
		// Replace a symlink (systemd-resolved's stub) with a plain file.
		if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			os.Remove(path)
		}
		os.MkdirAll(filepath.Dir(path), 0o755)
		content := "# written by harebox-agent from the kernel command line\nnameserver " + cfg.DNS.String() + "\n"
		if err := writeFileAtomic(path, []byte(content), 0o644); err != nil {
			return fmt.Errorf("resolv.conf: %w", err)
		}
	}
	return nil
}

// MoveNetwork moves the guest's interface from the network it has (its
// source's, in a clone) to cfg: the new MAC, only the new addresses (its
// source's mesh address goes too), the new routes and resolver.
func MoveNetwork(ctx context.Context, cfg *NetworkConfig, root string) error {
	link, err := findLink(nil)
	if err != nil {
		return err
	}
	if cfg.MAC != nil && link.Attrs().HardwareAddr.String() != cfg.MAC.String() {
		if err := netlink.LinkSetHardwareAddr(link, cfg.MAC); err != nil {
			return fmt.Errorf("mac of %s: %w", link.Attrs().Name, err)
		}
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if a.IP.Equal(cfg.Addr.Addr().AsSlice()) || (cfg.Mesh.IsValid() && a.IP.Equal(cfg.Mesh.Addr().AsSlice())) {
			continue
		}
		// (The old address's routes go with it.)
		if err := netlink.AddrDel(link, &a); err != nil {
			return fmt.Errorf("drop %s: %w", a.IPNet, err)
		}
	}
	return SetupNetwork(ctx, cfg, root)
}

// findLink returns the interface with mac, or the first Ethernet device.
func findLink(mac net.HardwareAddr) (netlink.Link, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback != 0 || len(a.HardwareAddr) != 6 {
			continue
		}
		if mac == nil && l.Type() == "device" || mac != nil && a.HardwareAddr.String() == mac.String() {
			return l, nil
		}
	}
	return nil, errors.New("no network interface found")
}
