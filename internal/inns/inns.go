// Package inns runs a function in a named network namespace, for tests
// whose test hosts live in namespaces of their own: on a thread of its
// own that enters the namespace and is dropped after (its goroutine ends
// locked to it), so no other goroutine ever runs there. Sockets made in
// fn stay in the namespace and can be used from anywhere.
package inns

import (
	"runtime"

	"github.com/vishvananda/netns"
)

// Run calls fn in network namespace ns (made by ip netns add) and waits
// for it, also when fn ends its goroutine (a test's Fatal).
func Run(ns string, fn func()) error {
	done := make(chan error, 1)
	go func() {
		var err error
		defer func() { done <- err }()
		runtime.LockOSThread() // (never unlocked: the thread goes with the goroutine)
		var h netns.NsHandle
		if h, err = netns.GetFromName(ns); err != nil {
			return
		}
		err = netns.Set(h)
		h.Close()
		if err == nil {
			fn()
		}
	}()
	return <-done
}
