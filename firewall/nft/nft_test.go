package nft

import (
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/harebox/harebox/firewall"
)

// inFreshNetns runs the test body in a new network namespace, so the
// table it installs never touches the host's.
func inFreshNetns(t *testing.T, fn func()) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		ns, err := netns.New() // this thread only; it dies with the goroutine
		if err != nil {
			t.Error(err)
			return
		}
		defer ns.Close()
		fn()
	}()
	<-done
}

// TestInstall installs a policy in a throwaway namespace and checks the
// compiled rules as nft prints them: first match order, guards, the
// proxy redirect mirrored after a CIDR rule, and atomic replacement.
func TestInstall(t *testing.T) {
	inFreshNetns(t, func() {
		tb, err := Open(Config{Table: "harebox_test", Pool: netip.MustParsePrefix("10.231.0.0/16"), DNSPort: 5353, ProxyPort: 3128})
		if err != nil {
			t.Error(err)
			return
		}
		defer tb.Close()
		p, err := firewall.Parse([]byte(`{"default_outbound":"allow","outbound":[
		  {"action":"allow","cidrs":["10.1.0.0/16","198.18.0.8"],"protocol":"tcp","ports":"22,80-90"},
		  {"action":"deny","protocol":"udp"},
		  {"action":"allow","hosts":["pypi.org"],"ports":"443"}]}`))
		if err != nil {
			t.Error(err)
			return
		}
		b := firewall.Blocked(append(firewall.AlwaysInternal(), append(firewall.DefaultPrivate(), netip.MustParsePrefix("10.231.0.0/16"))...))
		sb := Sandbox{Tap: "hbtest1", Addr: netip.MustParseAddr("10.231.0.2"), Gateway: netip.MustParseAddr("10.231.0.1"), Policy: p, Blocked: b}
		if err := tb.Reset(nil); err != nil {
			t.Errorf("reset: %v", err)
			return
		}
		for range 2 { // a second Put replaces, it does not duplicate
			if err := tb.Put(sb); err != nil {
				t.Errorf("put: %v", err)
				return
			}
		}
		out, _ := exec.Command("nft", "list", "table", "inet", "harebox_test").CombinedOutput()
		list := string(out)
		for _, want := range []string{
			`iifname "hbtest1" jump h-hbtest1`,
			"ip saddr != 10.231.0.2 drop",
			"tcp dport { 53, 853 } goto reject",
			"udp dport 443 goto reject",
			"tcp dport { 22, 80-90 } ip daddr { 10.1.0.0/16, 198.18.0.8 } accept",
			"meta l4proto udp goto reject",
			"ip daddr != { 0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, 172.16.0.0/12, 192.168.0.0/16, 224.0.0.0/3 } accept",
			"tcp dport { 22, 80-90 } ip daddr { 10.1.0.0/16, 198.18.0.8 } return\n\t\ttcp dport 443 redirect to :3128",
			"ip daddr 10.231.0.1 udp dport 53 redirect to :5353",
			"ct status dnat ip daddr 10.231.0.1 tcp dport 3128 accept",
			"ip saddr 10.231.0.0/16 ip daddr != 10.231.0.0/16 masquerade",
		} {
			if !strings.Contains(list, want) {
				t.Errorf("missing %q", want)
			}
		}
		if strings.Count(list, `jump o-hbtest1`) != 1 {
			t.Errorf("jumps duplicated")
		}
		if t.Failed() {
			t.Logf("%s", list)
		}
		if err := tb.Remove("hbtest1"); err != nil {
			t.Error(err)
		}
		if taps, err := tb.Taps(); err != nil || len(taps) != 0 {
			t.Errorf("after Remove: %v %v", taps, err)
		}
		if err := tb.Delete(); err != nil {
			t.Error(err)
		}
	})
}

// TestResetMany: after a restart Reset installs every sandbox's chains in
// one transaction; the kernel's acknowledgements of that many rules must
// not overflow the netlink socket (they did at 6 sandboxes with the
// default receive buffer: ENOBUFS, and the engine did not start).
func TestResetMany(t *testing.T) {
	inFreshNetns(t, func() {
		tb, err := Open(Config{Table: "harebox_test", Pool: netip.MustParsePrefix("10.232.0.0/16"), DNSPort: 5353, ProxyPort: 3128})
		if err != nil {
			t.Error(err)
			return
		}
		defer tb.Close()
		p, err := firewall.Parse([]byte(`{"default_outbound":"deny","outbound":[
		  {"action":"allow","hosts":["pypi.org","files.pythonhosted.org"],"protocol":"tcp","ports":"443"},
		  {"action":"allow","cidrs":["10.1.0.0/16"],"protocol":"tcp","ports":"22,80-90"}]}`))
		if err != nil {
			t.Error(err)
			return
		}
		b := firewall.Blocked(append(firewall.AlwaysInternal(), append(firewall.DefaultPrivate(), netip.MustParsePrefix("10.232.0.0/16"))...))
		var sbs []Sandbox
		for i := range 64 {
			sbs = append(sbs, Sandbox{
				Tap: "hbmany" + strconv.Itoa(i), Policy: p, Blocked: b,
				Addr:    netip.AddrFrom4([4]byte{10, 232, byte(i), 2}),
				Gateway: netip.AddrFrom4([4]byte{10, 232, byte(i), 1}),
			})
		}
		if err := tb.Reset(sbs); err != nil {
			t.Errorf("reset with %d sandboxes: %v", len(sbs), err)
			return
		}
		out, _ := exec.Command("nft", "list", "table", "inet", "harebox_test").CombinedOutput()
		if n := strings.Count(string(out), "chain o-hbmany"); n != len(sbs) {
			t.Errorf("%d sandbox chains installed, want %d", n, len(sbs))
		}
	})
}
