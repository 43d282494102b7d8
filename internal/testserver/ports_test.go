package testserver

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// TestFreeAddr: each address is free, given once, and in a block of ports
// this process holds, which another process cannot lock.
func TestFreeAddr(t *testing.T) {
	seen := map[string]bool{}
	for range 300 { // (more than a block)
		addr := FreeAddr(t)
		if seen[addr] {
			t.Fatalf("%s given twice", addr)
		}
		seen[addr] = true
		_, p, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(p)
		if port < 20000 || port >= 32000 {
			t.Fatalf("%s: outside 20000 to 32000", addr)
		}
		b := (port - 20000) / portBlock
		held := false
		for _, x := range ports.blocks {
			held = held || x == b
		}
		if !held {
			t.Fatalf("%s: in block %d, which this process does not hold (%v)", addr, b, ports.blocks)
		}
	}
	// Another open file of a held block's lock is refused (as another
	// process's would be).
	f, err := os.Open(filepath.Join(os.TempDir(), "harebox-e2e-ports", strconv.Itoa(ports.blocks[0])))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		t.Fatal("a held block's lock was taken again")
	}
}
