package dnsfilter

import (
	"net/netip"
	"sync"
	"testing"
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
