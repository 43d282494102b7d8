package dnsfilter

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/harebox/harebox/firewall"
)

func TestInflightBounds(t *testing.T) {
	var r Resolver
	a, b := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.6")
	for i := 0; i < MaxInflightPerSandbox; i++ {
		if !r.acquire(a) {
			t.Fatalf("query %d refused under the per-sandbox bound", i)
		}
	}
	if r.acquire(a) {
		t.Fatal("a sandbox got past its bound of queries in flight")
	}
	// Another sandbox is not starved by the first.
	if !r.acquire(b) {
		t.Fatal("another sandbox was refused")
	}
	r.release(a)
	if !r.acquire(a) {
		t.Fatal("a released slot was not reusable")
	}
	// The global bound holds across many sandboxes, concurrently.
	var r2 Resolver
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := 0
	for i := 0; i < 2*MaxInflight/MaxInflightPerSandbox; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			src := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
			for j := 0; j < MaxInflightPerSandbox; j++ {
				if r2.acquire(src) {
					mu.Lock()
					granted++
					mu.Unlock()
				}
			}
		}(i)
	}
	wg.Wait()
	if granted != MaxInflight {
		t.Fatalf("%d queries in flight, want the global bound %d", granted, MaxInflight)
	}
}

// TestMeshNames: names under .internal are answered by the host only (the
// Mesh lookup, for the asking sandbox), never upstream, even where the
// sandbox's policy allows any name.
func TestMeshNames(t *testing.T) {
	src := netip.MustParseAddr("10.231.0.2")
	open := &firewall.Policy{DefaultOutbound: firewall.Allow}
	// (An upstream that would answer anything, were it asked: nothing
	// listens there, so an exchange fails as SERVFAIL.)
	r := &Resolver{
		Policy:   func(netip.Addr) (*firewall.Policy, firewall.Blocked, bool) { return open, nil, true },
		Upstream: &Upstream{Addr: "127.0.0.1:1", Timeout: 100 * time.Millisecond},
		Mesh: func(from netip.Addr, name string) (netip.Addr, bool) {
			return netip.MustParseAddr("10.240.0.7"), from == src && name == "web.shop.internal"
		},
	}
	ask := func(name string, qtype uint16) *dns.Msg {
		q := new(dns.Msg)
		q.SetQuestion(name, qtype)
		return r.answer(&net.UDPAddr{IP: src.AsSlice(), Port: 5353}, q)
	}
	resp := ask("Web.Shop.internal.", dns.TypeA)
	if resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != "10.240.0.7" || resp.Answer[0].Header().Ttl != 1 {
		t.Errorf("a mesh name: %v", resp)
	}
	if resp := ask("web.shop.internal.", dns.TypeAAAA); resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 0 {
		t.Errorf("a mesh name's AAAA: %v", resp)
	}
	for _, name := range []string{"db.shop.internal.", "web.other.internal.", "internal."} {
		if resp := ask(name, dns.TypeA); resp.Rcode != dns.RcodeNameError {
			t.Errorf("%s: rcode %s, want NXDOMAIN from the host, not upstream's SERVFAIL", name, dns.RcodeToString[resp.Rcode])
		}
	}
	r.Mesh = nil
	if resp := ask("web.shop.internal.", dns.TypeA); resp.Rcode != dns.RcodeNameError {
		t.Errorf("without a mesh: rcode %s", dns.RcodeToString[resp.Rcode])
	}
}
