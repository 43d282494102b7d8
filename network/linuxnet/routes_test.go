package linuxnet

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/harebox/harebox/internal/inns"
)

// RouteOverlaps, in a namespace of the test's own: a host network inside
// a pool is named; HareBox's own links' routes (named "hb..."),
// unreachable ranges and the default route are not.
func TestRouteOverlaps(t *testing.T) {
	ns := fmt.Sprintf("hbro%d", os.Getpid())
	sh(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { shq("ip", "netns", "del", ns) })
	for _, c := range [][]string{
		{"link", "add", "eth9", "type", "veth", "peer", "name", "eth9p"}, {"link", "set", "eth9p", "up"},
		{"addr", "add", "10.99.0.1/16", "dev", "eth9"}, {"link", "set", "eth9", "up"},
		{"link", "add", "hbtest", "type", "veth", "peer", "name", "hbtestp"}, {"link", "set", "hbtestp", "up"},
		{"addr", "add", "10.96.0.1/30", "dev", "hbtest"}, {"link", "set", "hbtest", "up"},
		{"route", "add", "default", "dev", "eth9"},
		{"route", "add", "unreachable", "10.97.0.0/22"},
	} {
		sh(t, append([]string{"ip", "-n", ns}, c...)...)
	}
	pool, mesh, apart := netip.MustParsePrefix("10.99.4.0/24"), netip.MustParsePrefix("10.96.0.0/15"), netip.MustParsePrefix("10.50.0.0/16")
	var got, none []string
	var err, errNone error
	if e := inns.Run(ns, func() {
		got, err = RouteOverlaps(pool, mesh, netip.Prefix{})
		none, errNone = RouteOverlaps(apart)
	}); e != nil {
		t.Fatal(e)
	}
	if want := []string{"10.99.0.0/16 dev eth9 overlaps 10.99.4.0/24"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("RouteOverlaps: %q %v, want %q", got, err, want)
	}
	if errNone != nil || len(none) != 0 {
		t.Errorf("RouteOverlaps of a pool apart: %q %v", none, errNone)
	}
}
