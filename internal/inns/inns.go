// Package inns runs a function in a network namespace: on a thread of its
// own that enters the namespace and is dropped after (its goroutine ends
// locked to it), so no other goroutine ever runs there. Sockets made in
// fn stay in the namespace and can be used from anywhere. Tests use it
// for test hosts that live in namespaces of their own (Run), the mesh
// tunnel to open its sockets in its own namespace from any thread (In).
package inns

import (
	"runtime"

	"github.com/vishvananda/netns"
)

// Run calls fn in network namespace ns (made by ip netns add) and waits
// for it, also when fn ends its goroutine (a test's Fatal).
func Run(ns string, fn func()) error {
	h, err := netns.GetFromName(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	return In(h, fn)
}

// In calls fn in the network namespace h names and waits for it, also
// when fn ends its goroutine. Its error is entering the namespace's (fn
// is then not called).
func In(h netns.NsHandle, fn func()) error {
	done := make(chan error, 1)
	go func() {
		var err error
		defer func() { done <- err }()
		runtime.LockOSThread() // (never unlocked: the thread goes with the goroutine)
		if err = netns.Set(h); err == nil {
			fn()
		}
	}()
	return <-done
}
